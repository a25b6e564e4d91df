//! What Slurm's multifactor priority is made of, for jobs that have no priority of
//! their own: a held job's priority is 0 and slurmctld neither computes nor shows one
//! for it (priority/multifactor skips held jobs). bftrainerd holds elastic jobs until
//! it admits them, so it orders them itself by the same factors and the site's
//! weights: the fairshare factor of the job's association (`sshare`'s FairShare),
//! its QOS's priority and its age.
//!
//! The inputs come from two RPCs any Slurm release answers: `slurm_load_ctl_conf`
//! (PriorityType, PriorityWeight*, PriorityMaxAge, PriorityCalcPeriod) and
//! `slurm_load_assoc_mgr_info` (slurmctld's association manager, as
//! `scontrol show assoc_mgr` shows it: each association's usage with its fairshare
//! factor, and the QOS table).

use crate::error::{clear_errno, last_error};
use crate::ffi::{for_each_borrowed, opt_string};
use crate::{Result, Slurm};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The site's priority weights (slurm.conf), as slurmctld reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorityWeights {
    /// PriorityType is priority/multifactor: the other fields mean something. Under
    /// priority/basic Slurm orders by submission, and so does bftrainerd.
    pub multifactor: bool,
    pub age: u32,
    pub fairshare: u32,
    pub qos: u32,
    /// PriorityMaxAge in seconds: the age at which the age factor reaches 1.
    pub max_age_s: u32,
    /// PriorityCalcPeriod in seconds: how often slurmctld recomputes fairshare.
    pub calc_period_s: u32,
}

/// The fairshare factors and QOS priorities slurmctld holds now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FairshareTable {
    /// The fairshare factor (0..1) of each user association, by (account, user);
    /// with per-partition associations, the highest of that pair.
    pub users: HashMap<(String, String), f64>,
    /// Each QOS's priority, by name.
    pub qos: HashMap<String, u32>,
}

impl FairshareTable {
    /// The fairshare factor of `user` charging `account` (0 when unknown).
    pub fn fairshare(&self, account: Option<&str>, user: Option<&str>) -> f64 {
        match (account, user) {
            (Some(a), Some(u)) => self
                .users
                .get(&(a.to_string(), u.to_string()))
                .copied()
                .unwrap_or(0.0),
            _ => 0.0,
        }
    }

    /// A QOS's priority normalised by the highest QOS priority (0..1), as Slurm does.
    pub fn qos_norm(&self, qos: Option<&str>) -> f64 {
        let max = self.qos.values().copied().max().unwrap_or(0);
        match qos.and_then(|q| self.qos.get(q)) {
            Some(&p) if max > 0 => f64::from(p) / f64::from(max),
            _ => 0.0,
        }
    }
}

/// Owns an assoc_mgr_info_msg_t.
struct AssocMgrMsg(*mut slurm_sys::assoc_mgr_info_msg_t);

impl Drop for AssocMgrMsg {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: allocated by slurm_load_assoc_mgr_info for this guard, freed once.
            unsafe { slurm_sys::slurm_free_assoc_mgr_info_msg(self.0) };
        }
    }
}

impl Slurm {
    /// PriorityType and the priority weights slurmctld runs with.
    pub fn priority_weights(&self) -> Result<PriorityWeights> {
        self.ctl_conf(|c| {
            // SAFETY: the field is NULL or a C string owned by the message.
            let kind = unsafe { opt_string(c.priority_type) }.unwrap_or_default();
            PriorityWeights {
                multifactor: kind.ends_with("multifactor"),
                age: c.priority_weight_age,
                fairshare: c.priority_weight_fs,
                qos: c.priority_weight_qos,
                max_age_s: c.priority_max_age,
                calc_period_s: c.priority_calc_period,
            }
        })
    }

    /// Every user association's fairshare factor and every QOS's priority, from
    /// slurmctld's association manager (`scontrol show assoc_mgr flags=assoc,qos`).
    pub fn fairshare_table(&self) -> Result<FairshareTable> {
        let mut req = slurm_sys::assoc_mgr_info_request_msg_t {
            flags: (slurm_sys::ASSOC_MGR_INFO_FLAG_ASSOC | slurm_sys::ASSOC_MGR_INFO_FLAG_QOS) as _,
            ..Default::default()
        };
        let mut msg = AssocMgrMsg(std::ptr::null_mut());
        clear_errno();
        // SAFETY: `req` is a valid request with no lists (all associations and QOS);
        // msg.0 receives a message owned by the guard.
        let rc = unsafe { slurm_sys::slurm_load_assoc_mgr_info(&mut req, &mut msg.0) };
        if rc != slurm_sys::SLURM_SUCCESS as i32 {
            return Err(last_error("slurm_load_assoc_mgr_info", rc));
        }
        let mut table = FairshareTable::default();
        // SAFETY: valid until the guard drops.
        let Some(m) = (unsafe { msg.0.as_ref() }) else {
            return Ok(table);
        };
        // SAFETY: the lists are NULL or live lists of the message's records, each item
        // a slurmdb_assoc_rec_t / slurmdb_qos_rec_t; their strings are NULL or C
        // strings and `usage` is NULL or the record's usage, all owned by the message.
        unsafe {
            for_each_borrowed(m.assoc_list, |p| {
                let a = &*(p as *const slurm_sys::slurmdb_assoc_rec_t);
                let (Some(acct), Some(user)) = (opt_string(a.acct), opt_string(a.user)) else {
                    return; // an account's association, not a user's
                };
                let Some(usage) = a.usage.as_ref() else {
                    return;
                };
                let fs = usage.fs_factor;
                if !fs.is_finite() {
                    return;
                }
                let fs = fs.clamp(0.0, 1.0);
                let e = table.users.entry((acct, user)).or_insert(fs);
                *e = e.max(fs);
            });
            for_each_borrowed(m.qos_list, |p| {
                let q = &*(p as *const slurm_sys::slurmdb_qos_rec_t);
                if let Some(name) = opt_string(q.name) {
                    let prio = if q.priority == slurm_sys::NO_VAL {
                        0
                    } else {
                        q.priority
                    };
                    table.qos.insert(name, prio);
                }
            });
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_and_normalisation() {
        let mut t = FairshareTable::default();
        t.users.insert(("acct".into(), "ann".into()), 0.8);
        t.qos.insert("normal".into(), 10);
        t.qos.insert("high".into(), 40);
        assert_eq!(t.fairshare(Some("acct"), Some("ann")), 0.8);
        assert_eq!(t.fairshare(Some("other"), Some("ann")), 0.0);
        assert_eq!(t.fairshare(None, Some("ann")), 0.0);
        assert_eq!(t.qos_norm(Some("high")), 1.0);
        assert_eq!(t.qos_norm(Some("normal")), 0.25);
        assert_eq!(t.qos_norm(Some("nope")), 0.0);
        assert_eq!(t.qos_norm(None), 0.0);
        assert_eq!(FairshareTable::default().qos_norm(Some("normal")), 0.0);
    }
}
