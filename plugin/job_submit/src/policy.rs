//! What job_submit and job_modify decide, as pure functions over plain data: the FFI
//! layer copies the few fields it needs out of Slurm's structs and applies the verdict.
//!
//! Kept free of pointers so every rule is unit-tested without slurmctld.

use bftrainer_core::spankopt;
use bftrainer_core::spec::{self, ElasticSpec, Role, JOB_ENV_COPY, OPTION_ENV_PREFIX};

use crate::config::{partition_list, PlainJobs, Policy};

/// Slurm's "not set" for 32-bit fields of job_desc_msg_t.
pub const NO_VAL: u32 = 0xffff_fffe;
/// Slurm's "not set" for 16-bit fields.
pub const NO_VAL16: u16 = 0xfffe;
/// `priority` value that `scontrol release` sends.
pub const INFINITE: u32 = 0xffff_ffff;

/// The fields of a submission the policy looks at.
#[derive(Debug, Clone, Default)]
pub struct Submission<'a> {
    pub uid: u32,
    pub account: Option<&'a [u8]>,
    pub partition: Option<&'a [u8]>,
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub admin_comment: Option<&'a [u8]>,
    pub comment: Option<&'a [u8]>,
    /// `--array` index expression, if any.
    pub array: Option<&'a [u8]>,
    /// Component index of a heterogeneous job; NO_VAL for ordinary jobs.
    pub het_offset: u32,
    /// `NAME=value` entries of `spank_job_env`.
    pub spank_env: Vec<&'a [u8]>,
    /// `NAME=value` entries of the job's environment (batch jobs only).
    pub environment: Vec<&'a [u8]>,
}

/// The changes an accepted elastic job gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub spec: ElasticSpec,
    pub partition: String,
    /// Core allocation: min_nodes = max_nodes = MIN.
    pub nodes: u32,
    /// `Some(0)`: hold (priority 0) until bftrainerd releases the job.
    pub priority: Option<u32>,
    /// `Some(0)`: whole nodes (`shared = 0`, i.e. `--exclusive`).
    pub shared: Option<u16>,
    /// Requeue on preemption or node failure: core jobs yes; satellites no (one pinned
    /// to a failed node is useless; bftrainerd grows the job again elsewhere).
    pub requeue: bool,
    pub admin_comment: String,
    /// Plain-words note shown by `squeue -O comment`; only set when the user gave none.
    pub comment: Option<String>,
    /// The QOS a core job is put in (`[policy] core_qos`); None: its own.
    pub qos: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not an elastic job: leave every field as it is.
    Untouched,
    Elastic(Box<Rewrite>),
    /// Refuse the job; the text goes to the user as err_msg.
    Reject(String, Code),
}

/// The Slurm error code a rejection returns (sbatch prints its text after err_msg).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Malformed request: SLURM_ERROR ("Unspecified error"), err_msg says the rest.
    Invalid,
    /// Not allowed for this user: ESLURM_ACCESS_DENIED.
    Denied,
    /// Partition closed to elastic jobs: ESLURM_INVALID_PARTITION_NAME.
    Partition,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn split_env(entry: &[u8]) -> (&[u8], &[u8]) {
    match entry.iter().position(|&b| b == b'=') {
        Some(i) => (&entry[..i], &entry[i + 1..]),
        None => (entry, &[]),
    }
}

/// Decides what happens to a submitted job.
pub fn submit(pol: &Policy, s: &Submission<'_>) -> Verdict {
    let privileged = pol.privileged(s.uid);
    let requests: Vec<&[u8]> = s
        .spank_env
        .iter()
        .map(|e| split_env(e))
        .filter(|(k, _)| *k == spec::JOB_ENV_NAME.as_bytes())
        .map(|(_, v)| v)
        .collect();
    if requests.len() > 1 {
        return Verdict::Reject(format!(
            "the elastic request ({}) appears {} times in the job's SPANK environment; give --elastic once",
            spec::JOB_ENV_NAME,
            requests.len()
        ), Code::Invalid);
    }
    let request = match requests.first().map(|v| spec::parse_bytes(v)) {
        None => None,
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => return Verdict::Reject(e.to_string(), Code::Invalid),
    };

    // The job's environment must not claim an elastic request that slurmctld has not
    // been given (--export=...,SLURM_SPANK_BFTRAINER_ELASTIC=...): bft-run and the SPANK
    // plugin's remote side read it from there.
    for entry in &s.environment {
        let (name, value) = split_env(entry);
        // The option travels as _SLURM_SPANK_OPTION_bftrainer_elastic, and sbatch re-exports
        // it as SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic: match any carrier.
        let option = OPTION_ENV_PREFIX.as_bytes();
        // Cheap pre-filter first: every carrier name holds "SPANK", most variables do not.
        let reserved = name.windows(5).any(|w| w == b"SPANK")
            && (name == JOB_ENV_COPY.as_bytes() || name.windows(option.len()).any(|w| w == option));
        if !reserved {
            continue;
        }
        let agrees = matches!((&request, spec::parse_bytes(value)), (Some(r), Ok(v)) if *r == v);
        if !agrees {
            return Verdict::Reject(
                format!(
                "environment variable {} is reserved for bftrainer and does not match the job's \
                 elastic request; request an elastic job with --elastic=MIN[:MAX], not through \
                 --export or the environment (unset {} before calling sbatch)",
                text(name),
                text(name)
            ),
                Code::Denied,
            );
        }
    }

    let Some(spec) = request else {
        if let Some(c) = s.admin_comment {
            if !privileged && spec::looks_like_tag(&text(c)) {
                return Verdict::Reject(format!(
                    "an admin comment starting with '{}' is bftrainer's tag; only bftrainerd sets it",
                    spec::TAG_PREFIX.trim_end()
                ), Code::Denied);
            }
        }
        // A broken config names no elastic partition to keep plain jobs out of.
        if !privileged && pol.broken.is_none() && pol.plain_jobs == PlainJobs::Refuse {
            if let Some(list) = s.partition.map(text) {
                if let Some(p) = partition_list(&list).find(|p| pol.is_elastic_partition(p)) {
                    return Verdict::Reject(format!(
                        "partition '{p}' is for elastic jobs, which bftrainerd places on idle nodes; \
                         submit with --elastic=MIN[:MAX], or send a plain job to a regular partition \
                         (this cluster's [policy] plain_jobs = \"refuse\")"
                    ), Code::Partition);
                }
            }
        }
        return Verdict::Untouched;
    };
    elastic(pol, s, spec, privileged)
}

