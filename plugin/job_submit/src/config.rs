//! The admin's policy for elastic jobs: the `[policy]` table of bftrainer.toml, parsed
//! once (at init and after `scontrol reconfigure`) into a typed, range-checked struct.
//!
//! Every error names the file, the key and what is allowed, because it ends up as the
//! one line in slurmctld's log that explains why slurmctld refused to start.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::path::{Path, PathBuf};

// Top-level tables (the plugin reads `policy` and leaves the others to bftrainerd) and
// the key readers are shared with bftrainerd.
use bftrainer_core::config::{parse_doc, partition_name_ok, Table};
pub use bftrainer_core::config::{ConfigError, TABLES};

/// Keys of `[policy]` (shared with bftrainerd, which checks them too).
pub use bftrainer_core::config::POLICY_KEYS;

/// Where the config comes from when nothing else is said.
pub const DEFAULT_PATH: &str = "/etc/slurm/bftrainer.toml";

/// The policy, ready for use on the submit path without any further I/O: user names
/// are resolved to uids and the profile directory is listed here, not per job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The file this came from (for messages).
    pub path: PathBuf,
    /// Where elastic (core) jobs go when the user names no partition.
    pub partition: String,
    /// Where bftrainerd's satellite jobs go: one PriorityTier below `partition`, so
    /// that Slurm preempts satellites before core jobs. Default: `partition`.
    pub satellite_partition: String,
    /// `[gpu_lending] satellite_partition` when GPU lending is on: bftrainerd's GPU
    /// satellites go there, one GPU each, sharing their node (not exclusive).
    pub gpu_satellite_partition: Option<String>,
    /// Further partitions a user may pick with `-p` for an elastic job.
    pub allowed_partitions: Vec<String>,
    /// Upper limit on MAX (and fill-in for an open MAX); `None`: no limit.
    pub max_nodes: Option<u32>,
    /// Uids allowed to submit elastic jobs; empty: everyone.
    pub allowed_uids: BTreeSet<u32>,
    pub allowed_users: Vec<String>,
    /// Names of `allowed_users` and `daemon_user` that NSS did not resolve (a user that
    /// does not exist, or LDAP down at slurmctld's start). Not an error: slurmctld must
    /// never stay down over it. While any is left, elastic jobs are refused with
    /// [`Policy::unavailable`]'s reason, and the plugin retries in the background.
    pub unresolved: Vec<String>,
    /// Accounts allowed to submit elastic jobs; empty: every account.
    pub allowed_accounts: Vec<String>,
    pub daemon_user: String,
    /// `None` while `daemon_user` does not resolve: then only root and SlurmUser are
    /// privileged.
    pub daemon_uid: Option<u32>,
    /// slurmctld's SlurmUser, set by the FFI layer (`None` in unit tests).
    pub slurm_uid: Option<u32>,
    pub profile_dir: Option<PathBuf>,
    /// Profile names found in `profile_dir` (file names without their extension).
    pub profiles: BTreeSet<String>,
    /// Elastic jobs get whole nodes (one job per node, as the allocator assumes).
    pub exclusive: bool,
    /// Core jobs are held until bftrainerd admits them.
    pub hold: bool,
    /// What happens to a plain (non-elastic) job sent to an elastic partition.
    pub plain_jobs: PlainJobs,
    /// Other SPANK plugins (or options of them) whose options a core job's satellites
    /// carry (`[policy] satellite_spank_options`); empty: none.
    pub satellite_spank_options: Vec<bftrainer_core::spankopt::Allowed>,
    /// The QOS every core job is put in (`[policy] core_qos`), whatever it asked; its
    /// owner may not change it. None: the job keeps its own.
    pub core_qos: Option<String>,
    /// Why no policy could be read at slurmctld's start (the file missing or broken, and
    /// no last good copy): init() must not fail over it, since that stops slurmctld.
    /// Every elastic request is then refused with this reason (root's too), plain jobs
    /// pass untouched, and the next reconfigure reads the file again.
    pub broken: Option<String>,
}

/// `[policy] plain_jobs`: a plain job in an elastic partition would take idle nodes
/// outside bftrainerd's control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlainJobs {
    /// Refused at submission with a message naming the regular partitions' use.
    Refuse,
    /// Accepted as a scavenger job; bftrainerd counts its nodes as claimed.
    Scavenger,
}

