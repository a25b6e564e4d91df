//! External merge sort of fixed-size records, for inputs out of time order: records are
//! sorted in chunks of bounded size, each chunk written as a sorted run to an anonymous
//! temporary file, and the runs merged again on every pass over the input.

use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::marker::PhantomData;

/// Where sorted runs are kept: bytes appended, then read back at offsets. The caller
/// supplies it (the replay: an anonymous temporary file), so that the core does no I/O
/// of its own; [`Vec<u8>`] keeps them in memory.
pub trait Scratch {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Every run is appended: what was appended must now read back.
    fn seal(&mut self) -> std::io::Result<()>;
    /// Fills `buf` from `offset`; the bytes were appended before `seal`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Scratch for Vec<u8> {
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
    fn seal(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let from = usize::try_from(offset).map_err(std::io::Error::other)?;
        let src = self
            .get(from..from + buf.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// Makes the [`Scratch`] of an input found larger than one chunk.
pub type MakeScratch<'a> = &'a dyn Fn() -> std::io::Result<Box<dyn Scratch>>;

/// Scratch space in memory (tests).
#[cfg(test)]
pub(crate) fn in_memory() -> std::io::Result<Box<dyn Scratch>> {
    Ok(Box::new(Vec::new()))
}

/// A record that a run stores in `SIZE` bytes, ordered by its sort key. The key must be
/// unique within an input (the file line is part of it), so that an unstable sort of a
/// chunk and a merge of runs give one order, the in-memory sort's.
pub(crate) trait Record: Ord + Clone {
    const SIZE: usize;
    /// Appends exactly `SIZE` bytes.
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(b: &[u8]) -> Self;
}

/// Bytes of merge buffers shared by all the runs of one pass; each run gets its share,
/// within [`MIN_RUN_BUFFER`, `MAX_RUN_BUFFER`].
const MERGE_BUFFER: usize = 1 << 20;
const MIN_RUN_BUFFER: usize = 4 << 10;
const MAX_RUN_BUFFER: usize = 64 << 10;

/// Collects records; once `chunk` of them are held, sorts them and writes them out as a
/// run, so that at most `chunk` records are ever in memory.
pub(crate) struct Sorter<'a, T> {
    what: String,
    chunk: usize,
    held: Vec<T>,
    make: MakeScratch<'a>,
    spill: Option<Spill>,
}

struct Spill {
    out: Box<dyn Scratch>,
    /// (first byte, bytes) of each run in the file.
    runs: Vec<(u64, u64)>,
    written: u64,
    scratch: Vec<u8>,
}

fn spill_err(what: &str, cause: std::io::Error) -> Error {
    Error::Spill {
        what: what.to_string(),
        cause,
    }
}

impl<'a, T: Record> Sorter<'a, T> {
    /// `chunk`: records held in memory at most (at least 1); `make` gives the scratch
    /// space for runs once there are more.
    pub fn new(what: &str, chunk: usize, make: MakeScratch<'a>) -> Self {
        Self {
            what: what.to_string(),
            chunk: chunk.max(1),
            held: Vec::new(),
            make,
            spill: None,
        }
    }

    pub fn push(&mut self, r: T) -> Result<()> {
        // A full chunk goes to disk only when more records come: an input of one
        // chunk stays in memory.
        if self.held.len() >= self.chunk {
            self.write_run()?;
        }
        self.held.push(r);
        Ok(())
    }

    /// Sorts the records held and appends them to the file as one run.
    fn write_run(&mut self) -> Result<()> {
        self.held.sort_unstable();
        if self.spill.is_none() {
            let out = (self.make)().map_err(|e| spill_err(&self.what, e))?;
            self.spill = Some(Spill {
                out,
                runs: Vec::new(),
                written: 0,
                scratch: Vec::with_capacity(T::SIZE),
            });
        }
        let s = self.spill.as_mut().expect("created above");
        let first = s.written;
        for r in self.held.drain(..) {
            s.scratch.clear();
            r.encode(&mut s.scratch);
            debug_assert_eq!(s.scratch.len(), T::SIZE);
            s.out
                .append(&s.scratch)
                .map_err(|e| spill_err(&self.what, e))?;
            s.written += T::SIZE as u64;
        }
        s.runs.push((first, s.written - first));
        Ok(())
    }

    /// All records, sorted: in memory when they fit in one chunk, else as runs.
    pub fn finish(mut self) -> Result<Store<T>> {
        if self.spill.is_none() {
            self.held.sort_unstable();
            return Ok(Store::Memory(self.held));
        }
        if !self.held.is_empty() {
            self.write_run()?;
        }
        let mut s = self.spill.take().expect("spilled");
        let what = self.what;
        s.out.seal().map_err(|e| spill_err(&what, e))?;
        Ok(Store::Runs(Runs {
            what,
            file: s.out,
            runs: s.runs,
            _t: PhantomData,
        }))
    }
}

/// Sorted records: held, or in runs on disk that every pass merges.
pub(crate) enum Store<T> {
    Memory(Vec<T>),
    Runs(Runs<T>),
}

/// Sorted runs in one scratch space.
pub(crate) struct Runs<T> {
    what: String,
    file: Box<dyn Scratch>,
    runs: Vec<(u64, u64)>,
    _t: PhantomData<fn() -> T>,
}

impl<T: Record> Store<T> {
    /// Runs on disk; 0 when the records are held in memory.
    pub fn runs(&self) -> usize {
        match self {
            Store::Memory(_) => 0,
            Store::Runs(r) => r.runs.len(),
        }
    }

    /// One pass over the records in order. Passes are independent: each run is read
    /// through the pass's own buffer at its own offset (positional reads), never
    /// through the file's shared offset.
    pub fn iter(&self) -> Result<Iter<'_, T>> {
        match self {
            Store::Memory(v) => Ok(Iter::Memory(v.iter())),
            Store::Runs(r) => Ok(Iter::Merge(Merge::new(r)?)),
        }
    }
}

/// One pass over a [`Store`].
pub(crate) enum Iter<'a, T> {
    Memory(std::slice::Iter<'a, T>),
    Merge(Merge<'a, T>),
}

impl<T: Record> Iterator for Iter<'_, T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        match self {
            Iter::Memory(it) => it.next().cloned().map(Ok),
            Iter::Merge(m) => m.next(),
        }
    }
}

