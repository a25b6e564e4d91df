//! Loading nodes, partitions and jobs from slurmctld into owned snapshots, passing the
//! previous snapshot's update time so an unchanged cluster costs one cheap RPC.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::{clear_errno, last_error, Result};
use crate::ffi::{
    comma_list, opt_string, opt_time, opt_u16, opt_u32, opt_u64, owned_msg, string, user_name,
};
use crate::state::{reason_name, JobBase, JobState, NodeState, TimeLimit};
use crate::Slurm;

/// Result of a load with a previous update time.
#[derive(Clone, Debug, PartialEq)]
pub enum Loaded<T> {
    /// slurmctld sent data newer than the time passed in.
    Changed(T),
    /// SLURM_NO_CHANGE_IN_DATA: nothing changed since the time passed in; keep the
    /// snapshot you have.
    Unchanged,
}

impl<T> Loaded<T> {
    /// The new data, if any.
    pub fn changed(self) -> Option<T> {
        match self {
            Loaded::Changed(t) => Some(t),
            Loaded::Unchanged => None,
        }
    }
}

/// One node as slurmctld reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub state: NodeState,
    /// Partitions containing the node. slurmctld does not send this with nodes; it is
    /// filled by [`crate::ClusterView`] (or [`Nodes::assign_partitions`]).
    pub partitions: Vec<String>,
    pub cpus: u16,
    /// CPUs allocated to jobs now (from the select plugin), if it reports it.
    pub alloc_cpus: Option<u16>,
    /// Configured memory (RealMemory), MiB.
    pub real_memory_mb: u64,
    /// Memory allocated to jobs now, MiB, if reported.
    pub alloc_memory_mb: Option<u64>,
    /// Free memory measured by slurmd, MiB, if reported.
    pub free_memory_mb: Option<u64>,
    /// Raw GRES string, e.g. "gpu:a100:4(S:0-1)".
    pub gres: Option<String>,
    /// GPUs configured, summed over the `gpu` GRES entries.
    pub gpus: u32,
    pub gres_used: Option<String>,
    /// Available features.
    pub features: Vec<String>,
    /// Active features (same as `features` when Slurm sends none).
    pub active_features: Vec<String>,
    /// Why the node is down/drained, if set.
    pub reason: Option<String>,
    pub boot_time: Option<i64>,
    pub last_busy: Option<i64>,
    /// The only user allowed on the node (ExclusiveUser), if any.
    pub owner: Option<u32>,
    pub weight: u32,
}

/// All nodes, with the controller's update time of this snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Nodes {
    pub last_update: i64,
    pub nodes: Vec<Node>,
}

impl Nodes {
    /// The node called `name`.
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Fills each node's `partitions` from partition node lists.
    pub fn assign_partitions(&mut self, parts: &Partitions) {
        assign_partitions(&mut self.nodes, &parts.partitions);
    }
}

/// Sets each node's `partitions` from the partitions' node lists, in partition order.
pub fn assign_partitions(nodes: &mut [Node], parts: &[Partition]) {
    // One pass over each table: O(nodes + partition nodes), not a scan of the node table
    // per partition node (10^8 compares at 10,000 nodes). A name the table lists twice
    // gets its partitions on its last entry.
    //
    // Partitions list their nodes in the node table's order as a rule (both come from
    // slurm.conf), so each name is first compared with the entry after the last one
    // found; only a miss goes through a name index, built on the first miss. The guess
    // is taken only in a table whose names increase strictly (so are unique); the check
    // is one compare per node, cheaper than hashing every name.
    let unique = nodes.windows(2).all(|w| w[0].name < w[1].name);
    // (node, partition) in partition order.
    let mut pairs: Vec<(u32, u32)> =
        Vec::with_capacity(parts.iter().map(|p| p.node_names.len()).sum());
    {
        let mut index: Option<FxHashMap<&str, u32>> = None;
        for (k, p) in parts.iter().enumerate() {
            let mut next = 0usize;
            for name in &p.node_names {
                let guess = nodes.get(next).filter(|n| unique && n.name == *name);
                let found = match guess {
                    Some(_) => Some(next as u32),
                    None => index
                        .get_or_insert_with(|| {
                            nodes
                                .iter()
                                .enumerate()
                                .map(|(i, n)| (n.name.as_str(), i as u32))
                                .collect()
                        })
                        .get(name.as_str())
                        .copied(),
                };
                if let Some(i) = found {
                    pairs.push((i, k as u32));
                    next = i as usize + 1;
                }
            }
        }
    }
    // Grouped by node, each node's partitions in partition order: a counting sort
    // (stable), not a comparison sort.
    let mut start = vec![0u32; nodes.len() + 1];
    for &(i, _) in &pairs {
        start[i as usize + 1] += 1;
    }
    for i in 0..nodes.len() {
        start[i + 1] += start[i];
    }
    let mut fill = start.clone();
    let mut grouped = vec![0u32; pairs.len()];
    for &(i, k) in &pairs {
        grouped[fill[i as usize] as usize] = k;
        fill[i as usize] += 1;
    }
    drop(pairs);
    for (i, n) in nodes.iter_mut().enumerate() {
        let mine = &grouped[start[i] as usize..start[i + 1] as usize];
        // A node whose list is already right keeps it (no copies of the names).
        let same = n.partitions.len() == mine.len()
            && n.partitions
                .iter()
                .zip(mine)
                .all(|(have, &k)| *have == parts[k as usize].name);
        if !same {
            n.partitions.clear();
            n.partitions
                .extend(mine.iter().map(|&k| parts[k as usize].name.clone()));
        }
    }
}

