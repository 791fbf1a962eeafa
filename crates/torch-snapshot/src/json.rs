//! A snapshot's JSON read as its pickle is ([`super::pickle`]): serde_json
//! walks the text and drives the same machine, an array as a list its
//! items are appended to (a thousand at a time, as Python's pickler
//! batches them), an object as a dict its fields are set on. So JSON is
//! folded and held to the same limit as a pickle: never a tree of the
//! whole file first.

use super::pickle::{list, Fold, Held, Machine, Value};
use crate::error::Malformed;
use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::rc::Rc;

/// Items appended, or fields set, at a time.
const BATCH: usize = 1000;

/// Reads JSON `text` on the machine; the value and the bytes it held.
pub fn read<F: Fold>(text: &[u8], fold: F) -> Result<(Value, Held), Malformed> {
    let mut m = Machine::driven(text.len(), fold);
    let mut de = serde_json::Deserializer::from_slice(text);
    let walked = Drive(&mut m)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| Malformed(format!("the file is not JSON: {e}")));
    let top = walked.and_then(|()| m.pop());
    m.finish(top)
}

/// Drives the machine with one JSON value.
struct Drive<'m, 'a, F: Fold>(&'m mut Machine<'a, F>);

impl<'de, F: Fold> DeserializeSeed<'de> for Drive<'_, '_, F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<F: Fold> Drive<'_, '_, F> {
    fn push<E: Error>(self, v: Value) -> Result<(), E> {
        self.0.push(v).map_err(E::custom)
    }
}

impl<'de, F: Fold> Visitor<'de> for Drive<'_, '_, F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a memory snapshot's JSON")
    }

    fn visit_unit<E: Error>(self) -> Result<(), E> {
        self.push(Value::None)
    }

    fn visit_bool<E: Error>(self, b: bool) -> Result<(), E> {
        self.push(Value::Bool(b))
    }

    fn visit_i64<E: Error>(self, i: i64) -> Result<(), E> {
        self.push(Value::Int(i.into()))
    }

    fn visit_u64<E: Error>(self, u: u64) -> Result<(), E> {
        self.push(Value::Int(u.into()))
    }

    fn visit_f64<E: Error>(self, x: f64) -> Result<(), E> {
        self.push(Value::Float(x))
    }

    fn visit_str<E: Error>(self, s: &str) -> Result<(), E> {
        self.0.make(Value::Str(s.into())).map_err(E::custom)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let m = self.0;
        m.make(list(Vec::new())).map_err(A::Error::custom)?;
        m.push(Value::Mark).map_err(A::Error::custom)?;
        let mut n = 0;
        while seq.next_element_seed(Drive(&mut *m))?.is_some() {
            n += 1;
            if n % BATCH == 0 {
                m.appends().map_err(A::Error::custom)?;
                m.push(Value::Mark).map_err(A::Error::custom)?;
            }
        }
        m.appends().map_err(A::Error::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let m = self.0;
        m.make(Value::Dict(Rc::default()))
            .map_err(A::Error::custom)?;
        m.push(Value::Mark).map_err(A::Error::custom)?;
        let mut n = 0;
        while map.next_key_seed(Drive(&mut *m))?.is_some() {
            map.next_value_seed(Drive(&mut *m))?;
            n += 1;
            if n % BATCH == 0 {
                m.set_items_from_mark().map_err(A::Error::custom)?;
                m.push(Value::Mark).map_err(A::Error::custom)?;
            }
        }
        m.set_items_from_mark().map_err(A::Error::custom)
    }
}
