//! `amp`: a forward pass and its loss under
//! `torch.autocast('cuda', dtype=...)`. Written `false` or `true`
//! (float16, autocast's CUDA default) or the type's name, `"float16"` or
//! `"bfloat16"`.

use crate::types::Dtype;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

/// Whether, and to which type, autocast casts the matrix products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Value")]
pub enum Amp {
    #[default]
    Off,
    Float16,
    Bfloat16,
}

impl Amp {
    /// The type matrix products compute in, if autocast is on.
    pub fn dtype(self) -> Option<Dtype> {
        match self {
            Amp::Off => None,
            Amp::Float16 => Some(Dtype::Float16),
            Amp::Bfloat16 => Some(Dtype::Bfloat16),
        }
    }

    pub fn is_on(self) -> bool {
        self != Amp::Off
    }

    pub const ALL: [Amp; 3] = [Amp::Off, Amp::Float16, Amp::Bfloat16];

    /// Its name on the page: `off`, or the type's.
    pub fn id(self) -> &'static str {
        match self {
            Amp::Off => "off",
            Amp::Float16 => "float16",
            Amp::Bfloat16 => "bfloat16",
        }
    }

    /// PyTorch's name of the type: `torch.float16`.
    pub fn torch_dtype(self) -> &'static str {
        match self {
            Amp::Bfloat16 => "torch.bfloat16",
            Amp::Off | Amp::Float16 => "torch.float16",
        }
    }
}

impl TryFrom<Value> for Amp {
    type Error = String;

    fn try_from(v: Value) -> Result<Self, Self::Error> {
        match v {
            Value::Bool(false) => Ok(Amp::Off),
            Value::Bool(true) => Ok(Amp::Float16),
            Value::String(s) if s == "float16" => Ok(Amp::Float16),
            Value::String(s) if s == "bfloat16" => Ok(Amp::Bfloat16),
            other => Err(format!(
                "`amp` is true, false, \"float16\" or \"bfloat16\", not {other}"
            )),
        }
    }
}

impl Serialize for Amp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Amp::Off => s.serialize_bool(false),
            Amp::Float16 => s.serialize_bool(true),
            Amp::Bfloat16 => s.serialize_str("bfloat16"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn amp_reads_a_flag_or_a_type_and_writes_what_it_read() {
        for (written, amp) in [
            (json!(false), Amp::Off),
            (json!(true), Amp::Float16),
            (json!("float16"), Amp::Float16),
            (json!("bfloat16"), Amp::Bfloat16),
        ] {
            assert_eq!(serde_json::from_value::<Amp>(written).unwrap(), amp);
            let again = serde_json::to_value(amp).unwrap();
            assert_eq!(serde_json::from_value::<Amp>(again).unwrap(), amp);
        }
        assert_eq!(Amp::Bfloat16.dtype(), Some(Dtype::Bfloat16));
        let e = serde_json::from_value::<Amp>(json!("int8")).unwrap_err();
        assert!(e.to_string().contains("\"float16\" or \"bfloat16\""));
    }
}