/// One partition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// Host expression as configured, e.g. "n[1-4]".
    pub nodes: Option<String>,
    /// `nodes` expanded.
    pub node_names: Vec<String>,
    pub priority_tier: u16,
    pub priority_job_factor: u16,
    /// PREEMPT_MODE_* bits (slurm_sys), e.g. PREEMPT_MODE_REQUEUE;
    /// [`Partition::PREEMPT_INHERIT`]: none of its own (slurm.conf's global one holds).
    pub preempt_mode: u16,
    /// Preemption grace time, seconds.
    pub grace_time_s: u32,
    pub max_time: Option<TimeLimit>,
    pub default_time: Option<TimeLimit>,
    pub total_cpus: u32,
    pub total_nodes: u32,
    /// Up: accepts and schedules jobs (PARTITION_UP).
    pub up: bool,
    pub is_default: bool,
}

impl Partition {
    /// `preempt_mode` of PreemptMode=REQUEUE.
    pub const PREEMPT_REQUEUE: u16 = slurm_sys::PREEMPT_MODE_REQUEUE as u16;

    /// `preempt_mode` of PreemptMode=OFF.
    pub const PREEMPT_OFF: u16 = slurm_sys::PREEMPT_MODE_OFF as u16;

    /// `preempt_mode` of a partition without a PreemptMode of its own (NO_VAL16): it
    /// takes slurm.conf's global PreemptMode (as sinfo and scontrol show it).
    pub const PREEMPT_INHERIT: u16 = slurm_sys::NO_VAL16 as u16;

    /// PreemptMode=OFF: Slurm never preempts jobs in this partition.
    pub fn preempt_off(&self) -> bool {
        u32::from(self.preempt_mode) == slurm_sys::PREEMPT_MODE_OFF
    }

    /// The PreemptMode that holds in this partition under slurm.conf's global one.
    pub fn effective_preempt_mode(&self, global: u16) -> u16 {
        if self.preempt_mode == Self::PREEMPT_INHERIT {
            global
        } else {
            self.preempt_mode
        }
    }

    /// Jobs in this partition are requeued when preempted.
    pub fn preempt_requeues(&self) -> bool {
        u32::from(self.preempt_mode) & slurm_sys::PREEMPT_MODE_REQUEUE != 0
    }
}

/// slurmctld's preemption settings (`slurm_load_ctl_conf`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    /// PreemptType (`preempt/partition_prio`), if set.
    pub preempt_type: Option<String>,
    /// The global PreemptMode (PREEMPT_MODE_* bits): what a partition without one of
    /// its own takes.
    pub preempt_mode: u16,
}

/// All partitions, with the controller's update time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Partitions {
    pub last_update: i64,
    pub partitions: Vec<Partition>,
}

impl Partitions {
    pub fn get(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }
}

/// One job as slurmctld reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: u32,
    /// Array master id and task id, for array tasks.
    pub array_job_id: Option<u32>,
    pub array_task_id: Option<u32>,
    /// Pending array tasks this record stands for, e.g. "2-9".
    pub array_task_str: Option<String>,
    /// Heterogeneous job leader and this component's offset.
    pub het_job_id: Option<u32>,
    pub het_job_offset: Option<u32>,
    pub name: String,
    pub user_id: u32,
    /// From Slurm if it sent one, else resolved locally from the uid.
    pub user_name: Option<String>,
    pub group_id: u32,
    /// The account the job is charged to.
    pub account: Option<String>,
    /// Its QOS.
    #[serde(default)]
    pub qos: Option<String>,
    pub state: JobState,
    /// Why pending / why it ended ("Priority", "Resources", "JobHeldAdmin", ...).
    pub reason: Option<String>,
    /// Extra text for the reason, if any.
    pub reason_detail: Option<String>,
    pub partition: Option<String>,
    /// Allocated nodes (host expression) of a running or finished job.
    pub nodes: Option<String>,
    /// Nodes the backfill scheduler plans for a pending job (SchedNodes).
    pub sched_nodes: Option<String>,
    /// Nodes the job asked for (ReqNodeList) and excluded (ExcNodeList).
    pub req_nodes: Option<String>,
    pub exc_nodes: Option<String>,
    pub batch_host: Option<String>,
    /// Node count: requested when pending, allocated when running.
    pub num_nodes: u32,
    pub num_cpus: u32,
    pub comment: Option<String>,
    pub admin_comment: Option<String>,
    pub submit_time: Option<i64>,
    /// Actual start for started jobs; the scheduler's expected start for pending ones.
    pub start_time: Option<i64>,
    /// Actual or expected end.
    pub end_time: Option<i64>,
    pub time_limit: Option<TimeLimit>,
    pub priority: u32,
    /// The job may be requeued.
    pub requeue: bool,
    pub restart_count: u16,
    /// When preemption of this job began, if it has.
    pub preempt_time: Option<i64>,
    /// The earliest time it may start (its BeginTime, `EligibleTime` in `scontrol show
    /// job`; a requeue sets it a while ahead); `None` when unset.
    #[serde(default)]
    pub eligible_time: Option<i64>,
    pub work_dir: Option<String>,
    pub std_out: Option<String>,
    /// The job's `--constraint` (required node features), as Slurm shows it.
    #[serde(default)]
    pub constraint: Option<String>,
    /// Memory it asks per node in MB (`--mem`); `None` when unset or per CPU.
    #[serde(default)]
    pub mem_per_node_mb: Option<u64>,
    /// Memory it asks per CPU in MB (`--mem-per-cpu`); `None` when unset or per node.
    #[serde(default)]
    pub mem_per_cpu_mb: Option<u64>,
    /// Trackable resources per node (`--gres`, `--gpus-per-node`), as slurmctld stores
    /// them (e.g. `gres:gpu:2` on 22.05, `gres/gpu:2` from 23.02): what a satellite of
    /// this job asks for on its node.
    #[serde(default)]
    pub tres_per_node: Option<String>,
    /// Trackable resources per task (`--gpus-per-task`).
    #[serde(default)]
    pub tres_per_task: Option<String>,
    #[serde(default)]
    pub cpus_per_task: Option<u16>,
    #[serde(default)]
    pub ntasks_per_node: Option<u16>,
}