impl Policy {
    /// Partitions an elastic job may name.
    pub fn partition_ok(&self, name: &str) -> bool {
        same_partition(&self.partition, name)
            || self
                .allowed_partitions
                .iter()
                .any(|p| same_partition(p, name))
    }

    /// Partitions that belong to elastic work: the core, satellite and allowed ones.
    /// Compared without case or surrounding blanks, so that no spelling slurmctld might
    /// resolve to one of them slips past a check that refuses them.
    pub fn is_elastic_partition(&self, name: &str) -> bool {
        self.partition_ok(name)
            || same_partition(&self.satellite_partition, name)
            || self.gpu_satellite(name)
    }

    /// The GPU satellites' partition (`[gpu_lending]`), when GPU lending is on.
    pub fn gpu_satellite(&self, name: &str) -> bool {
        self.gpu_satellite_partition
            .as_deref()
            .is_some_and(|p| same_partition(p, name))
    }

    /// `elastic` or `elastic, gpu-elastic` for messages.
    pub fn partitions_text(&self) -> String {
        std::iter::once(self.partition.as_str())
            .chain(self.allowed_partitions.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Root, SlurmUser and the daemon's user may submit satellites and edit elastic jobs
    /// freely.
    pub fn privileged(&self, uid: u32) -> bool {
        uid == 0 || Some(uid) == self.daemon_uid || Some(uid) == self.slurm_uid
    }

    /// Why elastic jobs cannot be accepted now (names NSS did not resolve), or `None`.
    pub fn unavailable(&self) -> Option<String> {
        if let Some(why) = &self.broken {
            return Some(why.clone());
        }
        (!self.unresolved.is_empty()).then(|| {
            format!(
                "{} names {} that cannot be looked up (no such user, or the user database \
                 (NSS/LDAP) did not answer); the plugin retries every few seconds",
                self.path.display(),
                self.unresolved.join(", ")
            )
        })
    }
}

/// Whether `given` (a name of a job's partition list, as a user typed it) names the
/// configured partition `configured`: blanks around it and case do not count.
pub fn same_partition(configured: &str, given: &str) -> bool {
    configured.eq_ignore_ascii_case(given.trim())
}

/// The names of a partition list (`-p a,b` or `Partition=a,b`), blanks trimmed, empty
/// entries dropped.
pub fn partition_list(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|p| !p.is_empty())
}

/// Which file to read: `$BFTRAINER_CONFIG`, else `bftrainer.toml` beside slurm.conf
/// (`slurm_conf_path`, or `$SLURM_CONF`), else [`DEFAULT_PATH`].
pub fn locate(env_config: Option<&str>, slurm_conf_path: Option<&Path>) -> PathBuf {
    if let Some(p) = env_config.filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(dir) = slurm_conf_path.and_then(Path::parent) {
        let p = dir.join("bftrainer.toml");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(DEFAULT_PATH)
}

/// Reads and checks the policy in `path`. `lookup_uid` maps a user name to its uid
/// (getpwnam in the plugin, a table in tests).
pub fn load(path: &Path, lookup_uid: &dyn Fn(&str) -> Option<u32>) -> Result<Policy, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "{shown}: cannot read the bftrainer config: {e}; write it (see conf/bftrainer.toml) \
             or point BFTRAINER_CONFIG at it"
        ))
    })?;
    parse(&text, path, lookup_uid)
}

/// Where the plugin keeps a copy of the last bftrainer.toml that loaded: in slurmctld's
/// StateSaveLocation, which only SlurmUser writes.
pub fn last_good_path(state_dir: &Path) -> PathBuf {
    state_dir.join("bftrainer-job_submit.last-good.toml")
}

/// Keeps `text` (a file that just loaded) as the last good policy, written beside and
/// renamed over the old copy, readable by SlurmUser only. Unchanged text is not
/// rewritten.
pub fn save_last_good(state_dir: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dst = last_good_path(state_dir);
    if std::fs::read_to_string(&dst).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let tmp = state_dir.join(".bftrainer-job_submit.last-good.toml.new");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &dst)
}

