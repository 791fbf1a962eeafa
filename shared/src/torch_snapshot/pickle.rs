//! A pickle reader for data only: the opcodes of protocols 2 to 5 that
//! build None, booleans, integers, floats, strings, bytes, lists, tuples,
//! dicts and sets, with the memo shared as CPython shares it (a value
//! referenced twice is one value). Any opcode that would name a Python
//! class or call a function (`GLOBAL`, `REDUCE`, `BUILD`, `NEWOBJ`, …) is
//! an error: nothing in a file is ever run.
//!
//! The result is a tree of [`Value`]s (JSON is read into the same tree),
//! which `decode` reads into the snapshot's types.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(Rc<str>),
    /// Bytes (no field of a snapshot holds any: only their kind is kept).
    Bytes,
    /// Lists, tuples and sets (built in place after being memoized).
    List(Rc<RefCell<Vec<Value>>>),
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
    Mark,
}

struct Machine<'a> {
    input: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
    /// What the pickle let go of (`POP`, a memo slot set again): dropped
    /// at the end by [`tear_down`].
    #[cfg(feature = "teardown")]
    dead: Vec<Value>,
}

/// Runs a pickle's opcodes; the value it builds. With the `teardown`
/// feature (not in the page) whatever else it built is taken apart without
/// recursion (a pickle can nest a value as deep as it has opcodes: a
/// million one-item tuples in 1 MB), and the caller drops the value it
/// gets the same way.
pub fn read(input: &[u8]) -> Result<Value, String> {
    let mut m = Machine {
        input,
        at: 0,
        stack: Vec::new(),
        memo: HashMap::new(),
        #[cfg(feature = "teardown")]
        dead: Vec::new(),
    };
    let top = m.run();
    #[cfg(feature = "teardown")]
    {
        let mut rest = m.dead;
        rest.append(&mut m.stack);
        rest.extend(m.memo.into_values());
        tear_down(rest);
    }
    top
}

/// Drops `values` one container at a time: each that held the last
/// reference to a list or dict gives up its items here, so no value's
/// depth reaches the stack.
#[cfg(feature = "teardown")]
pub fn tear_down(mut values: Vec<Value>) {
    while let Some(v) = values.pop() {
        match v {
            Value::List(rc) => {
                if let Some(items) = Rc::into_inner(rc) {
                    values.extend(items.into_inner());
                }
            }
            Value::Dict(rc) => {
                if let Some(pairs) = Rc::into_inner(rc) {
                    for (k, v) in pairs.into_inner() {
                        values.push(k);
                        values.push(v);
                    }
                }
            }
            _ => {}
        }
    }
}

/// JSON as the same tree a pickle builds.
pub fn from_json(json: serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match json {
        Json::Null => Value::None,
        Json::Bool(b) => Value::Bool(b),
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Value::Int(u.into()),
            (_, Some(i)) => Value::Int(i.into()),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::Str(s.into()),
        Json::Array(items) => list(items.into_iter().map(from_json).collect()),
        Json::Object(fields) => Value::Dict(Rc::new(RefCell::new(
            fields
                .into_iter()
                .map(|(k, v)| (Value::Str(k.into()), from_json(v)))
                .collect(),
        ))),
    }
}

fn list(items: Vec<Value>) -> Value {
    Value::List(Rc::new(RefCell::new(items)))
}

impl<'a> Machine<'a> {
    fn run(&mut self) -> Result<Value, String> {
        loop {
            let op = self.take(1)?[0];
            if op == b'.' {
                return self.pop();
            }
            self.step(op)?;
        }
    }