impl Job {
    /// Expected start of a pending job, as the backfill scheduler planned it.
    #[inline]
    pub fn expected_start(&self) -> Option<i64> {
        if self.state.base() == JobBase::Pending {
            self.start_time
        } else {
            None
        }
    }

    /// Held: pending with priority 0 (admin or user hold).
    #[inline]
    pub fn is_held(&self) -> bool {
        self.state.base() == JobBase::Pending && self.priority == 0
    }
}

/// All jobs, with the controller's update time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Jobs {
    pub last_update: i64,
    pub jobs: Vec<Job>,
}

impl Jobs {
    pub fn get(&self, job_id: u32) -> Option<&Job> {
        self.jobs.iter().find(|j| j.job_id == job_id)
    }
}

/// GPUs in a GRES string such as "gpu:a100:4(S:0-1),gpu:1,nic:2": sums the counts of
/// entries named `gpu`. An entry without a count counts 1, as in Slurm.
pub fn gpu_count(gres: &str) -> u32 {
    gpus_of_type(gres, None)
}

/// The entries of a GRES string, without their socket lists: "gpu:a100:2(S:0-1)".
fn gres_entries(gres: &str) -> Vec<&str> {
    // Entries are comma-separated, but socket lists in parentheses may hold commas.
    let mut depth = 0;
    let mut start = 0;
    let mut entries = Vec::new();
    for (i, &b) in gres.as_bytes().iter().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b',' if depth == 0 => {
                entries.push(&gres[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries.push(&gres[start..]);
    entries
        .into_iter()
        .map(|e| e.split('(').next().unwrap_or("").trim())
        .collect()
}

/// GPUs in a node's GRES string (`gpu:a100:2(S:0-1),gpu:v100:1`), all of them or only
/// those of type `typ`.
pub fn gpus_of_type(gres: &str, typ: Option<&str>) -> u32 {
    gpu_entries(gres)
        .into_iter()
        .filter(|(t, _)| typ.is_none() || t.as_deref() == typ)
        .fold(0u32, |a, (_, c)| a.saturating_add(c))
}

/// The GPU entries of a node's GRES string: (type, count) each.
pub fn gpu_entries(gres: &str) -> Vec<(Option<String>, u32)> {
    let mut out = Vec::new();
    for e in gres_entries(gres) {
        let mut parts = e.split(':');
        if parts.next() != Some("gpu") {
            continue;
        }
        let rest: Vec<&str> = parts.collect();
        out.push(match rest.as_slice() {
            [] => (None, 1),
            [one] => match parse_count(one) {
                Some(c) => (None, c),
                None => (Some(one.to_string()), 1),
            },
            [t, c, ..] => (Some(t.to_string()), parse_count(c).unwrap_or(1)),
        });
    }
    out
}

/// GPUs a job asks per node, from its TresPerNode as slurmctld stores it
/// (`gres:gpu:2` on 22.05, `gres/gpu:a100:2` from 23.02, or a bare `gpu:2`): the type
/// (None: any) and the count. None when it asks for no GPU.
pub fn gpus_per_node(tres_per_node: &str) -> Option<(Option<String>, u32)> {
    for e in gres_entries(tres_per_node) {
        let e = e
            .strip_prefix("gres:")
            .or_else(|| e.strip_prefix("gres/"))
            .unwrap_or(e);
        let mut parts = e.split(':');
        if parts.next() != Some("gpu") {
            continue;
        }
        let rest: Vec<&str> = parts.collect();
        return Some(match rest.as_slice() {
            [] => (None, 1),
            [one] => match parse_count(one) {
                Some(c) => (None, c),
                None => (Some(one.to_string()), 1),
            },
            [t, c, ..] => (Some(t.to_string()), parse_count(c).unwrap_or(1)),
        });
    }
    None
}

/// A request of `count` GPUs (of type `typ`, any for `None`) per node, as slurmctld
/// takes a job description's TresPerNode: `gres:gpu[:TYPE]:N` before 23.02,
/// `gres/gpu[:TYPE]:N` from 23.02 (what sbatch's `--gres` becomes on each release).
pub fn gpu_tres_request(typ: Option<&str>, count: u32) -> String {
    let sep = if crate::SLURM_VERSION >= 0x17_02_00 {
        '/'
    } else {
        ':'
    };
    match typ {
        Some(t) => format!("gres{sep}gpu:{t}:{count}"),
        None => format!("gres{sep}gpu:{count}"),
    }
}

/// "4", "2K" (Slurm allows suffixes on counts); None if not a count (a type name).
fn parse_count(s: &str) -> Option<u32> {
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024u64),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        b'g' | b'G' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    let n: u64 = num.parse().ok()?;
    u32::try_from(n.saturating_mul(mult)).ok()
}

owned_msg!(
    /// Owns a node_info_msg_t from slurm_load_node.
    NodeMsg, node_info_msg_t, slurm_free_node_info_msg
);
owned_msg!(
    /// Owns a partition_info_msg_t from slurm_load_partitions.
    PartMsg, partition_info_msg_t, slurm_free_partition_info_msg
);
owned_msg!(
    /// Owns a job_info_msg_t from slurm_load_jobs / slurm_load_job.
    JobMsg, job_info_msg_t, slurm_free_job_info_msg
);

/// Runs a load call; -1 with SLURM_NO_CHANGE_IN_DATA is not an error.
fn run_load(call: &'static str, f: impl FnOnce() -> i32) -> Result<bool> {
    clear_errno();
    let rc = f();
    if rc == slurm_sys::SLURM_SUCCESS as i32 {
        return Ok(true);
    }
    let err = last_error(call, rc);
    if err.code() == Some(slurm_sys::SLURM_NO_CHANGE_IN_DATA as i32) {
        Ok(false)
    } else {
        Err(err)
    }
}

fn records<'a, T>(ptr: *const T, count: u32) -> &'a [T] {
    if ptr.is_null() || count == 0 {
        &[]
    } else {
        // SAFETY: Slurm's message holds `count` records at `ptr`; the slice does not
        // outlive the message guard in the callers.
        unsafe { std::slice::from_raw_parts(ptr, count as usize) }
    }
}

/// Owns a slurm_conf_t from slurm_load_ctl_conf.
struct ConfMsg(*mut slurm_sys::slurm_conf_t);

impl Drop for ConfMsg {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by slurm_load_ctl_conf for this guard, freed only here.
            unsafe { slurm_sys::compat::free_ctl_conf(self.0) };
        }
    }
}

