//! Keeps the policy current outside slurmctld's hooks: reloads it after a reconfigure
//! and asks NSS again for names that did not resolve. The FFI layer runs it on a thread.
//!
//! Slurm-free (the config stamp, the clock and the NSS lookup are passed in), so every
//! decision is unit-tested; logging goes through Slurm's logger (stderr in tests).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bftrainer_plugin_common::Logger;

use crate::config::{self, ConfigError, Loaded, Policy};

const LOG: Logger = Logger("job_submit/bftrainer");

/// How often names that did not resolve are asked for again.
pub const RETRY: Duration = Duration::from_secs(5);

/// user name -> uid (getpwnam_r in slurmctld, a table in tests).
pub type Lookup = fn(&str) -> Option<u32>;

/// The file, the text and the policy in force, and when to retry names.
pub struct Watch {
    path: PathBuf,
    /// Finds the file again (`config::locate`) while none has loaded: one written after
    /// the start may be somewhere else than the default path read then.
    pub locate: Option<fn() -> PathBuf>,
    state_dir: Option<PathBuf>,
    lookup: Lookup,
    /// slurmctld's config stamp the policy was read at.
    stamp: i64,
    /// Text the policy was parsed from, parsed again to retry names (a reconfigure, not
    /// a retry, is what reads an edited file).
    text: String,
    current: Policy,
    next_retry: Instant,
}

/// One line for slurmctld's log: what was loaded.
pub fn describe(p: &Policy) -> String {
    format!(
        "loaded {}: partition={} allowed_partitions=[{}] max_nodes={} daemon_user={} ({}) users={} accounts={} profiles={} exclusive={} hold={}",
        p.path.display(),
        p.partition,
        p.allowed_partitions.join(","),
        p.max_nodes.map(|n| n.to_string()).unwrap_or_else(|| "none".into()),
        p.daemon_user,
        p.daemon_uid.map(|u| u.to_string()).unwrap_or_else(|| "unresolved".into()),
        if p.allowed_users.is_empty() { "all".into() } else { p.allowed_users.join(",") },
        if p.allowed_accounts.is_empty() { "all".into() } else { p.allowed_accounts.join(",") },
        p.profiles.len(),
        p.exclusive,
        p.hold
    )
}

fn load(path: &Path, state_dir: Option<&Path>, lookup: Lookup) -> Result<Loaded, ConfigError> {
    let loaded = config::load_or_last_good(path, state_dir, &lookup)?;
    if let Some(w) = &loaded.warning {
        LOG.error(&format!("{w}"));
    }
    Ok(loaded)
}

