//! The pickle's bytes read opcode by opcode, and the first pass over them:
//! which memo entries the file fetches back.

/// Memo ids as sets of bits: at most one per byte of the file (each
/// `PUT` takes a byte or more; an id past that is refused).
pub(super) struct Ids {
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

    fn bit(bits: &[u64], id: u32) -> Result<(usize, u64), String> {
        let word = id as usize / 64;
        match word < bits.len() {
            true => Ok((word, 1 << (id % 64))),
            false => Err(format!(
                "the pickle's memo entry {id} is beyond what its size can store"
            )),
        }
    }

    /// Records a `PUT` of `id` (`None`: `MEMOIZE`, the next id); the id.
    pub(super) fn store(&mut self, id: Option<u32>) -> Result<u32, String> {
        let id = id.unwrap_or(self.count);
        let (w, b) = Ids::bit(&self.stored, id)?;
        if self.stored[w] & b == 0 {
            self.stored[w] |= b;
            self.count += 1;
        }
        Ok(id)
    }

    fn fetch(&mut self, id: u32) -> Result<(), String> {
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
pub(super) fn fetched(input: &[u8]) -> Result<Ids, String> {
    let mut ids = Ids::new(input.len());
    let mut r = Reader { input, at: 0 };
    loop {
        let op = r.take(1)?[0];
        match op {
            b'.' => break,
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
    }
    ids.count = 0;
    ids.stored.fill(0);
    Ok(ids)
}

/// The input and where it is read.
pub(super) struct Reader<'a> {
    pub(super) input: &'a [u8],
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let input: &'a [u8] = self.input;
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= input.len())
            .ok_or("the pickle ends too early: the file is truncated")?;
        let bytes = &input[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A length prefix of 4 or 8 bytes.
    pub(super) fn length(&mut self, width: usize) -> Result<usize, String> {
        let n = if width == 4 {
            u64::from(u32::from_le_bytes(self.array()?))
        } else {
            u64::from_le_bytes(self.array()?)
        };
        usize::try_from(n).map_err(|_| "a length in the pickle is too large".to_string())
    }

    /// A memo index: one byte (`short`) or four.
    pub(super) fn memo_id(&mut self, short: bool) -> Result<u32, String> {
        Ok(match short {
            true => self.take(1)?[0].into(),
            false => u32::from_le_bytes(self.array()?),
        })
    }

    /// Skips the argument of `op` (the first pass; the second pass says
    /// what is wrong with an opcode it does not read).
    fn skip_argument(&mut self, op: u8) -> Result<(), String> {
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