impl Slurm {
    /// `f` of slurmctld's configuration (`slurm_load_ctl_conf`).
    pub(crate) fn ctl_conf<T>(&self, f: impl FnOnce(&slurm_sys::slurm_conf_t) -> T) -> Result<T> {
        let mut msg = ConfMsg(std::ptr::null_mut());
        clear_errno();
        // SAFETY: msg.0 receives a message owned by the guard.
        let rc = unsafe { slurm_sys::slurm_load_ctl_conf(0, &mut msg.0) };
        if rc != slurm_sys::SLURM_SUCCESS as i32 {
            return Err(last_error("slurm_load_ctl_conf", rc));
        }
        // SAFETY: valid until the guard drops.
        unsafe { msg.0.as_ref() }
            .map(f)
            .ok_or_else(|| crate::Error::from_code("slurm_load_ctl_conf", slurm_sys::SLURM_ERROR))
    }

    /// The cluster's name (ClusterName) as slurmctld reports it (`slurm_load_ctl_conf`).
    pub fn cluster_name(&self) -> Result<String> {
        // SAFETY: the field is NULL or a C string owned by the message.
        self.ctl_conf(|c| unsafe { opt_string(c.cluster_name) })?
            .ok_or_else(|| crate::Error::from_code("slurm_load_ctl_conf", slurm_sys::SLURM_ERROR))
    }

    /// PreemptType as slurmctld reports it (`preempt/partition_prio`), if set.
    pub fn preempt_type(&self) -> Result<Option<String>> {
        // SAFETY: the field is NULL or a C string owned by the message.
        self.ctl_conf(|c| unsafe { opt_string(c.preempt_type) })
    }

    /// slurmctld's PreemptType and global PreemptMode, read in one call.
    pub fn preemption(&self) -> Result<Preemption> {
        self.ctl_conf(|c| Preemption {
            // SAFETY: the field is NULL or a C string owned by the message.
            preempt_type: unsafe { opt_string(c.preempt_type) },
            preempt_mode: c.preempt_mode,
        })
    }

    /// The release slurmctld runs, as it reports it ("24.11.5"), if it says.
    pub fn controller_version(&self) -> Result<Option<String>> {
        // SAFETY: the field is NULL or a C string owned by the message.
        self.ctl_conf(|c| unsafe { opt_string(c.version) })
    }

