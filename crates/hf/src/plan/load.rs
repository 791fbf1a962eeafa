//! What a plan holds before its run: the weights as `from_pretrained` (or
//! QLoRA's 4-bit loading and `prepare_model_for_kbit_training`) leaves them,
//! peft's adapters, and the optimizer's state its first `step()` makes.

use super::{Question, Task, Training};
use crate::config::HfConfig;
use crate::params::buffers;
use crate::step;
use vramlab_core::types::Dtype;
use vramlab_core::units::GIB;
use vramlab_device::alloc::Allocator;
use vramlab_device::device::{Device, SimDevice};
use vramlab_train::kinds::NamedTensor;
use vramlab_train::optim::QMAP_VALUES;
use vramlab_train::{OptimizerKind, OptimizerSpec};

/// One step of making the model on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadStep {
    /// A tensor made, by name, and its bytes.
    Alloc { name: String, bytes: u64 },
    /// The tensor made under this name goes (a copy quantized or upcast).
    Free(String),
    /// `torch.cuda.empty_cache()` (`prepare_model_for_kbit_training`'s).
    EmptyCache,
    /// transformers' `caching_allocator_warmup` before `from_pretrained`
    /// loads onto the GPU: one tensor of the model's loading bytes (this
    /// many), made and freed at once, so that the weights land in the one
    /// segment it leaves cached ([`warmup_request`] says how much it asks).
    Warmup(u64),
}

fn alloc(name: String, bytes: u64) -> LoadStep {
    LoadStep::Alloc { name, bytes }
}

/// The model made on the GPU in `c`'s type. `from_config(...).to("cuda")`:
/// every parameter, then every buffer, in the model's order.
/// `from_pretrained(..., device_map=...)` (always so with `quant`):
/// transformers 5's loading, its [`LoadStep::Warmup`] first, then the
/// checkpoint's tensors in `dot_natural_key` order, each linear layer of the
/// decoder with `quant` made in the loading type and quantized by
/// bitsandbytes ([`quantize_4bit`]), its copy freed; the buffers last.
pub fn load_model(
    c: &HfConfig,
    params: &[NamedTensor],
    quant: Option<step::Quant4>,
    from_pretrained: bool,
) -> Vec<LoadStep> {
    let buffers = buffers(c);
    if !(from_pretrained || quant.is_some()) {
        return params
            .iter()
            .chain(&buffers)
            .map(|p| alloc(p.name.clone(), bytes_of(p)))
            .collect();
    }
    let is_quantized = |p: &NamedTensor| quant.is_some() && step::quantized(&p.name, &p.shape);
    let warmup = params
        .iter()
        .map(|p| match is_quantized(p) {
            true => p.numel() / 2,
            false => bytes_of(p),
        })
        .sum();
    let mut steps = vec![LoadStep::Warmup(warmup)];
    let mut order: Vec<&NamedTensor> = params.iter().collect();
    order.sort_by_cached_key(|p| dot_natural_key(&p.name));
    let mut first = true;
    for p in order {
        steps.push(alloc(p.name.clone(), bytes_of(p)));
        if let Some(q) = quant.filter(|_| is_quantized(p)) {
            steps.extend(quantize_4bit(&p.name, p.numel(), q, first));
            steps.push(LoadStep::Free(p.name.clone()));
            first = false;
        }
    }
    steps.extend(buffers.iter().map(|b| alloc(b.name.clone(), bytes_of(b))));
    steps
}

fn bytes_of(p: &NamedTensor) -> u64 {
    p.numel() * p.dtype.size_bytes()
}

/// transformers' `dot_natural_key`: a state-dict name split at its dots,
/// numbers compared as numbers (`layers.2` before `layers.10`) and before
/// text, text as text, a word before the same word with a number.
fn dot_natural_key(name: &str) -> Vec<(u8, String, Option<u64>)> {
    name.split('.')
        .map(|part| match part.parse::<u64>() {
            Ok(n) if part.bytes().all(|b| b.is_ascii_digit()) => (0, String::new(), Some(n)),
            _ => {
                let text = part.trim_end_matches(|c: char| c.is_ascii_digit());
                (1, text.to_string(), part[text.len()..].parse().ok())
            }
        })
        .collect()
}

