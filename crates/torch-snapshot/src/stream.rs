//! A pickle read as it arrives, a chunk at a time: the page reads a large
//! file so, never holding its bytes whole. The file is passed over twice,
//! as [`super::read`] passes over a whole one: the first pass finds the
//! memo entries the pickle fetches back, the second builds and folds its
//! records, held to the same limit.

use super::fold::Folder;
use super::pickle::{self, Machine, Scan, Value, TRUNCATED};
use super::{check_size, decoded, folder_for, Malformed, MemorySnapshot, SnapshotError, PICKLE};

/// A pickle of a known size, read in two passes over its chunks.
pub struct PickleStream {
    len: usize,
    pass: Pass,
}

enum Pass {
    First(Scan),
    Second(Machine<'static, Folder>),
    /// The pickle's value, built.
    Built(Machine<'static, Folder>, Value),
    /// Refused (what it built was taken apart).
    Done,
}

impl PickleStream {
    /// For a pickle of `len` bytes (refused over [`super::MAX_FILE_BYTES`]).
    pub fn new(len: usize) -> Result<PickleStream, SnapshotError> {
        check_size(len)?;
        Ok(PickleStream {
            len,
            pass: Pass::First(Scan::new(len)),
        })
    }

    /// The first pass: the file's chunks in order, `last` with its end.
    pub fn scan(&mut self, chunk: &[u8], last: bool) -> Result<(), SnapshotError> {
        let Pass::First(scan) = &mut self.pass else {
            return Err(out_of_order());
        };
        scan.feed(chunk, last)?;
        if last {
            let Pass::First(scan) = std::mem::replace(&mut self.pass, Pass::Done) else {
                return Err(out_of_order());
            };
            let ids = scan.finish()?;
            self.pass = Pass::Second(pickle::streaming(self.len, ids, folder_for(self.len)));
        }
        Ok(())
    }

    /// The second pass: the file's chunks again, from its start.
    pub fn read(&mut self, chunk: &[u8], last: bool) -> Result<(), SnapshotError> {
        let machine = match &mut self.pass {
            Pass::Second(machine) => machine,
            Pass::Built(..) => return Ok(()),
            _ => return Err(out_of_order()),
        };
        machine.feed(chunk, last);
        let outcome = match machine.run_some() {
            Ok(Some(top)) => Ok(Some(top)),
            Ok(None) if last => Err(TRUNCATED.into()),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(None) => Ok(()),
            Ok(Some(top)) => {
                if let Pass::Second(machine) = std::mem::replace(&mut self.pass, Pass::Done) {
                    self.pass = Pass::Built(machine, top);
                }
                Ok(())
            }
            Err(e) => {
                // What it built is taken apart without recursion.
                if let Pass::Second(machine) = std::mem::replace(&mut self.pass, Pass::Done) {
                    let _ = machine.finish(Err(e.clone()));
                }
                Err(e.into())
            }
        }
    }

    /// The snapshot, once the second pass has read the pickle's end.
    pub fn finish(self) -> Result<MemorySnapshot, SnapshotError> {
        let Pass::Built(machine, top) = self.pass else {
            return Err(out_of_order());
        };
        let (top, held, folder) = machine.finish_into(Ok(top))?;
        decoded(top, held, self.len, folder, PICKLE)
    }

    /// The records read so far, beside the file's limit ([`super::read_bound`]).
    pub fn records(&self) -> super::Records {
        match &self.pass {
            Pass::Second(machine) | Pass::Built(machine, _) => machine.records(),
            _ => super::Records::default(),
        }
    }
}

fn out_of_order() -> SnapshotError {
    SnapshotError::Malformed(Malformed(
        "the pickle's chunks came out of order: scan all, then read all".into(),
    ))
}
