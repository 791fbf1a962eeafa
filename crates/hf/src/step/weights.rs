//! The model's parameters as a step reads them: each a tensor of the tape
//! (trainable or frozen, in 4 bits under QLoRA), peft's LoRA adapters on
//! the layers it targets.

use super::tape::{Sid, Tape, T};
use super::Run;
use crate::config::{Arch, HfConfig};
use vramlab_train::kinds::NamedTensor;

/// A module of the model: one of decoder layer `layer`'s by its name in
/// the layer (`self_attn.q_proj`), or the model's own by its full name
/// (`model.norm`, `lm_head`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Name {
    pub layer: Option<u64>,
    pub local: &'static str,
}

impl Name {
    /// The model's own module `name`.
    pub fn top(name: &'static str) -> Name {
        Name {
            layer: None,
            local: name,
        }
    }

    /// Module `local` of decoder layer `layer`.
    pub fn of(layer: u64, local: &'static str) -> Name {
        Name {
            layer: Some(layer),
            local,
        }
    }
}

/// A module's parameters as the step reads them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Module {
    pub weight: Option<T>,
    pub bias: Option<T>,
    /// peft's `lora_A` and `lora_B`, where LoRA adapts the module.
    pub adapters: Option<(T, T)>,
    /// Stored in 4 bits: the linear layer's (outputs, inputs).
    pub quantized: Option<(u64, u64)>,
}

/// A few modules by name, looked up by a scan: a layer has about ten,
/// fewer than hashing a name costs.
type Modules = Vec<(String, Module)>;

/// The model's weights as the step reads them, by module: found by layer
/// and name without making a string for each op.
pub(super) struct Weights {
    /// The model's own modules by full name.
    top: Modules,
    /// Each decoder layer's modules by their name in the layer.
    layers: Vec<Modules>,
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
        let mut w = Weights::empty(none(0));
        for p in params {
            *w.slot(&p.name) = Some(none(p.numel() * p.dtype.size_bytes()));
        }
        w
    }

    fn empty(missing: T) -> Weights {
        Weights {
            top: Vec::new(),
            layers: Vec::new(),
            trainable: Vec::new(),
            missing,
        }
    }

    /// Module `name`'s parameters (none where the model has no such
    /// module).
    pub fn module(&self, name: Name) -> Module {
        let table = match name.layer {
            None => Some(&self.top),
            Some(l) => usize::try_from(l).ok().and_then(|l| self.layers.get(l)),
        };
        let found = table.and_then(|t| t.iter().find(|(n, _)| n == name.local));
        found.map(|&(_, m)| m).unwrap_or_default()
    }

    /// The module a parameter's full name belongs to, made if new.
    fn module_mut(&mut self, param: &str) -> &mut Module {
        let module = param.rsplit_once('.').map_or("", |(m, _)| m);
        let (table, local) = match in_layer(module) {
            Some((l, local)) => {
                if self.layers.len() <= l {
                    self.layers.resize_with(l + 1, Vec::new);
                }
                (&mut self.layers[l], local)
            }
            None => (&mut self.top, module),
        };
        let i = match table.iter().position(|(n, _)| n == local) {
            Some(i) => i,
            None => {
                table.push((local.to_string(), Module::default()));
                table.len() - 1
            }
        };
        &mut table[i].1
    }

    /// Where the parameter of full name `param` goes: its module's weight
    /// or bias (any other parameter is kept as a weight).
    fn slot(&mut self, param: &str) -> &mut Option<T> {
        let bias = param.ends_with(".bias");
        let m = self.module_mut(param);
        match bias {
            true => &mut m.bias,
            false => &mut m.weight,
        }
    }

    pub(super) fn new(
        t: &mut Tape<'_>,
        c: &HfConfig,
        params: &[NamedTensor],
        run: &Run,
    ) -> Weights {
        let lora = run.lora;
        let mut w = Weights::empty(t.external(0));
        for p in params {
            let four = run.quant.is_some() && quantized(&p.name, &p.shape);
            let bytes = match four {
                true => p.numel().div_ceil(2),
                false => p.numel() * p.dtype.size_bytes(),
            };
            if four {
                w.module_mut(&p.name).quantized = Some(fans(c, &p.shape));
            }
            let param = t.parameter(bytes, lora.is_none());
            if lora.is_none() {
                w.trainable.push(param);
            }
            *w.slot(&p.name) = Some(param);
            let Some(rank) = lora else { continue };
            if adapted(c, run.quant.is_some(), &p.name, &p.shape) {
                let (fan_out, fan_in) = fans(c, &p.shape);
                // peft keeps the adapters in float32 (`autocast_adapter_dtype`).
                let a = t.parameter(rank * fan_in * 4, true);
                let b = t.parameter(fan_out * rank * 4, true);
                w.trainable.extend([a, b]);
                w.module_mut(&p.name).adapters = Some((a, b));
            }
        }
        w
    }
}

/// A decoder layer's module path (`model.layers.3.self_attn.q_proj`,
/// GPT-2's `transformer.h.3.attn.c_attn`): the layer and the module's
/// name in it.
fn in_layer(module: &str) -> Option<(usize, &str)> {
    let mut start = 0;
    let mut previous = "";
    for segment in module.split('.') {
        let end = start + segment.len();
        if matches!(previous, "layers" | "h") {
            if let Ok(l) = segment.parse::<usize>() {
                return Some((l, module.get(end + 1..).unwrap_or("")));
            }
        }
        previous = segment;
        start = end + 1;
    }
    None
}
