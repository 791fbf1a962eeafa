//! The machine the pickle's opcodes drive (and JSON's structure, in
//! `json`): its stack, its memo (only the entries the file fetches back),
//! the containers it builds and folds, and every byte it holds counted
//! against the file's limit.

use super::scan::{Ids, Reader, TRUNCATED};
#[cfg(feature = "teardown")]
use super::tear_down;
use super::{
    cost, freed, limit, list, not_an_entry, pairs, unique, Fold, Value, HEADER, SLACK, SLOT,
};
use crate::error::Malformed;
use crate::trace::{Trace, EVENT_BYTES};
use crate::Records;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// What a machine held when it finished: all it counted, and of that its
/// records' share (beside the file's limit).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Held {
    pub bytes: usize,
    pub records: Records,
}

/// The pickle machine: its stack, memo and containers, which the pickle's
/// opcodes drive (and JSON's structure, in `json`).
pub(crate) struct Machine<'a, F: Fold> {
    r: Reader<'a>,
    /// The file's size (its limit's measure).
    len: usize,
    stack: Vec<Value>,
    /// The entries the pickle fetches back; the others are never kept.
    memo: HashMap<u32, Value>,
    /// Which memo ids were stored (their count is `MEMOIZE`'s next id) and
    /// which are ever fetched.
    ids: Ids,
    fold: F,
    /// Bytes held by the values made (an upper bound: a value let go of
    /// is not taken off), the stack and the memo aside.
    held: usize,
    /// What the pickle let go of (`POP`, a memo slot set again): dropped
    /// at the end by [`tear_down`].
    #[cfg(feature = "teardown")]
    dead: Vec<Value>,
}

impl<'a, F: Fold> Machine<'a, F> {
    /// A machine reading `r`, a file of `len` bytes.
    pub(super) fn new(r: Reader<'a>, len: usize, ids: Ids, fold: F) -> Self {
        Machine {
            len,
            r,
            stack: Vec::new(),
            memo: HashMap::new(),
            ids,
            fold,
            held: 0,
            #[cfg(feature = "teardown")]
            dead: Vec::new(),
        }
    }

    /// A machine driven from outside (no pickle, no memo) for a file of
    /// `len` bytes.
    pub(crate) fn driven(len: usize, fold: F) -> Self {
        Machine::new(Reader::whole(&[]), len, Ids::new(0), fold)
    }

    /// The value built (`top`) and what it held, the rest taken apart.
    pub(crate) fn finish(self, top: Result<Value, Malformed>) -> Result<(Value, Held), Malformed> {
        self.finish_into(top).map(|(top, held, _)| (top, held))
    }

    /// The records read, beside the file's limit.
    pub(crate) fn records(&self) -> Records {
        self.fold.records()
    }

    /// The most the machine may hold now: the file's limit, its records
    /// beside it, less what its count misses.
    fn limit(&self) -> usize {
        limit(self.len, self.records().bytes()).saturating_sub(SLACK)
    }

    /// As [`Machine::finish`], and the fold back.
    #[cfg_attr(not(feature = "teardown"), allow(unused_mut))]
    pub(crate) fn finish_into(
        mut self,
        top: Result<Value, Malformed>,
    ) -> Result<(Value, Held, F), Malformed> {
        let held = Held {
            bytes: self.total(),
            records: self.records(),
        };
        #[cfg(feature = "teardown")]
        {
            // Each in its own storage: gathering them in one would hold
            // the stack twice for a moment.
            tear_down(std::mem::take(&mut self.stack));
            tear_down(std::mem::take(&mut self.dead));
            tear_down(std::mem::take(&mut self.memo).into_values().collect());
        }
        Ok((top?, held, self.fold))
    }
}

impl<'a, F: Fold> Machine<'a, F> {
    pub(super) fn run(&mut self) -> Result<Value, Malformed> {
        self.run_some()?.ok_or_else(|| TRUNCATED.into())
    }