/// What [`load_or_last_good`] read.
#[derive(Debug)]
pub struct Loaded {
    pub policy: Policy,
    /// The text `policy` was parsed from (the file's, or the last good copy's), kept to
    /// parse again when names did not resolve.
    pub text: String,
    /// The file was broken, so `policy` is the last good copy's; this says what was wrong.
    pub fell_back: Option<ConfigError>,
    /// The file loaded but no copy of it could be kept (the fallback will be older).
    pub warning: Option<ConfigError>,
}

/// The policy of `path`; when that file is broken and a last good copy exists in
/// `state_dir`, the copy's policy and the error that made us fall back to it.
///
/// Why: from Slurm 23.11 `scontrol reconfigure` starts slurmctld anew, which runs the
/// plugin's init() again, and an init() that fails there is fatal to slurmctld. So a
/// broken edit must never fail init once a policy has loaded on this controller.
pub fn load_or_last_good(
    path: &Path,
    state_dir: Option<&Path>,
    lookup_uid: &dyn Fn(&str) -> Option<u32>,
) -> Result<Loaded, ConfigError> {
    let loaded = std::fs::read_to_string(path)
        .map_err(|e| {
            ConfigError(format!(
                "{}: cannot read the bftrainer config: {e}; write it (see conf/bftrainer.toml) \
                 or point BFTRAINER_CONFIG at it",
                path.display()
            ))
        })
        .and_then(|text| parse(&text, path, lookup_uid).map(|p| (p, text)));
    match loaded {
        Ok((policy, text)) => {
            // A copy we cannot write only costs the fallback later: say so, go on.
            let warning = state_dir.and_then(|dir| {
                save_last_good(dir, &text).err().map(|e| {
                    ConfigError(format!(
                        "could not keep a copy of {} as {}: {e}",
                        path.display(),
                        last_good_path(dir).display()
                    ))
                })
            });
            Ok(Loaded {
                policy,
                text,
                fell_back: None,
                warning,
            })
        }
        Err(e) => {
            let Some(text) =
                state_dir.and_then(|d| std::fs::read_to_string(last_good_path(d)).ok())
            else {
                return Err(e);
            };
            // Parsed as the original file, so profile_dir and messages stay the same.
            match parse(&text, path, lookup_uid) {
                Ok(policy) => Ok(Loaded {
                    policy,
                    text,
                    fell_back: Some(e),
                    warning: None,
                }),
                Err(_) => Err(e),
            }
        }
    }
}

