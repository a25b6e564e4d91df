//! Reading job records back from accounting (slurmdbd) through libslurm's slurmdb API:
//! one connection, queries by time window, state, user, partition, node and job id.

use std::os::raw::c_void;

use serde::{Deserialize, Serialize};

use crate::error::{clear_errno, last_error, Error, Result};
use crate::ffi::{opt_string, opt_time, opt_u32, string, List};
use crate::state::{JobState, TimeLimit};
use crate::Slurm;

/// Which job records to read. `start` is required: slurmdbd returns the jobs that were
/// eligible, running or ended inside [start, end].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AcctQuery {
    /// Window start, unix seconds.
    pub start: i64,
    /// Window end, unix seconds; None = now.
    pub end: Option<i64>,
    /// Only jobs that were in one of these states inside the window: for RUNNING and
    /// PENDING, at some time in it; for end states (COMPLETED, PREEMPTED, REQUEUED...),
    /// ending in it (slurmdbd's rules, as `sacct -s`). E.g.
    /// `JobState::from_base(JobBase::Preempted)`, [`JobState::REQUEUED`]; empty = all.
    pub states: Vec<JobState>,
    pub job_ids: Vec<u32>,
    pub user_ids: Vec<u32>,
    pub partitions: Vec<String>,
    /// Only jobs that ran on one of these nodes (host expression). slurmdbd resolves
    /// node names in one cluster only: with `nodes` set, `clusters` must name at most
    /// one, and empty means this cluster (ClusterName of slurm.conf).
    pub nodes: Option<String>,
    /// Clusters to read; empty = all clusters in this slurmdbd (see `nodes`).
    pub clusters: Vec<String>,
    /// Also return the earlier runs of requeued jobs (sacct -D); without it only the
    /// latest record of each job comes back.
    pub duplicates: bool,
}

/// One job record from accounting (one run of a job when `duplicates` is set).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcctJob {
    pub job_id: u32,
    pub array_job_id: Option<u32>,
    pub array_task_id: Option<u32>,
    pub het_job_id: Option<u32>,
    pub het_job_offset: Option<u32>,
    pub cluster: Option<String>,
    pub name: String,
    pub user: Option<String>,
    pub user_id: u32,
    pub group_id: u32,
    pub account: Option<String>,
    pub partition: Option<String>,
    /// Nodes it ran on (host expression); None if it never ran.
    pub nodes: Option<String>,
    pub alloc_nodes: u32,
    pub state: JobState,
    pub submit_time: Option<i64>,
    pub eligible_time: Option<i64>,
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Run time in seconds (suspended time excluded), as sacct's Elapsed.
    pub elapsed_s: u32,
    pub time_limit: Option<TimeLimit>,
    /// Wait status as sacct's ExitCode encodes it.
    pub exit_code: u32,
    /// Who cancelled/requeued the job, if someone did.
    pub requested_by_uid: Option<u32>,
    pub admin_comment: Option<String>,
    pub system_comment: Option<String>,
    pub work_dir: Option<String>,
    pub tres_alloc: Option<String>,
}

/// A connection to slurmdbd. Closed on drop (or by [`SlurmDb::close`] to see errors).
/// `Send` but not `Sync`: one persistent socket, one request at a time.
#[derive(Debug)]
pub struct SlurmDb {
    conn: *mut c_void,
    slurm: Option<Slurm>,
}

// SAFETY: the connection is a heap object used by one thread at a time (&mut self);
// libslurmdb keeps no thread affinity for it.
unsafe impl Send for SlurmDb {}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl SlurmDb {
    /// Opens a connection (`slurmdb_connection_get`) to the slurmdbd named in
    /// slurm.conf; needs [`Slurm::init`] first, which the argument proves.
    pub fn connect(slurm: &Slurm) -> Result<SlurmDb> {
        clear_errno();
        let mut flags: u16 = 0;
        // SAFETY: flags outlives the call; the result is owned by SlurmDb.
        let conn = unsafe { slurm_sys::slurmdb_connection_get(&mut flags) };
        let errno = slurm_sys::compat::errno();
        // When slurmdbd cannot be reached, the slurmdbd plugin still hands back a
        // connection object and reports the failure in errno only (sacct checks errno,
        // not the pointer, for this reason). Take it as the failure it is.
        if conn.is_null() || errno != 0 {
            let err = last_error("slurmdb_connection_get", -1);
            drop(SlurmDb { conn, slurm: None });
            return Err(err);
        }
        Ok(SlurmDb {
            conn,
            slurm: Some(*slurm),
        })
    }