fn elastic(pol: &Policy, s: &Submission<'_>, mut spec: ElasticSpec, privileged: bool) -> Verdict {
    let shown = format!("--elastic={spec}");
    // Without a readable config not even bftrainerd's requests are placed: partitions,
    // limits and the daemon's user are unknown.
    if privileged {
        if let Some(why) = &pol.broken {
            return Verdict::Reject(
                format!("{shown}: elastic jobs are unavailable on this cluster for now: {why}"),
                Code::Denied,
            );
        }
    } else {
        if let Some(why) = pol.unavailable() {
            return Verdict::Reject(
                format!(
                    "{shown}: elastic jobs are unavailable on this cluster for now: {why}; \
                     plain jobs are not affected"
                ),
                Code::Denied,
            );
        }
    }
    // One tag, one core allocation, one set of satellites: the daemon manages whole
    // jobs, so arrays and heterogeneous jobs stay rigid.
    if let Some(a) = s.array {
        return Verdict::Reject(
            format!("{shown}: job arrays cannot be elastic (--array={}); submit each elastic job on its own", text(a)),
            Code::Invalid,
        );
    }
    if s.het_offset != NO_VAL {
        return Verdict::Reject(
            format!(
                "{shown}: heterogeneous jobs cannot be elastic; give --elastic to an ordinary job"
            ),
            Code::Invalid,
        );
    }
    if spec.role == Role::Satellite && !privileged {
        return Verdict::Reject(format!(
            "{shown}: role=satellite is reserved for bftrainerd (user '{}'); submit the core job with --elastic=MIN[:MAX] and bftrainerd adds satellites",
            pol.daemon_user
        ), Code::Denied);
    }
    if !privileged && !pol.allowed_uids.is_empty() && !pol.allowed_uids.contains(&s.uid) {
        return Verdict::Reject(
            format!(
                "{shown}: user {} may not submit elastic jobs on this cluster; allowed users: {}",
                s.uid,
                pol.allowed_users.join(", ")
            ),
            Code::Denied,
        );
    }
    if !privileged && !pol.allowed_accounts.is_empty() {
        match s.account.map(text) {
            None => {
                return Verdict::Reject(format!(
                    "{shown}: elastic jobs must name their account (--account); allowed accounts: {}",
                    pol.allowed_accounts.join(", ")
                ), Code::Denied)
            }
            Some(a) if !pol.allowed_accounts.contains(&a) => {
                return Verdict::Reject(format!(
                    "{shown}: account '{a}' may not submit elastic jobs; allowed accounts: {}",
                    pol.allowed_accounts.join(", ")
                ), Code::Denied)
            }
            Some(_) => {}
        }
    }
    if let Some(limit) = pol.max_nodes {
        let (what, n) = match spec.max {
            Some(m) => ("MAX", m),
            None => ("MIN", spec.min),
        };
        if n > limit {
            return Verdict::Reject(format!(
                "{shown}: {what} ({n}) is over this cluster's limit of {limit} nodes for elastic jobs; use --elastic=MIN:MAX with MAX <= {limit}"
            ), Code::Invalid);
        }
        spec.max.get_or_insert(limit);
    }
    if let Some(name) = &spec.profile {
        if pol.profile_dir.is_none() {
            return Verdict::Reject(format!("{shown}: profile={name}: this cluster has no profile directory; leave out profile="), Code::Invalid);
        }
        if !pol.profiles.contains(name) {
            let known: Vec<&str> = pol.profiles.iter().take(20).map(String::as_str).collect();
            return Verdict::Reject(
                format!(
                    "{shown}: profile={name}: no such profile; known profiles: {}",
                    if known.is_empty() {
                        "(none)".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
                Code::Invalid,
            );
        }
    }
    let partition = match s.partition.map(text) {
        None if spec.role == Role::Satellite => pol.satellite_partition.clone(),
        None => pol.partition.clone(),
        // bftrainerd names the satellite partition itself; only it submits satellites.
        Some(p)
            if spec.role == Role::Satellite
                && (p == pol.satellite_partition || pol.gpu_satellite(&p)) =>
        {
            p
        }
        Some(list) => {
            if let Some(bad) = partition_list(&list).find(|p| !pol.partition_ok(p)) {
                return Verdict::Reject(format!(
                    "{shown}: partition '{bad}' is closed to elastic jobs by this cluster's policy; elastic jobs may use: {} (leave out -p to get {})",
                    pol.partitions_text(),
                    pol.partition
                ), Code::Partition);
            }
            list
        }
    };
    // An explicit node count that disagrees with MIN would be silently overwritten;
    // say so instead. sbatch sends NO_VAL (min) / 0 or NO_VAL (max) when -N is absent.
    let min_given = s.min_nodes != NO_VAL && s.min_nodes != 0;
    let max_given = s.max_nodes != NO_VAL && s.max_nodes != 0;
    if (min_given && s.min_nodes != spec.min) || (max_given && s.max_nodes != spec.min) {
        return Verdict::Reject(format!(
            "{shown}: --nodes conflicts with the elastic request; an elastic job starts on MIN ({}) nodes and grows up to MAX: leave out --nodes",
            spec.min
        ), Code::Invalid);
    }
    // A GPU satellite holds one GPU of a node that regular jobs share.
    let gpu_satellite = spec.role == Role::Satellite && pol.gpu_satellite(&partition);
    let hold = pol.hold && spec.role == Role::Core;
    let comment = (hold && s.comment.is_none()).then(|| spec::waiting_note(&spec));
    // Other SPANK plugins' options (a container image...) go into the core's tag for
    // bftrainerd to give its satellites; one the admin lets satellites carry but that
    // cannot be carried as given is refused now, not on the grown nodes later.
    let mut admin_comment = spec.to_tag();
    if spec.role == Role::Core {
        match spankopt::collect(&s.spank_env, &pol.satellite_spank_options) {
            Ok(carried) => admin_comment = spankopt::with_carried(&admin_comment, &carried),
            Err(e) => {
                return Verdict::Reject(
                    format!("{shown}: {e} ([policy] satellite_spank_options of this cluster)"),
                    Code::Invalid,
                )
            }
        }
    }
    Verdict::Elastic(Box::new(Rewrite {
        partition,
        nodes: spec.min,
        priority: hold.then_some(0),
        shared: (pol.exclusive && !gpu_satellite).then_some(0),
        requeue: spec.role == Role::Core,
        admin_comment,
        comment,
        qos: pol.core_qos.clone().filter(|_| spec.role == Role::Core),
        spec,
    }))
}

/// The fields of a job update (`scontrol update`, `scontrol release`...) the policy checks.
#[derive(Debug, Clone, Default)]
pub struct Modification<'a> {
    pub uid: u32,
    /// slurmctld counts `uid` as an operator: AdminLevel Operator or Administrator in
    /// slurmdbd (its `validate_operator`, which `_update_job` calls before this hook).
    /// Such a user is an administrator here, as root is.
    pub operator: bool,
    /// The job's owner (slurmctld fills job_desc.user_id in before calling job_modify);
    /// NO_VAL when unknown.
    pub owner: u32,
    /// The update's Comment (NULL: not changed).
    pub comment: Option<&'a [u8]>,
    /// The job's current admin comment (its tag, if elastic).
    pub current_admin_comment: Option<&'a [u8]>,
    pub admin_comment: Option<&'a [u8]>,
    pub partition: Option<&'a [u8]>,
    /// The update's Account (NULL: not changed).
    pub account: Option<&'a [u8]>,
    /// `OverSubscribe` (job_desc.shared): NO_VAL16 when not changed.
    pub shared: u16,
    pub min_nodes: u32,
    pub max_nodes: u32,
    /// `ReqNodeList`: NULL (None) when not updated; `Some(b"")` clears it.
    pub req_nodes: Option<&'a [u8]>,
    /// `ExcNodeList`, as `req_nodes`.
    pub exc_nodes: Option<&'a [u8]>,
    pub priority: u32,
    /// Sent with priority 0 by `scontrol hold` (0) and `scontrol uhold`
    /// (ALLOC_SID_USER_HOLD); NO_VAL otherwise.
    pub alloc_sid: u32,
    pub requeue: u16,
    /// `scontrol` names of every other field the update sets (Name, TimeLimit, QOS...),
    /// compared by the FFI layer with what slurm_init_job_desc_msg leaves unset. The
    /// job's identity (job id, the user_id slurmctld fills in) is not among them.
    pub others: Vec<&'static str>,
}

/// What satellites' owners are told when they try anything but cancel, hold or release.
pub const SATELLITE_RULE: &str =
    "satellites are bftrainerd's: you may cancel or hold them, nothing else";

/// Changes job_modify makes to an update it lets through, so that holds placed by
/// others than bftrainerd stay visible to it (see [`spec::SiteHold`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edit {
    /// New admin comment (the tag with or without [`spec::ADMIN_HOLD`]).
    pub admin_comment: Option<String>,
    /// New Comment (the owner's hold note, or the waiting note when they lift it).
    pub comment: Option<String>,
    /// Drop the update's priority change: a release that only lifts a hold, the job
    /// staying held until bftrainerd admits it.
    pub keep_held: bool,
}

impl Edit {
    pub fn is_none(&self) -> bool {
        *self == Edit::default()
    }
}

