//! The cluster-wide lease that makes one bftrainerd active, whatever its `state_dir`:
//! terms are files in `[daemon] lease_dir`, a directory every candidate host sees
//! (slurmctld's StateSaveLocation, which an HA controller pair already shares).
//!
//! - Who wins: term `e` is the file `lease.<e>`, created with `O_CREAT|O_EXCL`, which
//!   the filesystem arbitrates: of two standbys that find term `e` expired, exactly one
//!   creates `lease.<e+1>`. The highest term present is the one that counts.
//! - One clock: a term's age is the file server's time now (the mtime of a probe file
//!   this daemon just touched) minus the term's mtime (set by the server at each
//!   renewal, `futimens(UTIME_NOW)`): never one host's clock against another's.
//! - Fencing: the holder checks its term before each cycle's actions (`hold`): a
//!   higher term, or its own older than `duration - guard` (it was paused: SIGSTOP, a
//!   frozen VM), and it does not act. Expired but not taken, it must win a new term
//!   like any standby.

use anyhow::Context;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

const PREFIX: &str = "lease.";

/// What the lease directory shows now.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseState {
    /// The highest term and its holder (`None`: no term yet).
    pub term: Option<(u64, String)>,
    /// Seconds since the holder last renewed it, on the file server's clock.
    pub age_s: f64,
    /// Whether this daemon holds it now.
    pub mine: bool,
    pub duration_s: f64,
}

impl LeaseState {
    /// One line for logs and `bftrainer status`.
    pub fn describe(&self) -> String {
        match &self.term {
            None => "no daemon has held the lease yet".into(),
            Some((e, who)) => format!(
                "term {e} held by {who}{}, renewed {:.1} s ago ({}, lease {:.0} s)",
                if self.mine { " (this daemon)" } else { "" },
                self.age_s,
                if self.age_s > self.duration_s {
                    "expired"
                } else {
                    "valid"
                },
                self.duration_s
            ),
        }
    }
}

/// This daemon's side of the lease.
#[derive(Debug)]
pub struct Lease {
    dir: PathBuf,
    /// Who this daemon is: host, pid and start time (unique across restarts).
    pub id: String,
    pub duration_s: f64,
    /// The term this daemon won, while it believes it holds it.
    term: Option<u64>,
}

