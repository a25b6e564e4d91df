//! Node and job states as Slurm encodes them: a base state in the low bits and
//! SLURM_BIT flags above it, kept raw so nothing Slurm sends is lost.

use serde::{Deserialize, Serialize};
use std::ffi::CStr;

use crate::ffi::XString;

/// Base state of a node (`NODE_STATE_BASE` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeBase {
    Unknown,
    Down,
    Idle,
    Allocated,
    Error,
    Mixed,
    Future,
    /// A base value this crate does not know (newer Slurm).
    Other(u32),
}

/// A node's state word: base + flags (DRAIN, PLANNED, COMPLETING, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeState(pub u32);

impl NodeState {
    /// The state word of a plain base state (no flags).
    pub fn from_base(base: NodeBase) -> NodeState {
        NodeState(match base {
            NodeBase::Unknown => slurm_sys::NODE_STATE_UNKNOWN,
            NodeBase::Down => slurm_sys::NODE_STATE_DOWN,
            NodeBase::Idle => slurm_sys::NODE_STATE_IDLE,
            NodeBase::Allocated => slurm_sys::NODE_STATE_ALLOCATED,
            NodeBase::Error => slurm_sys::NODE_STATE_ERROR,
            NodeBase::Mixed => slurm_sys::NODE_STATE_MIXED,
            NodeBase::Future => slurm_sys::NODE_STATE_FUTURE,
            NodeBase::Other(x) => x,
        })
    }

    /// The base state.
    #[inline]
    pub fn base(self) -> NodeBase {
        match self.0 & slurm_sys::NODE_STATE_BASE {
            x if x == slurm_sys::NODE_STATE_UNKNOWN => NodeBase::Unknown,
            x if x == slurm_sys::NODE_STATE_DOWN => NodeBase::Down,
            x if x == slurm_sys::NODE_STATE_IDLE => NodeBase::Idle,
            x if x == slurm_sys::NODE_STATE_ALLOCATED => NodeBase::Allocated,
            x if x == slurm_sys::NODE_STATE_ERROR => NodeBase::Error,
            x if x == slurm_sys::NODE_STATE_MIXED => NodeBase::Mixed,
            x if x == slurm_sys::NODE_STATE_FUTURE => NodeBase::Future,
            x => NodeBase::Other(x),
        }
    }

    /// The flag bits only.
    pub fn flags(self) -> u32 {
        self.0 & slurm_sys::NODE_STATE_FLAGS
    }

    /// True if `flag` (one of `slurm_sys::NODE_STATE_*` flags) is set.
    #[inline]
    pub fn has(self, flag: u64) -> bool {
        u64::from(self.0) & flag != 0
    }

    #[inline]
    pub fn is_drain(self) -> bool {
        self.has(slurm_sys::NODE_STATE_DRAIN)
    }

    /// Backfill has planned a pending job on this node (it will be reclaimed).
    #[inline]
    pub fn is_planned(self) -> bool {
        self.has(slurm_sys::NODE_STATE_PLANNED)
    }

    #[inline]
    pub fn is_completing(self) -> bool {
        self.has(slurm_sys::NODE_STATE_COMPLETING)
    }

    #[inline]
    pub fn is_not_responding(self) -> bool {
        self.has(slurm_sys::NODE_STATE_NO_RESPOND)
    }

    #[inline]
    pub fn is_reserved(self) -> bool {
        self.has(slurm_sys::NODE_STATE_RES)
    }

    /// Powered down, powering up/down, or in maintenance: not usable now.
    #[inline]
    pub fn is_unavailable(self) -> bool {
        matches!(
            self.base(),
            NodeBase::Down | NodeBase::Future | NodeBase::Unknown
        ) || self.has(slurm_sys::NODE_STATE_POWERED_DOWN)
            || self.has(slurm_sys::NODE_STATE_POWERING_DOWN)
            || self.has(slurm_sys::NODE_STATE_POWERING_UP)
            || self.has(slurm_sys::NODE_STATE_MAINT)
            || self.has(slurm_sys::NODE_STATE_FAIL)
            || self.is_not_responding()
    }