    /// Refuses a slurmctld of another release series (major.minor) than the libslurm
    /// this program was built against: `Error::Release` names both and the fix. A
    /// controller too far apart to answer at all gives `Error::Slurm` with the same
    /// advice (see [`crate::Error`]).
    pub fn check_controller_release(&self) -> Result<()> {
        let running = self.controller_version()?.unwrap_or_default();
        crate::error::check_release(slurm_sys::SLURM_VERSION_NUMBER_BUILT, &running)
            .map_err(crate::Error::Release)
    }

    /// SlurmUser's uid as slurmctld reports it: the one non-root user Slurm treats as
    /// an administrator.
    pub fn slurm_user_id(&self) -> Result<u32> {
        self.ctl_conf(|c| c.slurm_user_id)
    }

    /// AuthInfo as slurmctld reports it (`socket=/path,cred_expire=15`), if set: where
    /// the cluster's munged listens.
    pub fn auth_info(&self) -> Result<Option<String>> {
        // SAFETY: the field is NULL or a C string owned by the message.
        self.ctl_conf(|c| unsafe { opt_string(c.authinfo) })
    }

    /// All nodes (`slurm_load_node`, SHOW_ALL | SHOW_MIXED). With `since` set to a
    /// previous snapshot's `last_update`, returns `Unchanged` if nothing changed.
    pub fn load_nodes(&self, since: Option<i64>) -> Result<Loaded<Nodes>> {
        self.load_nodes_with(since, false)
    }

    /// As [`Slurm::load_nodes`]; with `detail` (SHOW_DETAIL) slurmctld also sends each
    /// node's GRES in use (`Node::gres_used`), which it leaves out otherwise.
    pub fn load_nodes_with(&self, since: Option<i64>, detail: bool) -> Result<Loaded<Nodes>> {
        let mut msg = NodeMsg(std::ptr::null_mut());
        let mut flags = (slurm_sys::SHOW_ALL | slurm_sys::SHOW_MIXED) as u16;
        if detail {
            flags |= slurm_sys::SHOW_DETAIL as u16;
        }
        // SAFETY: msg.0 receives a message owned by the guard.
        let changed = run_load("slurm_load_node", || unsafe {
            slurm_sys::slurm_load_node(since.unwrap_or(0) as libc::time_t, &mut msg.0, flags)
        })?;
        if !changed || msg.0.is_null() {
            return Ok(Loaded::Unchanged);
        }
        // SAFETY: msg.0 is a valid message until the guard drops at the end.
        let m = unsafe { &*msg.0 };
        let nodes = records(m.node_array, m.record_count)
            .iter()
            .filter(|n| !n.name.is_null())
            .map(convert_node)
            .collect();
        Ok(Loaded::Changed(Nodes {
            last_update: m.last_update as i64,
            nodes,
        }))
    }

    /// All partitions (`slurm_load_partitions`, SHOW_ALL).
    pub fn load_partitions(&self, since: Option<i64>) -> Result<Loaded<Partitions>> {
        let mut msg = PartMsg(std::ptr::null_mut());
        let flags = slurm_sys::SHOW_ALL as u16;
        // SAFETY: as in load_nodes.
        let changed = run_load("slurm_load_partitions", || unsafe {
            slurm_sys::slurm_load_partitions(since.unwrap_or(0) as libc::time_t, &mut msg.0, flags)
        })?;
        if !changed || msg.0.is_null() {
            return Ok(Loaded::Unchanged);
        }
        // SAFETY: valid until the guard drops.
        let m = unsafe { &*msg.0 };
        let mut partitions = Vec::new();
        for p in records(m.partition_array, m.record_count) {
            if p.name.is_null() {
                continue;
            }
            partitions.push(convert_partition(p)?);
        }
        Ok(Loaded::Changed(Partitions {
            last_update: m.last_update as i64,
            partitions,
        }))
    }

    /// All jobs slurmctld still knows (`slurm_load_jobs`, SHOW_ALL), finished ones
    /// included until MinJobAge expires them.
    pub fn load_jobs(&self, since: Option<i64>) -> Result<Loaded<Jobs>> {
        let mut msg = JobMsg(std::ptr::null_mut());
        let flags = slurm_sys::SHOW_ALL as u16;
        // SAFETY: as in load_nodes.
        let changed = run_load("slurm_load_jobs", || unsafe {
            slurm_sys::slurm_load_jobs(since.unwrap_or(0) as libc::time_t, &mut msg.0, flags)
        })?;
        if !changed || msg.0.is_null() {
            return Ok(Loaded::Unchanged);
        }
        // SAFETY: valid until the guard drops.
        let m = unsafe { &*msg.0 };
        let mut names = NameCache::default();
        let jobs = records(m.job_array, m.record_count)
            .iter()
            .map(|j| convert_job(j, &mut names))
            .collect();
        Ok(Loaded::Changed(Jobs {
            last_update: m.last_update as i64,
            jobs,
        }))
    }