    /// Reads job records (`slurmdb_jobs_get`); steps are not fetched. Job start/end
    /// times are the real ones, not clipped to the window.
    pub fn jobs(&mut self, q: &AcctQuery) -> Result<Vec<AcctJob>> {
        if q.start <= 0 {
            return Err(Error::invalid("start", "must be a unix time after 1970"));
        }
        if let Some(end) = q.end {
            if end < q.start {
                return Err(Error::invalid(
                    "end",
                    format!("{end} is before start {}", q.start),
                ));
            }
        }
        let mut clusters = q.clusters.clone();
        if q.nodes.is_some() {
            match clusters.len() {
                0 => {
                    let s = self.slurm.ok_or_else(|| {
                        Error::invalid("clusters", "name the cluster to filter by nodes")
                    })?;
                    clusters.push(s.cluster_name()?);
                }
                1 => {}
                n => {
                    return Err(Error::invalid(
                        "clusters",
                        format!("{n} given with a node filter; slurmdbd allows one"),
                    ))
                }
            }
        }
        // Lists are Rust-owned guards: freed on every return path, with their items.
        let mut lists: Vec<List> = Vec::new();
        let mut flags = slurm_sys::JOBCOND_FLAG_NO_STEP | slurm_sys::JOBCOND_FLAG_NO_TRUNC;
        if q.duplicates {
            flags |= slurm_sys::JOBCOND_FLAG_DUP;
        }
        // Zero is Slurm's "unset" for the numeric ranges (cpus, nodes, time limit), but
        // not for db_flags: 0 there means "jobs whose scheduling flags are all clear",
        // which filters out most jobs; NOTSET is "no filter", as sacct sends.
        let mut cond = slurm_sys::slurmdb_job_cond_t {
            usage_start: q.start as libc::time_t,
            // Explicitly now: with a state filter slurmdbd would take end = start.
            usage_end: q.end.unwrap_or_else(now) as libc::time_t,
            flags: flags as u32,
            db_flags: slurm_sys::SLURMDB_JOB_FLAG_NOTSET as u32,
            ..Default::default()
        };
        let mut strs =
            |items: Vec<String>, what: &'static str| -> Result<slurm_sys::compat::List> {
                if items.is_empty() {
                    return Ok(std::ptr::null_mut());
                }
                let mut l = List::new_xfree();
                for it in &items {
                    l.push_str(what, it)?;
                }
                let p = l.0;
                lists.push(l);
                Ok(p)
            };
        // slurmdbd matches states by number, as sacct sends them.
        cond.state_list = strs(q.states.iter().map(|s| s.0.to_string()).collect(), "state")?;
        cond.userid_list = strs(q.user_ids.iter().map(u32::to_string).collect(), "user id")?;
        cond.partition_list = strs(q.partitions.clone(), "partition")?;
        cond.cluster_list = strs(clusters, "cluster")?;
        let used_nodes = match &q.nodes {
            Some(n) => Some(crate::ffi::c_arg("nodes", n)?),
            None => None,
        };
        cond.used_nodes = used_nodes
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.as_ptr() as *mut _);
        let steps = if q.job_ids.is_empty() {
            None
        } else {
            let l = List::new_xfree();
            for id in &q.job_ids {
                // SAFETY: a zeroed, xmalloc'd slurm_selected_step_t the list frees with
                // xfree (it holds no pointers).
                unsafe {
                    let p = slurm_sys::slurm_xcalloc(
                        1,
                        std::mem::size_of::<slurm_sys::slurm_selected_step_t>(),
                        true,
                        false,
                        c"bftrainer-slurm".as_ptr(),
                        0,
                        c"jobs".as_ptr(),
                    )
                    .cast::<slurm_sys::slurm_selected_step_t>();
                    (*p).array_task_id = slurm_sys::NO_VAL;
                    (*p).het_job_offset = slurm_sys::NO_VAL;
                    (*p).step_id.job_id = *id;
                    (*p).step_id.step_id = slurm_sys::NO_VAL;
                    (*p).step_id.step_het_comp = slurm_sys::NO_VAL;
                    slurm_sys::slurm_list_append(l.0, p.cast());
                }
            }
            Some(l)
        };
        cond.step_list = steps.as_ref().map_or(std::ptr::null_mut(), |l| l.0);

        clear_errno();
        // SAFETY: cond and everything it points to outlive the call; slurmdb does not
        // take ownership of cond. The returned list is owned by the guard.
        let result = List(unsafe { slurm_sys::slurmdb_jobs_get(self.conn, &mut cond) });
        if result.0.is_null() {
            return Err(last_error("slurmdb_jobs_get", -1));
        }
        let mut out = Vec::new();
        result.for_each(|p| {
            // SAFETY: the list holds slurmdb_job_rec_t items, alive while it is.
            out.push(convert(unsafe {
                &*p.cast::<slurm_sys::slurmdb_job_rec_t>()
            }));
        });
        Ok(out)
    }

    /// Closes the connection, reporting a failure to do so.
    pub fn close(mut self) -> Result<()> {
        let r = self.close_inner();
        std::mem::forget(self);
        r
    }

    fn close_inner(&mut self) -> Result<()> {
        if self.conn.is_null() {
            return Ok(());
        }
        clear_errno();
        // SAFETY: conn came from slurmdb_connection_get; close frees it and NULLs it.
        let rc = unsafe { slurm_sys::slurmdb_connection_close(&mut self.conn) };
        self.conn = std::ptr::null_mut();
        crate::error::check("slurmdb_connection_close", rc)
    }
}

