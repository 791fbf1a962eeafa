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

/// Allocates `sizes` in order, made before the run: their bytes as the
/// allocator holds them, or the request refused.
pub(super) fn load(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    sizes: impl Iterator<Item = u64>,
) -> Result<u64, u64> {
    let before = allocator.stats().allocated_bytes.current;
    for bytes in sizes {
        if let Err(e) = allocator.malloc(device, bytes) {
            return Err(e.out_of_memory().map_or(0, |o| o.requested));
        }
    }
    Ok(allocator.stats().allocated_bytes.current - before)
}

/// QLoRA's model made: `from_pretrained(..., quantization_config=...)`
/// quantizes each linear layer of the decoder from its copy in the
/// loading type (which goes) and loads the rest in that type;
/// `prepare_model_for_kbit_training` upcasts each of those to float32
/// (`param.data.to(torch.float32)`) and empties the cache; peft adds
/// LoRA's adapters on every linear layer. The bytes held, or the request
/// refused.
pub(super) fn load_4bit(
    allocator: &mut dyn Allocator,
    device: &mut SimDevice,
    quant: step::Quant4,
    (c, params): (&HfConfig, &[NamedTensor]),
    rank: u64,
) -> Result<u64, u64> {
    let refused = |e: crate::alloc::AllocError| e.out_of_memory().map_or(0, |o| o.requested);
    let before = allocator.stats().allocated_bytes.current;
    let mut halves = Vec::new();
    for p in params.iter().chain(&buffers(c)) {
        let bytes = p.numel() * p.dtype.size_bytes();
        let copy = allocator.malloc(device, bytes).map_err(refused)?;
        if !step::quantized(&p.name, &p.shape) {
            if p.dtype != Dtype::Float32 {
                halves.push((copy, p.numel()));
            }
            continue;
        }
        for stored in quant.stored(p.numel()) {
            allocator.malloc(device, stored).map_err(refused)?;
        }
        if let Some(b) = copy {
            allocator.free(device, b);
        }
    }
    for (half, n) in halves {
        allocator.malloc(device, n * 4).map_err(refused)?;
        if let Some(b) = half {
            allocator.free(device, b);
        }
    }
    allocator.empty_cache(device);
    if rank > 0 {
        for bytes in adapters(c, params, rank, true) {
            allocator.malloc(device, bytes).map_err(refused)?;
        }
    }
    Ok(allocator.stats().allocated_bytes.current - before)
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

/// The adapters' bytes.
pub(super) fn adapters(c: &HfConfig, params: &[NamedTensor], rank: u64, quant: bool) -> Vec<u64> {
    (adapter_shapes(c, params, rank, quant).iter())
        .map(|s| s.iter().product::<u64>() * 4)
        .collect()
}

/// What AdamW's first `step()` makes for each parameter it updates:
/// `torch.optim.AdamW`'s `exp_avg` and `exp_avg_sq`, each like the
/// parameter; bitsandbytes' `AdamW8bit` its two quantization maps first,
/// then each parameter's `state1` and `state2` in 8 bits with a float32
/// `absmax` per block of 256 (float32 states under 4,096 elements:
/// `optim::OptimizerSpec::state`).
pub(super) fn adam_state(c: &HfConfig, params: &[NamedTensor], t: &Training) -> Vec<u64> {
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
