//! "Will it fit?": a model's weights loaded on a simulated GPU and its
//! `generate` played on PyTorch's caching allocator there, request by
//! request (the same program the tests hold to transformers'), with the
//! peak, what holds it, where it runs out, and the largest batch and the
//! longest prompt that fit.

use super::config::HfConfig;
use super::generate::{program, Generation, Holds, Step};
use super::params::{buffers, parameters};
use crate::device::{SimDevice, SimDeviceConfig};
use crate::error::Invalid;
use crate::framework::{make_allocator, RestartSettings, Settings};
use crate::gpu::GpuModel;
use crate::process::Process;
use crate::runtime::ObjId;
use crate::types::{Category, Dtype};

/// The question.
#[derive(Clone, Copy, Debug)]
pub struct Question {
    pub config: HfConfig,
    /// The type the weights load in (`torch_dtype=`).
    pub dtype: Dtype,
    pub gpu: GpuModel,
    pub generation: Generation,
}

/// Where a run stopped for want of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Loading the weights.
    Weights,
    /// Forward `k` (0: the prefill over the prompt).
    Forward(u64),
    /// Between forwards, `generate`'s own tensors after forward `k`.
    After(u64),
}

/// One run's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The parameters' and buffers' bytes as the allocator holds them.
    pub weights: u64,
    /// `max_memory_allocated()` and `max_memory_reserved()`.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// At the peak of allocated memory, the bytes of each kind of tensor
    /// besides the weights.
    pub at_peak: Vec<(Holds, u64)>,
    /// Where it ran out of memory, if it did, and the request refused.
    pub out_of_memory: Option<(Stop, u64)>,
    /// The memory `cudaMemGetInfo` reports, and the CUDA context's part.
    pub total: u64,
    pub context: u64,
}

impl Run {
    pub fn fits(&self) -> bool {
        self.out_of_memory.is_none()
    }
}

fn process(gpu: GpuModel) -> Result<Process, Invalid> {
    let patch = RestartSettings {
        gpu: Some(gpu),
        ..RestartSettings::default()
    };
    let settings: Settings = Settings::default()
        .patched(&patch)
        .map_err(|e| Invalid(e.message))?;
    let device = SimDevice::new(SimDeviceConfig {
        total_bytes: settings.device_total_bytes,
        context_bytes: settings.context_bytes,
        other_processes_bytes: settings.other_processes_bytes,
        compute_capability: settings.compute_capability,
        model_name: Some(gpu.spec().name),
    });
    let allocator = make_allocator(&settings, &device);
    Ok(Process::new(Box::new(device), allocator))
}

/// Plays the question once.
pub fn run(q: &Question) -> Result<Run, Invalid> {
    let p = program(&q.config, q.dtype, q.generation)?;
    let mut proc = process(q.gpu)?;
    let stats = proc.stats();
    let mut out = Run {
        weights: 0,
        peak_allocated: 0,
        peak_reserved: 0,
        at_peak: Vec::new(),
        out_of_memory: None,
        total: stats.device_total_bytes,
        context: stats.context_bytes,
    };
    // `from_config(..., dtype=...).to("cuda")`: each tensor in order.
    let tensors = parameters(&q.config).into_iter().chain(buffers(&q.config));
    for t in tensors {
        let dtype = if t.dtype == Dtype::Float32 {
            t.dtype
        } else {
            q.dtype
        };
        let bytes = t.numel() * dtype.size_bytes();
        if let Err(f) = proc.alloc_tensor(&t.name, bytes, t.shape, dtype, Category::Parameter) {
            out.out_of_memory = Some((
                Stop::Weights,
                f.error.out_of_memory().map_or(0, |o| o.requested),
            ));
            return Ok(finish(out, &proc));
        }
    }
    out.weights = proc.stats().allocated_bytes;
    let mut ids: Vec<Option<ObjId>> = vec![None; p.made.len()];
    let mut held = [0_u64; 4];
    let mut at = Stop::Forward(0);
    for step in &p.steps {
        match *step {
            Step::Alloc(i) => {
                let m = p.made[i];
                let label = m.holds.name();
                let shape = vec![m.bytes];
                match proc.alloc_tensor(label, m.bytes, shape, Dtype::Uint8, m.holds.category()) {
                    Ok(id) => ids[i] = Some(id),
                    Err(f) => {
                        out.out_of_memory =
                            Some((at, f.error.out_of_memory().map_or(0, |o| o.requested)));
                        return Ok(finish(out, &proc));
                    }
                }
                if let Some(id) = ids[i] {
                    held[index(m.holds)] += proc.block_size(id);
                }
                let allocated = proc.stats().allocated_bytes;
                if allocated > out.peak_allocated {
                    out.peak_allocated = allocated;
                    out.at_peak = Holds::ALL.iter().map(|&h| (h, held[index(h)])).collect();
                }
            }
            Step::Free(i) => {
                if let Some(id) = ids[i].take() {
                    held[index(p.made[i].holds)] -= proc.block_size(id);
                    proc.drop_local(id);
                }
            }
            Step::Forward(k) => at = Stop::Forward(k),
            Step::Returned(k) => at = Stop::After(k),
        }
    }
    Ok(finish(out, &proc))
}

fn index(h: Holds) -> usize {
    Holds::ALL.iter().position(|&x| x == h).unwrap_or(0)
}

fn finish(mut out: Run, proc: &Process) -> Run {
    let s = proc.stats();
    out.peak_allocated = out.peak_allocated.max(s.peak_allocated_bytes);
    out.peak_reserved = s.peak_reserved_bytes;
    out
}

/// The largest value in `1..=most` for which `fits` holds, when `fits`
/// holds for every value below one that fits (0: none fits).
pub fn largest(
    most: u64,
    mut fits: impl FnMut(u64) -> Result<bool, Invalid>,
) -> Result<u64, Invalid> {
    let (mut lo, mut hi) = (0, most);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// The answer: the run asked for, the largest batch (up to 4,096) and the
/// longest prompt (up to the model's positions) that fit.
#[derive(Clone, Debug)]
pub struct Answer {
    pub run: Run,
    pub largest_batch: u64,
    pub longest_prompt: u64,
}

pub fn answer(q: &Question) -> Result<Answer, Invalid> {
    let run = run(q)?;
    let with = |g: Generation| Question {
        generation: g,
        ..*q
    };
    let g = q.generation;
    // A run refused for its size (a tensor beyond any GPU) does not fit.
    let fits = |g: Generation| Ok(self::run(&with(g)).is_ok_and(|r| r.fits()));
    let largest_batch = largest(4096, |b| fits(Generation { batch: b, ..g }))?;
    let room = q.config.max_positions.saturating_sub(g.new_tokens);
    let longest_prompt = largest(room, |p| fits(Generation { prompt: p, ..g }))?;
    Ok(Answer {
        run,
        largest_batch,
        longest_prompt,
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
