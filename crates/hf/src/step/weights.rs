//! The model's parameters as a step reads them: each a tensor of the tape
//! (trainable or frozen, in 4 bits under QLoRA), peft's LoRA adapters on
//! the layers it targets.

use super::tape::{Sid, Tape, T};
use super::Run;
use crate::config::{Arch, HfConfig};
use std::collections::HashMap;
use vramlab_train::kinds::NamedTensor;

/// The model's weights as the step reads them.
pub(super) struct Weights {
    pub by_name: HashMap<String, T>,
    /// peft's `lora_A` and `lora_B` by the linear layer they adapt.
    pub adapters: HashMap<String, (T, T)>,
    /// The linear layers stored in 4 bits: (outputs, inputs).
    pub quantized: HashMap<String, (u64, u64)>,
    /// What the optimizer updates, in `named_parameters()` order.
    pub trainable: Vec<T>,
    pub missing: T,
}

/// The linear layers peft's LoRA targets by default for the model type
/// (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`; Phi-3's fused
/// projection, which peft has no default for, as people target it).
pub fn lora_targets(arch: Arch) -> &'static [&'static str] {
    match arch {
        Arch::Gpt2 => &["c_attn"],
        Arch::Phi3 => &["qkv_proj"],
        _ => &["q_proj", "v_proj"],
    }
}

/// A linear layer's (outputs, inputs) from its weight's shape: `[out,
/// in]`, GPT-2's `Conv1D` `[in, out]`.
pub fn fans(c: &HfConfig, shape: &[u64]) -> (u64, u64) {
    let (a, b) = (
        shape.first().copied().unwrap_or(1),
        shape.get(1).copied().unwrap_or(1),
    );
    match c.arch {
        Arch::Gpt2 => (b, a),
        _ => (a, b),
    }
}

/// Whether bitsandbytes stores parameter `name` of `shape` in 4 bits:
/// every linear layer of the decoder (transformers keeps the embeddings
/// and the output layer, `get_keys_to_not_convert`).
pub fn quantized(name: &str, shape: &[u64]) -> bool {
    shape.len() == 2 && name.contains(".layers.") && name.ends_with(".weight")
}

/// Whether peft's LoRA adapts parameter `name` of `shape` (a weight): the
/// model type's default targets, or with 4-bit weights every linear layer
/// but the output (`"all-linear"`, QLoRA's recipe).
pub fn adapted(c: &HfConfig, quant: bool, name: &str, shape: &[u64]) -> bool {
    let module = name.rsplit_once('.').map_or("", |(m, _)| m);
    match quant {
        true => quantized(name, shape),
        false => {
            name.ends_with(".weight") && lora_targets(c.arch).iter().any(|t| module.ends_with(t))
        }
    }
}

impl Weights {
    /// The weights as `generate` reads them under `no_grad`: no tape
    /// holds them (nothing ever frees a parameter, and nothing records a
    /// gradient for one), so one set serves every forward of a run.
    pub(super) fn frozen(params: &[NamedTensor]) -> Weights {
        let none = |bytes| T {
            s: Sid::MAX,
            bytes,
            fun: None,
        };
        let by_name = (params.iter())
            .map(|p| (p.name.clone(), none(p.numel() * p.dtype.size_bytes())))
            .collect();
        Weights {
            by_name,
            adapters: HashMap::new(),
            quantized: HashMap::new(),
            trainable: Vec::new(),
            missing: none(0),
        }
    }

    pub(super) fn new(
        t: &mut Tape<'_>,
        c: &HfConfig,
        params: &[NamedTensor],
        run: &Run,
    ) -> Weights {
        let lora = run.lora;
        let mut w = Weights {
            by_name: HashMap::new(),
            adapters: HashMap::new(),
            quantized: HashMap::new(),
            trainable: Vec::new(),
            missing: t.external(0),
        };
        for p in params {
            let module = p.name.rsplit_once('.').map_or("", |(m, _)| m).to_string();
            let four = run.quant.is_some() && quantized(&p.name, &p.shape);
            let bytes = match four {
                true => p.numel().div_ceil(2),
                false => p.numel() * p.dtype.size_bytes(),
            };
            if four {
                w.quantized.insert(module.clone(), fans(c, &p.shape));
            }
            let param = t.parameter(bytes, lora.is_none());
            if lora.is_none() {
                w.trainable.push(param);
            }
            w.by_name.insert(p.name.clone(), param);
            let Some(rank) = lora else { continue };
            if adapted(c, run.quant.is_some(), &p.name, &p.shape) {
                let (fan_out, fan_in) = fans(c, &p.shape);
                // peft keeps the adapters in float32 (`autocast_adapter_dtype`).
                let a = t.parameter(rank * fan_in * 4, true);
                let b = t.parameter(fan_out * rank * 4, true);
                w.trainable.extend([a, b]);
                w.adapters.insert(module, (a, b));
            }
        }
        w
    }
}
