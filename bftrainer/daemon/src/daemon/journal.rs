//! The daemon's append-only journal of engine events (v1 `Record` lines, what
//! `bftrainer replay --journal` reads) and its one-daemon-per-cluster lock, both in
//! `[daemon] state_dir`. Once the journal holds `COMPACT_AFTER` records the daemon
//! rewrites it, atomically, as one snapshot record (`Event::Snapshot`) and appends
//! from there: its size stays bounded, and so does the start-up.

use anyhow::Context;
use bftrainer_core::engine::Record;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub const JOURNAL_FILE: &str = "journal.jsonl";
pub const LOCK_FILE: &str = "bftrainerd.lock";
/// Records in the journal (since its last snapshot) at which the daemon compacts it.
pub const COMPACT_AFTER: u64 = 200_000;

/// Appends records; `flush` writes and fsyncs them before the daemon acts on them.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    pub written: u64,
    /// Records in the file (read at open, pushed since), the snapshot included.
    pub records: u64,
    /// Flushes that wrote and synced (fsyncs of the journal since open).
    pub syncs: u64,
    /// Damaged or unknown lines skipped at open (each logged with its line and reason).
    pub skipped: u64,
    /// Where the journal as found at open was copied when it had such lines (before
    /// any rewrite can drop them).
    pub damaged_copy: Option<PathBuf>,
}

impl Journal {
    /// Opens (creating) the journal in `dir` and returns it with the records already
    /// there. A torn last line (the daemon killed mid-write) is cut off; any other bad
    /// line (damaged, or a record this build does not know) is logged with its line and
    /// reason, counted in `skipped` and left out: one bad line must not keep the daemon
    /// (and every job it manages) down. The file as found is then copied aside
    /// (`journal.jsonl.damaged-<unix time>`) before anything rewrites it.
    pub fn open(dir: &Path) -> anyhow::Result<(Journal, Vec<Record>)> {
        let path = dir.join(JOURNAL_FILE);
        let mut records = Vec::new();
        let mut good_len: u64 = 0;
        let mut skipped = 0u64;
        if path.exists() {
            let f = File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let mut r = BufReader::new(f);
            let mut line = String::new();
            let mut n = 0usize;
            loop {
                line.clear();
                let got = r
                    .read_line(&mut line)
                    .with_context(|| format!("{}: read failed after line {n}", path.display()))?;
                if got == 0 {
                    break;
                }
                n += 1;
                if !line.ends_with('\n') {
                    log::warn!(
                        "{}:{n}: dropping a torn last line ({} bytes; the daemon stopped while writing it)",
                        path.display(),
                        line.len()
                    );
                    break;
                }
                if !line.trim().is_empty() {
                    match Record::from_json_line(line.trim_end()) {
                        Ok(rec) => records.push(rec),
                        Err(m) => {
                            skipped += 1;
                            log::error!("{}:{n}: record skipped: {m}", path.display());
                        }
                    }
                }
                good_len += got as u64;
            }
        }
        let damaged_copy = if skipped > 0 {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let copy = path.with_extension(format!("jsonl.damaged-{secs}"));
            std::fs::copy(&path, &copy).with_context(|| {
                format!(
                    "{} has {skipped} damaged records; cannot keep a copy of it as {}",
                    path.display(),
                    copy.display()
                )
            })?;
            log::error!(
                "{}: {skipped} damaged or unknown records skipped; the journal as found is kept in {}",
                path.display(),
                copy.display()
            );
            Some(copy)
        } else {
            None
        };
        // Only the daemon reads it: the state directory is searchable by all users
        // (they reach the control socket there), its files are not.
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open {} for appending", path.display()))?;
        if file.metadata().map(|m| m.len()).unwrap_or(0) > good_len {
            file.set_len(good_len)
                .with_context(|| format!("cannot cut the torn line off {}", path.display()))?;
        }
        Ok((
            Journal {
                path,
                file,
                buf: Vec::new(),
                written: 0,
                records: records.len() as u64,
                syncs: 0,
                skipped,
                damaged_copy,
            },
            records,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn push(&mut self, rec: &Record) {
        // Records are plain data: serialisation cannot fail.
        serde_json::to_writer(&mut self.buf, rec).expect("journal record serialises");
        self.buf.push(b'\n');
        self.written += 1;
        self.records += 1;
    }

    /// Whether the journal has outgrown its bound (`COMPACT_AFTER` records).
    pub fn compact_due(&self) -> bool {
        self.records >= COMPACT_AFTER
    }

    /// Replaces the whole journal with `records` (a snapshot), atomically: written to
    /// a temporary file beside it, synced, renamed over it, the directory synced; a
    /// crash leaves the old journal or the new one, never a mix. Appends go to the new
    /// file from then on. Records pushed but not flushed are dropped (the snapshot
    /// holds their effect).
    pub fn rewrite(&mut self, records: &[Record]) -> anyhow::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        let write = || -> std::io::Result<File> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            let mut w = std::io::BufWriter::new(&mut f);
            for r in records {
                serde_json::to_writer(&mut w, r).map_err(std::io::Error::other)?;
                w.write_all(b"\n")?;
            }
            w.flush()?;
            drop(w);
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                File::open(dir)?.sync_all()?;
            }
            OpenOptions::new().append(true).open(&self.path)
        };
        let file = write().with_context(|| {
            format!(
                "cannot rewrite the journal {} (via {})",
                self.path.display(),
                tmp.display()
            )
        })?;
        self.file = file;
        self.buf.clear();
        self.records = records.len() as u64;
        Ok(())
    }

