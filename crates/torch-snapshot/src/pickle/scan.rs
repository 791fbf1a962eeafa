//! The pickle's bytes read opcode by opcode, and the first pass over them:
//! which memo entries the file fetches back.

use crate::error::Malformed;

/// Memo ids as sets of bits: at most one per byte of the file (each
/// `PUT` takes a byte or more; an id past that is refused).
pub(crate) struct Ids {
    pub(super) stored: Vec<u64>,
    count: u32,
    fetched: Vec<u64>,
}

impl Ids {
    pub(super) fn new(len: usize) -> Ids {
        let words = len / 64 + 1;
        Ids {
            stored: vec![0; words],
            count: 0,
            fetched: vec![0; words],
        }
    }

    fn bit(bits: &[u64], id: u32) -> Result<(usize, u64), Malformed> {
        let word = id as usize / 64;
        match word < bits.len() {
            true => Ok((word, 1 << (id % 64))),
            false => Err(
                format!("the pickle's memo entry {id} is beyond what its size can store").into(),
            ),
        }
    }

    /// Records a `PUT` of `id` (`None`: `MEMOIZE`, the next id); the id.
    pub(super) fn store(&mut self, id: Option<u32>) -> Result<u32, Malformed> {
        let id = id.unwrap_or(self.count);
        let (w, b) = Ids::bit(&self.stored, id)?;
        if self.stored[w] & b == 0 {
            self.stored[w] |= b;
            self.count += 1;
        }
        Ok(id)
    }

    fn fetch(&mut self, id: u32) -> Result<(), Malformed> {
        let (w, b) = Ids::bit(&self.fetched, id)?;
        self.fetched[w] |= b;
        Ok(())
    }

    pub(super) fn is_fetched(&self, id: u32) -> bool {
        Ids::bit(&self.fetched, id).is_ok_and(|(w, b)| self.fetched[w] & b != 0)
    }
}

/// The first pass: which memo ids the pickle fetches back. Reads the
/// opcodes and their arguments only, as the second pass will.
pub(super) fn fetched(input: &[u8]) -> Result<Ids, Malformed> {
    let mut ids = Ids::new(input.len());
    let mut r = Reader::whole(input);
    while !scan_one(&mut r, &mut ids)? {}
    Ok(ids.fetched_only())
}

/// Scans one opcode and its argument; whether it was the pickle's `STOP`.
fn scan_one(r: &mut Reader, ids: &mut Ids) -> Result<bool, Malformed> {
    let op = r.take(1)?[0];
    match op {
        b'.' => return Ok(true),
        b'q' | b'r' | 0x94 => {
            let id = match op {
                0x94 => None,
                _ => Some(r.memo_id(op == b'q')?),
            };
            ids.store(id)?;
        }
        b'h' | b'j' => {
            let id = r.memo_id(op == b'h')?;
            ids.fetch(id)?;
        }
        _ => r.skip_argument(op)?,
    }
    Ok(false)
}

impl Ids {
    /// What the second pass starts from: the ids fetched, none stored.
    fn fetched_only(mut self) -> Ids {
        self.count = 0;
        self.stored.fill(0);
        self
    }
}

/// The first pass over a pickle that arrives a chunk at a time.
pub(crate) struct Scan {
    r: Reader<'static>,
    ids: Ids,
    stopped: bool,
}

impl Scan {
    /// For a file of `len` bytes.
    pub(crate) fn new(len: usize) -> Scan {
        Scan {
            r: Reader::stream(),
            ids: Ids::new(len),
            stopped: false,
        }
    }