/// `Ok(edit)` lets the update through with `edit` applied; `Err` is logged and turned
/// into an error code.
pub fn modify(pol: &Policy, m: &Modification<'_>) -> Result<Edit, ModifyDenied> {
    let current = m.current_admin_comment.map(text);
    let tag = current.as_deref().and_then(spec::parse_tag);
    if pol.privileged(m.uid) || m.operator {
        return match (tag, current.as_deref()) {
            (Some(Ok(s)), Some(cur)) if s.role == Role::Core => privileged_core(m, cur),
            _ => Ok(Edit::default()),
        };
    }
    let Some(Ok(spec)) = tag else {
        if m.admin_comment
            .map(text)
            .is_some_and(|c| spec::looks_like_tag(&c))
        {
            return Err(ModifyDenied::Access("sets bftrainer's tag on a job".into()));
        }
        // A plain job moved into an elastic partition (held, moved, released) would
        // skip admission, caps and billing, and in the core partition preempt other
        // users' satellites: it may only be submitted there, where submit's rules apply.
        if let Some(list) = m.partition.map(text) {
            if let Some(p) = partition_list(&list).find(|p| pol.is_elastic_partition(p)) {
                let there = match pol.plain_jobs {
                    PlainJobs::Refuse => format!(
                        "submit an elastic job there with sbatch --elastic=MIN[:MAX] (elastic partitions: {})",
                        pol.partitions_text()
                    ),
                    PlainJobs::Scavenger => "submit the job there instead (sbatch -p), as a scavenger job".into(),
                };
                return Err(ModifyDenied::Access(format!(
                    "moves a plain job into partition '{p}', which belongs to bftrainer's elastic jobs and satellites; plain jobs may be moved between regular partitions only: {there}"
                )));
            }
        }
        return Ok(Edit::default());
    };
    if spec.role == Role::Satellite {
        return satellite(m, spec.parent).map(|()| Edit::default());
    }
    if m.admin_comment.is_some() {
        return Err(ModifyDenied::Access(
            "edits the admin comment (bftrainer's tag) of an elastic job".into(),
        ));
    }
    let owner = m.owner == m.uid;
    // What submit checked of a core job is checked again here, for each field an
    // update can change: partition, account, node count, node lists, whole nodes,
    // requeue; the tag (profile, MAX, role) is refused above.
    if let Some(p) = m.partition.map(text) {
        if partition_list(&p).next().is_none() || partition_list(&p).any(|p| !pol.partition_ok(p)) {
            return Err(ModifyDenied::Partition);
        }
    }
    if let Some(a) = m.account.map(text) {
        if !pol.allowed_accounts.is_empty() && !pol.allowed_accounts.contains(&a) {
            return Err(ModifyDenied::Access(format!(
                "moves an elastic job to account '{a}', which may not run elastic jobs; allowed accounts: {}",
                pol.allowed_accounts.join(", ")
            )));
        }
    }
    if pol.exclusive && m.shared != NO_VAL16 && m.shared != 0 {
        return Err(ModifyDenied::Access(
            "lets an elastic job share its nodes (OverSubscribe): elastic jobs get whole nodes on this cluster".into(),
        ));
    }
    if m.min_nodes != NO_VAL || m.max_nodes != NO_VAL {
        return Err(ModifyDenied::Access(
            "changes the node count of an elastic job (bftrainerd sizes it)".into(),
        ));
    }
    // Under preempt/qos the core's QOS ranks it for preemption: out of it, a regular
    // job could no longer preempt the core (or would preempt it before satellites).
    if let Some(q) = &pol.core_qos {
        if m.others.contains(&"QOS") {
            return Err(ModifyDenied::Access(format!(
                "changes the QOS of an elastic job: elastic jobs run in QOS '{q}' on this cluster ([policy] core_qos)"
            )));
        }
    }
    // bftrainerd pins an admitted job to the idle nodes it chose; a user's list would
    // start it elsewhere (on nodes lent to other jobs) or keep it from starting.
    for (field, value) in [("ReqNodeList", m.req_nodes), ("ExcNodeList", m.exc_nodes)] {
        if value.is_some() {
            return Err(ModifyDenied::Access(format!(
                "changes {field} of an elastic job (bftrainerd pins it to the nodes it admits it on)"
            )));
        }
    }
    // Holding one's own job is fine; releasing a held core job is bftrainerd's call,
    // so the owner's release only lifts their own hold (the job stays held until
    // bftrainerd admits it).
    let release = m.priority == INFINITE && owner;
    if m.priority != NO_VAL && m.priority != 0 && !release {
        return Err(ModifyDenied::Access(
            "releases or reprioritises an elastic job (bftrainerd admits it)".into(),
        ));
    }
    if m.requeue != NO_VAL16 && m.requeue == 0 {
        return Err(ModifyDenied::Access(
            "turns requeue off for an elastic job (preemption requeues it)".into(),
        ));
    }
    // The owner's hold is written where bftrainerd reads it and the owner may write:
    // the Comment (an update that sets the Comment itself keeps its own). Another
    // user's hold (a Slurm operator's, an account coordinator's) is Slurm's alone.
    let mut edit = Edit::default();
    if owner && m.comment.is_none() {
        if m.priority == 0 {
            edit.comment = Some(spec::owner_hold_note());
        } else if release {
            edit.comment = Some(spec::waiting_note(&spec));
        }
    }
    edit.keep_held = release;
    Ok(edit)
}

/// A core job updated by root, SlurmUser or `daemon_user`. bftrainerd's own holds and
/// releases carry its marker: the admin comment set to the job's tag as it read it.
/// Any other hold is an administrator's, recorded in the tag ([`spec::ADMIN_HOLD`]) so
/// that bftrainerd does not admit the job; a release lifts it and leaves the job held
/// for bftrainerd to admit.
fn privileged_core(m: &Modification<'_>, current: &str) -> Result<Edit, ModifyDenied> {
    let (bare, held) = spec::split_admin_hold(current);
    let hold = m.priority == 0;
    let release = m.priority == INFINITE;
    match m.admin_comment.map(text) {
        // bftrainerd's marker, read before an administrator's hold: it must not
        // release a job held since.
        Some(marker) if held && release && (marker == current || marker == bare) => {
            Err(ModifyDenied::Access(
                "releases an elastic job an administrator holds (`scontrol release` it first)"
                    .into(),
            ))
        }
        // bftrainerd's own update (or an administrator writing the tag on purpose).
        Some(_) => Ok(Edit::default()),
        None if hold && !held => Ok(Edit {
            admin_comment: Some(format!("{current}{}", spec::ADMIN_HOLD)),
            ..Edit::default()
        }),
        None if release && held => Ok(Edit {
            admin_comment: Some(bare.to_string()),
            keep_held: true,
            ..Edit::default()
        }),
        None => Ok(Edit::default()),
    }
}

/// An update of a job whose record slurmctld passed in a layout this build does not know
/// (its magic cookie differs), so its tag cannot be read: it may be a satellite or a
/// held core job, so only privileged uids may go on.
pub fn modify_unreadable(pol: &Policy, uid: u32) -> Result<(), ModifyDenied> {
    if pol.privileged(uid) {
        return Ok(());
    }
    Err(ModifyDenied::Access(
        "cannot be checked: the job record is not in the layout this plugin was built for \
         (ask an admin)"
            .into(),
    ))
}

