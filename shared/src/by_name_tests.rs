//! Every unit enum read by name (`by_name::read`), in whichever layer it
//! lives, reads what serde's derive writes.

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
