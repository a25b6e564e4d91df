//! The elastic-spec grammar `MIN[:MAX][,key=value...]`, written once and shared by the
//! SPANK plugin (command line), the job_submit plugin (slurmctld) and the daemon.
//!
//! ```text
//! spec   := bounds ( "," pair )*
//! bounds := MIN [ ":" MAX ]          whole numbers, 1 <= MIN <= MAX <= 4294967295
//! pair   := key "=" value            each key at most once
//! key    := up | down | profile | batch | lr | role | parent
//! ```
//!
//! `batch=MIN:MAX` (or `batch=G`) is the global batch range bftrainerd may choose from
//! (Effective Elastic Scaling), `lr=linear|sqrt|none` how the workers' learning rate
//! follows a change of it. The batch bftrainerd chose rides on the core job's tag as
//! `,batch_now=G` after `role=core` ([`with_batch_now`]); users cannot write it.
//!
//! The value is plain ASCII without spaces and at most [`MAX_SPEC_LEN`] bytes. Parsing
//! never panics and never allocates more than a small multiple of the input (checked by
//! the property tests over millions of generated inputs). [`ElasticSpec`]'s `Display` is
//! the canonical form: `parse(spec.to_string()) == spec`.

use std::fmt;

/// Longest accepted value, in bytes. Real specs are < 80 bytes; the limit keeps a
/// hostile 100 kB argument from costing slurmctld anything but a length check.
pub const MAX_SPEC_LEN: usize = 256;

/// Longest rescale cost accepted for `up=`/`down=`, in seconds (one day).
pub const MAX_RESCALE_SECONDS: u32 = 86_400;

/// Longest profile name.
pub const MAX_PROFILE_LEN: usize = 64;

/// The usage hint appended to bound errors.
pub const USAGE: &str = "expected --elastic=MIN[:MAX] with 1 <= MIN <= MAX";

/// Keys of the `key=value` part, in canonical order. New keys go here and in
/// [`parse_pair`]; everything else (messages, canonical output) follows.
pub const KEYS: [&str; 7] = ["up", "down", "profile", "batch", "lr", "role", "parent"];

/// Largest global batch accepted in `batch=` (2^24 samples per step).
pub const MAX_BATCH: u32 = 1 << 24;

/// How the learning rate follows the global batch when bftrainerd changes it, from the
/// job's base batch G0 (the one its script gives the sampler) to G.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LrRule {
    /// lr unchanged.
    #[default]
    None,
    /// lr * G / G0 (Goyal et al. 2017).
    Linear,
    /// lr * sqrt(G / G0) (Krizhevsky 2014; Adam-style optimisers).
    Sqrt,
}

impl LrRule {
    pub fn as_str(self) -> &'static str {
        match self {
            LrRule::None => "none",
            LrRule::Linear => "linear",
            LrRule::Sqrt => "sqrt",
        }
    }
}

/// Name under which the request travels in the job's `spank_job_env`
/// (set by the SPANK plugin with `spank_job_control_setenv`, read by job_submit).
pub const JOB_ENV_NAME: &str = "BFTRAINER_ELASTIC";

/// sbatch copies each SPANK job-environment entry into the job's own environment
/// under `SLURM_SPANK_<name>`; stepd reads the request from there for API-submitted jobs.
pub const JOB_ENV_COPY: &str = "SLURM_SPANK_BFTRAINER_ELASTIC";

/// Slurm forwards a SPANK option to the remote side as the environment variable
/// `_SLURM_SPANK_OPTION_<plugin>_<option>`; this is ours without the option name.
pub const OPTION_ENV_PREFIX: &str = "_SLURM_SPANK_OPTION_bftrainer_";

/// Prefix that marks bftrainer's machine-readable tag in a job's admin comment.
pub const TAG_PREFIX: &str = "bftrainer:v1 ";

/// Environment that the SPANK plugin exports to the tasks of an elastic job, for `bft-run`.
pub mod env {
    /// Canonical spec, e.g. `2:8,up=30`.
    pub const SPEC: &str = "BFT_ELASTIC";
    pub const MIN: &str = "BFT_ELASTIC_MIN";
    /// Absent when the request gave no MAX (the daemon caps by policy and cluster size).
    pub const MAX: &str = "BFT_ELASTIC_MAX";
    /// `core` or `satellite`.
    pub const ROLE: &str = "BFT_ROLE";
    /// The core job's id: the job itself for a core job, `parent=` for a satellite.
    pub const PARENT_JOB_ID: &str = "BFT_PARENT_JOB_ID";
    pub const UP_SECONDS: &str = "BFT_UP_SECONDS";
    pub const DOWN_SECONDS: &str = "BFT_DOWN_SECONDS";
    pub const PROFILE: &str = "BFT_PROFILE";
    /// The `batch=` range; absent without one.
    pub const BATCH_MIN: &str = "BFT_BATCH_MIN";
    pub const BATCH_MAX: &str = "BFT_BATCH_MAX";
    /// The `lr=` rule (`linear`, `sqrt` or `none`); absent without one.
    pub const LR_RULE: &str = "BFT_LR_RULE";
}

/// Which part of an elastic job a Slurm job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// The job the user submitted: holds the MIN-node core allocation.
    #[default]
    Core,
    /// One extra node lent to a core job; only bftrainerd submits these.
    Satellite,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Core => "core",
            Role::Satellite => "satellite",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed, valid elastic request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ElasticSpec {
    /// Fewest nodes the job runs on (its core allocation), >= 1.
    pub min: u32,
    /// Most nodes it can use, >= min; `None` when the user left it to the policy.
    pub max: Option<u32>,
    /// Cost of growing, in seconds (BFTrainer's Tup).
    pub up: Option<u32>,
    /// Cost of shrinking, in seconds (BFTrainer's Tdw).
    pub down: Option<u32>,
    /// Throughput curve name in the admin's profile directory.
    pub profile: Option<String>,
    /// Global batch range `(min, max)` bftrainerd chooses from; `None`: the job's own.
    pub batch: Option<(u32, u32)>,
    /// Learning-rate rule for batch changes; `None` when not given (means `none`).
    pub lr: Option<LrRule>,
    pub role: Role,
    /// Core job of a satellite; present exactly when `role == Satellite`.
    pub parent: Option<u32>,
}