    /// One job by id (`slurm_load_job`); `ESLURM_INVALID_JOB_ID` once it is gone.
    pub fn load_job(&self, job_id: u32) -> Result<Job> {
        let mut msg = JobMsg(std::ptr::null_mut());
        clear_errno();
        // SAFETY: msg.0 receives a message owned by the guard.
        let rc =
            unsafe { slurm_sys::compat::load_job(&mut msg.0, job_id, slurm_sys::SHOW_ALL as u16) };
        if rc != slurm_sys::SLURM_SUCCESS as i32 {
            return Err(last_error("slurm_load_job", rc));
        }
        // SAFETY: valid until the guard drops.
        let m = unsafe { msg.0.as_ref() };
        let mut names = NameCache::default();
        m.and_then(|m| records(m.job_array, m.record_count).first())
            .map(|j| convert_job(j, &mut names))
            .ok_or_else(|| {
                crate::Error::from_code("slurm_load_job", slurm_sys::ESLURM_INVALID_JOB_ID as i32)
            })
    }
}

fn convert_node(n: &slurm_sys::node_info_t) -> Node {
    // SAFETY (for every string read here): the fields are NULL or valid C strings
    // inside the live message.
    unsafe {
        let gres = opt_string(n.gres);
        let features = comma_list(n.features);
        let active = comma_list(n.features_act);
        Node {
            name: string(n.name),
            state: NodeState(n.node_state),
            partitions: comma_list(n.partitions),
            cpus: n.cpus,
            alloc_cpus: slurm_sys::compat::node_alloc_cpus(n),
            real_memory_mb: n.real_memory,
            alloc_memory_mb: slurm_sys::compat::node_alloc_memory(n),
            free_memory_mb: opt_u64(n.free_mem),
            gpus: gres.as_deref().map(gpu_count).unwrap_or(0),
            gres,
            gres_used: opt_string(n.gres_used),
            active_features: if active.is_empty() {
                features.clone()
            } else {
                active
            },
            features,
            reason: opt_string(n.reason),
            boot_time: opt_time(n.boot_time),
            last_busy: opt_time(n.last_busy),
            owner: opt_u32(n.owner),
            weight: n.weight,
        }
    }
}

fn convert_partition(p: &slurm_sys::partition_info_t) -> Result<Partition> {
    // SAFETY: fields are NULL or valid C strings inside the live message.
    let nodes = unsafe { opt_string(p.nodes) };
    let node_names = match &nodes {
        Some(expr) => crate::ffi::hostlist_expand(expr)?,
        None => Vec::new(),
    };
    let up = u32::from(p.state_up) & slurm_sys::PARTITION_UP == slurm_sys::PARTITION_UP;
    Ok(Partition {
        // SAFETY: as above.
        name: unsafe { string(p.name) },
        nodes,
        node_names,
        priority_tier: p.priority_tier,
        priority_job_factor: p.priority_job_factor,
        preempt_mode: p.preempt_mode,
        grace_time_s: p.grace_time,
        max_time: TimeLimit::from_raw(p.max_time),
        default_time: TimeLimit::from_raw(p.default_time),
        total_cpus: p.total_cpus,
        total_nodes: p.total_nodes,
        up,
        // A uint16_t and a plain 0x0001 in 22.05, a uint32_t and SLURM_BIT(0) (u64 here)
        // from 24.05: widen both.
        is_default: u64::from(p.flags) & slurm_sys::PART_FLAG_DEFAULT as u64 != 0,
    })
}

/// uid -> name lookups done once per snapshot, not once per job.
#[derive(Default)]
struct NameCache(std::collections::HashMap<u32, Option<String>>);

impl NameCache {
    fn get(&mut self, uid: u32) -> Option<String> {
        self.0.entry(uid).or_insert_with(|| user_name(uid)).clone()
    }
}

/// `--mem-per-cpu` from `pn_min_memory`: the MEM_PER_CPU bit (the top one) set, and not
/// one of Slurm's "unset" markers (NO_VAL64, INFINITE64 have the top bit set too).
fn mem_per_cpu(raw: u64) -> Option<u64> {
    const PER_CPU: u64 = 1 << 63;
    let unset = [0, u64::from(slurm_sys::NO_VAL), u64::MAX, u64::MAX - 1];
    if raw & PER_CPU == 0 || unset.contains(&raw) {
        return None;
    }
    Some(raw & !PER_CPU).filter(|&m| m != 0)
}