    /// Whether Slurm lets the jobs running on a node in this state run on. DOWN (set
    /// by slurmctld once a node has missed pings for SlurmdTimeout, or by an
    /// administrator) kills or requeues them, and a powered-down or future node holds
    /// none. DRAIN, FAIL, MAINT, a reservation (`ignore_jobs` or not) and
    /// NOT_RESPONDING alone leave them running (slurmctld's node_mgr.c and ping_nodes.c).
    #[inline]
    pub fn keeps_jobs(self) -> bool {
        !matches!(self.base(), NodeBase::Down | NodeBase::Future)
            && !self.has(slurm_sys::NODE_STATE_POWERED_DOWN)
    }

    /// Slurm's own rendering, e.g. "IDLE+DRAIN+PLANNED" (as `scontrol show node`).
    pub fn name(self) -> String {
        // SAFETY: returns an xmalloc'd string (or NULL) owned by the guard.
        unsafe {
            let s = XString(slurm_sys::slurm_node_state_string_complete(self.0));
            if s.0.is_null() {
                format!("{:#x}", self.0)
            } else {
                CStr::from_ptr(s.0).to_string_lossy().into_owned()
            }
        }
    }
}

/// Base state of a job (`JOB_STATE_BASE` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobBase {
    Pending,
    Running,
    Suspended,
    Complete,
    Cancelled,
    Failed,
    Timeout,
    NodeFail,
    Preempted,
    BootFail,
    Deadline,
    OutOfMemory,
    /// A base value this crate does not know (newer Slurm).
    Other(u32),
}

/// A job's state word: base + flags (REQUEUE, COMPLETING, CONFIGURING, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobState(pub u32);

impl JobState {
    /// The state accounting records for a requeued run (the JOB_REQUEUE flag alone,
    /// sacct's REQUEUED).
    pub const REQUEUED: JobState = JobState(slurm_sys::JOB_REQUEUE as u32);

    /// The state word of a plain base state.
    pub fn from_base(base: JobBase) -> JobState {
        JobState(match base {
            JobBase::Pending => slurm_sys::JOB_PENDING,
            JobBase::Running => slurm_sys::JOB_RUNNING,
            JobBase::Suspended => slurm_sys::JOB_SUSPENDED,
            JobBase::Complete => slurm_sys::JOB_COMPLETE,
            JobBase::Cancelled => slurm_sys::JOB_CANCELLED,
            JobBase::Failed => slurm_sys::JOB_FAILED,
            JobBase::Timeout => slurm_sys::JOB_TIMEOUT,
            JobBase::NodeFail => slurm_sys::JOB_NODE_FAIL,
            JobBase::Preempted => slurm_sys::JOB_PREEMPTED,
            JobBase::BootFail => slurm_sys::JOB_BOOT_FAIL,
            JobBase::Deadline => slurm_sys::JOB_DEADLINE,
            JobBase::OutOfMemory => slurm_sys::JOB_OOM,
            JobBase::Other(x) => x,
        })
    }

    #[inline]
    pub fn base(self) -> JobBase {
        match self.0 & slurm_sys::JOB_STATE_BASE {
            x if x == slurm_sys::JOB_PENDING => JobBase::Pending,
            x if x == slurm_sys::JOB_RUNNING => JobBase::Running,
            x if x == slurm_sys::JOB_SUSPENDED => JobBase::Suspended,
            x if x == slurm_sys::JOB_COMPLETE => JobBase::Complete,
            x if x == slurm_sys::JOB_CANCELLED => JobBase::Cancelled,
            x if x == slurm_sys::JOB_FAILED => JobBase::Failed,
            x if x == slurm_sys::JOB_TIMEOUT => JobBase::Timeout,
            x if x == slurm_sys::JOB_NODE_FAIL => JobBase::NodeFail,
            x if x == slurm_sys::JOB_PREEMPTED => JobBase::Preempted,
            x if x == slurm_sys::JOB_BOOT_FAIL => JobBase::BootFail,
            x if x == slurm_sys::JOB_DEADLINE => JobBase::Deadline,
            x if x == slurm_sys::JOB_OOM => JobBase::OutOfMemory,
            x => JobBase::Other(x),
        }
    }

    pub fn flags(self) -> u32 {
        self.0 & slurm_sys::JOB_STATE_FLAGS
    }

    /// True if `flag` (one of `slurm_sys::JOB_*` state flags) is set.
    #[inline]
    pub fn has(self, flag: u64) -> bool {
        u64::from(self.0) & flag != 0
    }

    /// Requeued and not yet started again (sacct's REQUEUED).
    pub fn is_requeued(self) -> bool {
        self.has(slurm_sys::JOB_REQUEUE)
    }