impl ElasticSpec {
    /// The upper bound, with `cap` standing in for an open MAX.
    pub fn max_or(&self, cap: u32) -> u32 {
        self.max.unwrap_or(cap)
    }

    /// The machine-readable admin-comment tag, e.g. `bftrainer:v1 2:4,role=core`.
    /// The role is always written so that a reader never has to default it.
    pub fn to_tag(&self) -> String {
        let mut s = format!("{TAG_PREFIX}{self}");
        if self.role == Role::Core {
            s.push_str(",role=core");
        }
        s
    }
}

impl fmt::Display for ElasticSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.min)?;
        if let Some(max) = self.max {
            write!(f, ":{max}")?;
        }
        if let Some(v) = self.up {
            write!(f, ",up={v}")?;
        }
        if let Some(v) = self.down {
            write!(f, ",down={v}")?;
        }
        if let Some(v) = &self.profile {
            write!(f, ",profile={v}")?;
        }
        match self.batch {
            Some((a, b)) if a == b => write!(f, ",batch={a}")?,
            Some((a, b)) => write!(f, ",batch={a}:{b}")?,
            None => {}
        }
        if let Some(v) = self.lr {
            write!(f, ",lr={}", v.as_str())?;
        }
        if self.role == Role::Satellite {
            write!(f, ",role=satellite")?;
        }
        if let Some(v) = self.parent {
            write!(f, ",parent={v}")?;
        }
        Ok(())
    }
}

/// A rejected `--elastic` value: what was given (shortened when long) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--elastic={shown}: {kind}")]
pub struct SpecError {
    /// The value as shown to the user: lossy UTF-8, control bytes escaped, at most
    /// 40 characters.
    pub shown: String,
    pub kind: SpecErrorKind,
}