    fn step(&mut self, op: u8) -> Result<(), String> {
        match op {
            0x80 => _ = self.take(1)?,            // PROTO
            0x95 => _ = self.take(8)?,            // FRAME
            b'(' => self.stack.push(Value::Mark), // MARK
            b'N' => self.stack.push(Value::None),
            0x88 => self.stack.push(Value::Bool(true)),
            0x89 => self.stack.push(Value::Bool(false)),
            b'J' => {
                let n = i32::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(n.into()));
            }
            b'K' => {
                let n = self.take(1)?[0];
                self.stack.push(Value::Int(n.into()));
            }
            b'M' => {
                let n = u16::from_le_bytes(self.array()?);
                self.stack.push(Value::Int(n.into()));
            }
            0x8a => {
                let n = self.take(1)?[0] as usize;
                self.long(n)?;
            }
            0x8b => {
                let n = self.length(4)?;
                self.long(n)?;
            }
            b'G' => {
                let f = f64::from_be_bytes(self.array()?);
                self.stack.push(Value::Float(f));
            }
            _ => return self.step_strings(op),
        }
        Ok(())
    }

    fn step_strings(&mut self, op: u8) -> Result<(), String> {
        let text = |m: &mut Self, len: usize| -> Result<(), String> {
            let bytes = m.take(len)?;
            let s = std::str::from_utf8(bytes)
                .map_err(|_| "a string is not valid UTF-8".to_string())?;
            m.stack.push(Value::Str(s.into()));
            Ok(())
        };
        let bytes = |m: &mut Self, len: usize| -> Result<(), String> {
            m.take(len)?;
            m.stack.push(Value::Bytes);
            Ok(())
        };
        match op {
            b'X' => {
                let n = self.length(4)?;
                text(self, n)
            }
            0x8c => {
                let n = self.take(1)?[0] as usize;
                text(self, n)
            }
            0x8d => {
                let n = self.length(8)?;
                text(self, n)
            }
            // Protocol 2's `str`: bytes, read as text where they are UTF-8.
            b'T' | b'U' => {
                let n = if op == b'T' {
                    self.length(4)?
                } else {
                    self.take(1)?[0] as usize
                };
                let b = self.take(n)?;
                let s = String::from_utf8_lossy(b);
                self.stack.push(Value::Str(s.as_ref().into()));
                Ok(())
            }
            b'B' | 0x8e | 0x96 => {
                let n = self.length(if op == b'B' { 4 } else { 8 })?;
                bytes(self, n)
            }
            b'C' => {
                let n = self.take(1)?[0] as usize;
                bytes(self, n)
            }
            _ => self.step_containers(op),
        }
    }

    fn step_containers(&mut self, op: u8) -> Result<(), String> {
        match op {
            b']' | b')' | 0x8f => self.stack.push(list(Vec::new())),
            b'}' => self.stack.push(Value::Dict(Rc::default())),
            b'l' | b't' | 0x91 => {
                let items = self.pop_mark()?;
                self.stack.push(list(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if self.stack.len() < n {
                    return Err("the pickle's stack runs empty".into());
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.stack.push(list(items));
            }
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = pairs(items)?;
                self.stack.push(Value::Dict(Rc::new(RefCell::new(pairs))));
            }
            b'a' => {
                let item = self.pop()?;
                self.extend(vec![item])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                self.extend(items)?;
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![(key, value)])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(pairs(items)?)?;
            }
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
                self.stack.push(top);
            }
            _ => return self.step_memo(op),
        }
        Ok(())
    }

    fn step_memo(&mut self, op: u8) -> Result<(), String> {
        match op {
            // BINPUT, LONG_BINPUT, MEMOIZE
            b'q' | b'r' | 0x94 => {
                let id = match op {
                    0x94 => self.memo.len() as u32,
                    _ => self.memo_id(op == b'q')?,
                };
                let top = self.top()?;
                let old = self.memo.insert(id, top);
                self.bury(old);
            }
            // BINGET, LONG_BINGET
            b'h' | b'j' => {
                let id = self.memo_id(op == b'h')?;
                let value = self.memo.get(&id).cloned().ok_or_else(|| {
                    format!("the pickle refers to memo entry {id}, which it never stored")
                })?;
                self.stack.push(value);
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
                    self.at - 1
                ));
            }
            _ => {
                return Err(format!(
                    "the pickle has an opcode vramlab does not read ({:#04x} at byte {})",
                    op,
                    self.at - 1
                ))
            }
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
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

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A length prefix of 4 or 8 bytes.
    fn length(&mut self, width: usize) -> Result<usize, String> {
        let n = if width == 4 {
            u64::from(u32::from_le_bytes(self.array()?))
        } else {
            u64::from_le_bytes(self.array()?)
        };
        usize::try_from(n).map_err(|_| "a length in the pickle is too large".to_string())
    }

    /// `LONG1` / `LONG4`: little-endian two's complement of `n` bytes.
    fn long(&mut self, n: usize) -> Result<(), String> {
        if n > 16 {
            return Err("an integer in the pickle is larger than 128 bits".into());
        }
        let bytes = self.take(n)?;
        let mut v: i128 = 0;
        for (i, &b) in bytes.iter().enumerate() {
            v |= i128::from(b) << (8 * i);
        }
        if n > 0 && n < 16 && bytes[n - 1] & 0x80 != 0 {
            v -= 1i128 << (8 * n);
        }
        self.stack.push(Value::Int(v));
        Ok(())
    }

    /// A memo index: one byte (`short`) or four.
    fn memo_id(&mut self, short: bool) -> Result<u32, String> {
        Ok(match short {
            true => self.take(1)?[0].into(),
            false => u32::from_le_bytes(self.array()?),
        })
    }

    /// The value on top of the stack, kept there.
    fn top(&self) -> Result<Value, String> {
        match self.stack.last() {
            Some(Value::Mark) | None => Err("the pickle's stack runs empty".into()),
            Some(v) => Ok(v.clone()),
        }
    }

    fn pop(&mut self) -> Result<Value, String> {
        match self.stack.pop() {
            Some(Value::Mark) | None => Err("the pickle's stack runs empty".into()),
            Some(v) => Ok(v),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let mark = self
            .stack
            .iter()
            .rposition(|v| matches!(v, Value::Mark))
            .ok_or("the pickle has no mark where it needs one")?;
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

    fn extend(&mut self, items: Vec<Value>) -> Result<(), String> {
        match self.stack.last() {
            Some(Value::List(l)) => {
                l.borrow_mut().extend(items);
                Ok(())
            }
            _ => {
                #[cfg(feature = "teardown")]
                tear_down(items);
                Err("the pickle appends to something that is not a list".into())
            }
        }
    }

    fn set_items(&mut self, items: Vec<(Value, Value)>) -> Result<(), String> {
        match self.stack.last() {
            Some(Value::Dict(d)) => {
                d.borrow_mut().extend(items);
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

fn pairs(items: Vec<Value>) -> Result<Vec<(Value, Value)>, String> {
    if items.len() % 2 != 0 {
        #[cfg(feature = "teardown")]
        tear_down(items);
        return Err("a dict in the pickle has a key without a value".into());
    }
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}