/// Checks config text; `path` is only used in messages and to resolve `profile_dir`.
pub fn parse(
    text: &str,
    path: &Path,
    lookup_uid: &dyn Fn(&str) -> Option<u32>,
) -> Result<Policy, ConfigError> {
    let file = path.display().to_string();
    let doc = parse_doc(text, &file)?;
    let t = Table::new(&doc, "policy", &file);
    t.check_keys(&POLICY_KEYS)?;
    let not_a_partition = |p: &str| {
        format!("'{p}' is not a partition name; expected letters, digits, '.', '_' or '-'")
    };
    let partition = t.string("partition", "elastic")?;
    if !partition_name_ok(&partition) {
        return Err(t.err("partition", not_a_partition(&partition)));
    }
    let satellite_partition = t.string("satellite_partition", &partition)?;
    if !partition_name_ok(&satellite_partition) {
        return Err(t.err("satellite_partition", not_a_partition(&satellite_partition)));
    }
    let allowed_partitions = t.strings("allowed_partitions")?;
    if let Some(bad) = allowed_partitions.iter().find(|p| !partition_name_ok(p)) {
        return Err(t.err("allowed_partitions", not_a_partition(bad)));
    }
    let max_nodes = t
        .uint("max_nodes", 1..=u64::from(u32::MAX))?
        .map(|n| n as u32);
    let allowed_users = t.strings("allowed_users")?;
    let mut allowed_uids = BTreeSet::new();
    let mut unresolved = Vec::new();
    for u in &allowed_users {
        match lookup_uid(u) {
            Some(uid) => {
                allowed_uids.insert(uid);
            }
            None => unresolved.push(format!("[policy] allowed_users '{u}'")),
        }
    }
    let allowed_accounts = t.strings("allowed_accounts")?;
    let daemon_user = t.string("daemon_user", "root")?;
    let daemon_uid = lookup_uid(&daemon_user);
    if daemon_uid.is_none() {
        unresolved.push(format!("[policy] daemon_user '{daemon_user}'"));
    }
    let (profile_dir, profiles) = match t.opt_string("profile_dir") {
        Ok(None) => (None, BTreeSet::new()),
        Ok(Some(s)) => {
            let dir = path.parent().unwrap_or(Path::new("/")).join(s);
            let entries = std::fs::read_dir(&dir).map_err(|e| {
                t.err("profile_dir", format!("cannot list '{}': {e}; expected a readable directory of throughput profiles", dir.display()))
            })?;
            let mut names = BTreeSet::new();
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                    if let Some(stem) = Path::new(&entry.file_name())
                        .file_stem()
                        .and_then(|s| s.to_str())
                    {
                        if !stem.starts_with('.') {
                            names.insert(stem.to_string());
                        }
                    }
                }
            }
            (Some(dir), names)
        }
        Err(_) => {
            return Err(t.err(
                "profile_dir",
                format!(
                    "expected a directory path string, found {}",
                    doc["policy"]["profile_dir"].type_str()
                ),
            ))
        }
    };
    let plain_jobs = match t
        .choice("plain_jobs", &["refuse", "scavenger"], "refuse")?
        .as_str()
    {
        "scavenger" => PlainJobs::Scavenger,
        _ => PlainJobs::Refuse,
    };
    let (_, gpu_satellite_partition) = bftrainer_core::config::gpu_lending(&doc, &file)?;
    let satellite_spank_options =
        bftrainer_core::spankopt::parse_allowed(&t.strings("satellite_spank_options")?)
            .map_err(|m| t.err("satellite_spank_options", m))?;
    let core_qos = t.opt_string("core_qos")?;
    if let Some(q) = core_qos.as_deref().filter(|q| !partition_name_ok(q)) {
        return Err(t.err(
            "core_qos",
            format!("'{q}' is not a QOS name; expected letters, digits, '.', '_' or '-'"),
        ));
    }
    Ok(Policy {
        core_qos,
        satellite_spank_options,
        gpu_satellite_partition,
        path: path.to_path_buf(),
        partition,
        satellite_partition,
        allowed_partitions,
        max_nodes,
        allowed_uids,
        allowed_users,
        unresolved,
        allowed_accounts,
        daemon_user,
        daemon_uid,
        slurm_uid: None,
        profile_dir,
        profiles,
        exclusive: t.boolean("exclusive", true)?,
        hold: t.boolean("hold", true)?,
        plain_jobs,
        broken: None,
    })
}

impl Policy {
    /// The policy in force when `path` could not be loaded at start (`why`): the
    /// defaults, with nobody but root and SlurmUser privileged, and every elastic
    /// request refused (`broken`).
    pub fn broken(path: &Path, why: &ConfigError) -> Policy {
        let mut p = parse("", path, &|_| None).expect("the empty config parses");
        p.unresolved.clear();
        p.broken = Some(format!("{why}; fix it and run `scontrol reconfigure`"));
        p
    }
}

