//! What a plan holds before its run: the weights as `from_pretrained` (or
//! QLoRA's 4-bit loading and `prepare_model_for_kbit_training`) leaves them,
//! peft's adapters, and the optimizer's state its first `step()` makes.

use super::Training;
use crate::alloc::Allocator;
use crate::device::SimDevice;
use crate::train::hf::config::HfConfig;
use crate::train::hf::params::buffers;
use crate::train::hf::step;
use crate::train::kinds::NamedTensor;
use crate::train::optim::QMAP_VALUES;
use crate::train::{OptimizerKind, OptimizerSpec};
use crate::types::Dtype;

/// One step of making the model on the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadStep {
    /// A tensor made, by name, and its bytes.
    Alloc { name: String, bytes: u64 },
    /// The tensor made under this name goes (a copy quantized or upcast).
    Free(String),
    /// `torch.cuda.empty_cache()` (`prepare_model_for_kbit_training`'s).
    EmptyCache,
}

fn alloc(name: String, bytes: u64) -> LoadStep {
    LoadStep::Alloc { name, bytes }
}

/// `from_pretrained` (or `from_config(...).to("cuda")`) in `c`'s type:
/// every parameter, then every buffer; with `quant`, each linear layer of
/// the decoder quantized from its copy in the loading type, which goes.
pub fn load_model(
    c: &HfConfig,
    params: &[NamedTensor],
    quant: Option<step::Quant4>,
) -> Vec<LoadStep> {
    let mut steps = Vec::new();
    for p in params.iter().chain(&buffers(c)) {
        steps.push(alloc(p.name.clone(), p.numel() * p.dtype.size_bytes()));
        let Some(quant) = quant.filter(|_| step::quantized(&p.name, &p.shape)) else {
            continue;
        };
        for (piece, stored) in QUANT_PIECES.iter().zip(quant.stored(p.numel())) {
            steps.push(alloc(format!("{} ({piece})", p.name), stored));
        }
        steps.push(LoadStep::Free(p.name.clone()));
    }
    steps
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

/// peft's LoRA adapters of `rank` (float32: `autocast_adapter_dtype`), in
/// `named_parameters()` order: `lora_A` then `lora_B` of each target (with
/// 4-bit weights every linear layer of the decoder).
pub fn lora_adapters(
    c: &HfConfig,
    params: &[NamedTensor],
    rank: u64,
    quant: bool,
) -> Vec<LoadStep> {
    let mut steps = Vec::new();
    for p in params
        .iter()
        .filter(|p| step::adapted(c, quant, &p.name, &p.shape))
    {
        let (fan_out, fan_in) = step::fans(c, &p.shape);
        let module = p.name.trim_end_matches(".weight");
        steps.push(alloc(format!("{module}.lora_A.weight"), rank * fan_in * 4));
        steps.push(alloc(format!("{module}.lora_B.weight"), fan_out * rank * 4));
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
    let mut steps = load_model(c, params, quant);
    if quant.is_some() {
        steps.extend(kbit_prepare(c, params));
    }
    if let Some(rank) = rank {
        steps.extend(lora_adapters(c, params, rank, quant.is_some()));
    }
    steps
}

/// What `Quant4::stored` makes, by name: the packed weight, the 4-bit
/// code, then `absmax` (or, doubly quantized, its 8 bits, their float32
/// maxima, the offset and the 8-bit code).
const QUANT_PIECES: [&str; 6] = [
    "4-bit",
    "code",
    "absmax",
    "absmax maxima",
    "offset",
    "8-bit code",
];

/// Makes the model as [`loading`] says on the allocator: the bytes it
/// holds after, or the request refused.
pub(super) fn load(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    steps: &[LoadStep],
) -> Result<u64, u64> {
    let before = allocator.stats().allocated_bytes.current;
    let mut made: Vec<(&str, Option<crate::alloc::BlockId>)> = Vec::new();
    for s in steps {
        match s {
            LoadStep::Alloc { name, bytes } => match allocator.malloc(device, *bytes) {
                Ok(b) => made.push((name, b)),
                Err(e) => return Err(e.out_of_memory().map_or(0, |o| o.requested)),
            },
            LoadStep::Free(name) => {
                if let Some(b) = made
                    .iter_mut()
                    .rev()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, b)| b.take())
                {
                    allocator.free(device, b);
                }
            }
            LoadStep::EmptyCache => {
                allocator.empty_cache(device);
            }
        }
    }
    Ok(allocator.stats().allocated_bytes.current - before)
}

/// Allocates `sizes` in order (the optimizer's state): their bytes as
/// the allocator holds them, or the request refused.
pub(super) fn load_sizes(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    sizes: impl Iterator<Item = u64>,
) -> Result<u64, u64> {
    let steps: Vec<LoadStep> = sizes.map(|bytes| alloc(String::new(), bytes)).collect();
    load(allocator, device, &steps)
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
