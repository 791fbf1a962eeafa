//! A JSON object's fields, taken one by one: how the messages and settings
//! every page reads are read by hand (serde's derived readers for them are
//! a large part of the page's download).

use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde::Deserialize;
use serde_json::{Error, Map, Value};

/// A struct read from any input by `read`, which takes its fields one by
/// one; its errors come back as the input's own.
pub fn read<'de, D, T>(d: D, read: fn(&mut Fields) -> Result<T, Error>) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    read(&mut Fields::new(Map::deserialize(d)?)).map_err(D::Error::custom)
}

pub struct Fields(Map<String, Value>);

impl Fields {
    pub fn new(map: Map<String, Value>) -> Self {
        Self(map)
    }

    /// The field `key`; a missing one reads as `null` (an `Option` is
    /// `None`), and is missing for any other type.
    pub fn take<T: DeserializeOwned>(&mut self, key: &'static str) -> Result<T, Error> {
        match self.0.remove(key) {
            Some(v) => T::deserialize(v),
            None => T::deserialize(Value::Null).map_err(|_| Error::missing_field(key)),
        }
    }

    /// A nullable field: `None` when missing, `Some(None)` when `null`.
    pub fn take_nullable<T: DeserializeOwned>(
        &mut self,
        key: &'static str,
    ) -> Result<Option<Option<T>>, Error> {
        match self.0.remove(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(v) => T::deserialize(v).map(|t| Some(Some(t))),
        }
    }

    /// The field `key`, or `default` when it is missing.
    pub fn take_or<T: DeserializeOwned>(
        &mut self,
        key: &'static str,
        default: T,
    ) -> Result<T, Error> {
        match self.0.remove(key) {
            Some(v) => T::deserialize(v),
            None => Ok(default),
        }
    }

    /// The fields not taken, as one value (a variant's struct).
    pub fn rest<T: DeserializeOwned>(self) -> Result<T, Error> {
        T::deserialize(Value::Object(self.0))
    }

    /// Refuses a field not taken (a client message names only its own).
    pub fn done(&self, expected: &'static [&'static str]) -> Result<(), Error> {
        match self.0.keys().next() {
            Some(key) => Err(Error::unknown_field(key, expected)),
            None => Ok(()),
        }
    }
}