impl Drop for SlurmDb {
    fn drop(&mut self) {
        if let Err(e) = self.close_inner() {
            log::warn!("{e}");
        }
    }
}

fn convert(r: &slurm_sys::slurmdb_job_rec_t) -> AcctJob {
    let het = r.het_job_id != 0;
    // SAFETY: string fields are NULL or valid C strings inside the live record.
    unsafe {
        AcctJob {
            job_id: r.jobid,
            array_job_id: (r.array_job_id != 0).then_some(r.array_job_id),
            array_task_id: if r.array_job_id != 0 {
                opt_u32(r.array_task_id)
            } else {
                None
            },
            het_job_id: het.then_some(r.het_job_id),
            het_job_offset: if het { opt_u32(r.het_job_offset) } else { None },
            cluster: opt_string(r.cluster),
            name: string(r.jobname),
            user: opt_string(r.user),
            user_id: r.uid,
            group_id: r.gid,
            account: opt_string(r.account),
            partition: opt_string(r.partition),
            nodes: opt_string(r.nodes).filter(|n| n != "None assigned"),
            alloc_nodes: r.alloc_nodes,
            state: JobState(r.state),
            submit_time: opt_time(r.submit),
            eligible_time: opt_time(r.eligible),
            start_time: opt_time(r.start),
            end_time: opt_time(r.end),
            elapsed_s: r.elapsed,
            time_limit: TimeLimit::from_raw(r.timelimit),
            exit_code: r.exitcode,
            requested_by_uid: (r.requid != u32::MAX).then_some(r.requid).and_then(opt_u32),
            admin_comment: opt_string(r.admin_comment),
            system_comment: opt_string(r.system_comment),
            work_dir: opt_string(r.work_dir),
            tres_alloc: opt_string(r.tres_alloc_str),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_record_converts() {
        let r = slurm_sys::slurmdb_job_rec_t {
            requid: u32::MAX,
            timelimit: slurm_sys::INFINITE,
            ..Default::default()
        };
        let j = convert(&r);
        assert_eq!(j.requested_by_uid, None);
        assert_eq!(j.time_limit, Some(TimeLimit::Unlimited));
        assert!(j.nodes.is_none() && j.start_time.is_none());
    }

    #[test]
    fn bad_windows_are_refused_without_a_connection() {
        let mut db = SlurmDb {
            conn: std::ptr::null_mut(),
            slurm: None,
        };
        let e = db.jobs(&AcctQuery::default()).unwrap_err();
        assert!(e.to_string().contains("start"), "{e}");
        let e = db
            .jobs(&AcctQuery {
                start: 100,
                end: Some(50),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains("before start"), "{e}");
        let e = db
            .jobs(&AcctQuery {
                start: 100,
                nodes: Some("n1".into()),
                clusters: vec!["a".into(), "b".into()],
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains("slurmdbd allows one"), "{e}");
    }
}