    /// Scans `chunk` (the file's next bytes; `last`: its end).
    pub(crate) fn feed(&mut self, chunk: &[u8], last: bool) -> Result<(), Malformed> {
        if self.stopped {
            return Ok(());
        }
        self.r.feed(chunk, last);
        loop {
            let mark = self.r.at;
            match scan_one(&mut self.r, &mut self.ids) {
                Ok(true) => {
                    self.stopped = true;
                    self.r.feed(&[], true);
                    return Ok(());
                }
                Ok(false) => {}
                Err(_) if self.r.short => {
                    self.r.at = mark;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The ids the second pass keeps, once the whole file was scanned.
    pub(crate) fn finish(self) -> Result<Ids, Malformed> {
        match self.stopped {
            true => Ok(self.ids.fetched_only()),
            false => Err(TRUNCATED.into()),
        }
    }
}

/// Why a pickle whose end never came is refused.
pub(crate) const TRUNCATED: &str = "the pickle ends too early: the file is truncated";

/// What a reader reads from: a whole file, or a stream's buffer (the
/// bytes not yet read of those that have come).
enum Input<'a> {
    Whole(&'a [u8]),
    Stream(Vec<u8>),
}

/// The input and where it is read.
pub(super) struct Reader<'a> {
    input: Input<'a>,
    pub(super) at: usize,
    /// The file offset of the input's first byte (a stream drops what it
    /// has read).
    base: usize,
    /// Whether more of the file may come: a read past the end is then
    /// `short` (wait for the next chunk), not a truncated file.
    more: bool,
    pub(super) short: bool,
}

impl<'a> Reader<'a> {
    pub(super) fn whole(input: &'a [u8]) -> Reader<'a> {
        Reader {
            input: Input::Whole(input),
            at: 0,
            base: 0,
            more: false,
            short: false,
        }
    }

    pub(super) fn stream() -> Reader<'static> {
        Reader {
            input: Input::Stream(Vec::new()),
            at: 0,
            base: 0,
            more: true,
            short: false,
        }
    }

    /// The next bytes of a stream (`last`: the file ends after them); what
    /// has been read is dropped.
    pub(super) fn feed(&mut self, chunk: &[u8], last: bool) {
        if let Input::Stream(buffer) = &mut self.input {
            buffer.drain(..self.at);
            self.base += self.at;
            self.at = 0;
            buffer.extend_from_slice(chunk);
        }
        self.more = !last;
        self.short = false;
    }

    fn input(&self) -> &[u8] {
        match &self.input {
            Input::Whole(bytes) => bytes,
            Input::Stream(buffer) => buffer,
        }
    }

    /// Where in the file the next byte is.
    pub(super) fn position(&self) -> usize {
        self.base + self.at
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        let start = self.at;
        let Some(end) = start.checked_add(n).filter(|&e| e <= self.input().len()) else {
            self.short = self.more;
            return Err(TRUNCATED.into());
        };
        self.at = end;
        Ok(&self.input()[start..end])
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A length prefix of 4 or 8 bytes.
    pub(super) fn length(&mut self, width: usize) -> Result<usize, Malformed> {
        let n = if width == 4 {
            u64::from(u32::from_le_bytes(self.array()?))
        } else {
            u64::from_le_bytes(self.array()?)
        };
        usize::try_from(n).map_err(|_| "a length in the pickle is too large".into())
    }

    /// A memo index: one byte (`short`) or four.
    pub(super) fn memo_id(&mut self, short: bool) -> Result<u32, Malformed> {
        Ok(match short {
            true => self.take(1)?[0].into(),
            false => u32::from_le_bytes(self.array()?),
        })
    }

    /// Skips the argument of `op` (the first pass; the second pass says
    /// what is wrong with an opcode it does not read).
    fn skip_argument(&mut self, op: u8) -> Result<(), Malformed> {
        let n = match op {
            0x80 | b'K' | b'C' => 1,
            b'M' => 2,
            b'J' => 4,
            0x95 | b'G' => 8,
            0x8a | 0x8c | b'U' => self.take(1)?[0] as usize,
            0x8b | b'X' | b'T' | b'B' => self.length(4)?,
            0x8d | 0x8e | 0x96 => self.length(8)?,
            _ => 0,
        };
        self.take(n).map(|_| ())
    }
}