/// bitsandbytes 0.50's `Params4bit._quantize` of the weight `name` (`n`
/// elements, made in the loading type), as the H100's snapshot of
/// `from_pretrained` recorded it: `absmax` in float32 and the packed
/// weight (`quantize_4bit`), the 4-bit code; with double quantization the
/// offset (`absmax.mean()`), `absmax - offset` for `quantize_blockwise`
/// (whose 8-bit code is made once a process, `first`), its float32
/// maxima a block of 256, the 8-bit `absmax` and a copy of the code, then
/// the float32 `absmax` and the difference go. (The reductions' own few
/// hundred bytes of scratch are left out.)
fn quantize_4bit(name: &str, n: u64, q: step::Quant4, first: bool) -> Vec<LoadStep> {
    let blocks = n.div_ceil(step::BLOCK);
    let piece = |what: &str| format!("{name} ({what})");
    let mut steps = vec![
        alloc(piece("absmax"), blocks * 4),
        alloc(piece("4-bit"), n.div_ceil(2)),
        alloc(piece("code"), 16 * 4),
    ];
    if !q.double_quant {
        return steps;
    }
    steps.push(alloc(piece("offset"), 4));
    steps.push(alloc(piece("absmax - offset"), blocks * 4));
    if first {
        steps.push(alloc("bitsandbytes (dynamic map)".into(), 256 * 4));
    }
    steps.extend([
        alloc(piece("absmax maxima"), blocks.div_ceil(step::BLOCK2) * 4),
        alloc(piece("8-bit absmax"), blocks),
        alloc(piece("8-bit code"), 256 * 4),
        LoadStep::Free(piece("absmax - offset")),
        LoadStep::Free(piece("absmax")),
    ]);
    steps
}

/// What `caching_allocator_warmup` asks for on a device of `total` bytes
/// (`mem_get_info`'s, `free` of them free) with `reserved` and
/// `allocated` bytes already: the model's `bytes` less the cache it can
/// reuse, or just over that cache if that makes a new segment, or
/// nothing; at most the device less 1.2 GiB; an even number of bytes (a
/// float16 tensor of half as many elements).
pub fn warmup_request(bytes: u64, reserved: u64, allocated: u64, free: u64, total: u64) -> u64 {
    let unused = reserved.saturating_sub(allocated);
    let need = bytes.saturating_sub(unused);
    let ask = if need > unused {
        need
    } else if need as f64 > 1.5 * GIB as f64 {
        if unused + 1 > free {
            0
        } else {
            unused + 1
        }
    } else {
        0
    };
    let cap = total as f64 - 1.2 * GIB as f64;
    let ask = (ask as f64).min(cap).max(0.0) as u64;
    ask / 2 * 2
}

/// `prepare_model_for_kbit_training` on a 4-bit model: every other
/// parameter (and buffer) not in float32 upcast (`param.data.to(torch.float32)`:
/// the new tensor, then the old one goes), then the cache emptied.
pub fn kbit_prepare(c: &HfConfig, params: &[NamedTensor]) -> Vec<LoadStep> {
    let mut steps = Vec::new();
    for p in params.iter().chain(&buffers(c)) {
        if step::quantized(&p.name, &p.shape) || p.dtype == Dtype::Float32 {
            continue;
        }
        steps.push(alloc(format!("{} (float32)", p.name), p.numel() * 4));
        steps.push(LoadStep::Free(p.name.clone()));
    }
    steps.push(LoadStep::EmptyCache);
    steps
}