/// A satellite's owner may hold it (priority 0, with the alloc_sid `scontrol hold` /
/// `uhold` send) and release it (priority INFINITE); every other field is refused, by
/// name: bftrainerd recognises its satellites by name, partition, owner and tag, and
/// one it no longer recognises would stay joined to the training outside its control.
fn satellite(m: &Modification<'_>, parent: Option<u32>) -> Result<(), ModifyDenied> {
    let mut set: Vec<&str> = Vec::new();
    let flags = [
        ("AdminComment", m.admin_comment.is_some()),
        ("Partition", m.partition.is_some()),
        ("NumNodes", m.min_nodes != NO_VAL || m.max_nodes != NO_VAL),
        ("ReqNodeList", m.req_nodes.is_some()),
        ("ExcNodeList", m.exc_nodes.is_some()),
        ("Requeue", m.requeue != NO_VAL16),
        (
            "Priority",
            m.priority != NO_VAL && m.priority != 0 && m.priority != INFINITE,
        ),
        // Meaningful only beside priority 0 (which hold it is).
        ("AllocSid", m.alloc_sid != NO_VAL && m.priority != 0),
    ];
    set.extend(flags.iter().filter(|(_, on)| *on).map(|(name, _)| *name));
    set.extend(m.others.iter().copied());
    if set.is_empty() {
        return Ok(());
    }
    let of = parent.map(|p| format!(" of job {p}")).unwrap_or_default();
    Err(ModifyDenied::Access(format!(
        "sets {} on a satellite{of}; {SATELLITE_RULE}",
        set.join(", ")
    )))
}

