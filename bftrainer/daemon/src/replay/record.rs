//! The replay's per-step outputs written as the simulator makes them (`--csv`,
//! `--sizes-csv`, `--write-journal`, `--actions-csv`, the data of `--plots`), so that a
//! replay of years keeps none of them in memory. Each file is written whole or not at
//! all: into a hidden temporary file beside it, renamed into place at the end.

use super::journal::{action_row, journal_line, ACTIONS_HEADER};
use super::output::{size_row, step_row, SIZES_HEADER, STEPS_HEADER};
use super::plot::PlotData;
use super::{Loaded, Options};
use anyhow::Context;
use bftrainer_core::engine::{Action, Record};
use bftrainer_core::sim::{Recorder, SizeRecord, StepRecord};
use bftrainer_core::trace::{Head, NodeChange, Scratch};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Scratch space for sorting an input out of time order: an anonymous temporary file
/// in $TMPDIR (else /tmp), deleted when closed, appended through a buffer and read
/// back with positional reads (so that passes over it never share an offset).
pub(super) struct TempScratch(BufWriter<File>);

impl TempScratch {
    pub fn make() -> std::io::Result<Box<dyn Scratch>> {
        Ok(Box::new(TempScratch(BufWriter::with_capacity(
            64 << 10,
            tempfile::tempfile()?,
        ))))
    }
}

impl Scratch for TempScratch {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_all(bytes)
    }
    fn seal(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.0.get_ref().read_exact_at(buf, offset)
    }
}

/// An output file being written: a hidden temporary file beside `path`, renamed over it
/// by [`Spool::commit`]; dropped uncommitted, the temporary file is removed and `path`
/// is left as it was.
pub(super) struct Spool {
    path: PathBuf,
    tmp: PathBuf,
    w: Option<BufWriter<File>>,
}

impl Spool {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .with_context(|| format!("{}: not a file name", path.display()))?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = File::create(&tmp).with_context(|| {
            format!(
                "cannot write {}: cannot create {}",
                path.display(),
                tmp.display()
            )
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            w: Some(BufWriter::new(file)),
        })
    }

    pub fn w(&mut self) -> &mut BufWriter<File> {
        self.w.as_mut().expect("written until committed")
    }

    /// Flushes the file and renames it into place.
    pub fn commit(mut self) -> anyhow::Result<()> {
        let w = self.w.take().expect("committed once");
        let done = (|| -> std::io::Result<()> {
            w.into_inner().map_err(|e| e.into_error())?;
            std::fs::rename(&self.tmp, &self.path)
        })();
        done.with_context(|| format!("cannot write {}", self.path.display()))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if self.w.is_some() || self.tmp.exists() {
            self.w = None;
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The requested per-step outputs of one replay, fed by the simulator.
pub(super) struct Outputs {
    steps: Option<Spool>,
    sizes: Option<Spool>,
    journal: Option<Spool>,
    actions: Option<Spool>,
    pub plot: Option<PlotData>,
    /// The first write that failed: the replay goes on, the outputs are not committed.
    failed: Option<anyhow::Error>,
}

impl Outputs {
    /// Opens the outputs `o` asks for (headers written).
    pub fn open(o: &Options, loaded: &Loaded) -> anyhow::Result<Self> {
        let with_header = |p: &Option<PathBuf>, header: &str| -> anyhow::Result<Option<Spool>> {
            p.as_deref()
                .map(|p| {
                    let mut s = Spool::create(p)?;
                    writeln!(s.w(), "{header}")
                        .with_context(|| format!("cannot write {}", p.display()))?;
                    Ok(s)
                })
                .transpose()
        };
        Ok(Self {
            steps: with_header(&o.csv, STEPS_HEADER)?,
            sizes: with_header(&o.sizes_csv, SIZES_HEADER)?,
            journal: o.write_journal.as_deref().map(Spool::create).transpose()?,
            actions: with_header(&o.actions_csv, ACTIONS_HEADER)?,
            plot: o
                .plots
                .as_ref()
                .map(|_| PlotData::new(loaded.start, loaded.end)),
            failed: None,
        })
    }

    /// Renames every file into place, or none when a write failed.
    pub fn commit(self) -> anyhow::Result<()> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        for s in [self.steps, self.sizes, self.journal, self.actions]
            .into_iter()
            .flatten()
        {
            s.commit()?;
        }
        Ok(())
    }

    fn check(failed: &mut Option<anyhow::Error>, s: &Spool, r: std::io::Result<()>) {
        if let Err(e) = r {
            if failed.is_none() {
                *failed = Some(
                    anyhow::Error::new(e).context(format!("cannot write {}", s.path.display())),
                );
            }
        }
    }
}

impl Recorder for Outputs {
    fn step(&mut self, s: &StepRecord) {
        if let Some(sp) = &mut self.steps {
            let r = step_row(sp.w(), s);
            Self::check(&mut self.failed, sp, r);
        }
        if let Some(p) = &mut self.plot {
            p.step(s);
        }
    }

    fn size(&mut self, s: &SizeRecord, job: &str) {
        if let Some(sp) = &mut self.sizes {
            let r = size_row(sp.w(), s, job);
            Self::check(&mut self.failed, sp, r);
        }
        if let Some(p) = &mut self.plot {
            p.size(s);
        }
    }

    fn trace_head(&mut self, head: Head<'_>) {
        if let Some(p) = &mut self.plot {
            p.trace_head(head);
        }
    }

    fn change(&mut self, c: &NodeChange) {
        if let Some(p) = &mut self.plot {
            p.change(c);
        }
    }

    fn journal(&mut self, r: &Record, actions: &[Action]) {
        if let Some(sp) = &mut self.journal {
            let res = journal_line(sp.w(), r);
            Self::check(&mut self.failed, sp, res);
        }
        if let Some(sp) = &mut self.actions {
            for a in actions {
                let res = action_row(sp.w(), r.t, a);
                Self::check(&mut self.failed, sp, res);
            }
        }
    }
}