/// Seconds since the epoch of a file time.
fn secs(t: SystemTime) -> f64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Sets the file's times to the file server's now (`UTIME_NOW`; over NFS the server
/// sets them, not the client).
fn touch(f: &File) -> std::io::Result<()> {
    use nix::sys::time::TimeSpec;
    nix::sys::stat::futimens(f.as_raw_fd(), &TimeSpec::UTIME_NOW, &TimeSpec::UTIME_NOW)?;
    Ok(())
}

impl Lease {
    /// The lease in `dir` for a daemon named `id`. The directory must exist.
    pub fn new(dir: &Path, id: String, duration_s: f64) -> anyhow::Result<Lease> {
        let md = std::fs::metadata(dir)
            .with_context(|| format!("[daemon] lease_dir '{}'", dir.display()))?;
        anyhow::ensure!(
            md.is_dir(),
            "[daemon] lease_dir '{}' is not a directory",
            dir.display()
        );
        Ok(Lease {
            dir: dir.to_path_buf(),
            id,
            duration_s,
            term: None,
        })
    }

    /// This daemon's default name: host, pid and start time.
    pub fn default_id() -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "{host}:{}:{}",
            std::process::id(),
            secs(SystemTime::now()) as u64
        )
    }

    /// How long before expiry the holder stops acting: a third of the lease, so that a
    /// holder's check and its cycle's calls end before a standby can judge it expired.
    fn guard(&self) -> f64 {
        self.duration_s / 3.0
    }

    /// The file server's time now: the mtime of this daemon's probe file, just touched
    /// (then removed).
    fn fs_now(&self) -> anyhow::Result<f64> {
        let p = self.dir.join(format!(
            "probe.{}",
            self.id.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .open(&p)
            .with_context(|| format!("cannot write {}", p.display()))?;
        touch(&f).with_context(|| format!("cannot touch {}", p.display()))?;
        let t = secs(f.metadata()?.modified()?);
        // Not left behind: each daemon start has its own name.
        let _ = std::fs::remove_file(&p);
        Ok(t)
    }

    /// The highest term in the directory: (term, holder, mtime).
    fn highest(&self) -> anyhow::Result<Option<(u64, String, f64)>> {
        let mut best: Option<u64> = None;
        for e in std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot read {}", self.dir.display()))?
        {
            let e = e?;
            let name = e.file_name();
            let Some(t) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            best = Some(best.map_or(t, |b| b.max(t)));
        }
        let Some(t) = best else {
            return Ok(None);
        };
        let p = self.term_path(t);
        // Read just after its creation, the holder may not have written its name yet.
        let who = std::fs::read_to_string(&p).unwrap_or_default();
        let mtime = match std::fs::metadata(&p) {
            Ok(m) => secs(m.modified()?),
            // Removed between the listing and now: a newer term exists; look again.
            Err(_) => return self.highest(),
        };
        Ok(Some((t, who.trim().to_string(), mtime)))
    }

    fn term_path(&self, t: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{t:020}"))
    }

    /// What the directory shows now.
    pub fn state(&self) -> anyhow::Result<LeaseState> {
        let now = self.fs_now()?;
        let h = self.highest()?;
        Ok(LeaseState {
            mine: h
                .as_ref()
                .is_some_and(|(t, who, _)| Some(*t) == self.term && *who == self.id),
            age_s: h.as_ref().map_or(0.0, |(_, _, m)| (now - m).max(0.0)),
            term: h.map(|(t, who, _)| (t, who)),
            duration_s: self.duration_s,
        })
    }

    /// Whether this daemon may act now: it holds the lease (renewed by this call), or
    /// it won a new term because the last one expired. `false`: another daemon holds
    /// it, or this one lost it (a higher term, or its own expired while it was paused)
    /// and lost the race for the next. Call it before each cycle's actions.
    pub fn hold(&mut self) -> anyhow::Result<bool> {
        let now = self.fs_now()?;
        let h = self.highest()?;
        if let (Some(mine), Some((t, who, mtime))) = (self.term, &h) {
            if *t == mine && *who == self.id && now - mtime < self.duration_s - self.guard() {
                let p = self.term_path(mine);
                let f = OpenOptions::new().write(true).open(&p)?;
                touch(&f).with_context(|| format!("cannot renew {}", p.display()))?;
                return Ok(true);
            }
            if *t != mine || *who != self.id {
                log::error!(
                    "lease: term {mine} of this daemon was taken over (term {t}, by {who}): no more actions here"
                );
            } else {
                log::warn!(
                    "lease: term {mine} of this daemon is {:.1} s old (paused?), past its guard: it must win a new term",
                    now - mtime
                );
            }
            self.term = None;
        }
        let next = match &h {
            None => 1,
            Some((t, _, mtime)) => {
                if now - mtime <= self.duration_s {
                    return Ok(false);
                }
                t + 1
            }
        };
        let p = self.term_path(next);
        let f = OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o644)
            .open(&p);
        let mut f = match f {
            Ok(f) => f,
            // Another daemon won this term.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
        };
        f.write_all(format!("{}\n", self.id).as_bytes())?;
        f.sync_all()?;
        touch(&f)?;
        self.term = Some(next);
        // Terms before the last are history.
        if next > 2 {
            for e in std::fs::read_dir(&self.dir)?.flatten() {
                let n = e.file_name();
                if let Some(t) = n
                    .to_str()
                    .and_then(|n| n.strip_prefix(PREFIX))
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    if t + 1 < next {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        log::info!(
            "lease: this daemon ({}) won term {next}{}",
            self.id,
            match &h {
                Some((t, who, _)) => format!(" (term {t} of {who} expired)"),
                None => String::new(),
            }
        );
        Ok(true)
    }

    /// The term this daemon holds, as far as it knows.
    pub fn term(&self) -> Option<u64> {
        self.term
    }

    /// Ages this daemon's term by `s` seconds, as a pause of that long would (tests).
    #[cfg(test)]
    fn age_by(&self, s: f64) {
        age_terms(&self.dir, s);
    }
}

/// Ages every term in `dir` by `s` seconds, as a holder's pause would (tests).
#[cfg(test)]
pub(super) fn age_terms(dir: &Path, s: f64) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let f = OpenOptions::new().write(true).open(e.path()).unwrap();
        let m = f.metadata().unwrap().modified().unwrap();
        f.set_modified(m - std::time::Duration::from_secs_f64(s))
            .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, d: f64) -> (Lease, Lease) {
        (
            Lease::new(dir, "a:1:1".into(), d).unwrap(),
            Lease::new(dir, "b:2:2".into(), d).unwrap(),
        )
    }

    #[test]
    fn the_first_daemon_wins_and_a_second_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path(), 10.0);
        assert!(a.hold().unwrap());
        assert!(!b.hold().unwrap(), "a holds a valid term");
        assert!(a.hold().unwrap(), "renewed");
        let s = b.state().unwrap();
        assert_eq!(s.term, Some((1, "a:1:1".into())));
        assert!(!s.mine && s.age_s < 10.0);
        assert!(a.state().unwrap().mine);
    }

    #[test]
    fn of_many_contenders_for_an_expired_term_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Lease::new(dir.path(), "a".into(), 5.0).unwrap();
        assert!(a.hold().unwrap());
        a.age_by(60.0);
        let won: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let p = dir.path().to_path_buf();
                    s.spawn(move || {
                        let mut l = Lease::new(&p, format!("s{i}"), 5.0).unwrap();
                        usize::from(l.hold().unwrap())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(won, 1, "one standby takes term 2");
        let s = a.state().unwrap();
        assert_eq!(s.term.as_ref().map(|t| t.0), Some(2));
    }

    #[test]
    fn a_standby_takes_over_only_after_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path(), 10.0);
        assert!(a.hold().unwrap());
        a.age_by(9.0);
        assert!(!b.hold().unwrap(), "9 s old of 10: still a's");
        a.age_by(2.0);
        assert!(b.hold().unwrap(), "11 s old: expired, b wins term 2");
        assert_eq!(b.term(), Some(2));
    }

    #[test]
    fn a_paused_holder_that_comes_back_does_not_act() {
        // a is paused past its lease; b takes over; a, back, finds term 2 and stops.
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path(), 10.0);
        assert!(a.hold().unwrap());
        a.age_by(30.0);
        assert!(b.hold().unwrap());
        assert!(!a.hold().unwrap(), "fenced: b holds term 2");
        assert_eq!(a.term(), None);
        assert!(b.hold().unwrap());
    }

    #[test]
    fn a_holder_paused_past_its_guard_but_not_replaced_wins_a_new_term() {
        // Nobody took over: it may act again, but only by winning a new term (the race
        // a standby would run), never by renewing the expired one.
        let dir = tempfile::tempdir().unwrap();
        let (mut a, mut b) = pair(dir.path(), 9.0);
        assert!(a.hold().unwrap());
        a.age_by(7.0); // past duration - guard (6 s), not expired
        assert!(!a.hold().unwrap(), "not renewed past its guard");
        assert!(!b.hold().unwrap(), "not expired for b either");
        a.age_by(3.0);
        // Expired: whoever comes first wins term 2.
        assert!(a.hold().unwrap());
        assert_eq!(a.term(), Some(2));
        assert!(!b.hold().unwrap());
    }
}