/// A k-way merge of runs: a heap of each run's head record.
pub(crate) struct Merge<'a, T> {
    runs: &'a Runs<T>,
    cursors: Vec<Cursor>,
    heap: BinaryHeap<Reverse<(T, usize)>>,
    failed: bool,
}

/// Where a pass stands in one run: the bytes still on disk, and a buffer of the next.
struct Cursor {
    next: u64,
    end: u64,
    buf: Vec<u8>,
    pos: usize,
    cap: usize,
}

impl Cursor {
    /// The next record's bytes; `None` at the run's end.
    fn take(&mut self, file: &dyn Scratch, size: usize) -> std::io::Result<Option<&[u8]>> {
        if self.pos == self.buf.len() {
            if self.next == self.end {
                return Ok(None);
            }
            let n = (self.end - self.next).min(self.cap as u64) as usize;
            self.buf.resize(n, 0);
            file.read_at(&mut self.buf, self.next)?;
            self.next += n as u64;
            self.pos = 0;
        }
        let r = &self.buf[self.pos..self.pos + size];
        self.pos += size;
        Ok(Some(r))
    }
}

impl<'a, T: Record> Merge<'a, T> {
    fn new(runs: &'a Runs<T>) -> Result<Self> {
        let k = runs.runs.len().max(1);
        let share = (MERGE_BUFFER / k).clamp(MIN_RUN_BUFFER, MAX_RUN_BUFFER);
        let cap = (share / T::SIZE).max(1) * T::SIZE;
        let mut m = Self {
            runs,
            cursors: runs
                .runs
                .iter()
                .map(|&(first, len)| Cursor {
                    next: first,
                    end: first + len,
                    buf: Vec::new(),
                    pos: 0,
                    cap,
                })
                .collect(),
            heap: BinaryHeap::with_capacity(k),
            failed: false,
        };
        for i in 0..m.cursors.len() {
            m.refill(i)?;
        }
        Ok(m)
    }

    /// Puts run `i`'s next record on the heap.
    fn refill(&mut self, i: usize) -> Result<()> {
        let rec = self.cursors[i]
            .take(&*self.runs.file, T::SIZE)
            .map_err(|e| spill_err(&self.runs.what, e))?
            .map(T::decode);
        if let Some(r) = rec {
            self.heap.push(Reverse((r, i)));
        }
        Ok(())
    }
}

impl<T: Record> Iterator for Merge<'_, T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        if self.failed {
            return None;
        }
        let Reverse((r, i)) = self.heap.pop()?;
        if let Err(e) = self.refill(i) {
            self.failed = true;
            return Some(Err(e));
        }
        Some(Ok(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct K(u32, u32);

    impl Record for K {
        const SIZE: usize = 8;
        fn encode(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0.to_le_bytes());
            out.extend_from_slice(&self.1.to_le_bytes());
        }
        fn decode(b: &[u8]) -> Self {
            K(
                u32::from_le_bytes(b[..4].try_into().unwrap()),
                u32::from_le_bytes(b[4..8].try_into().unwrap()),
            )
        }
    }

    /// Any chunk size gives the in-memory sort; passes over the runs do not disturb
    /// each other, even interleaved.
    #[test]
    fn runs_merge_to_the_in_memory_sort() {
        let input: Vec<K> = (0..1000u32).map(|i| K((i * 7919) % 97, i)).collect();
        let mut want = input.clone();
        want.sort();
        for chunk in [1, 3, 64, 999, 1000, 5000] {
            let mut s = Sorter::new("k", chunk, &in_memory);
            for k in &input {
                s.push(k.clone()).unwrap();
            }
            let st = s.finish().unwrap();
            assert_eq!(
                st.runs(),
                if chunk >= 1000 {
                    0
                } else {
                    1000usize.div_ceil(chunk)
                }
            );
            let got: Vec<K> = st.iter().unwrap().map(Result::unwrap).collect();
            assert_eq!(got, want, "chunk {chunk}");
            let (mut a, mut b) = (st.iter().unwrap(), st.iter().unwrap());
            for w in &want {
                assert_eq!(&a.next().unwrap().unwrap(), w);
                assert_eq!(&b.next().unwrap().unwrap(), w);
            }
            assert!(a.next().is_none() && b.next().is_none());
        }
        let empty = Sorter::<K>::new("k", 3, &in_memory).finish().unwrap();
        assert_eq!(empty.iter().unwrap().count(), 0);
    }
}