/// peft's LoRA adapters of `rank`, in `named_parameters()` order: `lora_A`
/// then `lora_B` of each target (with 4-bit weights every linear layer of
/// the decoder). peft 0.21 moves each new adapter to its base layer's
/// device in the model's type (`_move_adapter_to_device_of_base_layer`),
/// then `cast_adapter_dtype` upcasts them to float32 one by one, each old
/// one freed, as the H100's snapshot of `get_peft_model` recorded.
pub fn lora_adapters(
    c: &HfConfig,
    params: &[NamedTensor],
    rank: u64,
    quant: bool,
) -> Vec<LoadStep> {
    let mut adapters = Vec::new();
    for p in params
        .iter()
        .filter(|p| step::adapted(c, quant, &p.name, &p.shape))
    {
        let (fan_out, fan_in) = step::fans(c, &p.shape);
        let module = p.name.trim_end_matches(".weight");
        adapters.push((format!("{module}.lora_A.weight"), rank * fan_in));
        adapters.push((format!("{module}.lora_B.weight"), fan_out * rank));
    }
    if c.dtype == Dtype::Float32 {
        return adapters.into_iter().map(|(n, e)| alloc(n, e * 4)).collect();
    }
    let first = |n: &str| format!("{n} ({})", c.dtype.torch_name());
    let mut steps: Vec<LoadStep> = (adapters.iter())
        .map(|(n, e)| alloc(first(n), e * c.dtype.size_bytes()))
        .collect();
    for (n, e) in adapters {
        steps.push(alloc(n.clone(), e * 4));
        steps.push(LoadStep::Free(first(&n)));
    }
    steps
}

/// The whole of a plan's loading: the model; for QLoRA,
/// `prepare_model_for_kbit_training`; peft's adapters.
pub fn loading(
    c: &HfConfig,
    params: &[NamedTensor],
    quant: Option<step::Quant4>,
    rank: Option<u64>,
) -> Vec<LoadStep> {
    let mut steps = load_model(c, params, quant, quant.is_some());
    if quant.is_some() {
        steps.extend(kbit_prepare(c, params));
    }
    if let Some(rank) = rank {
        steps.extend(lora_adapters(c, params, rank, quant.is_some()));
    }
    steps
}

/// [`loading`]'s steps with each freed tensor found once, by the index of
/// the step that made it: what a run replays (a search replays the same
/// loading for every probe).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Alloc(u64),
    /// The last tensor made under the freed name (already freed: nothing).
    Free(usize),
    EmptyCache,
    Warmup(u64),
}

pub(super) fn compile(steps: &[LoadStep]) -> Vec<Op> {
    let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut made = 0;
    let mut ops = Vec::with_capacity(steps.len());
    for s in steps {
        ops.push(match s {
            LoadStep::Alloc { name, bytes } => {
                last.insert(name, made);
                made += 1;
                Op::Alloc(*bytes)
            }
            LoadStep::Free(name) => match last.get(name.as_str()) {
                Some(&i) => Op::Free(i),
                None => continue,
            },
            LoadStep::EmptyCache => Op::EmptyCache,
            LoadStep::Warmup(bytes) => Op::Warmup(*bytes),
        });
    }
    ops
}

/// Makes the model as [`compile`]d [`loading`] says on the allocator: the
/// bytes it holds after, or the request refused.
pub(super) fn load(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    ops: &[Op],
) -> Result<u64, u64> {
    let before = allocator.stats().allocated_bytes.current;
    let refused =
        |e: vramlab_device::alloc::AllocError| e.out_of_memory().map_or(0, |o| o.requested);
    let mut made: Vec<Option<vramlab_device::alloc::BlockId>> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc(bytes) => made.push(allocator.malloc(device, bytes).map_err(refused)?),
            Op::Free(i) => {
                if let Some(b) = made.get_mut(i).and_then(Option::take) {
                    allocator.free(device, b);
                }
            }
            Op::EmptyCache => {
                allocator.empty_cache(device);
            }
            Op::Warmup(bytes) => {
                let s = allocator.stats();
                let (free, total) = device.mem_get_info();
                let ask = warmup_request(
                    bytes,
                    s.reserved_bytes.current,
                    s.allocated_bytes.current,
                    free,
                    total,
                );
                if ask > 0 {
                    if let Some(b) = allocator.malloc(device, ask).map_err(refused)? {
                        allocator.free(device, b);
                    }
                }
            }
        }
    }
    Ok(allocator.stats().allocated_bytes.current - before)
}