    #[inline]
    pub fn is_completing(self) -> bool {
        self.has(slurm_sys::JOB_COMPLETING)
    }

    pub fn is_configuring(self) -> bool {
        self.has(slurm_sys::JOB_CONFIGURING)
    }

    /// Pending or running (including suspended); i.e. not finished.
    #[inline]
    pub fn is_active(self) -> bool {
        matches!(
            self.base(),
            JobBase::Pending | JobBase::Running | JobBase::Suspended
        )
    }

    /// Slurm's name, flags taking precedence as in squeue/sacct ("REQUEUED",
    /// "COMPLETING", "PENDING", ...).
    pub fn name(self) -> String {
        // SAFETY: returns a pointer to a static string (or NULL).
        unsafe {
            let p = slurm_sys::slurm_job_state_string(self.0);
            if p.is_null() {
                format!("{:#x}", self.0)
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

/// Slurm's text for a job's state reason ("Priority", "Resources", "JobHeldAdmin"...).
pub(crate) fn reason_name(reason: u32) -> String {
    // SAFETY: returns a pointer to a static string (or NULL); unknown values are
    // mapped by Slurm to "?".
    unsafe {
        let p = slurm_sys::compat::job_reason_string(reason as slurm_sys::job_state_reason);
        if p.is_null() {
            format!("reason {reason}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A time limit in minutes, or unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeLimit {
    Minutes(u32),
    Unlimited,
}

impl TimeLimit {
    /// From Slurm's encoding: INFINITE is unlimited, NO_VAL is "not set".
    pub(crate) fn from_raw(v: u32) -> Option<TimeLimit> {
        if v == slurm_sys::INFINITE {
            Some(TimeLimit::Unlimited)
        } else if v == slurm_sys::NO_VAL {
            None
        } else {
            Some(TimeLimit::Minutes(v))
        }
    }

    pub(crate) fn to_raw(self) -> u32 {
        match self {
            TimeLimit::Minutes(m) => m,
            TimeLimit::Unlimited => slurm_sys::INFINITE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_state_base_and_flags() {
        let s = NodeState(
            slurm_sys::NODE_STATE_IDLE
                | slurm_sys::NODE_STATE_DRAIN as u32
                | slurm_sys::NODE_STATE_PLANNED as u32,
        );
        assert_eq!(s.base(), NodeBase::Idle);
        assert!(s.is_drain() && s.is_planned() && !s.is_completing());
        assert_eq!(s.name(), "IDLE+DRAIN+PLANNED");
        assert_eq!(NodeState(0xe).base(), NodeBase::Other(0xe));
        for b in [
            NodeBase::Idle,
            NodeBase::Allocated,
            NodeBase::Down,
            NodeBase::Mixed,
        ] {
            assert_eq!(NodeState::from_base(b).base(), b);
        }
    }

    #[test]
    fn job_state_names_follow_slurm() {
        let s = JobState(slurm_sys::JOB_PENDING | slurm_sys::JOB_REQUEUE as u32);
        assert_eq!(s.base(), JobBase::Pending);
        assert!(s.is_requeued() && s.is_active());
        assert_eq!(s.name(), "REQUEUED");
        assert_eq!(JobState(slurm_sys::JOB_PREEMPTED).name(), "PREEMPTED");
        assert!(!JobState(slurm_sys::JOB_PREEMPTED).is_active());
    }

    #[test]
    fn base_round_trips() {
        for b in [
            JobBase::Pending,
            JobBase::Preempted,
            JobBase::OutOfMemory,
            JobBase::Other(77),
        ] {
            assert_eq!(JobState::from_base(b).base(), b);
        }
        assert_eq!(JobState::REQUEUED.name(), "REQUEUED");
        assert_eq!(JobState::REQUEUED.base(), JobBase::Pending);
    }

    #[test]
    fn reasons_and_limits() {
        assert_eq!(reason_name(slurm_sys::WAIT_PRIORITY), "Priority");
        assert_eq!(reason_name(slurm_sys::WAIT_HELD), "JobHeldAdmin");
        assert_eq!(
            TimeLimit::from_raw(slurm_sys::INFINITE),
            Some(TimeLimit::Unlimited)
        );
        assert_eq!(TimeLimit::from_raw(slurm_sys::NO_VAL), None);
        assert_eq!(TimeLimit::from_raw(30), Some(TimeLimit::Minutes(30)));
        assert_eq!(TimeLimit::Unlimited.to_raw(), slurm_sys::INFINITE);
    }
}
