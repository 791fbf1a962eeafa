//! Every name, shape and type of the twelve published shapes, held to
//! what transformers 5.24 builds from the same config.json fields
//! (`tests/reference/hf_params.py`, on the meta device).

use super::{buffers, parameters};
use crate::config::HfConfig;
use serde_json::Value;
use vramlab_train::kinds::{count, NamedTensor};

const TRANSFORMERS: &str = include_str!("../../../tests/reference/hf_params.json");

fn listed(v: &Value) -> Vec<(String, Vec<u64>, String)> {
    let rows = v.as_array().unwrap();
    rows.iter()
        .map(|r| serde_json::from_value(r.clone()).unwrap())
        .collect()
}

fn ours(tensors: &[NamedTensor]) -> Vec<(String, Vec<u64>, String)> {
    tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.shape.clone(),
                t.dtype.torch_name().to_string(),
            )
        })
        .collect()
}

#[test]
fn every_published_shape_has_transformers_parameters_and_buffers_in_order() {
    let reference: Value = serde_json::from_str(TRANSFORMERS).unwrap();
    let models = reference["models"].as_array().unwrap();
    assert_eq!(models.len(), 12);
    for m in models {
        let name = m["name"].as_str().unwrap();
        let c = HfConfig::read(&m["fields"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let params = parameters(&c);
        assert_eq!(ours(&params), listed(&m["parameters"]), "{name}");
        assert_eq!(ours(&buffers(&c)), listed(&m["buffers"]), "{name}");
        assert_eq!(count(&params), m["count"].as_u64().unwrap(), "{name}");
        let bytes: u64 = params
            .iter()
            .map(|t| t.numel() * t.dtype.size_bytes())
            .sum();
        assert_eq!(bytes, m["parameter_bytes"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn llama_3_1_8b_has_8_030_261_248_parameters() {
    let known = crate::known::find("Llama-3.1-8B").unwrap();
    assert_eq!(count(&parameters(&known.config)), 8_030_261_248);
}