/// A run's start: the simulated GPU and its allocator once the model, and
/// a training task's AdamW state, are loaded (or where loading stopped:
/// the request refused), with the bytes each holds.
pub(super) struct Start {
    pub device: SimDevice,
    pub allocator: Box<dyn Allocator>,
    pub weights: Result<u64, u64>,
    pub state: Option<Result<u64, u64>>,
}

/// What every run of a question loads before its task, whatever its batch
/// and tokens: the model (`from_config(..., dtype=...).to("cuda")`, each
/// tensor in order in the type asked for, the rotary frequencies float32;
/// or QLoRA's loading), and a training task's AdamW state; loaded once,
/// and each run started from a copy where the allocator makes one.
pub(super) struct Loading {
    ops: Vec<Op>,
    state: Option<Vec<u64>>,
    loaded: Option<Start>,
}

impl Loading {
    pub(super) fn of(
        q: &Question,
        params: &[NamedTensor],
        (device, allocator): (SimDevice, Box<dyn Allocator>),
    ) -> Loading {
        let loaded = HfConfig {
            dtype: q.dtype,
            ..q.config
        };
        let (quant, lora) = match q.task {
            Task::Train(t) => (t.quant, t.lora),
            Task::Generate(_) => (None, None),
        };
        let mut l = Loading {
            ops: compile(&loading(&loaded, params, quant, lora)),
            state: match &q.task {
                Task::Train(t) => Some(adam_state(&loaded, params, t)),
                Task::Generate(_) => None,
            },
            loaded: None,
        };
        if allocator.boxed_clone().is_some() {
            l.loaded = Some(l.load(device, allocator));
        }
        l
    }

    fn load(&self, mut device: SimDevice, mut allocator: Box<dyn Allocator>) -> Start {
        let weights = load(allocator.as_mut(), &mut device, &self.ops);
        let state = match (&weights, &self.state) {
            (Ok(_), Some(sizes)) => Some(load_sizes(
                allocator.as_mut(),
                &mut device,
                sizes.iter().copied(),
            )),
            _ => None,
        };
        Start {
            device,
            allocator,
            weights,
            state,
        }
    }

    /// One run's start: a copy of the loaded one, or `fresh` loaded now.
    pub(super) fn start(&self, device: SimDevice, allocator: Box<dyn Allocator>) -> Start {
        let copy = self.loaded.as_ref().and_then(|s| {
            Some(Start {
                device: s.device.clone(),
                allocator: s.allocator.boxed_clone()?,
                weights: s.weights,
                state: s.state,
            })
        });
        copy.unwrap_or_else(|| self.load(device, allocator))
    }
}

/// Allocates `sizes` in order (the optimizer's state): their bytes as
/// the allocator holds them, or the request refused.
pub(super) fn load_sizes(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    sizes: impl Iterator<Item = u64>,
) -> Result<u64, u64> {
    let ops: Vec<Op> = sizes.map(Op::Alloc).collect();
    load(allocator, device, &ops)
}

/// The LoRA adapters peft adds (float32: `autocast_adapter_dtype`), in
/// `named_parameters()` order: `lora_A` then `lora_B` of each target, as
/// shapes.
fn adapter_shapes(c: &HfConfig, params: &[NamedTensor], rank: u64, quant: bool) -> Vec<Vec<u64>> {
    let mut shapes = Vec::new();
    for p in params
        .iter()
        .filter(|p| step::adapted(c, quant, &p.name, &p.shape))
    {
        let (fan_out, fan_in) = step::fans(c, &p.shape);
        shapes.extend([vec![rank, fan_in], vec![fan_out, rank]]);
    }
    shapes
}