/// Why an update was refused; job_modify in 22.05 has no err_msg, so the user sees the
/// Slurm error code's text and slurmctld's log gets this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyDenied {
    /// What the update does ("sets Name on a satellite of job 5; ..."), completing
    /// "this update ...".
    Access(String),
    Partition,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use std::path::Path;

    fn pol(extra: &str) -> Policy {
        let users = |n: &str| match n {
            "root" => Some(0),
            "alice" => Some(1000),
            "bftd" => Some(990),
            _ => None,
        };
        config::parse(
            &format!("[policy]\ndaemon_user = \"bftd\"\n{extra}"),
            Path::new("/t/bftrainer.toml"),
            &users,
        )
        .unwrap()
    }

    fn sub(env: &'static str) -> Submission<'static> {
        Submission {
            uid: 1000,
            min_nodes: NO_VAL,
            max_nodes: NO_VAL,
            het_offset: NO_VAL,
            spank_env: vec![env.as_bytes()],
            ..Submission::default()
        }
    }

    fn rejected(v: Verdict) -> String {
        match v {
            Verdict::Reject(m, _) => m,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn rewrite(v: Verdict) -> Rewrite {
        match v {
            Verdict::Elastic(r) => *r,
            other => panic!("expected an elastic rewrite, got {other:?}"),
        }
    }

    #[test]
    fn plain_jobs_are_untouched() {
        let p = pol("");
        let s = Submission {
            uid: 1000,
            min_nodes: 3,
            partition: Some(b"batch"),
            spank_env: vec![b"OTHER=1"],
            environment: vec![b"PATH=/bin"],
            ..Default::default()
        };
        assert_eq!(submit(&p, &s), Verdict::Untouched);
    }

    #[test]
    fn elastic_job_is_routed_tagged_and_held() {
        let r = rewrite(submit(&pol(""), &sub("BFTRAINER_ELASTIC=2:4")));
        assert_eq!(r.partition, "elastic");
        assert_eq!(r.nodes, 2);
        assert_eq!(r.priority, Some(0));
        assert_eq!(r.shared, Some(0));
        assert!(r.requeue);
        assert_eq!(r.admin_comment, "bftrainer:v1 2:4,role=core");
        assert_eq!(
            r.comment.as_deref(),
            Some("bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it")
        );
    }

    /// Under preempt/qos the core's QOS ranks it for preemption: `[policy] core_qos`
    /// puts every core job in it, whatever it asked, and its owner cannot move it out.
    #[test]
    fn core_qos_puts_core_jobs_in_it_and_keeps_them_there() {
        let plain = rewrite(submit(&pol(""), &sub("BFTRAINER_ELASTIC=2:4")));
        assert_eq!(plain.qos, None, "without core_qos a job keeps its own QOS");
        let p = pol("core_qos = \"elastic\"\n");
        let r = rewrite(submit(&p, &sub("BFTRAINER_ELASTIC=2:4")));
        assert_eq!(r.qos.as_deref(), Some("elastic"));
        // bftrainerd's satellites keep the QOS it gives them ([policy] satellite_qos).
        let sat = Submission {
            uid: 990,
            ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
        };
        assert_eq!(rewrite(submit(&p, &sat)).qos, None);
        let core = b"bftrainer:v1 2:4,role=core";
        for (others, refused) in [
            (vec!["QOS"], true),
            (vec!["Name", "QOS"], true),
            (vec!["Name"], false),
        ] {
            let m = Modification {
                owner: 1000,
                others,
                ..change(core)
            };
            match modify(&p, &m) {
                Err(ModifyDenied::Access(why)) if refused => assert_eq!(
                    why,
                    "changes the QOS of an elastic job: elastic jobs run in QOS 'elastic' on this cluster ([policy] core_qos)"
                ),
                Ok(_) if !refused => {}
                other => panic!("{m:?}: {other:?}"),
            }
            // Without core_qos the owner's QOS change is Slurm's to judge.
            assert!(modify(&pol(""), &m).is_ok(), "{m:?}");
        }
        // An admin may.
        let admin = Modification {
            uid: 0,
            others: vec!["QOS"],
            ..change(core)
        };
        assert!(modify(&p, &admin).is_ok());
        for bad in ["\"\"", "\"a b\"", "\"x,y\"", "3"] {
            let users = |_: &str| None;
            let e = config::parse(
                &format!("[policy]\ncore_qos = {bad}\n"),
                Path::new("/t/bftrainer.toml"),
                &users,
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("core_qos"), "{bad}: {e}");
        }
    }

    #[test]
    fn other_plugins_options_go_into_the_core_tag_when_the_policy_allows_them() {
        let env: Vec<&'static [u8]> = vec![
            b"BFTRAINER_ELASTIC=2:4",
            b"_SLURM_SPANK_OPTION_pyxis_container_image=nvcr.io#nvidia/pytorch:24.01",
            b"_SLURM_SPANK_OPTION_x11_x11=all",
        ];
        let s = Submission {
            spank_env: env.clone(),
            ..sub("X=1")
        };
        // Not allowed by the policy: not carried.
        let r = rewrite(submit(&pol(""), &s));
        assert_eq!(r.admin_comment, "bftrainer:v1 2:4,role=core");
        let p = pol("satellite_spank_options = [\"pyxis\"]");
        let r = rewrite(submit(&p, &s));
        assert_eq!(
            r.admin_comment,
            "bftrainer:v1 spank:pyxis_container_image=nvcr.io%23nvidia/pytorch%3A24.01 2:4,role=core"
        );
        assert_eq!(spec::parse_tag(&r.admin_comment), Some(Ok(r.spec.clone())));
        // An allowed option that cannot be carried refuses the job, saying why.
        let bad = Submission {
            spank_env: vec![
                b"BFTRAINER_ELASTIC=2:4",
                b"_SLURM_SPANK_OPTION_pyxis_container_image=a\tb",
            ],
            ..sub("X=1")
        };
        let m = rejected(submit(&p, &bad));
        assert!(
            m.contains("SPANK option pyxis_container_image: its value holds a control character"),
            "{m}"
        );
        assert!(m.contains("[policy] satellite_spank_options"), "{m}");
        // The daemon's satellites carry them in their own way; their tag stays bare.
        let sat = Submission {
            uid: 990,
            spank_env: vec![
                b"BFTRAINER_ELASTIC=1:1,role=satellite,parent=5",
                b"_SLURM_SPANK_OPTION_pyxis_container_image=x",
            ],
            ..sub("X=1")
        };
        let r = rewrite(submit(&p, &sat));
        assert_eq!(r.admin_comment, "bftrainer:v1 1:1,role=satellite,parent=5");
        // A bad entry in the list names the key.
        let e = config::parse(
            "[policy]\nsatellite_spank_options = [\"bftrainer\"]",
            Path::new("/t/bftrainer.toml"),
            &|_| Some(0),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/t/bftrainer.toml: [policy] satellite_spank_options: 'bftrainer' names bftrainer's own plugin"), "{e}");
    }

    #[test]
    fn open_max_takes_the_policy_limit() {
        let r = rewrite(submit(&pol("max_nodes = 8"), &sub("BFTRAINER_ELASTIC=3")));
        assert_eq!(r.admin_comment, "bftrainer:v1 3:8,role=core");
        let r = rewrite(submit(&pol(""), &sub("BFTRAINER_ELASTIC=3")));
        assert_eq!(r.admin_comment, "bftrainer:v1 3,role=core");
    }

    #[test]
    fn forged_requests_are_revalidated() {
        let p = pol("max_nodes = 4");
        assert!(rejected(submit(&p, &sub("BFTRAINER_ELASTIC=8:2")))
            .contains("MAX (2) is smaller than MIN (8)"));
        assert!(rejected(submit(&p, &sub("BFTRAINER_ELASTIC="))).contains("the value is empty"));
        assert!(rejected(submit(&p, &sub("BFTRAINER_ELASTIC=2:64")))
            .contains("MAX (64) is over this cluster's limit of 4 nodes"));
        assert!(rejected(submit(&p, &sub("BFTRAINER_ELASTIC=6"))).contains("MIN (6) is over"));
        let twice = Submission {
            spank_env: vec![b"BFTRAINER_ELASTIC=1:2", b"BFTRAINER_ELASTIC=1:2"],
            ..sub("X=1")
        };
        assert!(rejected(submit(&p, &twice)).contains("appears 2 times"));
    }

    #[test]
    fn satellites_only_from_the_daemon() {
        let p = pol("");
        let m = rejected(submit(
            &p,
            &sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5"),
        ));
        assert!(
            m.contains("role=satellite is reserved for bftrainerd (user 'bftd')"),
            "{m}"
        );
        let daemon = Submission {
            uid: 990,
            ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
        };
        let r = rewrite(submit(&p, &daemon));
        assert_eq!(
            r.priority, None,
            "satellites start as soon as Slurm can place them"
        );
        assert!(
            !r.requeue,
            "a satellite pinned to a failed node is not requeued"
        );
        assert_eq!(r.comment, None);
        assert_eq!(r.admin_comment, "bftrainer:v1 1:1,role=satellite,parent=5");
    }

    #[test]
    fn satellites_go_to_their_own_partition() {
        let p = pol("satellite_partition = \"elastic-sat\"");
        let daemon = Submission {
            uid: 990,
            ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
        };
        assert_eq!(rewrite(submit(&p, &daemon)).partition, "elastic-sat");
        let named = Submission {
            partition: Some(b"elastic-sat"),
            ..daemon.clone()
        };
        assert_eq!(rewrite(submit(&p, &named)).partition, "elastic-sat");
        // Core jobs still go to the core partition; a user cannot pick the satellites'.
        assert_eq!(
            rewrite(submit(&p, &sub("BFTRAINER_ELASTIC=1:2"))).partition,
            "elastic"
        );
        let user = Submission {
            partition: Some(b"elastic-sat"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert!(rejected(submit(&p, &user)).contains("partition 'elastic-sat' is closed"));
    }

    #[test]
    fn gpu_satellites_share_their_nodes() {
        let p = pol("satellite_partition = \"elastic-sat\"\n[gpu_lending]\npartitions = [\"shared\"]\nsatellite_partition = \"shared-sat\"");
        let daemon = Submission {
            uid: 990,
            partition: Some(b"shared-sat"),
            ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
        };
        let r = rewrite(submit(&p, &daemon));
        assert_eq!((r.partition.as_str(), r.shared), ("shared-sat", None));
        // Whole-node satellites stay exclusive.
        let whole = Submission {
            partition: Some(b"elastic-sat"),
            ..daemon.clone()
        };
        assert_eq!(rewrite(submit(&p, &whole)).shared, Some(0));
        // Neither a user's elastic job nor a plain job may go there.
        let user = Submission {
            partition: Some(b"shared-sat"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert!(rejected(submit(&p, &user)).contains("partition 'shared-sat' is closed"));
        let plain = Submission {
            uid: 1000,
            min_nodes: 1,
            partition: Some(b"shared-sat"),
            het_offset: NO_VAL,
            ..Default::default()
        };
        assert!(matches!(submit(&p, &plain), Verdict::Reject(..)));
        // Without [gpu_lending], the partition is nothing special.
        let off = pol("satellite_partition = \"elastic-sat\"");
        assert!(rejected(submit(&off, &daemon)).contains("partition 'shared-sat' is closed"));
    }

    #[test]
    fn plain_jobs_in_elastic_partitions_follow_the_policy() {
        let plain = |part: &'static [u8]| Submission {
            uid: 1000,
            min_nodes: 2,
            partition: Some(part),
            het_offset: NO_VAL,
            ..Default::default()
        };
        let p = pol("satellite_partition = \"elastic-sat\"");
        for part in [b"elastic".as_slice(), b"batch,elastic-sat"] {
            let m = rejected(submit(&p, &plain(part)));
            assert!(
                m.contains("is for elastic jobs") && m.contains("plain_jobs = \"refuse\""),
                "{m}"
            );
        }
        assert_eq!(submit(&p, &plain(b"batch")), Verdict::Untouched);
        let root = Submission {
            uid: 0,
            ..plain(b"elastic")
        };
        assert_eq!(submit(&p, &root), Verdict::Untouched);
        let p = pol("plain_jobs = \"scavenger\"");
        assert_eq!(submit(&p, &plain(b"elastic")), Verdict::Untouched);
    }

    #[test]
    fn users_cannot_plant_the_tag() {
        let s = Submission {
            uid: 1000,
            admin_comment: Some(b"bftrainer:v1 1:1,role=satellite,parent=5"),
            ..Default::default()
        };
        assert!(rejected(submit(&pol(""), &s)).contains("is bftrainer's tag"));
        let s = Submission {
            uid: 0,
            admin_comment: Some(b"bftrainer:v1 1:1"),
            ..Default::default()
        };
        assert_eq!(submit(&pol(""), &s), Verdict::Untouched);
    }

    #[test]
    fn environment_forgery() {
        let p = pol("");
        let forged = Submission {
            environment: vec![b"SLURM_SPANK_BFTRAINER_ELASTIC=1:1,role=satellite,parent=9"],
            ..Submission::default()
        };
        assert!(rejected(submit(&p, &forged))
            .contains("environment variable SLURM_SPANK_BFTRAINER_ELASTIC is reserved"));
        let forged = Submission {
            environment: vec![b"_SLURM_SPANK_OPTION_bftrainer_elastic=2:4"],
            ..Submission::default()
        };
        assert!(rejected(submit(&p, &forged))
            .contains("_SLURM_SPANK_OPTION_bftrainer_elastic is reserved"));
        let forged = Submission {
            uid: 0,
            environment: vec![
                b"SLURM_EXPORT_ENV=ALL,SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic=1:1",
                b"SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic=1:1",
            ],
            ..Submission::default()
        };
        assert!(rejected(submit(&p, &forged))
            .contains("SLURM_SPANK__SLURM_SPANK_OPTION_bftrainer_elastic is reserved"));
        // What sbatch itself sends for --elastic=2:4,role=core agrees with the request.
        let honest = Submission {
            environment: vec![
                b"SLURM_SPANK_BFTRAINER_ELASTIC=2:4",
                b"_SLURM_SPANK_OPTION_bftrainer_elastic=2:4,role=core",
            ],
            ..sub("BFTRAINER_ELASTIC=2:4")
        };
        rewrite(submit(&p, &honest));
        let mismatch = Submission {
            environment: vec![b"SLURM_SPANK_BFTRAINER_ELASTIC=2:8"],
            ..sub("BFTRAINER_ELASTIC=2:4")
        };
        assert!(rejected(submit(&p, &mismatch)).contains("does not match"));
    }

    /// Names NSS cannot resolve: elastic jobs are refused with the reason, plain jobs and
    /// root's (satellite) submissions go on.
    #[test]
    fn unresolved_names_refuse_elastic_jobs_only() {
        let p = config::parse(
            "[policy]\nallowed_users = [\"ghost\"]\n",
            Path::new("/t/bftrainer.toml"),
            &|n: &str| (n == "root").then_some(0),
        )
        .unwrap();
        match submit(&p, &sub("BFTRAINER_ELASTIC=2:4")) {
            Verdict::Reject(m, Code::Denied) => assert_eq!(
                m,
                "--elastic=2:4: elastic jobs are unavailable on this cluster for now: \
                 /t/bftrainer.toml names [policy] allowed_users 'ghost' that cannot be looked \
                 up (no such user, or the user database (NSS/LDAP) did not answer); the plugin \
                 retries every few seconds; plain jobs are not affected"
            ),
            other => panic!("{other:?}"),
        }
        let plain = Submission {
            uid: 1000,
            min_nodes: 2,
            partition: Some(b"batch"),
            het_offset: NO_VAL,
            ..Default::default()
        };
        assert_eq!(submit(&p, &plain), Verdict::Untouched);
        let root = Submission {
            uid: 0,
            ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
        };
        rewrite(submit(&p, &root));
    }

    /// No readable config at slurmctld's start: every elastic request is refused, root's
    /// too, with the reason; plain jobs pass untouched, even into a partition named as
    /// the default elastic one (the site's real one is unknown).
    #[test]
    fn a_broken_config_refuses_every_elastic_request_and_no_plain_job() {
        let why = config::ConfigError("/t/bftrainer.toml: cannot read the bftrainer config: No such file or directory (os error 2)".into());
        let p = Policy::broken(Path::new("/t/bftrainer.toml"), &why);
        for uid in [1000, 0] {
            let s = Submission {
                uid,
                ..sub("BFTRAINER_ELASTIC=1:1,role=satellite,parent=5")
            };
            match submit(&p, &s) {
                Verdict::Reject(m, Code::Denied) => assert!(
                    m.starts_with("--elastic=1:1,role=satellite,parent=5: elastic jobs are unavailable on this cluster for now: /t/bftrainer.toml: cannot read the bftrainer config")
                        && m.contains("run `scontrol reconfigure`"),
                    "{m}"
                ),
                other => panic!("uid {uid}: {other:?}"),
            }
        }
        for part in [&b"batch"[..], b"elastic"] {
            let plain = Submission {
                uid: 1000,
                min_nodes: 2,
                partition: Some(part),
                het_offset: NO_VAL,
                ..Default::default()
            };
            assert_eq!(submit(&p, &plain), Verdict::Untouched);
        }
    }

    #[test]
    fn arrays_and_het_jobs_stay_rigid() {
        let p = pol("");
        let s = Submission {
            array: Some(b"1-10"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert!(rejected(submit(&p, &s)).contains("job arrays cannot be elastic (--array=1-10)"));
        let s = Submission {
            het_offset: 0,
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert!(rejected(submit(&p, &s)).contains("heterogeneous jobs cannot be elastic"));
        // Plain arrays are none of our business.
        let s = Submission {
            array: Some(b"1-10"),
            het_offset: NO_VAL,
            ..Default::default()
        };
        assert_eq!(submit(&p, &s), Verdict::Untouched);
    }

    #[test]
    fn partitions() {
        let p = pol("allowed_partitions = [\"elastic-gpu\"]");
        let s = Submission {
            partition: Some(b"batch"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert_eq!(
            rejected(submit(&p, &s)),
            "--elastic=1:2: partition 'batch' is closed to elastic jobs by this cluster's policy; elastic jobs may use: elastic, elastic-gpu (leave out -p to get elastic)"
        );
        let s = Submission {
            partition: Some(b"elastic-gpu"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert_eq!(rewrite(submit(&p, &s)).partition, "elastic-gpu");
    }

    #[test]
    fn users_accounts_profiles_nodes() {
        let p = pol("allowed_users = [\"root\"]");
        assert!(rejected(submit(&p, &sub("BFTRAINER_ELASTIC=1:2")))
            .contains("user 1000 may not submit elastic jobs"));
        let p = pol("allowed_accounts = [\"ml\"]");
        assert!(
            rejected(submit(&p, &sub("BFTRAINER_ELASTIC=1:2"))).contains("must name their account")
        );
        let s = Submission {
            account: Some(b"physics"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        assert!(rejected(submit(&p, &s)).contains("account 'physics' may not"));
        let s = Submission {
            account: Some(b"ml"),
            ..sub("BFTRAINER_ELASTIC=1:2")
        };
        rewrite(submit(&p, &s));
        assert!(
            rejected(submit(&pol(""), &sub("BFTRAINER_ELASTIC=1:2,profile=x")))
                .contains("no profile directory")
        );
        let s = Submission {
            min_nodes: 3,
            ..sub("BFTRAINER_ELASTIC=2:4")
        };
        assert!(rejected(submit(&pol(""), &s)).contains("--nodes conflicts"));
        let s = Submission {
            min_nodes: 2,
            max_nodes: 2,
            ..sub("BFTRAINER_ELASTIC=2:4")
        };
        rewrite(submit(&pol(""), &s));
        let s = Submission {
            comment: Some(b"mine"),
            ..sub("BFTRAINER_ELASTIC=2:4")
        };
        assert_eq!(rewrite(submit(&pol(""), &s)).comment, None);
        let r = rewrite(submit(
            &pol("hold = false\nexclusive = false"),
            &sub("BFTRAINER_ELASTIC=2:4"),
        ));
        assert_eq!((r.priority, r.shared, r.comment), (None, None, None));
    }

    fn change(current: &'static [u8]) -> Modification<'static> {
        Modification {
            uid: 1000,
            owner: NO_VAL,
            current_admin_comment: Some(current),
            min_nodes: NO_VAL,
            max_nodes: NO_VAL,
            priority: NO_VAL,
            alloc_sid: NO_VAL,
            requeue: NO_VAL16,
            shared: NO_VAL16,
            ..Default::default()
        }
    }

    /// Issue 33, items 12 and 15: an update may not do what submit refuses. A plain job
    /// moved into an elastic, core or satellite partition (any spelling, or inside a
    /// list) is refused with what is allowed; a core job may not move to an account or
    /// partition submit would refuse, nor give up whole nodes.
    #[test]
    fn updates_cannot_sidestep_what_submit_checks() {
        let p = pol(
            "satellite_partition = \"elastic-sat\"\nallowed_partitions = [\"gpu-el\"]\nallowed_accounts = [\"ml\"]\n\n[gpu_lending]\npartitions = [\"shared\"]\nsatellite_partition = \"gpu-sat\"\n",
        );
        let plain: &'static [u8] = b"";
        let core: &'static [u8] = b"bftrainer:v1 2:4,role=core";
        let moved = |list: &'static str, current: &'static [u8]| Modification {
            partition: Some(list.as_bytes()),
            owner: 1000,
            ..change(current)
        };
        for list in [
            "elastic",
            "elastic-sat",
            "gpu-el",
            "gpu-sat",
            "ELASTIC",
            " Elastic-Sat ",
            "batch,elastic",
            "batch, elastic-sat",
            ",elastic",
        ] {
            match modify(&p, &moved(list, plain)) {
                Err(ModifyDenied::Access(why)) => assert!(
                    why.contains("moves a plain job into partition")
                        && why.contains("plain jobs may be moved between regular partitions only")
                        && why.contains("sbatch --elastic=MIN[:MAX]"),
                    "{list}: {why}"
                ),
                other => panic!("plain job moved to {list:?}: {other:?}"),
            }
        }
        for list in ["batch", "batch,debug", "elastics"] {
            assert_eq!(
                modify(&p, &moved(list, plain)),
                Ok(Edit::default()),
                "{list}"
            );
        }
        let scavenger = pol("plain_jobs = \"scavenger\"");
        match modify(&scavenger, &moved("elastic", plain)) {
            Err(ModifyDenied::Access(why)) => assert!(why.contains("as a scavenger job"), "{why}"),
            other => panic!("{other:?}"),
        }
        // root, SlurmUser and the daemon's user move jobs where they like.
        let root = Modification {
            uid: 0,
            ..moved("elastic-sat", plain)
        };
        assert_eq!(modify(&p, &root), Ok(Edit::default()));

        // A core job: a partition list with a closed partition, or an empty one.
        for list in ["batch", "elastic,batch", "elastic-sat", ",", " "] {
            assert_eq!(
                modify(&p, &moved(list, core)),
                Err(ModifyDenied::Partition),
                "{list:?}"
            );
        }
        for list in ["elastic", "gpu-el,elastic", " ELASTIC "] {
            assert_eq!(
                modify(&p, &moved(list, core)),
                Ok(Edit::default()),
                "{list}"
            );
        }
        let account = |a: &'static str| Modification {
            account: Some(a.as_bytes()),
            owner: 1000,
            ..change(core)
        };
        match modify(&p, &account("other")) {
            Err(ModifyDenied::Access(why)) => assert_eq!(
                why,
                "moves an elastic job to account 'other', which may not run elastic jobs; allowed accounts: ml"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(modify(&p, &account("ml")), Ok(Edit::default()));
        // No allowed_accounts: any account.
        assert_eq!(modify(&pol(""), &account("other")), Ok(Edit::default()));
        // A plain job's account is not bftrainer's business.
        let plain_account = Modification {
            account: Some(b"other"),
            ..change(plain)
        };
        assert_eq!(modify(&p, &plain_account), Ok(Edit::default()));
        let share = Modification {
            shared: 1,
            ..change(core)
        };
        assert!(
            matches!(modify(&p, &share), Err(ModifyDenied::Access(w)) if w.contains("OverSubscribe"))
        );
        assert_eq!(
            modify(&pol("exclusive = false"), &share),
            Ok(Edit::default())
        );
    }

    /// What `modify` must answer; a refusal names what was refused.
    #[derive(Debug)]
    enum Want {
        Allowed,
        Partition,
        /// Refused with a message that contains this.
        Access(&'static str),
    }

    #[test]
    fn modify_rules() {
        use Want::*;
        let p = pol("");
        let core: &'static [u8] = b"bftrainer:v1 2:4,role=core";
        let plain: &'static [u8] = b"";
        let cases = [
            ("a core job, nothing changed", change(core), Allowed),
            (
                "a core job to a closed partition",
                Modification {
                    partition: Some(b"batch"),
                    ..change(core)
                },
                Partition,
            ),
            (
                "a core job to the elastic partition",
                Modification {
                    partition: Some(b"elastic"),
                    ..change(core)
                },
                Allowed,
            ),
            (
                "a core job released",
                Modification {
                    priority: INFINITE,
                    ..change(core)
                },
                Access("releases or reprioritises an elastic job"),
            ),
            (
                "a core job held",
                Modification {
                    priority: 0,
                    ..change(core)
                },
                Allowed,
            ),
            (
                "a core job resized",
                Modification {
                    min_nodes: 4,
                    ..change(core)
                },
                Access("changes the node count of an elastic job"),
            ),
            (
                "a core job's requeue turned off",
                Modification {
                    requeue: 0,
                    ..change(core)
                },
                Access("turns requeue off"),
            ),
            (
                "a core job's tag edited",
                Modification {
                    admin_comment: Some(b"x"),
                    ..change(core)
                },
                Access("edits the admin comment"),
            ),
            // The daemon and root may do all of it.
            (
                "a core job released by the daemon",
                Modification {
                    uid: 990,
                    priority: INFINITE,
                    ..change(core)
                },
                Allowed,
            ),
            (
                "a core job moved by root",
                Modification {
                    uid: 0,
                    partition: Some(b"batch"),
                    ..change(core)
                },
                Allowed,
            ),
            // Plain jobs: anything but planting the tag.
            (
                "a plain job moved and released",
                Modification {
                    partition: Some(b"batch"),
                    priority: INFINITE,
                    ..change(plain)
                },
                Allowed,
            ),
            (
                "a core job pinned by its user",
                Modification {
                    req_nodes: Some(b"n1,n2"),
                    ..change(core)
                },
                Access("changes ReqNodeList of an elastic job (bftrainerd pins it"),
            ),
            (
                "a core job's node list cleared by its user",
                Modification {
                    req_nodes: Some(b""),
                    ..change(core)
                },
                Access("changes ReqNodeList"),
            ),
            (
                "a core job's excluded nodes changed by its user",
                Modification {
                    exc_nodes: Some(b"n3"),
                    ..change(core)
                },
                Access("changes ExcNodeList of an elastic job"),
            ),
            (
                "a core job renamed (bftrainerd does not go by core jobs' names)",
                Modification {
                    others: vec!["Name", "TimeLimit"],
                    ..change(core)
                },
                Allowed,
            ),
            (
                "a core job pinned by the daemon",
                Modification {
                    uid: 990,
                    req_nodes: Some(b"n1"),
                    ..change(core)
                },
                Allowed,
            ),
            (
                "a plain job given the tag",
                Modification {
                    admin_comment: Some(b"bftrainer:v1 1:1"),
                    ..change(plain)
                },
                Access("sets bftrainer's tag"),
            ),
            (
                "a job without an admin comment",
                Modification {
                    current_admin_comment: None,
                    ..change(plain)
                },
                Allowed,
            ),
        ];
        for (what, m, want) in cases {
            match (&want, modify(&p, &m)) {
                (Allowed, Ok(e)) if e.is_none() => {}
                (Partition, Err(ModifyDenied::Partition)) => {}
                (Access(part), Err(ModifyDenied::Access(why))) if why.contains(*part) => {}
                (_, got) => panic!("{what}: expected {want:?}, got {got:?}"),
            }
        }
    }

    /// Holds that others than bftrainerd place on a core job are written where
    /// bftrainerd reads them; bftrainerd's own (marked with the job's tag) are not.
    #[test]
    fn holds_are_recorded_for_bftrainerd() {
        let p = pol("");
        let core: &'static [u8] = b"bftrainer:v1 2:4,role=core";
        let held: &'static [u8] = b"bftrainer:v1 2:4,role=core,hold=admin";
        let by = |uid: u32, current: &'static [u8], priority: u32| Modification {
            uid,
            owner: 1000,
            priority,
            alloc_sid: if priority == 0 { 0 } else { NO_VAL },
            ..change(current)
        };
        let admin_held = Edit {
            admin_comment: Some("bftrainer:v1 2:4,role=core,hold=admin".into()),
            ..Edit::default()
        };
        let handed_back = Edit {
            admin_comment: Some("bftrainer:v1 2:4,role=core".into()),
            keep_held: true,
            ..Edit::default()
        };
        let owner_held = Edit {
            comment: Some(spec::owner_hold_note()),
            ..Edit::default()
        };
        let owner_lifted = Edit {
            comment: Some(
                "bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it".into(),
            ),
            keep_held: true,
            ..Edit::default()
        };
        let operator = |m: Modification<'static>| Modification {
            operator: true,
            ..m
        };
        let marked = |m: Modification<'static>, tag: &'static [u8]| Modification {
            admin_comment: Some(tag),
            ..m
        };
        let cases: Vec<(&str, Modification<'static>, Result<Edit, &str>)> = vec![
            // An administrator's `scontrol hold` / `uhold` (root, SlurmUser, daemon_user).
            ("root holds", by(0, core, 0), Ok(admin_held.clone())),
            (
                "root uholds",
                Modification {
                    alloc_sid: 2,
                    ..by(0, core, 0)
                },
                Ok(admin_held.clone()),
            ),
            (
                "daemon_user holds by hand",
                by(990, core, 0),
                Ok(admin_held.clone()),
            ),
            ("root holds again", by(0, held, 0), Ok(Edit::default())),
            // Its release lifts the hold; the job waits for bftrainerd.
            (
                "root releases its hold",
                by(0, held, INFINITE),
                Ok(handed_back),
            ),
            // A release of a job no administrator holds is Slurm's as before.
            (
                "root releases a waiting job",
                by(0, core, INFINITE),
                Ok(Edit::default()),
            ),
            // bftrainerd's own hold and release carry the tag it read: nothing recorded.
            (
                "bftrainerd holds",
                marked(by(0, core, 0), core),
                Ok(Edit::default()),
            ),
            (
                "bftrainerd releases",
                marked(by(0, core, INFINITE), core),
                Ok(Edit::default()),
            ),
            (
                "bftrainerd holds a held job",
                marked(by(0, held, 0), held),
                Ok(Edit::default()),
            ),
            // bftrainerd's release read before an administrator's hold, or despite it.
            (
                "bftrainerd releases a job held since it looked",
                marked(by(0, held, INFINITE), core),
                Err("releases an elastic job an administrator holds"),
            ),
            (
                "bftrainerd releases a held job",
                marked(by(0, held, INFINITE), held),
                Err("releases an elastic job an administrator holds"),
            ),
            // The owner: a hold becomes the note in the Comment, a release lifts it only.
            ("the owner holds", by(1000, core, 0), Ok(owner_held.clone())),
            (
                "the owner uholds",
                Modification {
                    alloc_sid: 2,
                    ..by(1000, core, 0)
                },
                Ok(owner_held),
            ),
            (
                "the owner releases",
                by(1000, core, INFINITE),
                Ok(owner_lifted.clone()),
            ),
            (
                "the owner releases a job an administrator holds (that hold stays)",
                by(1000, held, INFINITE),
                Ok(owner_lifted),
            ),
            (
                "the owner holds and sets their own comment",
                Modification {
                    comment: Some(b"mine"),
                    ..by(1000, core, 0)
                },
                Ok(Edit::default()),
            ),
            (
                "the owner sets a priority",
                by(1000, core, 5),
                Err("releases or reprioritises an elastic job"),
            ),
            // Nobody else may write the tag, with or without the key.
            (
                "the owner writes the hold key",
                marked(by(1000, core, 0), held),
                Err("edits the admin comment"),
            ),
            (
                "the owner rewrites a held tag",
                marked(by(1000, held, INFINITE), core),
                Err("edits the admin comment"),
            ),
            (
                "a user plants a held tag on a plain job",
                marked(by(1000, b"", 0), held),
                Err("sets bftrainer's tag on a job"),
            ),
            // A Slurm operator (AdminLevel Operator or Administrator): an administrator.
            (
                "an operator holds",
                operator(by(1001, core, 0)),
                Ok(admin_held.clone()),
            ),
            (
                "an operator releases its hold",
                operator(by(1001, held, INFINITE)),
                Ok(Edit {
                    admin_comment: Some("bftrainer:v1 2:4,role=core".into()),
                    keep_held: true,
                    ..Edit::default()
                }),
            ),
            (
                "an operator releases a waiting job",
                operator(by(1001, core, INFINITE)),
                Ok(Edit::default()),
            ),
            // Another user Slurm lets update the job (an account coordinator): Slurm's
            // hold only, and no release.
            (
                "a coordinator holds",
                by(1001, core, 0),
                Ok(Edit::default()),
            ),
            (
                "a coordinator releases",
                by(1001, core, INFINITE),
                Err("releases or reprioritises an elastic job"),
            ),
        ];
        for (what, m, want) in cases {
            match (modify(&p, &m), want) {
                (Ok(got), Ok(want)) if got == want => {}
                (Err(ModifyDenied::Access(why)), Err(part)) if why.contains(part) => {}
                (got, want) => panic!("{what}: expected {want:?}, got {got:?}"),
            }
        }
        // A satellite's tag never takes the key, whoever holds it.
        let sat: &'static [u8] = b"bftrainer:v1 1:1,role=satellite,parent=7";
        assert_eq!(modify(&p, &by(0, sat, 0)), Ok(Edit::default()));
        assert_eq!(modify(&p, &by(1000, sat, 0)), Ok(Edit::default()));
    }

    #[test]
    fn unreadable_job_records_are_for_privileged_uids_only() {
        let p = pol("");
        assert_eq!(modify_unreadable(&p, 0), Ok(()));
        assert_eq!(modify_unreadable(&p, 990), Ok(()));
        let Err(ModifyDenied::Access(why)) = modify_unreadable(&p, 1000) else {
            panic!("an unprivileged update of an unreadable job went through");
        };
        assert!(why.starts_with("cannot be checked"), "{why}");
    }

    /// Satellites are bftrainerd's: their owner may hold (`scontrol hold`, `uhold`) and
    /// release them and nothing else; each refusal names what the update sets.
    #[test]
    fn satellites_may_only_be_held_or_released() {
        let p = pol("satellite_partition = \"elastic-sat\"");
        let sat: &'static [u8] = b"bftrainer:v1 1:1,role=satellite,parent=7";
        let allowed = [
            ("nothing", change(sat)),
            (
                "scontrol hold",
                Modification {
                    priority: 0,
                    alloc_sid: 0,
                    ..change(sat)
                },
            ),
            (
                "scontrol uhold",
                Modification {
                    priority: 0,
                    alloc_sid: 2,
                    ..change(sat)
                },
            ),
            (
                "scontrol release",
                Modification {
                    priority: INFINITE,
                    ..change(sat)
                },
            ),
            (
                "anything, by the daemon",
                Modification {
                    uid: 990,
                    partition: Some(b"elastic"),
                    requeue: 1,
                    others: vec!["Name"],
                    ..change(sat)
                },
            ),
            (
                "anything, by root",
                Modification {
                    uid: 0,
                    req_nodes: Some(b""),
                    ..change(sat)
                },
            ),
        ];
        for (what, m) in allowed {
            assert_eq!(modify(&p, &m), Ok(Edit::default()), "{what}");
        }
        let refused = [
            (
                Modification {
                    others: vec!["Name"],
                    ..change(sat)
                },
                "Name",
            ),
            (
                Modification {
                    partition: Some(b"elastic"),
                    ..change(sat)
                },
                "Partition",
            ),
            (
                Modification {
                    partition: Some(b"elastic-sat"),
                    ..change(sat)
                },
                "Partition",
            ),
            (
                Modification {
                    req_nodes: Some(b""),
                    ..change(sat)
                },
                "ReqNodeList",
            ),
            (
                Modification {
                    exc_nodes: Some(b"n1"),
                    ..change(sat)
                },
                "ExcNodeList",
            ),
            (
                Modification {
                    requeue: 1,
                    ..change(sat)
                },
                "Requeue",
            ),
            (
                Modification {
                    requeue: 0,
                    ..change(sat)
                },
                "Requeue",
            ),
            (
                Modification {
                    min_nodes: 2,
                    ..change(sat)
                },
                "NumNodes",
            ),
            (
                Modification {
                    priority: 5,
                    ..change(sat)
                },
                "Priority",
            ),
            (
                Modification {
                    alloc_sid: 2,
                    ..change(sat)
                },
                "AllocSid",
            ),
            (
                Modification {
                    admin_comment: Some(b"x"),
                    ..change(sat)
                },
                "AdminComment",
            ),
            (
                Modification {
                    others: vec!["Account", "QOS", "TimeLimit"],
                    ..change(sat)
                },
                "Account, QOS, TimeLimit",
            ),
            // A hold that also changes something else is refused as a whole.
            (
                Modification {
                    priority: 0,
                    alloc_sid: 0,
                    others: vec!["Comment"],
                    ..change(sat)
                },
                "Comment",
            ),
        ];
        for (m, field) in refused {
            let Err(ModifyDenied::Access(why)) = modify(&p, &m) else {
                panic!("{m:?} not refused");
            };
            assert_eq!(
                why,
                format!(
                    "sets {field} on a satellite of job 7; satellites are bftrainerd's: \
                     you may cancel or hold them, nothing else"
                )
            );
        }
    }
}