/// What exactly is wrong; each message says what is allowed instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecErrorKind {
    #[error("the value is empty; {USAGE}, e.g. --elastic=2:8")]
    Empty,
    #[error("the value is {0} bytes long; at most {MAX_SPEC_LEN} bytes are allowed")]
    TooLong(usize),
    #[error("byte {offset} (0x{byte:02x}) is not printable ASCII; the value may hold only letters, digits and , : = . _ -")]
    BadByte { offset: usize, byte: u8 },
    #[error("{what} is empty; {USAGE}")]
    MissingBound { what: &'static str },
    #[error("{what} ({text}) is negative; {USAGE}")]
    Negative { what: &'static str, text: String },
    #[error("{what} ({text}) is not a whole number; {USAGE}")]
    NotANumber { what: &'static str, text: String },
    #[error("{what} ({text}) is too large; the most is {max}", max = u32::MAX)]
    TooLarge { what: &'static str, text: String },
    #[error("{what} (0) must be at least 1; {USAGE}")]
    Zero { what: &'static str },
    #[error("MAX ({max}) is smaller than MIN ({min}); {USAGE}")]
    MaxBelowMin { min: u32, max: u32 },
    #[error("'{0}' is not a key=value pair; after MIN[:MAX] come ,key=value items with keys {keys}", keys = KEYS.join(", "))]
    NotAPair(String),
    #[error("unknown key '{0}'; known keys: {keys}", keys = KEYS.join(", "))]
    UnknownKey(String),
    #[error("key '{0}' is given twice; give each key at most once")]
    DuplicateKey(&'static str),
    #[error("{0}= has an empty value; {1}")]
    EmptyValue(&'static str, &'static str),
    #[error("{key}={value}: {expected}")]
    BadValue {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("role=satellite needs parent=JOBID (the core job it serves)")]
    SatelliteWithoutParent,
    #[error("parent= is only for role=satellite")]
    ParentWithoutSatellite,
    #[error("batch={min}:{max}: MIN ({min}) is larger than MAX ({max}); {BATCH_EXPECTED}")]
    BatchMaxBelowMin { min: u32, max: u32 },
    #[error("lr= needs batch=MIN:MAX: the learning-rate rule applies when bftrainerd changes the global batch")]
    LrWithoutBatch,
}

const UP_EXPECTED: &str = "expected whole seconds from 0 to 86400";
const PROFILE_EXPECTED: &str =
    "expected a profile name of 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'";
const ROLE_EXPECTED: &str = "expected role=core or role=satellite";
const PARENT_EXPECTED: &str = "expected a job id from 1 to 4294967295";
const BATCH_EXPECTED: &str =
    "expected batch=MIN:MAX (or batch=G), whole numbers of samples per step with 1 <= MIN <= MAX <= 16777216";
const LR_EXPECTED: &str = "expected lr=linear, lr=sqrt or lr=none";

/// Parses raw bytes (what a C caller hands over). Non-ASCII input is an error, not a panic.
pub fn parse_bytes(input: &[u8]) -> Result<ElasticSpec, SpecError> {
    parse_inner(input).map_err(|kind| SpecError {
        shown: shown(input),
        kind,
    })
}

/// Parses a `--elastic` value.
pub fn parse(input: &str) -> Result<ElasticSpec, SpecError> {
    parse_bytes(input.as_bytes())
}

/// Parses an admin-comment tag written by [`ElasticSpec::to_tag`]. `None` when the
/// comment is not a bftrainer tag at all.
/// A core tag may end with [`ADMIN_HOLD`], which this ignores (see [`site_hold`]).
/// Other SPANK plugins' options that a core tag carries are skipped
/// ([`crate::spankopt::from_tag`] reads them).
pub fn parse_tag(comment: &str) -> Option<Result<ElasticSpec, SpecError>> {
    let comment = crate::spankopt::split(comment).0;
    let bare = split_admin_hold(&comment).0;
    split_batch_now(bare).0.strip_prefix(TAG_PREFIX).map(parse)
}

/// What bftrainerd appends to a running core job's tag, after `role=core`, to hand
/// the global batch it chose to the job's bft-run: `...,role=core,batch_now=G`. Only in
/// tags (only root and bftrainerd write admin comments): `--elastic` refuses the key.
pub const BATCH_NOW: &str = ",batch_now=";

/// Splits a decided batch off a core tag (without [`ADMIN_HOLD`]): `(tag without it,
/// the batch)`. Only a value of 1..=[`MAX_BATCH`] right after `,role=core` counts.
pub fn split_batch_now(tag: &str) -> (&str, Option<u32>) {
    if let Some(i) = tag.rfind(BATCH_NOW) {
        let (rest, value) = (&tag[..i], &tag[i + BATCH_NOW.len()..]);
        if rest.starts_with(TAG_PREFIX) && rest.ends_with(",role=core") {
            if let Some(g) = digits(value).filter(|g| (1..=u64::from(MAX_BATCH)).contains(g)) {
                return (rest, Some(g as u32));
            }
        }
    }
    (tag, None)
}

/// The global batch bftrainerd decided for a core job, from its admin comment.
pub fn batch_now(admin_comment: &str) -> Option<u32> {
    split_batch_now(split_admin_hold(admin_comment).0).1
}

/// The admin comment of a core job with its decided batch set to `g` (`None`: removed),
/// keeping an administrator's hold. `None` when `admin_comment` is not a core tag.
pub fn with_batch_now(admin_comment: &str, g: Option<u32>) -> Option<String> {
    let (bare, held) = split_admin_hold(admin_comment);
    let (tag, _) = split_batch_now(bare);
    if !tag.starts_with(TAG_PREFIX) || !tag.ends_with(",role=core") {
        return None;
    }
    let mut out = tag.to_string();
    if let Some(g) = g {
        out.push_str(&format!("{BATCH_NOW}{g}"));
    }
    if held {
        out.push_str(ADMIN_HOLD);
    }
    Some(out)
}

/// A hold that someone other than bftrainerd placed on a waiting core job, which
/// bftrainerd honours: it does not admit the job until the hold is lifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SiteHold {
    /// `scontrol hold` by root, SlurmUser or `daemon_user` (not bftrainerd itself):
    /// job_submit/bftrainer appends [`ADMIN_HOLD`] to the core job's tag.
    Admin,
    /// `scontrol hold` by the job's owner: job_submit/bftrainer sets the job's Comment
    /// to a note starting with [`OWNER_HOLD_NOTE`] (owners may not write admin comments).
    Owner,
    /// `scontrol requeuehold` of a running core job (by its owner or an operator: Slurm
    /// does not say who, and gives both the owner's hold, `JobHeldUser`), or a requeue
    /// Slurm held by itself (a failed launch): bftrainerd, which sees the job come back
    /// held though it did not requeue it, sets the job's Comment to a note starting with
    /// [`REQUEUE_HOLD_NOTE`]. The owner's `scontrol release` lifts it, as in Slurm.
    Requeue,
}

impl SiteHold {
    /// What `bftrainer jobs` and the log say about a job held so.
    pub fn describe(self) -> &'static str {
        match self {
            SiteHold::Admin => {
                "held by an administrator (scontrol hold); `scontrol release` hands it back to bftrainerd"
            }
            SiteHold::Owner => {
                "held by its owner (scontrol hold); `scontrol release` by the owner hands it back to bftrainerd"
            }
            SiteHold::Requeue => {
                "held by a requeue with hold (scontrol requeuehold); `scontrol release` by the owner hands it back to bftrainerd"
            }
        }
    }
}

/// The key job_submit/bftrainer appends to a core job's tag (`...,role=core,hold=admin`)
/// when a privileged user holds it. Only in tags, after `role=core`: `--elastic` refuses
/// it (a user cannot write it), and satellites' tags never carry it.
pub const ADMIN_HOLD: &str = ",hold=admin";

/// Start of the Comment job_submit/bftrainer gives a core job its owner holds.
pub const OWNER_HOLD_NOTE: &str = "bftrainer: held by its owner";

/// The Comment of a core job its owner held.
pub fn owner_hold_note() -> String {
    format!("{OWNER_HOLD_NOTE}; `scontrol release` hands it back to bftrainerd")
}

/// Start of the Comment bftrainerd gives a core job that came back from a requeue held,
/// a requeue it did not ask for ([`SiteHold::Requeue`]).
pub const REQUEUE_HOLD_NOTE: &str = "bftrainer: held by scontrol requeuehold";

/// The Comment of a core job requeued held by someone else than bftrainerd.
pub fn requeue_hold_note() -> String {
    format!("{REQUEUE_HOLD_NOTE}; `scontrol release` by its owner hands it back to bftrainerd")
}

/// Start of the Comment bftrainerd gives a core job as it admits it (releases it onto
/// the nodes it pinned): [`admitted_note`].
pub const ADMITTED_NOTE: &str = "bftrainer: admitted by bftrainerd for run ";

/// The Comment bftrainerd gives a core job it admits when Slurm's restart count of the
/// job is `restarts`: bft-run, starting as the job's script, finds it there when this
/// start is bftrainerd's ([`admitted_run`]), and otherwise (Slurm requeued the job and
/// started it again on its own, as while bftrainerd is down) requeues the job held
/// with [`UNADMITTED_NOTE`] for bftrainerd to admit.
pub fn admitted_note(restarts: u16) -> String {
    format!("{ADMITTED_NOTE}{restarts}; bft-run replaces this note once it runs")
}

/// The run (restart count) an [`admitted_note`] names, if `comment` is one.
pub fn admitted_run(comment: &str) -> Option<u16> {
    let rest = comment.strip_prefix(ADMITTED_NOTE)?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Start of the Comment bft-run gives a core job that Slurm started without bftrainerd's
/// admission, before it requeues the job held: bftrainerd takes such a job for one
/// waiting to be admitted, not for a site's requeue with hold ([`SiteHold::Requeue`]).
/// A user who writes it only has their own held job admitted, as their `scontrol
/// release` would.
pub const UNADMITTED_NOTE: &str = "bftrainer: started without bftrainerd's admission";

/// The Comment spank/bftrainer (or bft-run) writes with a requeue with hold of a start
/// bftrainerd did not admit (see [`admitted_note`]).
pub fn unadmitted_note(restarts: u16) -> String {
    format!(
        "{UNADMITTED_NOTE} (run {restarts}: requeued by Slurm while bftrainerd was away?); requeued held until bftrainerd admits it"
    )
}

/// Whether a job that Slurm has just started is an elastic core job started without
/// bftrainerd's admission: its admin comment tags it a core (only the plugin and
/// privileged uids write tags), and its Comment holds neither bftrainerd's
/// [`admitted_note`] for this run (`restarts`, Slurm's restart count) nor a
/// [`RunComment`](crate::runtime::RunComment) that bft-run wrote during this same
/// start (`start`, the job's start time). Slurm starts a requeued job again by itself
/// once its BeginTime passes, also while bftrainerd is down (no plugin is called on a
/// requeue), on nodes bftrainerd did not choose now; spank/bftrainer (before the batch
/// script runs) and bft-run (as the script) requeue such a start held with
/// [`unadmitted_note`]. Plain jobs and satellites are never unadmitted. The Comment is
/// the owner's to write: writing an admission note by hand only lets their own job run
/// where Slurm put it (bftrainerd adopts a running core that carries one, as it would
/// after losing its journal), on nodes of its own elastic partition that Slurm preempts
/// for regular jobs as ever. Only a job still `running` is judged: one requeued
/// since this start began (a site's `scontrol requeuehold` racing the launch) has a new
/// restart count, and its Comment is bftrainerd's to read as the site left it.
pub fn unadmitted(
    admin_comment: Option<&str>,
    comment: Option<&str>,
    restarts: u16,
    start: Option<i64>,
    running: bool,
) -> bool {
    if !running {
        return false;
    }
    let core = admin_comment
        .and_then(parse_tag)
        .is_some_and(|t| t.is_ok_and(|s| s.role == Role::Core));
    let comment = comment.unwrap_or("");
    let admitted = admitted_run(comment) == Some(restarts)
        || crate::runtime::RunComment::parse(comment)
            .is_some_and(|c| c.start != 0 && Some(c.start) == start);
    core && !admitted
}

/// The Comment of a core job waiting for bftrainerd (set at submission when the user
/// gave none, and again when its owner lifts their hold).
pub fn waiting_note(s: &ElasticSpec) -> String {
    format!(
        "bftrainer: elastic job ({}-{} nodes) waiting for bftrainerd to admit it",
        s.min,
        s.max.map(|m| m.to_string()).unwrap_or_else(|| "any".into())
    )
}

/// Splits an admin hold off a tag's text: `(tag without it, held)`. Only a core tag
/// (one that ends `,role=core`, or `,role=core,batch_now=G`, once the key is gone) can
/// carry it.
pub fn split_admin_hold(comment: &str) -> (&str, bool) {
    match comment.strip_suffix(ADMIN_HOLD) {
        Some(rest)
            if rest.starts_with(TAG_PREFIX) && split_batch_now(rest).0.ends_with(",role=core") =>
        {
            (rest, true)
        }
        _ => (comment, false),
    }
}

/// The site hold a job's admin comment and Comment record, if any: see [`SiteHold`].
/// Only meaningful for a waiting core job (Slurm ignores holds of running jobs).
pub fn site_hold(admin_comment: Option<&str>, comment: Option<&str>) -> Option<SiteHold> {
    if admin_comment.is_some_and(|c| split_admin_hold(c).1) {
        return Some(SiteHold::Admin);
    }
    if comment.is_some_and(|c| c.starts_with(OWNER_HOLD_NOTE)) {
        return Some(SiteHold::Owner);
    }
    if comment.is_some_and(|c| c.starts_with(REQUEUE_HOLD_NOTE)) {
        return Some(SiteHold::Requeue);
    }
    None
}

/// Whether an admin comment claims to be a bftrainer tag (valid or not). Used to stop
/// users from planting one: the prefix is matched without its trailing space.
pub fn looks_like_tag(comment: &str) -> bool {
    // Compared in place, without a lowercased copy (bftrainerd asks this of every job
    // with an admin comment, every poll). The prefix is lowercase ASCII.
    let prefix = TAG_PREFIX.trim_end().as_bytes();
    // Tags as written (the prefix exactly, at the start) first: one comparison.
    if comment.as_bytes().starts_with(prefix) {
        return true;
    }
    comment
        .trim_start()
        .as_bytes()
        .get(..prefix.len())
        .is_some_and(|b| b.eq_ignore_ascii_case(prefix))
}

fn shown(input: &[u8]) -> String {
    const LIMIT: usize = 40;
    let mut out = String::new();
    for (n, c) in String::from_utf8_lossy(input).chars().enumerate() {
        if n == LIMIT {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_inner(input: &[u8]) -> Result<ElasticSpec, SpecErrorKind> {
    if input.is_empty() {
        return Err(SpecErrorKind::Empty);
    }
    if input.len() > MAX_SPEC_LEN {
        return Err(SpecErrorKind::TooLong(input.len()));
    }
    if let Some(offset) = input.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(SpecErrorKind::BadByte {
            offset,
            byte: input[offset],
        });
    }
    // Only ASCII from here on, so this cannot fail; the error arm keeps it panic-free.
    let text = std::str::from_utf8(input).map_err(|e| SpecErrorKind::BadByte {
        offset: e.valid_up_to(),
        byte: input[e.valid_up_to()],
    })?;

    let mut items = text.split(',');
    let bounds = items.next().unwrap_or("");
    let (min_text, max_text) = match bounds.split_once(':') {
        Some((a, b)) => (a, Some(b)),
        None => (bounds, None),
    };
    let min = bound("MIN", min_text)?;
    let max = match max_text {
        Some(t) => {
            let max = bound("MAX", t)?;
            if max < min {
                return Err(SpecErrorKind::MaxBelowMin { min, max });
            }
            Some(max)
        }
        None => None,
    };
    let mut spec = ElasticSpec {
        min,
        max,
        ..ElasticSpec::default()
    };
    let mut role_given = false;
    for item in items {
        let Some((key, value)) = item.split_once('=') else {
            return Err(SpecErrorKind::NotAPair(item.to_string()));
        };
        parse_pair(&mut spec, &mut role_given, key, value)?;
    }
    match (spec.role, spec.parent) {
        (Role::Satellite, None) => Err(SpecErrorKind::SatelliteWithoutParent),
        (Role::Core, Some(_)) => Err(SpecErrorKind::ParentWithoutSatellite),
        _ if spec.lr.is_some() && spec.batch.is_none() => Err(SpecErrorKind::LrWithoutBatch),
        _ => Ok(spec),
    }
}

fn parse_pair(
    spec: &mut ElasticSpec,
    role_given: &mut bool,
    key: &str,
    value: &str,
) -> Result<(), SpecErrorKind> {
    let Some(&key) = KEYS.iter().find(|k| **k == key) else {
        return Err(SpecErrorKind::UnknownKey(key.to_string()));
    };
    let expected = match key {
        "up" | "down" => UP_EXPECTED,
        "profile" => PROFILE_EXPECTED,
        "role" => ROLE_EXPECTED,
        "batch" => BATCH_EXPECTED,
        "lr" => LR_EXPECTED,
        _ => PARENT_EXPECTED,
    };
    if value.is_empty() {
        return Err(SpecErrorKind::EmptyValue(key, expected));
    }
    let bad = || SpecErrorKind::BadValue {
        key,
        value: value.to_string(),
        expected,
    };
    let duplicate = |given: bool| {
        if given {
            Err(SpecErrorKind::DuplicateKey(key))
        } else {
            Ok(())
        }
    };
    match key {
        "up" | "down" => {
            let slot = if key == "up" {
                &mut spec.up
            } else {
                &mut spec.down
            };
            duplicate(slot.is_some())?;
            let secs = digits(value).ok_or_else(bad)?;
            if secs > u64::from(MAX_RESCALE_SECONDS) {
                return Err(bad());
            }
            *slot = Some(secs as u32);
        }
        "profile" => {
            duplicate(spec.profile.is_some())?;
            let ok = value.len() <= MAX_PROFILE_LEN
                && !value.starts_with('.')
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(bad());
            }
            spec.profile = Some(value.to_string());
        }
        "batch" => {
            duplicate(spec.batch.is_some())?;
            let (a, b) = value.split_once(':').unwrap_or((value, value));
            let one = |t: &str| match digits(t) {
                Some(v) if (1..=u64::from(MAX_BATCH)).contains(&v) => Ok(v as u32),
                _ => Err(bad()),
            };
            let (min, max) = (one(a)?, one(b)?);
            if max < min {
                return Err(SpecErrorKind::BatchMaxBelowMin { min, max });
            }
            spec.batch = Some((min, max));
        }
        "lr" => {
            duplicate(spec.lr.is_some())?;
            spec.lr = Some(match value {
                "linear" => LrRule::Linear,
                "sqrt" => LrRule::Sqrt,
                "none" => LrRule::None,
                _ => return Err(bad()),
            });
        }
        "role" => {
            duplicate(*role_given)?;
            *role_given = true;
            spec.role = match value {
                "core" => Role::Core,
                "satellite" => Role::Satellite,
                _ => return Err(bad()),
            };
        }
        _ => {
            duplicate(spec.parent.is_some())?;
            match digits(value) {
                Some(id) if (1..=u64::from(u32::MAX)).contains(&id) => {
                    spec.parent = Some(id as u32)
                }
                _ => return Err(bad()),
            }
        }
    }
    Ok(())
}

/// A MIN or MAX bound: digits only, 1..=u32::MAX.
fn bound(what: &'static str, text: &str) -> Result<u32, SpecErrorKind> {
    if text.is_empty() {
        return Err(SpecErrorKind::MissingBound { what });
    }
    let owned = || text.to_string();
    if text.starts_with('-') && text.len() > 1 && text[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(SpecErrorKind::Negative {
            what,
            text: owned(),
        });
    }
    let Some(v) = digits(text) else {
        return if text.bytes().all(|b| b.is_ascii_digit()) {
            Err(SpecErrorKind::TooLarge {
                what,
                text: owned(),
            })
        } else {
            Err(SpecErrorKind::NotANumber {
                what,
                text: owned(),
            })
        };
    };
    match u32::try_from(v) {
        Ok(0) => Err(SpecErrorKind::Zero { what }),
        Ok(v) => Ok(v),
        Err(_) => Err(SpecErrorKind::TooLarge {
            what,
            text: owned(),
        }),
    }
}

/// Unsigned decimal without sign or spaces; `None` when not all digits or past u64.
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(input: &str) -> String {
        parse(input).unwrap_err().to_string()
    }

    #[test]
    fn admitted_notes_name_their_run_and_nothing_else_does() {
        for r in [0u16, 1, 7, 65535] {
            assert_eq!(admitted_run(&admitted_note(r)), Some(r));
        }
        for c in [
            "",
            "bftrainer: admitted by bftrainerd for run ",
            "bftrainer: admitted by bftrainerd for run x1",
            "bftrainer: admitted by bftrainerd for run 65536",
            " bftrainer: admitted by bftrainerd for run 1",
            "bftrainer-run:v1 coord=h:1 gen=2",
            &unadmitted_note(3),
            &waiting_note(&parse("1:2").unwrap()),
        ] {
            assert_eq!(admitted_run(c), None, "{c:?}");
        }
        assert!(unadmitted_note(3).starts_with(UNADMITTED_NOTE));
        // Not a site hold: bftrainerd admits such a job.
        assert_eq!(site_hold(None, Some(&unadmitted_note(3))), None);
    }

    #[test]
    fn only_a_core_started_without_its_admission_note_is_unadmitted() {
        use crate::runtime::RunComment;
        let core = Some("bftrainer:v1 2:4,role=core");
        let start = Some(1_700_000_000);
        let run = |s: i64| {
            RunComment {
                coord: "h:1".into(),
                run: "ab".into(),
                start: s,
                gen: 2,
                nodes: 3,
                rate: 1.0,
                step: 0.5,
                batch: 0,
                done: false,
                up: 0.0,
                down: 0.0,
            }
            .to_string()
        };
        let ours = run(1_700_000_000);
        let stale = run(1_600_000_000);
        let admitted1 = admitted_note(1);
        // Admitted for this run, or a note of this start's earlier bft-run.
        assert!(!unadmitted(core, Some(&admitted1), 1, start, true));
        assert!(!unadmitted(core, Some(&ours), 1, start, true));
        // Admitted for another run, a previous start's note, none, the user's text,
        // a note without a start time, its own unadmitted note (a second look).
        assert!(unadmitted(core, Some(&admitted1), 2, start, true));
        assert!(unadmitted(core, Some(&stale), 1, start, true));
        assert!(unadmitted(core, None, 0, start, true));
        assert!(unadmitted(core, Some("my run"), 0, start, true));
        assert!(unadmitted(core, Some(&run(0)), 0, Some(0), true));
        assert!(unadmitted(core, Some(&ours), 1, None, true));
        assert!(unadmitted(core, Some(&unadmitted_note(1)), 1, start, true));
        // A job requeued since this start (no longer running) is not judged, whatever
        // its Comment says.
        assert!(!unadmitted(core, Some(&admitted1), 2, start, false));
        assert!(!unadmitted(core, None, 2, start, false));
        // Hostile Comments: an admission note for this run with text before it, one
        // too long for a restart count, binary junk.
        assert!(unadmitted(
            core,
            Some(&format!(" {admitted1}")),
            1,
            start,
            true
        ));
        assert!(unadmitted(
            core,
            Some("bftrainer: admitted by bftrainerd for run 65537"),
            1,
            start,
            true
        ));
        assert!(unadmitted(
            core,
            Some("\u{0}\u{fffd}coord=\n"),
            1,
            start,
            true
        ));
        // An administrator's hold mark keeps it a core job.
        assert!(unadmitted(
            Some("bftrainer:v1 2:4,role=core,hold=admin"),
            None,
            1,
            start,
            true
        ));
        // Not a core job: a plain job, a satellite, a broken tag.
        for a in [
            None,
            Some("site text"),
            Some("bftrainer:v1 1:1,role=satellite,parent=5"),
            Some("bftrainer:v1 x"),
        ] {
            assert!(!unadmitted(a, None, 3, start, true), "{a:?}");
        }
    }

    #[test]
    fn bounds_only() {
        let s = parse("2:16").unwrap();
        assert_eq!((s.min, s.max), (2, Some(16)));
        assert_eq!(s.role, Role::Core);
        let s = parse("3").unwrap();
        assert_eq!((s.min, s.max), (3, None));
        assert_eq!(parse("4:4").unwrap().max, Some(4));
        assert_eq!(parse("4294967295").unwrap().min, u32::MAX);
    }

    #[test]
    fn all_keys() {
        let s = parse("1:8,up=30,down=5,profile=resnet-50.v2,role=satellite,parent=77").unwrap();
        assert_eq!(s.up, Some(30));
        assert_eq!(s.down, Some(5));
        assert_eq!(s.profile.as_deref(), Some("resnet-50.v2"));
        assert_eq!(s.role, Role::Satellite);
        assert_eq!(s.parent, Some(77));
        assert_eq!(
            s.to_string(),
            "1:8,up=30,down=5,profile=resnet-50.v2,role=satellite,parent=77"
        );
    }

    #[test]
    fn canonical_order_and_tag() {
        let s = parse("2:4,profile=x,down=1,up=2,role=core").unwrap();
        assert_eq!(s.to_string(), "2:4,up=2,down=1,profile=x");
        assert_eq!(
            s.to_tag(),
            "bftrainer:v1 2:4,up=2,down=1,profile=x,role=core"
        );
        assert_eq!(parse_tag(&s.to_tag()).unwrap().unwrap(), s);
        assert!(parse_tag("user text").is_none());
        assert!(looks_like_tag("  BFTRAINER:v1 1:1"));
        assert!(looks_like_tag("bftrainer:v1"));
        assert!(!looks_like_tag("bftrainer rocks"));
        assert!(looks_like_tag("BfTrainer:V1 x") && !looks_like_tag("bftrainer:v"));
        assert!(!looks_like_tag("bftrainér:v1 1:1") && !looks_like_tag(""));
    }

    #[test]
    fn admin_hold_rides_on_core_tags_only() {
        let s = parse("2:4,up=2").unwrap();
        let held = format!("{}{ADMIN_HOLD}", s.to_tag());
        assert_eq!(held, "bftrainer:v1 2:4,up=2,role=core,hold=admin");
        assert_eq!(parse_tag(&held).unwrap().unwrap(), s);
        assert_eq!(split_admin_hold(&held), (s.to_tag().as_str(), true));
        assert_eq!(site_hold(Some(&held), None), Some(SiteHold::Admin));
        assert_eq!(site_hold(Some(&s.to_tag()), None), None);
        // Users cannot ask for it, and it means nothing on a satellite or out of place.
        assert!(err("2:4,hold=admin").contains("unknown key 'hold'"));
        let sat = "bftrainer:v1 1:1,role=satellite,parent=7,hold=admin";
        assert_eq!(split_admin_hold(sat), (sat, false));
        assert!(parse_tag(sat).unwrap().is_err());
        assert!(parse_tag("bftrainer:v1 2:4,hold=admin,role=core")
            .unwrap()
            .is_err());
        assert!(
            parse_tag("bftrainer:v1 2:4,role=core,hold=admin,hold=admin")
                .unwrap()
                .is_err()
        );
        // The owner's hold lives in the Comment.
        assert_eq!(
            site_hold(Some(&s.to_tag()), Some(&owner_hold_note())),
            Some(SiteHold::Owner)
        );
        assert_eq!(site_hold(None, Some(&waiting_note(&s))), None);
        // bftrainerd's note for a requeue with hold it did not ask for; the runtime's
        // Comment (after the job ran) is no hold.
        assert_eq!(
            site_hold(Some(&s.to_tag()), Some(&requeue_hold_note())),
            Some(SiteHold::Requeue)
        );
        assert_eq!(
            site_hold(Some(&s.to_tag()), Some("bftrainer-run:v1 coord=10.0.0.1:4000 run=ab start=1 gen=2 nodes=2 rate=0.0 step=0.000")),
            None
        );
        assert_eq!(
            waiting_note(&s),
            "bftrainer: elastic job (2-4 nodes) waiting for bftrainerd to admit it"
        );
    }

    #[test]
    fn batch_range_and_lr_rule() {
        let s = parse("1:16,batch=256:4096,lr=linear").unwrap();
        assert_eq!(s.batch, Some((256, 4096)));
        assert_eq!(s.lr, Some(LrRule::Linear));
        assert_eq!(s.to_string(), "1:16,batch=256:4096,lr=linear");
        assert_eq!(
            parse("2,lr=sqrt,batch=512").unwrap().to_string(),
            "2,batch=512,lr=sqrt"
        );
        assert_eq!(parse("2,batch=8:8,lr=none").unwrap().lr, Some(LrRule::None));
        assert_eq!(
            parse("2,batch=1:16777216").unwrap().batch,
            Some((1, MAX_BATCH))
        );
        assert_eq!(parse("2:4").unwrap().batch, None);
        assert_eq!(
            err("1:16,batch=4096:256"),
            "--elastic=1:16,batch=4096:256: batch=4096:256: MIN (4096) is larger than MAX (256); expected batch=MIN:MAX (or batch=G), whole numbers of samples per step with 1 <= MIN <= MAX <= 16777216"
        );
        for bad in [
            "batch=0:8",
            "batch=8:0",
            "batch=1:16777217",
            "batch=x",
            "batch=4:",
            "batch=:4",
            "batch=-4:8",
            "batch=4:8:16",
            "batch=99999999999999999999",
            "batch=1.5",
        ] {
            let e = err(&format!("1:2,{bad}"));
            assert!(
                e.contains("expected batch=MIN:MAX (or batch=G)"),
                "{bad}: {e}"
            );
        }
        assert!(err("1:2,batch=").contains("batch= has an empty value"));
        assert!(err("1:2,batch=4,batch=8").contains("key 'batch' is given twice"));
        assert_eq!(
            err("1:2,batch=4,lr=cubic"),
            "--elastic=1:2,batch=4,lr=cubic: lr=cubic: expected lr=linear, lr=sqrt or lr=none"
        );
        assert!(err("1:2,batch=4,lr=linear,lr=sqrt").contains("key 'lr' is given twice"));
        assert!(err("1:2,lr=linear").contains("lr= needs batch=MIN:MAX"));
        // The daemon's key is not the user's.
        assert!(err("1:2,batch=4:8,batch_now=8").contains("unknown key 'batch_now'"));
    }

    #[test]
    fn batch_now_rides_on_core_tags_only() {
        let s = parse("1:16,batch=256:4096,lr=sqrt").unwrap();
        let tag = s.to_tag();
        assert_eq!(tag, "bftrainer:v1 1:16,batch=256:4096,lr=sqrt,role=core");
        let with = with_batch_now(&tag, Some(1024)).unwrap();
        assert_eq!(with, format!("{tag},batch_now=1024"));
        assert_eq!(batch_now(&with), Some(1024));
        assert_eq!(parse_tag(&with).unwrap().unwrap(), s);
        assert_eq!(batch_now(&tag), None);
        // Changed, removed, and kept under an administrator's hold (and its release).
        let again = with_batch_now(&with, Some(512)).unwrap();
        assert_eq!(again, format!("{tag},batch_now=512"));
        assert_eq!(with_batch_now(&with, None).unwrap(), tag);
        let held = format!("{with}{ADMIN_HOLD}");
        assert_eq!(split_admin_hold(&held), (with.as_str(), true));
        assert_eq!(site_hold(Some(&held), None), Some(SiteHold::Admin));
        assert_eq!(batch_now(&held), Some(1024));
        assert_eq!(parse_tag(&held).unwrap().unwrap(), s);
        assert_eq!(
            with_batch_now(&held, Some(2048)).unwrap(),
            format!("{tag},batch_now=2048{ADMIN_HOLD}")
        );
        // Not a core tag, out of place, out of range: no batch, and a tag that fails.
        assert_eq!(with_batch_now("site text", Some(4)), None);
        let sat = "bftrainer:v1 1:1,role=satellite,parent=7";
        assert_eq!(with_batch_now(sat, Some(4)), None);
        assert_eq!(batch_now(&format!("{sat},batch_now=4")), None);
        assert!(parse_tag(&format!("{sat},batch_now=4")).unwrap().is_err());
        for v in ["0", "16777217", "x", "", "4,up=3"] {
            let t = format!("{tag},batch_now={v}");
            assert_eq!(batch_now(&t), None, "{t}");
            assert!(parse_tag(&t).unwrap().is_err(), "{t}");
        }
        assert!(parse_tag("bftrainer:v1 1:16,batch_now=4,role=core")
            .unwrap()
            .is_err());
    }

    #[test]
    fn issue_message_for_max_below_min() {
        assert_eq!(
            err("8:2"),
            "--elastic=8:2: MAX (2) is smaller than MIN (8); expected --elastic=MIN[:MAX] with 1 <= MIN <= MAX"
        );
    }

    #[test]
    fn bad_bounds() {
        assert!(err("").contains("the value is empty"));
        assert_eq!(
            err("0"),
            "--elastic=0: MIN (0) must be at least 1; expected --elastic=MIN[:MAX] with 1 <= MIN <= MAX"
        );
        assert!(err("2:0").contains("MAX (0) must be at least 1"));
        assert!(err("-1").contains("MIN (-1) is negative"));
        assert!(err("2:-4").contains("MAX (-4) is negative"));
        assert!(err("4294967296").contains("MIN (4294967296) is too large; the most is 4294967295"));
        assert!(
            err("1:99999999999999999999999").contains("MAX (99999999999999999999999) is too large")
        );
        assert!(err("two").contains("MIN (two) is not a whole number"));
        assert!(err("2:x").contains("MAX (x) is not a whole number"));
        assert!(err("2:4:8").contains("MAX (4:8) is not a whole number"));
        assert!(err("+2").contains("MIN (+2) is not a whole number"));
        assert!(err("1.5").contains("not a whole number"));
        assert!(err(":4").contains("MIN is empty"));
        assert!(err("2:").contains("MAX is empty"));
        assert!(err(",up=3").contains("MIN is empty"));
    }

    #[test]
    fn bad_keys() {
        assert_eq!(
            err("2:4,foo=1"),
            "--elastic=2:4,foo=1: unknown key 'foo'; known keys: up, down, profile, batch, lr, role, parent"
        );
        assert!(err("2:4,up=1,up=2").contains("key 'up' is given twice"));
        assert!(err("2:4,role=core,role=core").contains("key 'role' is given twice"));
        assert!(err("2:4,up=").contains("up= has an empty value"));
        assert!(err("2:4,up").contains("'up' is not a key=value pair"));
        assert!(err("2:4,").contains("'' is not a key=value pair"));
        assert!(err("2:4,up=x").contains("up=x: expected whole seconds from 0 to 86400"));
        assert!(err("2:4,down=86401").contains("down=86401: expected whole seconds"));
        assert!(err("2:4,profile=../etc").contains("profile=../etc: expected a profile name"));
        assert!(err("2:4,profile=a/b").contains("expected a profile name"));
        assert!(err(&format!("2:4,profile={}", "a".repeat(65))).contains("expected a profile name"));
        assert!(err("2:4,role=boss").contains("expected role=core or role=satellite"));
        assert!(err("1:1,role=satellite").contains("needs parent=JOBID"));
        assert!(err("1:1,parent=4").contains("only for role=satellite"));
        assert!(err("1:1,role=satellite,parent=0").contains("parent=0: expected a job id"));
        assert!(err("2:4,UP=3").contains("unknown key 'UP'"));
    }

    #[test]
    fn hostile_bytes() {
        let long = "1".repeat(100 * 1024);
        assert_eq!(
            err(&long),
            format!(
                "--elastic={}...: the value is 102400 bytes long; at most 256 bytes are allowed",
                "1".repeat(40)
            )
        );
        let e = parse_bytes(b"2:\xff\xfe").unwrap_err().to_string();
        assert!(e.contains("byte 2 (0xff) is not printable ASCII"), "{e}");
        assert!(e.starts_with("--elastic=2:\u{fffd}"), "{e}");
        assert!(err("2:4, up=3").contains("byte 4 (0x20)"));
        assert!(err("2:4\n").contains("--elastic=2:4\\n: byte 3 (0x0a)"));
        assert!(err("２").contains("byte 0 (0xef)"));
    }

    #[test]
    fn max_or() {
        assert_eq!(parse("2").unwrap().max_or(10), 10);
        assert_eq!(parse("2:3").unwrap().max_or(10), 3);
    }
}