fn convert_job(j: &slurm_sys::slurm_job_info_t, names: &mut NameCache) -> Job {
    let array = j.array_job_id != 0 && j.array_task_id != slurm_sys::NO_VAL;
    let het = j.het_job_id != 0;
    // SAFETY: fields are NULL or valid C strings inside the live message.
    unsafe {
        Job {
            job_id: j.job_id,
            array_job_id: (j.array_job_id != 0).then_some(j.array_job_id),
            array_task_id: if array {
                opt_u32(j.array_task_id)
            } else {
                None
            },
            array_task_str: opt_string(j.array_task_str),
            het_job_id: het.then_some(j.het_job_id),
            het_job_offset: if het { opt_u32(j.het_job_offset) } else { None },
            name: string(j.name),
            user_id: j.user_id,
            user_name: opt_string(j.user_name).or_else(|| names.get(j.user_id)),
            group_id: j.group_id,
            account: opt_string(j.account),
            qos: opt_string(j.qos),
            state: JobState(j.job_state),
            reason: (u32::from(j.state_reason) != slurm_sys::WAIT_NO_REASON)
                .then(|| reason_name(u32::from(j.state_reason))),
            reason_detail: opt_string(j.state_desc),
            partition: opt_string(j.partition),
            nodes: opt_string(j.nodes),
            sched_nodes: opt_string(j.sched_nodes),
            req_nodes: opt_string(j.req_nodes),
            exc_nodes: opt_string(j.exc_nodes),
            batch_host: opt_string(j.batch_host),
            num_nodes: j.num_nodes,
            num_cpus: j.num_cpus,
            comment: opt_string(j.comment),
            admin_comment: opt_string(j.admin_comment),
            submit_time: opt_time(j.submit_time),
            start_time: opt_time(j.start_time),
            end_time: opt_time(j.end_time),
            time_limit: TimeLimit::from_raw(j.time_limit),
            priority: j.priority,
            requeue: opt_u16(j.requeue).unwrap_or(0) != 0,
            restart_count: j.restart_cnt,
            preempt_time: opt_time(j.preempt_time),
            // Packed by slurmctld from the job's details->begin_time.
            eligible_time: opt_time(j.eligible_time),
            work_dir: opt_string(j.work_dir),
            std_out: opt_string(j.std_out),
            constraint: opt_string(j.features).filter(|f| !f.is_empty()),
            // The per-CPU flag is the top bit (MEM_PER_CPU in slurm.h).
            mem_per_node_mb: (j.pn_min_memory != 0
                && j.pn_min_memory & (1u64 << 63) == 0
                && j.pn_min_memory != u64::from(slurm_sys::NO_VAL))
            .then_some(j.pn_min_memory),
            mem_per_cpu_mb: mem_per_cpu(j.pn_min_memory),
            tres_per_node: opt_string(j.tres_per_node).filter(|t| !t.is_empty()),
            tres_per_task: opt_string(j.tres_per_task).filter(|t| !t.is_empty()),
            cpus_per_task: opt_u16(j.cpus_per_task).filter(|&c| c > 0),
            ntasks_per_node: opt_u16(j.ntasks_per_node).filter(|&c| c > 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_per_cpu_is_read_apart_from_unset_markers() {
        assert_eq!(mem_per_cpu((1 << 63) | 2048), Some(2048));
        assert_eq!(mem_per_cpu(2048), None, "per node");
        assert_eq!(mem_per_cpu(u64::MAX - 1), None, "NO_VAL64");
        assert_eq!(mem_per_cpu(u64::MAX), None, "INFINITE64");
        assert_eq!(mem_per_cpu(1 << 63), None);
        assert_eq!(mem_per_cpu(0), None);
    }

    #[test]
    fn gpus_by_type_and_a_jobs_gpus_per_node() {
        let node = "gpu:a100:2(S:0,1),gpu:v100:1,nic:8";
        assert_eq!(gpus_of_type(node, Some("a100")), 2);
        assert_eq!(gpus_of_type(node, Some("v100")), 1);
        assert_eq!(gpus_of_type(node, Some("h100")), 0);
        assert_eq!(gpus_of_type(node, None), 3);
        assert_eq!(gpus_per_node("gres:gpu:2"), Some((None, 2)));
        // What we ask reads back as asked, on every release.
        assert_eq!(
            gpus_per_node(&gpu_tres_request(Some("a100"), 1)),
            Some((Some("a100".into()), 1))
        );
        assert_eq!(gpus_per_node(&gpu_tres_request(None, 1)), Some((None, 1)));
        assert_eq!(
            gpus_per_node("gres/gpu:a100:4"),
            Some((Some("a100".into()), 4))
        );
        assert_eq!(gpus_per_node("gres/nic:1,gres/gpu:1"), Some((None, 1)));
        assert_eq!(gpus_per_node("gpu"), Some((None, 1)));
        assert_eq!(
            gpus_per_node("gres:gpu:tesla"),
            Some((Some("tesla".into()), 1))
        );
        assert_eq!(gpus_per_node("gres/nic:1"), None);
        assert_eq!(gpus_per_node(""), None);
    }

    #[test]
    fn gpu_counts_from_gres_strings() {
        assert_eq!(gpu_count("gpu:4"), 4);
        assert_eq!(gpu_count("gpu:a100:4(S:0-1)"), 4);
        assert_eq!(gpu_count("gpu:a100:2(S:0,1),gpu:v100:1,nic:8"), 3);
        assert_eq!(gpu_count("gpu"), 1);
        assert_eq!(gpu_count("gpu:tesla"), 1);
        assert_eq!(gpu_count("nic:2"), 0);
        assert_eq!(gpu_count(""), 0);
        assert_eq!(gpu_count("(null)"), 0);
    }

    #[test]
    fn partitions_are_assigned_by_name_in_partition_order() {
        let n: slurm_sys::node_info_t = Default::default();
        let mut nodes: Vec<Node> = ["a", "b", "c"]
            .iter()
            .map(|name| Node {
                name: name.to_string(),
                partitions: vec!["stale".into()],
                ..convert_node(&n)
            })
            .collect();
        let p = |name: &str, members: &[&str]| Partition {
            name: name.into(),
            nodes: None,
            node_names: members.iter().map(|m| m.to_string()).collect(),
            priority_tier: 1,
            priority_job_factor: 1,
            preempt_mode: 0,
            grace_time_s: 0,
            max_time: None,
            default_time: None,
            total_cpus: 0,
            total_nodes: members.len() as u32,
            up: true,
            is_default: false,
        };
        // "z" is in no node table (a stale partition list): ignored.
        let parts = [p("batch", &["a", "b", "c"]), p("gpu", &["c", "z", "a"])];
        assign_partitions(&mut nodes, &parts);
        let got: Vec<Vec<String>> = nodes.iter().map(|n| n.partitions.clone()).collect();
        assert_eq!(
            got,
            vec![
                vec!["batch".to_string(), "gpu".into()],
                vec!["batch".into()],
                vec!["batch".into(), "gpu".into()],
            ]
        );
        // Again on the assigned table: unchanged. A name the table lists twice gets its
        // partitions on its last entry; a partition listing a node twice, twice.
        assign_partitions(&mut nodes, &parts);
        let again: Vec<Vec<String>> = nodes.iter().map(|n| n.partitions.clone()).collect();
        assert_eq!(again, got);
        nodes[1].name = "a".into();
        assign_partitions(&mut nodes, &[p("batch", &["a", "c", "a"])]);
        let got: Vec<Vec<String>> = nodes.iter().map(|n| n.partitions.clone()).collect();
        assert_eq!(
            got,
            vec![
                vec![],
                vec!["batch".to_string(), "batch".into()],
                vec!["batch".into()]
            ]
        );
    }

    #[test]
    fn partition_assignment_matches_a_scan_per_partition_node() {
        // Tables in order, shuffled, with names missing from the node table, names
        // listed twice by a partition, and names the node table lists twice: the same
        // lists as the plain definition (for each partition in order, for each of its
        // node names, the last node of that name gets the partition).
        let n: slurm_sys::node_info_t = Default::default();
        let mut seed = 7u64;
        let mut rnd = |m: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as usize) % m
        };
        for round in 0..300 {
            let size = 1 + rnd(40);
            let mut names: Vec<String> = (0..size).map(|i| format!("n{i:03}")).collect();
            match round % 3 {
                0 => {}
                1 => {
                    for i in (1..names.len()).rev() {
                        names.swap(i, rnd(i + 1));
                    }
                }
                _ => {
                    let dup = names[rnd(size)].clone();
                    let at = rnd(size + 1);
                    names.insert(at, dup);
                }
            }
            let mut nodes: Vec<Node> = names
                .iter()
                .map(|name| Node {
                    name: name.clone(),
                    partitions: if rnd(2) == 0 {
                        vec!["p0".into()]
                    } else {
                        Vec::new()
                    },
                    ..convert_node(&n)
                })
                .collect();
            let parts: Vec<Partition> = (0..1 + rnd(4))
                .map(|k| {
                    let mut members: Vec<String> =
                        names.iter().filter(|_| rnd(3) != 0).cloned().collect();
                    if rnd(2) == 0 {
                        members.push(format!("z{}", rnd(5)));
                    }
                    if rnd(4) == 0 && !members.is_empty() {
                        let m = members[rnd(members.len())].clone();
                        members.push(m);
                    }
                    if rnd(3) == 0 {
                        for i in (1..members.len()).rev() {
                            members.swap(i, rnd(i + 1));
                        }
                    }
                    Partition {
                        name: format!("p{k}"),
                        nodes: None,
                        total_nodes: members.len() as u32,
                        node_names: members,
                        priority_tier: 1,
                        priority_job_factor: 1,
                        preempt_mode: 0,
                        grace_time_s: 0,
                        max_time: None,
                        default_time: None,
                        total_cpus: 0,
                        up: true,
                        is_default: false,
                    }
                })
                .collect();
            let mut want: Vec<Vec<String>> = vec![Vec::new(); nodes.len()];
            for p in &parts {
                for name in &p.node_names {
                    if let Some(i) = nodes.iter().rposition(|n| &n.name == name) {
                        want[i].push(p.name.clone());
                    }
                }
            }
            assign_partitions(&mut nodes, &parts);
            let got: Vec<Vec<String>> = nodes.iter().map(|n| n.partitions.clone()).collect();
            assert_eq!(got, want, "round {round}: nodes {names:?}");
        }
    }

    #[test]
    fn counts_accept_suffixes() {
        assert_eq!(parse_count("2K"), Some(2048));
        assert_eq!(parse_count("a100"), None);
    }

    #[test]
    fn zeroed_records_do_not_panic() {
        // Every pointer NULL, every number 0: what a half-filled record looks like.
        let n: slurm_sys::node_info_t = Default::default();
        let node = convert_node(&n);
        assert_eq!(node.name, "");
        assert!(node.gres.is_none() && node.features.is_empty());
        let j = slurm_sys::slurm_job_info_t {
            time_limit: slurm_sys::NO_VAL,
            array_task_id: slurm_sys::NO_VAL,
            het_job_offset: slurm_sys::NO_VAL,
            ..Default::default()
        };
        let job = convert_job(&j, &mut NameCache::default());
        assert_eq!(job.time_limit, None);
        assert_eq!(job.array_task_id, None);
        assert!(job.nodes.is_none() && job.comment.is_none());
        assert_eq!(job.user_name.as_deref(), Some("root"));
        let p: slurm_sys::partition_info_t = Default::default();
        let part = convert_partition(&p).unwrap();
        assert!(part.node_names.is_empty());
    }
}