impl Watch {
    /// The first load (init()). Never an error: a failed init() stops slurmctld. A file
    /// missing or broken with no last good copy gives the `broken` policy (elastic jobs
    /// refused, plain jobs untouched) until a reconfigure loads the file; names that do
    /// not resolve are logged and retried.
    pub fn start(
        path: PathBuf,
        state_dir: Option<PathBuf>,
        lookup: Lookup,
        stamp: i64,
        now: Instant,
    ) -> Watch {
        let loaded = match load(&path, state_dir.as_deref(), lookup) {
            Ok(l) => l,
            Err(e) => {
                let policy = Policy::broken(&path, &e);
                LOG.error(&format!(
                    "init: elastic jobs are refused (plain jobs run as usual) until this is mended: {}",
                    policy.broken.as_deref().unwrap_or_default()
                ));
                Loaded {
                    policy,
                    text: String::new(),
                    fell_back: None,
                    warning: None,
                }
            }
        };
        if let Some(why) = &loaded.fell_back {
            // From 23.11, `scontrol reconfigure` runs init() in a new slurmctld, and a
            // failed init() there is fatal: keep running on the last good policy.
            LOG.error(&format!(
                "init: {why}; using the last policy that loaded on this controller (kept \
                 in StateSaveLocation) until the file is fixed and `scontrol reconfigure` is run"
            ));
        }
        if loaded.policy.broken.is_none() {
            LOG.info(&describe(&loaded.policy));
        }
        if let Some(why) = loaded
            .policy
            .unavailable()
            .filter(|_| loaded.policy.broken.is_none())
        {
            LOG.error(&format!(
                "init: elastic jobs are refused (plain jobs run as usual) until this is mended: {why}"
            ));
        }
        Watch {
            path,
            locate: None,
            state_dir,
            lookup,
            stamp,
            text: loaded.text,
            current: loaded.policy,
            next_retry: now + RETRY,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.current
    }

    /// One look, given slurmctld's config stamp now: a new stamp (`scontrol reconfigure`;
    /// 22.05 keeps the plugin loaded, from 23.11 init() runs again instead) re-reads the
    /// file; names that did not resolve are asked for again every RETRY. Returns the
    /// policy to publish when it changed.
    pub fn tick(&mut self, stamp: i64, now: Instant) -> Option<Policy> {
        if stamp != self.stamp {
            self.stamp = stamp;
            return self.reload(now);
        }
        if !self.current.unresolved.is_empty() && now >= self.next_retry {
            return self.retry(now);
        }
        None
    }

    /// A broken file keeps the previous policy (slurmctld is already running; refusing
    /// every job would be worse).
    fn reload(&mut self, now: Instant) -> Option<Policy> {
        if self.current.broken.is_some() {
            // Written since the start, perhaps beside slurm.conf (found first).
            if let Some(locate) = self.locate {
                self.path = locate();
            }
        }
        let loaded = match load(&self.path, self.state_dir.as_deref(), self.lookup) {
            Ok(Loaded {
                fell_back: Some(why),
                ..
            }) => {
                LOG.error(&format!("reconfigure: keeping the previous policy: {why}"));
                return None;
            }
            Ok(loaded) => loaded,
            Err(e) if self.current.broken.is_some() => {
                LOG.error(&format!(
                    "reconfigure: elastic jobs are still refused (plain jobs run as usual): {e}"
                ));
                return None;
            }
            Err(e) => {
                LOG.error(&format!("reconfigure: keeping the previous policy: {e}"));
                return None;
            }
        };
        self.text = loaded.text;
        self.next_retry = now + RETRY;
        // slurmctld also bumps the stamp once right after start-up, so an unchanged
        // policy is only worth a verbose line.
        if loaded.policy == self.current {
            LOG.verbose("reconfigure: policy unchanged");
            return None;
        }
        LOG.info(&format!("reconfigure: {}", describe(&loaded.policy)));
        if let Some(why) = loaded.policy.unavailable() {
            LOG.error(&format!(
                "reconfigure: elastic jobs are refused until this is mended: {why}"
            ));
        }
        self.current = loaded.policy;
        Some(self.current.clone())
    }

    /// Parses the same text again with fresh NSS answers; logs only what changed.
    fn retry(&mut self, now: Instant) -> Option<Policy> {
        self.next_retry = now + RETRY;
        // It parsed before; only the profile directory can have gone since.
        let p = config::parse(&self.text, &self.path, &self.lookup).ok()?;
        if p.unresolved == self.current.unresolved {
            return None;
        }
        match p.unavailable() {
            None => LOG.info(&format!(
                "every user name in {} resolves now; elastic jobs are accepted again ({})",
                p.path.display(),
                describe(&p)
            )),
            Some(why) => LOG.error(&format!("elastic jobs are still refused: {why}")),
        }
        self.current = p;
        Some(self.current.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// NSS as the tests want it: "ghost" resolves only while GHOST_EXISTS.
    static GHOST_EXISTS: AtomicBool = AtomicBool::new(false);

    fn users(name: &str) -> Option<u32> {
        match name {
            "root" => Some(0),
            "alice" => Some(1000),
            "ghost" if GHOST_EXISTS.load(Ordering::SeqCst) => Some(1500),
            _ => None,
        }
    }

    #[test]
    fn a_reconfigure_reloads_and_a_broken_file_keeps_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bftrainer.toml");
        std::fs::write(&conf, "[policy]\nmax_nodes = 4\n").unwrap();
        let t0 = Instant::now();
        let mut w = Watch::start(conf.clone(), None, users, 100, t0);
        assert_eq!(w.policy().max_nodes, Some(4));

        // An edit is read at the next reconfigure, not before.
        std::fs::write(&conf, "[policy]\nmax_nodes = 2\n").unwrap();
        assert_eq!(w.tick(100, t0 + RETRY * 2), None);
        let p = w.tick(101, t0 + RETRY * 2).expect("reloaded");
        assert_eq!(p.max_nodes, Some(2));
        // The same stamp again, or an unchanged file: nothing to publish.
        assert_eq!(w.tick(101, t0 + RETRY * 3), None);
        assert_eq!(w.tick(102, t0 + RETRY * 3), None);

        std::fs::write(&conf, "[policy]\nmax_nodes = -1\n").unwrap();
        assert_eq!(w.tick(103, t0 + RETRY * 4), None);
        assert_eq!(w.policy().max_nodes, Some(2));
        std::fs::remove_file(&conf).unwrap();
        assert_eq!(w.tick(104, t0 + RETRY * 4), None);
        assert_eq!(w.policy().max_nodes, Some(2));
    }

    /// A missing or broken file at the first load, with no last good copy, never fails
    /// init() (that stops slurmctld): elastic jobs are refused with the reason until a
    /// reconfigure reads a good file.
    #[test]
    fn a_missing_or_broken_file_at_start_refuses_elastic_jobs_until_mended() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bftrainer.toml");
        let t0 = Instant::now();
        for (text, why) in [
            (None, "cannot read the bftrainer config"),
            (Some("[policy]\nmax_nodes = -1\n"), "max_nodes"),
            (Some("[policy\n"), "bftrainer.toml"),
        ] {
            match text {
                Some(t) => std::fs::write(&conf, t).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&conf);
                }
            }
            let mut w = Watch::start(conf.clone(), None, users, 1, t0);
            let p = w.policy().clone();
            let reason = p.unavailable().expect("elastic jobs refused");
            assert!(
                reason.contains(why) && reason.contains("scontrol reconfigure"),
                "{reason}"
            );
            // Nothing to retry from: the broken policy stays until a reconfigure.
            assert_eq!(w.tick(1, t0 + RETRY * 3), None);
            // Still broken at a reconfigure: still refused.
            assert_eq!(w.tick(2, t0 + RETRY * 3), None);
            assert!(w.policy().broken.is_some());
            std::fs::write(&conf, "[policy]\nmax_nodes = 4\n").unwrap();
            let p = w.tick(3, t0 + RETRY * 4).expect("mended");
            assert_eq!((p.broken, p.max_nodes), (None, Some(4)));
        }
    }

    /// A name that does not resolve at start is retried every RETRY, from the text that
    /// loaded, and the policy is published once when it resolves.
    #[test]
    fn unresolved_names_are_retried_until_they_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("bftrainer.toml");
        std::fs::write(&conf, "[policy]\nallowed_users = [\"alice\", \"ghost\"]\n").unwrap();
        let t0 = Instant::now();
        GHOST_EXISTS.store(false, Ordering::SeqCst);
        let mut w = Watch::start(conf.clone(), None, users, 7, t0);
        assert_eq!(w.policy().unresolved, ["[policy] allowed_users 'ghost'"]);
        assert!(w.policy().unavailable().is_some());
        // Still missing: nothing new to publish.
        assert_eq!(w.tick(7, t0 + RETRY), None);
        GHOST_EXISTS.store(true, Ordering::SeqCst);
        // Not due yet.
        assert_eq!(w.tick(7, t0 + RETRY + RETRY / 2), None);
        // A retry parses the text that loaded, not an edit made since.
        std::fs::write(&conf, "[policy]\nmax_nodes = 3\n").unwrap();
        let p = w.tick(7, t0 + RETRY * 2).expect("resolved");
        assert!(p.unresolved.is_empty() && p.allowed_uids.contains(&1500));
        assert_eq!(p.max_nodes, None);
        assert_eq!(p.unavailable(), None);
        assert_eq!(w.tick(7, t0 + RETRY * 10), None);
    }
}