    /// Writes what was pushed and syncs it to disk.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file
            .write_all(&self.buf)
            .and_then(|_| self.file.sync_data())
            .with_context(|| format!("cannot write the journal {}", self.path.display()))?;
        self.syncs += 1;
        self.buf.clear();
        Ok(())
    }
}

/// The lock that keeps a second bftrainerd off the same state directory (flock, held
/// for the process's life; the file names the holder's pid).
#[derive(Debug)]
pub struct Lock {
    _file: nix::fcntl::Flock<File>,
}

impl Lock {
    pub fn acquire(dir: &Path) -> anyhow::Result<Lock> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        let mut file = match nix::fcntl::Flock::lock(
            file,
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        ) {
            Ok(locked) => locked,
            Err(_) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                anyhow::bail!(
                    "another bftrainerd (pid {}) already runs on this state directory: {} is locked; \
                     one daemon per cluster (stop it first)",
                    if holder.is_empty() { "unknown" } else { holder },
                    path.display()
                );
            }
        };
        file.set_len(0)?;
        writeln!(*file, "{}", std::process::id())?;
        file.sync_data()?;
        Ok(Lock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bftrainer_core::engine::{Event, EVENT_FORMAT_VERSION};

    #[test]
    fn journal_round_trips_and_cuts_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, recs) = Journal::open(dir.path()).unwrap();
        assert!(recs.is_empty());
        let r = Record {
            v: EVENT_FORMAT_VERSION,
            t: 5.0,
            event: Event::Tick,
        };
        j.push(&r);
        j.flush().unwrap();
        drop(j);
        let p = dir.path().join(JOURNAL_FILE);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"v\":1,\"t\":6,\"ev").unwrap();
        drop(f);
        let (mut j, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(recs, vec![r.clone()]);
        j.push(&r);
        j.flush().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn a_damaged_record_mid_journal_is_skipped_counted_and_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let rec = |t: f64| Record {
            v: EVENT_FORMAT_VERSION,
            t,
            event: Event::Tick,
        };
        let line = |t: f64| format!("{}\n", serde_json::to_string(&rec(t)).unwrap());
        let p = dir.path().join(JOURNAL_FILE);
        let text = format!(
            "{}{{\"v\":1,\"t\":6,\"event\":{{\"type\":\"nap\"}}}}\n{}garbage\n{}",
            line(5.0),
            line(7.0),
            line(8.0)
        );
        std::fs::write(&p, &text).unwrap();
        let (mut j, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(recs, vec![rec(5.0), rec(7.0), rec(8.0)]);
        assert_eq!(j.skipped, 2);
        let copy = j
            .damaged_copy
            .clone()
            .expect("a copy of the damaged journal");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
        // A compaction rewrites the journal; the copy keeps what was skipped.
        j.rewrite(&[rec(9.0)]).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), text);
        drop(j);
        let (j, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!((recs, j.skipped, j.damaged_copy), (vec![rec(9.0)], 0, None));
    }

    #[test]
    fn a_rewrite_replaces_the_journal_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        let rec = |t: f64| Record {
            v: EVENT_FORMAT_VERSION,
            t,
            event: Event::Tick,
        };
        for t in 0..5 {
            j.push(&rec(f64::from(t)));
        }
        j.flush().unwrap();
        assert_eq!(j.records, 5);
        assert!(!j.compact_due());
        j.push(&rec(5.0));
        j.rewrite(&[rec(9.0)]).unwrap();
        assert_eq!(j.records, 1);
        j.push(&rec(10.0));
        j.flush().unwrap();
        drop(j);
        let (j, recs) = Journal::open(dir.path()).unwrap();
        assert_eq!(recs, vec![rec(9.0), rec(10.0)]);
        assert_eq!(j.records, 2);
        assert!(!dir.path().join("journal.jsonl.tmp").exists());
    }

    #[test]
    fn second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let _l = Lock::acquire(dir.path()).unwrap();
        // flock locks belong to the open file description: a second open conflicts
        // even in the same process.
        let e = Lock::acquire(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("another bftrainerd (pid {})", std::process::id())),
            "{e}"
        );
    }
}
