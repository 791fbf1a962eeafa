//! Unit enums read from their names, through one reader shared by all
//! (serde's derived reader costs each enum its own visitors: about 1 KB of
//! the page's download apiece). Each enum still serializes through serde's
//! derive; `read_by_name!` lists the same names, and a test per enum holds
//! the two to each other. Errors are serde's own ("unknown variant `x`,
//! expected one of `a`, `b`").

use serde::de::{Deserialize, Deserializer, Error};

/// The position of the name read in `names`.
pub fn read<'de, D: Deserializer<'de>>(
    d: D,
    names: &'static [&'static str],
) -> Result<usize, D::Error> {
    let name = String::deserialize(d)?;
    names
        .iter()
        .position(|n| *n == name)
        .ok_or_else(|| D::Error::unknown_variant(&name, names))
}

/// `impl Deserialize` for a unit enum from its variants' names:
/// `read_by_name!(Norm { LayerNorm = "layernorm", RmsNorm = "rmsnorm" });`
macro_rules! read_by_name {
    ($t:ident { $($variant:ident = $name:literal),* $(,)? }) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                const NAMES: &[&str] = &[$($name),*];
                const ALL: &[$t] = &[$($t::$variant),*];
                $crate::by_name::read(d, NAMES).map(|i| ALL[i])
            }
        }

        #[cfg(test)]
        impl $t {
            /// Every variant, for the test that holds the names to serde's.
            pub(crate) const ALL_BY_NAME: &'static [$t] = &[$($t::$variant),*];
        }
    };
}

pub(crate) use read_by_name;

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde::Serialize;
    use serde_json::{json, Value};

    /// Every variant reads back from what serde's derive writes, from text
    /// and from a JSON value; another name is refused as serde refuses it.
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(all: &[T]) {
        for v in all {
            let text = serde_json::to_string(v).unwrap();
            assert_eq!(&serde_json::from_str::<T>(&text).unwrap(), v, "{text}");
            let value = serde_json::to_value(v).unwrap();
            assert_eq!(&serde_json::from_value::<T>(value).unwrap(), v);
        }
        let e = serde_json::from_value::<T>(json!("nonsense")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown variant `nonsense`, expected "),
            "{e}"
        );
        assert!(serde_json::from_value::<T>(Value::from(3)).is_err());
    }

    #[test]
    fn every_enum_reads_the_names_serde_writes() {
        use crate::*;
        round_trip(train::kinds::Attention::ALL_BY_NAME);
        round_trip(types::Framework::ALL_BY_NAME);
        round_trip(framework::TorchVersion::ALL_BY_NAME);
        round_trip(types::Dtype::ALL_BY_NAME);
        round_trip(types::Category::ALL_BY_NAME);
        round_trip(train::OptimizerKind::ALL_BY_NAME);
        round_trip(error::ErrorKind::ALL_BY_NAME);
        round_trip(stats::EventAction::ALL_BY_NAME);
        round_trip(gpu::GpuModel::ALL_BY_NAME);
        round_trip(train::kinds::Norm::ALL_BY_NAME);
        round_trip(train::kv_cache::Cache::ALL_BY_NAME);
        round_trip(command::ModelKind::ALL_BY_NAME);
        round_trip(command::LossHistory::ALL_BY_NAME);
        round_trip(device::DeviceKind::ALL_BY_NAME);
        round_trip(protocol::Role::ALL_BY_NAME);
        round_trip(protocol::ConnectionErrorKind::ALL_BY_NAME);
        round_trip(alloc::BlockState::ALL_BY_NAME);
        round_trip(alloc::PoolKind::ALL_BY_NAME);
    }

    #[test]
    fn an_unknown_name_gets_serdes_message() {
        let e = serde_json::from_value::<crate::types::Framework>(json!("mxnet")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown variant `mxnet`, expected one of `pytorch`, `tensorflow`, `jax`"
        );
    }
}