/// getpwnam_r: user name to uid. Only called while (re)loading the config, never per
/// job, because NSS may sit on LDAP and slurmctld must not wait on the network per job.
pub fn uid_of(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf outlives pwd's string fields,
    // which are not used after this function.
    let rc =
        unsafe { libc::getpwnam_r(c.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out) };
    (rc == 0 && !out.is_null()).then_some(pwd.pw_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(name: &str) -> Option<u32> {
        match name {
            "root" => Some(0),
            "alice" => Some(1000),
            "bftd" => Some(990),
            _ => None,
        }
    }

    fn p(text: &str) -> Result<Policy, String> {
        parse(text, Path::new("/etc/slurm/bftrainer.toml"), &users).map_err(|e| e.0)
    }

    /// A broken edit falls back to the last file that loaded (kept 0600 in the state
    /// directory); with no copy yet, or a copy that no longer parses, it is an error.
    #[test]
    fn a_broken_file_falls_back_to_the_last_good_copy() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bftrainer.toml");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();

        // Broken before anything loaded: an error, no copy.
        std::fs::write(&conf, "[policy]\nmax_nodes = -1\n").unwrap();
        let e = load_or_last_good(&conf, Some(&state), &users).unwrap_err();
        assert!(e.0.contains("max_nodes"), "{e:?}");
        assert!(!last_good_path(&state).exists());

        std::fs::write(&conf, "[policy]\nmax_nodes = 4\n").unwrap();
        let l = load_or_last_good(&conf, Some(&state), &users).unwrap();
        assert_eq!(l.policy.max_nodes, Some(4));
        assert!(l.fell_back.is_none() && l.warning.is_none());
        let mode = std::fs::metadata(last_good_path(&state))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        std::fs::write(&conf, "[policy]\nmax_nodes = -1\n").unwrap();
        let l = load_or_last_good(&conf, Some(&state), &users).unwrap();
        assert_eq!(l.policy.max_nodes, Some(4));
        assert_eq!(l.policy.path, conf);
        assert!(l.fell_back.unwrap().0.contains("max_nodes"));
        // Without a state directory there is nothing to fall back to.
        assert!(load_or_last_good(&conf, None, &users).is_err());
        // A missing file falls back too.
        std::fs::remove_file(&conf).unwrap();
        let l = load_or_last_good(&conf, Some(&state), &users).unwrap();
        assert!(l.fell_back.unwrap().0.contains("cannot read"));
        // A corrupt copy is no fallback.
        std::fs::write(last_good_path(&state), "not toml [").unwrap();
        assert!(load_or_last_good(&conf, Some(&state), &users).is_err());

        // A state directory that cannot be written: the file still loads, with a warning.
        std::fs::write(&conf, "").unwrap();
        let l = load_or_last_good(&conf, Some(&dir.path().join("missing")), &users).unwrap();
        assert!(l.warning.unwrap().0.contains("could not keep a copy"));
    }

    #[test]
    fn defaults() {
        let pol = p("").unwrap();
        assert_eq!(pol.partition, "elastic");
        assert_eq!(pol.max_nodes, None);
        assert!(pol.exclusive && pol.hold);
        assert_eq!(
            (pol.daemon_user.as_str(), pol.daemon_uid),
            ("root", Some(0))
        );
        assert!(pol.privileged(0) && !pol.privileged(1000));
        assert_eq!(pol.unavailable(), None);
        let slurm = Policy {
            slurm_uid: Some(64030),
            ..pol
        };
        assert!(slurm.privileged(64030));
    }

    #[test]
    fn full() {
        let pol = p(r#"
            [policy]
            partition = "harvest"
            allowed_partitions = ["harvest-gpu"]
            max_nodes = 16
            allowed_users = ["alice"]
            allowed_accounts = ["ml"]
            daemon_user = "bftd"
            exclusive = false
            hold = false
            [daemon]
            anything = 1
        "#)
        .unwrap();
        assert!(
            pol.partition_ok("harvest")
                && pol.partition_ok("harvest-gpu")
                && !pol.partition_ok("batch")
        );
        assert_eq!(pol.partitions_text(), "harvest, harvest-gpu");
        assert_eq!(pol.max_nodes, Some(16));
        assert!(pol.allowed_uids.contains(&1000));
        assert!(pol.privileged(990));
        assert!(!pol.exclusive && !pol.hold);
    }

    #[test]
    fn errors_name_file_key_and_allowed_values() {
        assert_eq!(
            p("[policy]\nmax_nodes = 0").unwrap_err(),
            "/etc/slurm/bftrainer.toml: [policy] max_nodes: 0 is out of range; expected a whole number from 1 to 4294967295"
        );
        assert!(p("[policy]\nmax_nodes = \"8\"")
            .unwrap_err()
            .contains("max_nodes: expected a whole number from 1 to 4294967295, found string"));
        assert!(p("[policy]\nmaxnodes = 3").unwrap_err().contains("[policy] maxnodes: unknown key; allowed keys: partition, satellite_partition, allowed_partitions, max_nodes"));
        assert!(p("[polcy]\n").unwrap_err().contains(
            "unknown table or key 'polcy' at top level; allowed tables: [policy], [daemon]"
        ));
        assert!(p("[policy]\nallowed_users = \"alice\"")
            .unwrap_err()
            .contains("expected a list of strings"));
        assert!(p("[policy]\nhold = 1")
            .unwrap_err()
            .contains("hold: expected true or false, found integer"));
        assert!(p("[policy]\npartition = \"a b\"")
            .unwrap_err()
            .contains("'a b' is not a partition name"));
        assert!(p("[policy]\nprofile_dir = \"/nonexistent/x\"")
            .unwrap_err()
            .contains("profile_dir: cannot list '/nonexistent/x'"));
        assert!(p("policy = 3")
            .unwrap_err()
            .contains("'policy' must be a table"));
        assert!(p("[policy\n")
            .unwrap_err()
            .starts_with("/etc/slurm/bftrainer.toml: not valid TOML"));
    }

    /// A name NSS cannot resolve (LDAP down at boot, or a user that does not exist) is
    /// no error: the policy loads, says why elastic jobs are unavailable, and a later
    /// parse of the same text with NSS back resolves it.
    #[test]
    fn unresolved_names_load_and_make_elastic_jobs_unavailable() {
        let text = "[policy]\nallowed_users = [\"alice\", \"zed\"]\ndaemon_user = \"bftd\"\n";
        let path = Path::new("/etc/slurm/bftrainer.toml");
        let nss_down = |_: &str| None;
        let pol = parse(text, path, &nss_down).unwrap();
        assert_eq!(
            pol.unresolved,
            [
                "[policy] allowed_users 'alice'",
                "[policy] allowed_users 'zed'",
                "[policy] daemon_user 'bftd'"
            ]
        );
        assert_eq!(pol.daemon_uid, None);
        assert!(pol.privileged(0) && !pol.privileged(990));
        assert_eq!(
            pol.unavailable().unwrap(),
            "/etc/slurm/bftrainer.toml names [policy] allowed_users 'alice', [policy] \
             allowed_users 'zed', [policy] daemon_user 'bftd' that cannot be looked up (no such \
             user, or the user database (NSS/LDAP) did not answer); the plugin retries every \
             few seconds"
        );
        // NSS back: only the user that does not exist is left.
        let pol = parse(text, path, &users).unwrap();
        assert_eq!(pol.unresolved, ["[policy] allowed_users 'zed'"]);
        assert_eq!(pol.daemon_uid, Some(990));
        assert!(pol.allowed_uids.contains(&1000));
        let pol = parse("[policy]\nallowed_users = [\"alice\"]\n", path, &users).unwrap();
        assert_eq!(pol.unavailable(), None);
    }

    #[test]
    fn profiles_are_listed_once() {
        let dir = tempfile::tempdir().unwrap();
        let prof = dir.path().join("profiles");
        std::fs::create_dir_all(prof.join("subdir")).unwrap();
        std::fs::write(prof.join("resnet50.toml"), "").unwrap();
        std::fs::write(prof.join("bert.json"), "").unwrap();
        std::fs::write(prof.join(".hidden"), "").unwrap();
        // Relative to the config file's directory.
        let cfg = dir.path().join("bftrainer.toml");
        std::fs::write(&cfg, "[policy]\nprofile_dir = \"profiles\"\n").unwrap();
        let pol = load(&cfg, &users).unwrap();
        assert_eq!(
            pol.profiles.iter().map(String::as_str).collect::<Vec<_>>(),
            ["bert", "resnet50"]
        );
    }

    #[test]
    fn locate_order() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("slurm.conf");
        assert_eq!(
            locate(Some("/x/b.toml"), Some(&conf)),
            PathBuf::from("/x/b.toml")
        );
        assert_eq!(locate(None, Some(&conf)), PathBuf::from(DEFAULT_PATH));
        std::fs::write(dir.path().join("bftrainer.toml"), "").unwrap();
        assert_eq!(locate(None, Some(&conf)), dir.path().join("bftrainer.toml"));
        assert_eq!(locate(Some(""), None), PathBuf::from(DEFAULT_PATH));
    }

    #[test]
    fn uid_lookup() {
        assert_eq!(uid_of("root"), Some(0));
        assert_eq!(uid_of("no-such-user-bft"), None);
        assert_eq!(uid_of("a\0b"), None);
    }
}