/// What AdamW's first `step()` makes for each parameter it updates:
/// `torch.optim.AdamW`'s `exp_avg` and `exp_avg_sq`, each like the
/// parameter; bitsandbytes' `AdamW8bit` its two quantization maps first,
/// then each parameter's `state1` and `state2` in 8 bits with a float32
/// `absmax` per block of 256 (float32 states under 4,096 elements:
/// `optim::OptimizerSpec::state`).
pub fn adam_state(c: &HfConfig, params: &[NamedTensor], t: &Training) -> Vec<u64> {
    let trained: Vec<(Vec<u64>, Dtype)> = match t.lora {
        Some(rank) => (adapter_shapes(c, params, rank, t.quant.is_some()).into_iter())
            .map(|s| (s, Dtype::Float32))
            .collect(),
        None => params.iter().map(|p| (p.shape.clone(), p.dtype)).collect(),
    };
    let spec = match t.adam8bit {
        true => OptimizerSpec::new(OptimizerKind::Adamw, 8)
            .unwrap_or(OptimizerSpec::torch(OptimizerKind::Adamw)),
        false => OptimizerSpec::torch(OptimizerKind::Adamw),
    };
    let mut sizes = Vec::new();
    let quantized = trained
        .iter()
        .any(|(s, _)| spec.quantizes(s.iter().product()));
    if quantized {
        sizes.extend(spec.qmaps().iter().map(|_| QMAP_VALUES * 4));
    }
    for (shape, dtype) in &trained {
        for st in spec.state(shape, *dtype) {
            sizes.push(st.shape.iter().product::<u64>() * st.dtype.size_bytes());
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_loads_in_transformers_natural_order() {
        let mut names = [
            "model.norm.weight",
            "model.layers.10.mlp.up_proj.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.layers.2.input_layernorm.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
            "shard_11.w",
            "shard_2.w",
            "shard.w",
        ];
        names.sort_by_cached_key(|n| dot_natural_key(n));
        assert_eq!(
            names,
            [
                "lm_head.weight",
                "model.embed_tokens.weight",
                "model.layers.2.input_layernorm.weight",
                "model.layers.2.self_attn.q_proj.weight",
                "model.layers.10.mlp.up_proj.weight",
                "model.norm.weight",
                "shard.w",
                "shard_2.w",
                "shard_11.w",
            ]
        );
    }

    /// `caching_allocator_warmup`'s request in each of its cases.
    #[test]
    fn the_warmup_asks_for_what_the_cache_cannot_give() {
        let total = 80 * GIB;
        // A new process: the model's bytes, even.
        assert_eq!(
            warmup_request(1_012_011_009, 0, 0, total, total),
            1_012_011_008
        );
        // Cache to reuse: the rest, when it is more than the cache.
        assert_eq!(
            warmup_request(10 * GIB, 3 * GIB, GIB, total, total),
            8 * GIB
        );
        // The rest no more than the cache but over 1.5 GiB: just over the
        // cache, to force a new segment; nothing if that cannot fit.
        assert_eq!(warmup_request(7 * GIB, 4 * GIB, 0, total, total), 4 * GIB);
        assert_eq!(warmup_request(7 * GIB, 4 * GIB, 0, GIB, total), 0);
        // Under 1.5 GiB to find: nothing.
        assert_eq!(warmup_request(5 * GIB, 4 * GIB, 0, total, total), 0);
        // At most the device less 1.2 GiB.
        let card = 16 * GIB;
        let cap = (card as f64 - 1.2 * GIB as f64) as u64 / 2 * 2;
        assert_eq!(warmup_request(20 * GIB, 0, 0, card, card), cap);
    }
}