    /// Runs the opcodes the input holds whole: the value built at the
    /// pickle's `STOP`, or `None` where a stream's next chunk is needed
    /// (the opcode cut off is read again then: each reads its argument
    /// before it changes anything).
    pub(crate) fn run_some(&mut self) -> Result<Option<Value>, Malformed> {
        loop {
            let mark = self.r.at;
            let stepped = self.r.take(1).map(|op| op[0]).and_then(|op| match op {
                b'.' => Ok(Some(op)),
                _ => self.step(op).map(|()| None),
            });
            match stepped {
                Ok(Some(_)) => return self.pop().map(Some),
                Ok(None) => self.room(0)?,
                Err(_) if self.r.short => {
                    self.r.at = mark;
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The next bytes of a streamed pickle (`last`: the file ends after
    /// them).
    pub(crate) fn feed(&mut self, chunk: &[u8], last: bool) {
        self.r.feed(chunk, last);
    }

    /// Bytes held: the values made, the stack and the memo as reserved
    /// (not only as used), the folds.
    fn total(&self) -> usize {
        let tables = self.stack.capacity() + 2 * self.memo.capacity();
        let ids = 2 * 8 * self.ids.stored.len();
        self.held + tables * SLOT + ids + self.fold.held()
    }

    /// Whether `bytes` more fit under the limit; refused when not. Checked
    /// before anything grows, so that a growing table's old and new
    /// storage, both held for a moment, fit too.
    fn room(&self, bytes: usize) -> Result<(), Malformed> {
        match self.total().saturating_add(bytes) <= self.limit() {
            true => Ok(()),
            false => Err(format!(
                "reading the file would take more than twice its size beside its records ({} MB from {} MB, {} MB of them records): a snapshot takes less",
                (self.total() + bytes) >> 20,
                self.len >> 20,
                self.records().bytes() >> 20
            ).into()),
        }
    }

    pub(crate) fn push(&mut self, v: Value) -> Result<(), Malformed> {
        let cap = self.stack.capacity();
        if self.stack.len() == cap {
            let more = cap.max(64);
            self.room((cap + more) * SLOT)?;
            self.stack.reserve_exact(more);
        }
        self.stack.push(v);
        Ok(())
    }

    /// Pushes a value just made, counting what it holds.
    pub(crate) fn make(&mut self, v: Value) -> Result<(), Malformed> {
        self.held += cost(&v);
        self.push(v)
    }

    fn step(&mut self, op: u8) -> Result<(), Malformed> {
        match op {
            0x80 => _ = self.r.take(1)?,     // PROTO
            0x95 => _ = self.r.take(8)?,     // FRAME
            b'(' => self.push(Value::Mark)?, // MARK
            b'N' => self.push(Value::None)?,
            0x88 => self.push(Value::Bool(true))?,
            0x89 => self.push(Value::Bool(false))?,
            b'J' => {
                let n = i32::from_le_bytes(self.r.array()?);
                self.push(Value::Int(n.into()))?;
            }
            b'K' => {
                let n = self.r.take(1)?[0];
                self.push(Value::Int(n.into()))?;
            }
            b'M' => {
                let n = u16::from_le_bytes(self.r.array()?);
                self.push(Value::Int(n.into()))?;
            }
            0x8a => {
                let n = self.r.take(1)?[0] as usize;
                self.long(n)?;
            }
            0x8b => {
                let n = self.r.length(4)?;
                self.long(n)?;
            }
            b'G' => {
                let f = f64::from_be_bytes(self.r.array()?);
                self.push(Value::Float(f))?;
            }
            _ => return self.step_strings(op),
        }
        Ok(())
    }

    fn step_strings(&mut self, op: u8) -> Result<(), Malformed> {
        let text = |m: &mut Self, len: usize| -> Result<(), Malformed> {
            let bytes = m.r.take(len)?;
            let s: Rc<str> = std::str::from_utf8(bytes)
                .map_err(|_| "a string is not valid UTF-8".to_string())?
                .into();
            m.make(Value::Str(s))?;
            Ok(())
        };
        let bytes = |m: &mut Self, len: usize| -> Result<(), Malformed> {
            m.r.take(len)?;
            m.push(Value::Bytes)?;
            Ok(())
        };
        match op {
            b'X' => {
                let n = self.r.length(4)?;
                text(self, n)
            }
            0x8c => {
                let n = self.r.take(1)?[0] as usize;
                text(self, n)
            }
            0x8d => {
                let n = self.r.length(8)?;
                text(self, n)
            }
            // Protocol 2's `str`: bytes, read as text where they are UTF-8.
            b'T' | b'U' => {
                let n = if op == b'T' {
                    self.r.length(4)?
                } else {
                    self.r.take(1)?[0] as usize
                };
                let b = self.r.take(n)?;
                let s: Rc<str> = String::from_utf8_lossy(b).as_ref().into();
                self.make(Value::Str(s))?;
                Ok(())
            }
            b'B' | 0x8e | 0x96 => {
                let n = self.r.length(if op == b'B' { 4 } else { 8 })?;
                bytes(self, n)
            }
            b'C' => {
                let n = self.r.take(1)?[0] as usize;
                bytes(self, n)
            }
            _ => self.step_containers(op),
        }
    }

    fn step_containers(&mut self, op: u8) -> Result<(), Malformed> {
        match op {
            b']' | b')' | 0x8f => self.make(list(Vec::new()))?,
            b'}' => self.make(Value::Dict(Rc::default()))?,
            b'l' | b't' | 0x91 => {
                let items = self.pop_mark()?;
                let items = self.folded(items);
                self.make(list(items))?;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < n {
                    return Err("the pickle's stack runs empty".into());
                }
                self.room(n * SLOT)?;
                let items = self.stack.split_off(self.stack.len() - n);
                let items = self.folded(items);
                self.make(list(items))?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                self.room(items.len() * SLOT)?;
                let pairs = pairs(items)?;
                let pairs = self.folded_pairs(pairs);
                self.make(Value::Dict(Rc::new(RefCell::new(pairs))))?;
            }
            b'a' => {
                let item = self.pop()?;
                self.extend(vec![item])?;
            }
            b'e' | 0x90 => self.appends()?,
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![(key, value)])?;
            }
            b'u' => self.set_items_from_mark()?,
            b'0' => {
                let v = self.pop()?;
                self.bury([v]);
            }
            b'1' => {
                let items = self.pop_mark()?;
                self.bury(items);
            }
            b'2' => {
                let top = self.top()?;
                self.push(top)?;
            }
            _ => return self.step_memo(op),
        }
        Ok(())
    }

    fn step_memo(&mut self, op: u8) -> Result<(), Malformed> {
        match op {
            // BINPUT, LONG_BINPUT, MEMOIZE: kept only when fetched back.
            b'q' | b'r' | 0x94 => {
                let id = match op {
                    0x94 => None,
                    _ => Some(self.r.memo_id(op == b'q')?),
                };
                let id = self.ids.store(id)?;
                let top = self.top()?;
                if self.ids.is_fetched(id) {
                    if self.memo.len() == self.memo.capacity() {
                        self.room(self.memo.capacity().max(4) * 4 * SLOT)?;
                    }
                    let old = self.memo.insert(id, top);
                    self.bury(old);
                }
            }
            // BINGET, LONG_BINGET
            b'h' | b'j' => {
                let id = self.r.memo_id(op == b'h')?;
                let value = self.memo.get(&id).cloned().ok_or_else(|| {
                    format!("the pickle refers to memo entry {id}, which it never stored")
                })?;
                self.push(value)?;
            }
            b'c'
            | 0x93
            | b'R'
            | b'b'
            | b'i'
            | b'o'
            | 0x81
            | 0x92
            | 0x82..=0x84
            | b'P'
            | b'Q'
            | 0x97
            | 0x98 => {
                return Err(format!(
                    "the pickle refers to Python code or classes (opcode {:#04x} at byte {}); a memory snapshot holds only plain data, and vramlab runs nothing from a file",
                    op,
                    self.r.position() - 1
                ).into());
            }
            _ => {
                return Err(format!(
                    "the pickle has an opcode vramlab does not read ({:#04x} at byte {})",
                    op,
                    self.r.position() - 1
                )
                .into())
            }
        }
        Ok(())
    }

    /// `LONG1` / `LONG4`: little-endian two's complement of `n` bytes.
    fn long(&mut self, n: usize) -> Result<(), Malformed> {
        if n > 16 {
            return Err("an integer in the pickle is larger than 128 bits".into());
        }
        let bytes = self.r.take(n)?;
        let mut v: i128 = 0;
        for (i, &b) in bytes.iter().enumerate() {
            v |= i128::from(b) << (8 * i);
        }
        if n > 0 && n < 16 && bytes[n - 1] & 0x80 != 0 {
            v -= 1i128 << (8 * n);
        }
        self.push(Value::Int(v))?;
        Ok(())
    }

    /// The value on top of the stack, kept there.
    fn top(&self) -> Result<Value, Malformed> {
        match self.stack.last() {
            Some(Value::Mark) | None => Err("the pickle's stack runs empty".into()),
            Some(v) => Ok(v.clone()),
        }
    }

    pub(crate) fn pop(&mut self) -> Result<Value, Malformed> {
        match self.stack.pop() {
            Some(Value::Mark) | None => Err("the pickle's stack runs empty".into()),
            Some(v) => Ok(v),
        }
    }

    /// `APPENDS`: the items since the mark into the list below it.
    pub(crate) fn appends(&mut self) -> Result<(), Malformed> {
        let items = self.pop_mark()?;
        self.extend(items)
    }

    /// `SETITEMS`: the keys and values since the mark into the dict below.
    pub(crate) fn set_items_from_mark(&mut self) -> Result<(), Malformed> {
        let items = self.pop_mark()?;
        self.room(items.len() * SLOT)?;
        self.set_items(pairs(items)?)
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, Malformed> {
        let mark = self
            .stack
            .iter()
            .rposition(|v| matches!(v, Value::Mark))
            .ok_or("the pickle has no mark where it needs one")?;
        self.room((self.stack.len() - mark) * SLOT)?;
        let items = self.stack.split_off(mark + 1);
        self.stack.pop();
        Ok(items)
    }

    /// Values the pickle let go of, kept to be torn down with the rest.
    fn bury(&mut self, values: impl IntoIterator<Item = Value>) {
        #[cfg(feature = "teardown")]
        self.dead.extend(values);
        #[cfg(not(feature = "teardown"))]
        drop(values);
    }

    /// `v` folded as it goes into a container: what folding frees (a
    /// container held only here, or emptied by its fold) is given back.
    fn fold(&mut self, v: Value) -> Value {
        if !matches!(v, Value::List(_) | Value::Dict(_)) {
            return v;
        }
        let before = freed(&v);
        let shared = (!unique(&v)).then(|| v.clone());
        let folded = self.fold.item(v);
        if !matches!(folded, Value::List(_) | Value::Dict(_)) {
            let after = shared.as_ref().map_or(0, freed);
            self.held = self.held.saturating_sub(before.saturating_sub(after));
            if matches!(&folded, Value::Frame(f) if Rc::strong_count(f) == 1) {
                self.held += HEADER;
            }
        }
        folded
    }

    fn folded(&mut self, items: Vec<Value>) -> Vec<Value> {
        items.into_iter().map(|v| self.fold(v)).collect()
    }

    fn folded_pairs(&mut self, pairs: Vec<(Value, Value)>) -> Vec<(Value, Value)> {
        (pairs.into_iter())
            .map(|(k, v)| (k, self.fold(v)))
            .collect()
    }

    fn extend(&mut self, items: Vec<Value>) -> Result<(), Malformed> {
        let items = self.folded(items);
        self.as_trace(&items);
        match self.stack.last() {
            Some(Value::Trace(t)) => {
                let mut t = t.borrow_mut();
                for v in &items {
                    if t.error.is_some() {
                        break;
                    }
                    let e = match self.fold.entry(v) {
                        Some(Ok(e)) => e,
                        Some(Err(e)) => {
                            t.error = Some(e);
                            break;
                        }
                        None => {
                            t.error = Some(not_an_entry(v));
                            break;
                        }
                    };
                    let (len, cap) = (t.trace.len(), t.trace.capacity());
                    if len == cap {
                        let more = (cap / 8).max(64);
                        // Column by column: the largest's old and new.
                        self.room(more * EVENT_BYTES + (cap + more) * 8)?;
                        t.trace.reserve_exact(more);
                        self.held += more * EVENT_BYTES;
                    }
                    match t.trace.push(e) {
                        Err(e) => t.error = Some(e),
                        Ok(()) if unique(v) => self.fold.entries(1, 0),
                        Ok(()) => {}
                    }
                }
                if t.error.is_some() {
                    self.held = self.held.saturating_sub(t.trace.bytes());
                    self.fold.entries(0, t.trace.len());
                    t.trace = Trace::default();
                }
                let gone: usize = items.iter().filter(|v| unique(v)).map(freed).sum();
                self.held = self.held.saturating_sub(gone);
                Ok(())
            }
            Some(Value::List(l)) => {
                let mut l = l.borrow_mut();
                let before = l.capacity();
                if let Some((new, more)) = grown(&l, items.len()) {
                    self.room(new * SLOT)?;
                    l.reserve_exact(more);
                }
                l.extend(items);
                self.held += (l.capacity() - before) * SLOT;
                Ok(())
            }
            _ => {
                #[cfg(feature = "teardown")]
                tear_down(items);
                Err("the pickle appends to something that is not a list".into())
            }
        }
    }

    /// Turns the list on top into a [`Trace`] when it is empty, held
    /// there alone, and `items` begin with a trace entry.
    fn as_trace(&mut self, items: &[Value]) {
        let Some(Value::List(l)) = self.stack.last() else {
            return;
        };
        if Rc::strong_count(l) != 1 || !l.borrow().is_empty() {
            return;
        }
        if let Some(Ok(_)) = items.first().and_then(|v| self.fold.entry(v)) {
            *self.stack.last_mut().expect("a list on top") = Value::Trace(Rc::default());
        }
    }

    fn set_items(&mut self, items: Vec<(Value, Value)>) -> Result<(), Malformed> {
        let items = self.folded_pairs(items);
        match self.stack.last() {
            Some(Value::Dict(d)) => {
                let mut d = d.borrow_mut();
                let before = d.capacity();
                if let Some((new, more)) = grown(&d, items.len()) {
                    self.room(new * 2 * SLOT)?;
                    d.reserve_exact(more);
                }
                d.extend(items);
                self.held += (d.capacity() - before) * 2 * SLOT;
                Ok(())
            }
            _ => {
                #[cfg(feature = "teardown")]
                tear_down(vec![Value::Dict(Rc::new(RefCell::new(items)))]);
                Err("the pickle sets items on something that is not a dict".into())
            }
        }
    }
}

/// The capacity `v` grows to for `n` more items, when it must grow: by an
/// eighth (not twice, as `Vec` does: what a table has reserved and not
/// used counts against the file's limit), and at least to hold them.
/// Also how many more to reserve.
fn grown<T>(v: &Vec<T>, n: usize) -> Option<(usize, usize)> {
    let (len, cap) = (v.len(), v.capacity());
    let new = (len + n).max(cap + cap / 8 + 4);
    (len + n > cap).then_some((new, new - len))
}
