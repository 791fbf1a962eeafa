//! How a language model's generation keeps its keys and values.

use serde::Serialize;

/// How `generate` keeps the keys and values: transformers'
/// `DynamicCache` (grown by `torch.cat` every token) or `StaticCache`
/// (`cache_implementation="static"`: the whole length made at the
/// prefill).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cache {
    #[default]
    Dynamic,
    Static,
}

vramlab_core::read_by_name!(Cache {
    Dynamic = "dynamic",
    Static = "static",
});
