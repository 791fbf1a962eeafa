//! "Will it fit?": a model's weights loaded on a simulated GPU and its
//! `generate` or one training step (full, or peft's LoRA; AdamW's state
//! made first) played on PyTorch's caching allocator there, request by
//! request (the same programs the tests hold to transformers'), with the
//! peak, what holds it, where it runs out, and the largest batch and the
//! longest prompt or sequence that fit. Matrix products take their cuBLAS
//! workspaces as the PyTorch release asked for does.

use super::config::HfConfig;
use super::generate::{play, Generation};
use super::params::parameters;
use super::step;
pub use load::{
    adam_state, kbit_prepare, load_model, loading, lora_adapters, warmup_request, LoadStep,
};
use load::{Loading, Start};
use vramlab_train::program::{Alloc, Holds, Op, Sink};

mod load;
mod remedy;
mod search;

pub use remedy::{remedies, Change, Remedy};
pub use search::{largest, largest_near};
use vramlab_core::error::Invalid;
use vramlab_core::types::Dtype;
use vramlab_device::alloc::{Allocator, BlockId};
use vramlab_device::device::{Device, SimDevice};
use vramlab_device::framework::{
    make_allocator, sim_device, BlasWorkspaces, RestartSettings, Settings, TorchVersion,
};
use vramlab_device::gpu::GpuModel;
use vramlab_train::kinds::NamedTensor;

/// One training step: `model(input_ids=ids, labels=ids).loss`,
/// `backward()`, AdamW's `step()` and `zero_grad()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Training {
    pub batch: u64,
    pub seq: u64,
    pub attention: vramlab_train::kinds::step::Attention,
    /// `gradient_checkpointing_enable(use_reentrant=False)`.
    pub checkpointing: bool,
    /// peft's LoRA of this rank on the model type's default targets; none:
    /// every parameter trains.
    pub lora: Option<u64>,
    /// bitsandbytes' `AdamW8bit` instead of `torch.optim.AdamW`.
    pub adam8bit: bool,
    /// QLoRA: loaded in bitsandbytes' 4 bits, readied by peft's
    /// `prepare_model_for_kbit_training` (the other parameters upcast to
    /// float32; its checkpointing reentrant), LoRA on every linear layer.
    pub quant: Option<step::Quant4>,
    /// `torch.autocast` of this type around the forward (`Trainer(bf16=True)`
    /// on float32 weights).
    pub amp: Option<Dtype>,
}

/// What the model is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    Generate(Generation),
    Train(Training),
}

impl Task {
    /// The batch, and the prompt's or the sequence's tokens.
    pub fn batch_and_tokens(self) -> (u64, u64) {
        match self {
            Task::Generate(g) => (g.batch, g.prompt),
            Task::Train(t) => (t.batch, t.seq),
        }
    }

    /// The same task with another batch and token count.
    pub(crate) fn with(self, batch: u64, tokens: u64) -> Task {
        match self {
            Task::Generate(g) => Task::Generate(Generation {
                batch,
                prompt: tokens,
                ..g
            }),
            Task::Train(t) => Task::Train(Training {
                batch,
                seq: tokens,
                ..t
            }),
        }
    }
}

/// The question.
#[derive(Clone, Copy, Debug)]
pub struct Question {
    pub config: HfConfig,
    /// The type the weights load in (`torch_dtype=`).
    pub dtype: Dtype,
    pub gpu: GpuModel,
    pub task: Task,
    /// The PyTorch release: where matrix products get their cuBLAS
    /// workspaces (`vramlab_train::cublas`).
    pub torch: TorchVersion,
}

/// Where a run stopped for want of memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Loading the weights.
    Weights,
    /// Making the optimizer's state (its first `step()`).
    State,
    /// A training step's forward, backward or optimizer step.
    Phase(&'static str),
    /// Forward `k` (0: the prefill over the prompt).
    Forward(u64),
    /// Between forwards, `generate`'s own tensors after forward `k`.
    After(u64),
}

/// One run's numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The parameters' and buffers' bytes as the allocator holds them
    /// (LoRA's adapters with them); where loading ran out, what it held
    /// when it did.
    pub weights: u64,
    /// The parameters' and buffers' own bytes, the model's whole size.
    pub model_bytes: u64,
    /// AdamW's state (`exp_avg`, `exp_avg_sq`) held before a step.
    pub state: u64,
    /// `max_memory_allocated()` and `max_memory_reserved()`.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// At the peak of allocated memory, the bytes of each kind of tensor
    /// besides the weights.
    pub at_peak: Vec<(Holds, u64)>,
    /// At the peak, the activations each decoder layer made (its forward's
    /// and its backward's), by layer.
    pub activations_by_layer: Vec<u64>,
    /// Where it ran out of memory, if it did, and the request refused.
    pub out_of_memory: Option<(Stop, u64)>,
    /// The memory `cudaMemGetInfo` reports, and the CUDA context's part.
    pub total: u64,
    pub context: u64,
    /// Each forward's peak of allocated memory (the prefill's first, then
    /// one per new token), and the memory reserved when it returned.
    pub by_token: Vec<(u64, u64)>,
}

impl Run {
    pub fn fits(&self) -> bool {
        self.out_of_memory.is_none()
    }

    /// The bytes of one kind of tensor at the peak.
    pub fn held_at_peak(&self, holds: Holds) -> u64 {
        self.at_peak
            .iter()
            .find(|(h, _)| *h == holds)
            .map_or(0, |(_, bytes)| *bytes)
    }
}

/// The GPU's simulated device and PyTorch's caching allocator on it, as
/// `restart` with this GPU makes them.
fn gpu_and_allocator(
    gpu: GpuModel,
    torch: TorchVersion,
) -> Result<(SimDevice, Box<dyn Allocator>, BlasWorkspaces), Invalid> {
    let patch = RestartSettings {
        gpu: Some(gpu),
        torch_version: Some(torch),
        ..RestartSettings::default()
    };
    let settings: Settings = Settings::default()
        .patched(&patch)
        .map_err(|e| Invalid(e.message))?;
    let device = sim_device(&settings)?;
    let mut allocator = make_allocator(&settings, &device);
    // The plan reads the counters only: no event log.
    allocator.set_tracing(false);
    Ok((device, allocator, settings.blas_workspaces()))
}

/// Plays a run's steps on the allocator as the run makes them: each live
/// block in a slot reused once it is freed, the bytes each kind holds,
/// the peak and what held it; the first request refused ends the run.
struct Player<'a> {
    device: &'a mut SimDevice,
    allocator: &'a mut dyn Allocator,
    out: &'a mut Run,
    live: Vec<Option<(BlockId, Holds, Option<u32>)>>,
    spare: Vec<usize>,
    held: [u64; Holds::ALL.len()],
    /// Activations held, by the layer that made them.
    by_layer: Vec<u64>,
    at: Stop,
    blas: BlasWorkspaces,
    /// The kept workspaces made so far: cuBLAS's, cuBLASLt's.
    kept: [bool; 2],
    /// The peak of allocated memory since the forward began.
    forward_peak: u64,
}

impl Player<'_> {
    /// A block of `bytes` for a tensor that holds `holds`; `None` once a
    /// request is refused (the run stops there).
    fn take(&mut self, bytes: u64, holds: Holds) -> Option<usize> {
        self.take_in(bytes, holds, None)
    }

    /// `take`, for a tensor layer `layer` made.
    fn take_in(&mut self, bytes: u64, holds: Holds, layer: Option<u32>) -> Option<usize> {
        if self.out.out_of_memory.is_some() {
            return None;
        }
        let block = match self.allocator.malloc(self.device, bytes) {
            Ok(Some(block)) => block,
            Ok(None) => return None,
            Err(e) => {
                let asked = e.out_of_memory().map_or(0, |o| o.requested);
                self.out.out_of_memory = Some((self.at.clone(), asked));
                return None;
            }
        };
        let size = self.allocator.block_size(block);
        self.held[index(holds)] += size;
        let layer = layer.filter(|_| holds == Holds::Activation);
        if let Some(l) = layer {
            let l = l as usize;
            if self.by_layer.len() <= l {
                self.by_layer.resize(l + 1, 0);
            }
            self.by_layer[l] += size;
        }
        let allocated = self.allocator.stats().allocated_bytes.current;
        self.forward_peak = self.forward_peak.max(allocated);
        if allocated > self.out.peak_allocated {
            self.out.peak_allocated = allocated;
            let held = self.held;
            self.out.at_peak = Holds::ALL.iter().map(|&h| (h, held[index(h)])).collect();
            self.out.activations_by_layer.clone_from(&self.by_layer);
        }
        let slot = self.spare.pop().unwrap_or(self.live.len());
        if slot == self.live.len() {
            self.live.push(None);
        }
        self.live[slot] = Some((block, holds, layer));
        Some(slot)
    }

    /// A matrix product's workspaces, its output already allocated
    /// (`vramlab_train::cublas`'s rule): for the call and freed as it
    /// returns in PyTorch 2.15; else kept from the first call, cuBLAS's by
    /// every product and cuBLASLt's by `addmm` (an `nn.Linear` with a bias)
    /// unless it shares cuBLAS's. `generate` runs on the main thread only.
    fn gemm_workspaces(&mut self, op: &str) {
        let lt = match op {
            "mm" | "bmm" => false,
            "addmm" => true,
            _ => return,
        };
        let c = self.blas;
        if c.per_call {
            let bytes = if lt { c.lt_bytes } else { c.cublas_bytes };
            if let Some(slot) = (bytes > 0)
                .then(|| self.take(bytes, Holds::Workspace))
                .flatten()
            {
                self.release(slot);
            }
            return;
        }
        let own_lt = lt && !c.lt_shares_cublas;
        for (i, bytes) in [(0, c.cublas_bytes), (1, c.lt_bytes)] {
            if (i == 0 || own_lt) && bytes > 0 && !self.kept[i] {
                // Kept for the process: never released by the run.
                self.kept[i] = self.take(bytes, Holds::Workspace).is_some();
            }
        }
    }

    fn release(&mut self, slot: usize) {
        let Some((block, holds, layer)) = self.live.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let size = self.allocator.block_size(block);
        self.held[index(holds)] -= size;
        if let Some(held) = layer.and_then(|l| self.by_layer.get_mut(l as usize)) {
            *held -= size;
        }
        self.allocator.free(self.device, block);
        self.spare.push(slot);
    }
}

impl Sink for Player<'_> {
    fn alloc(&mut self, m: &Alloc) -> usize {
        let Some(slot) = self.take_in(m.bytes(), m.holds, m.layer) else {
            return usize::MAX;
        };
        self.gemm_workspaces(m.op);
        slot
    }

    fn free(&mut self, slot: usize) {
        self.release(slot);
    }

    fn mark(&mut self, op: Op) {
        let stats = self.allocator.stats();
        self.at = match op {
            Op::Returned(k) => {
                let reserved = stats.reserved_bytes.current;
                self.out.by_token.push((self.forward_peak, reserved));
                Stop::After(k)
            }
            Op::Forward(k) => {
                self.forward_peak = stats.allocated_bytes.current;
                Stop::Forward(k)
            }
            Op::Phase(name) => Stop::Phase(name),
            _ => return,
        };
    }

    fn stopped(&self) -> bool {
        self.out.out_of_memory.is_some()
    }
}

/// Whether the step's grouped-query attention runs the math kernel on a
/// GPU of compute capability `gpu`: the fused kernel it would take is the
/// memory-efficient one (float32 activations: QLoRA's, or float32 weights
/// without autocast), which refuses grouped heads in PyTorch 2.11 and 2.9
/// (the H100's QLoRA run with 2.11 shows the math kernel's scores). For
/// 2.15 the plan takes the memory-efficient kernel to accept them
/// (pytorch#191085).
fn math_gqa(c: &HfConfig, t: &Training, gpu: Option<(u32, u32)>, torch: TorchVersion) -> bool {
    use vramlab_train::kinds::step::sdp::{self, Kernel};
    // Autocast casts attention's inputs; QLoRA's are float32 otherwise.
    let dtype = match (t.amp, t.quant.is_some()) {
        (Some(amp), _) => amp,
        (None, true) => Dtype::Float32,
        (None, false) => c.dtype,
    };
    c.heads != c.kv_heads
        && t.attention == vramlab_train::kinds::step::Attention::Sdpa
        && torch != TorchVersion::V2_15
        && sdp::select(gpu, dtype, c.head_dim, true) == Kernel::Efficient
}

/// The step `t` asks of model `c` (in its loading type) on a GPU of
/// compute capability `gpu` under PyTorch `torch`, and the model as the
/// step sees it (after `prepare_model_for_kbit_training` the embeddings
/// are float32, and so is every activation).
pub fn step_of(
    c: &HfConfig,
    t: &Training,
    gpu: Option<(u32, u32)>,
    torch: TorchVersion,
) -> (HfConfig, step::Run) {
    let four = t.quant.is_some();
    let run = step::Run {
        checkpointing: t.checkpointing,
        lora: t.lora,
        gpu,
        adam8bit: t.adam8bit,
        quant: t.quant,
        reentrant: four && t.checkpointing,
        amp: t.amp,
        math_gqa: math_gqa(c, t, gpu, torch),
        // peft readies a checkpointed model for LoRA by making the
        // embeddings need a gradient.
        input_grads: t.lora.is_some() && t.checkpointing,
        ..step::Run::plain(t.batch, t.seq, t.attention)
    };
    let stepped = HfConfig {
        dtype: if four { Dtype::Float32 } else { c.dtype },
        ..*c
    };
    (stepped, run)
}

/// Plays the question once.
pub fn run(q: &Question) -> Result<Run, Invalid> {
    let loaded = HfConfig {
        dtype: q.dtype,
        ..q.config
    };
    let params = parameters(&loaded);
    run_with(q, &params, &Loading::of(q, &params, fresh(q)?))
}

/// A fresh simulated GPU and allocator for `q`.
fn fresh(q: &Question) -> Result<(SimDevice, Box<dyn Allocator>), Invalid> {
    gpu_and_allocator(q.gpu, q.torch).map(|(d, a, _)| (d, a))
}

/// Plays the question once, the model's `named_parameters()` (loaded in
/// the question's type) and what it loads given.
fn run_with(q: &Question, params: &[NamedTensor], loads: &Loading) -> Result<Run, Invalid> {
    let (device, allocator, blas) = gpu_and_allocator(q.gpu, q.torch)?;
    let Start {
        mut device,
        mut allocator,
        weights,
        state,
    } = loads.start(device, allocator);
    let (_, total) = device.mem_get_info();
    let mut out = Run {
        weights: 0,
        model_bytes: params
            .iter()
            .map(|p| p.numel() * p.dtype.size_bytes())
            .sum(),
        state: 0,
        peak_allocated: 0,
        peak_reserved: 0,
        at_peak: Vec::new(),
        activations_by_layer: Vec::new(),
        out_of_memory: None,
        total,
        context: device.context_bytes(),
        by_token: Vec::new(),
    };
    let loaded = HfConfig {
        dtype: q.dtype,
        ..q.config
    };
    match weights {
        Ok(bytes) => out.weights = bytes,
        Err(asked) => {
            // How far loading got: what the allocator holds when refused.
            out.weights = allocator.stats().allocated_bytes.current;
            out.out_of_memory = Some((Stop::Weights, asked));
            return Ok(finish(out, allocator.as_ref()));
        }
    }
    match state {
        Some(Ok(bytes)) => out.state = bytes,
        Some(Err(asked)) => {
            out.out_of_memory = Some((Stop::State, asked));
            return Ok(finish(out, allocator.as_ref()));
        }
        None => {}
    }
    let mut player = Player {
        device: &mut device,
        allocator: allocator.as_mut(),
        out: &mut out,
        live: Vec::new(),
        spare: Vec::new(),
        held: [0; Holds::ALL.len()],
        by_layer: Vec::new(),
        at: Stop::Forward(0),
        forward_peak: 0,
        blas,
        kept: [false; 2],
    };
    match q.task {
        Task::Generate(g) => play(&loaded, q.dtype, g, &mut player)?,
        Task::Train(t) => {
            let gpu = Some(q.gpu.spec().compute_capability);
            let (stepped, run) = step_of(&loaded, &t, gpu, q.torch);
            step::play_with(&stepped, run, params, &mut player)?
        }
    }
    Ok(finish(out, allocator.as_ref()))
}

fn index(h: Holds) -> usize {
    Holds::ALL.iter().position(|&x| x == h).unwrap_or(0)
}

fn finish(mut out: Run, allocator: &dyn Allocator) -> Run {
    let s = allocator.stats();
    out.peak_allocated = out.peak_allocated.max(s.allocated_bytes.peak);
    out.peak_reserved = s.reserved_bytes.peak;
    out
}

/// The answer: the run asked for, the largest batch (up to 4,096) and the
/// longest prompt or training sequence (up to the model's positions) that
/// fit.
#[derive(Clone, Debug)]
pub struct Answer {
    pub run: Run,
    pub largest_batch: u64,
    pub longest_prompt: u64,
    /// Near the limit whether a run fits need not be monotone (the
    /// caching allocator's blocks fall otherwise from one size to the
    /// next): the value just below each found that does not fit, if so.
    pub batch_below_fails: Option<u64>,
    pub prompt_below_fails: Option<u64>,
    /// Where the run does not fit, the changes that make it fit, cheapest
    /// first, each played ([`remedies`]).
    pub remedies: Vec<Remedy>,
}

pub fn answer(q: &Question) -> Result<Answer, Invalid> {
    let loaded = HfConfig {
        dtype: q.dtype,
        ..q.config
    };
    let params = parameters(&loaded);
    let loads = Loading::of(q, &params, fresh(q)?);
    let run = run_with(q, &params, &loads)?;
    let with = |task: Task| Question { task, ..*q };
    let (batch, tokens) = q.task.batch_and_tokens();
    // Each (batch, tokens) is played once: the searches and the checks
    // below them share the answers, the question's own run among them.
    let seen = std::cell::RefCell::new(vec![((batch, tokens), run.fits())]);
    // A run refused for its size (a tensor beyond any GPU) does not fit.
    let fits = |task: Task| {
        let key = task.batch_and_tokens();
        if let Some(&(_, known)) = seen.borrow().iter().find(|(k, _)| *k == key) {
            return Ok(known);
        }
        let fit = run_with(&with(task), &params, &loads).is_ok_and(|r| r.fits());
        seen.borrow_mut().push((key, fit));
        Ok(fit)
    };
    let at_batch = |b: u64| q.task.with(b, tokens);
    let at_tokens = |n: u64| q.task.with(batch, n);
    // A training step that fits holds, beside the weights and AdamW's
    // state, the logits, their float32 copy where they are narrower, and
    // the float32 log-probabilities (`log_softmax` in `ForCausalLMLoss`)
    // of every token over the vocabulary at once: no more tokens than that
    // room allows are searched.
    let token_cap = match q.task {
        Task::Generate(_) => u64::MAX,
        Task::Train(t) => {
            let room = run.total.saturating_sub(run.weights + run.state);
            let logits = match (t.quant, t.amp) {
                (Some(_), None) => 4,
                (_, Some(amp)) => amp.size_bytes(),
                (None, None) => q.dtype.size_bytes(),
            };
            let wide = if logits < 4 { 4 } else { 0 };
            room / (q.config.vocab * (logits + wide + 4)).max(1)
        }
    };
    let batch_most = 4096.min(token_cap / tokens.max(1));
    let room = match q.task {
        Task::Generate(g) => q.config.max_positions.saturating_sub(g.new_tokens),
        Task::Train(_) => q.config.max_positions.min(token_cap / batch.max(1)),
    };
    let (largest_batch, longest_prompt) = match q.task {
        Task::Generate(_) => (
            largest(batch_most, |b| fits(at_batch(b)))?,
            largest(room, |n| fits(at_tokens(n)))?,
        ),
        // A training step's memory grows about in proportion to its
        // tokens past what lived before it: the run asked for guesses
        // where the card's memory runs out, within about a 32nd.
        Task::Train(_) => {
            let before = run.weights + run.state;
            let scale = |n: u64| -> (u64, u64) {
                let used = run.peak_reserved.saturating_sub(before).max(1) as u128;
                let free = run.total.saturating_sub(before) as u128;
                let at = (u128::from(n) * free / used).min(u128::from(u64::MAX)) as u64;
                (at, 32)
            };
            (
                largest_near(batch_most, scale(batch), |b| fits(at_batch(b)))?,
                largest_near(room, scale(tokens), |n| fits(at_tokens(n)))?,
            )
        }
    };
    let below_fails = |found: u64, at: &dyn Fn(u64) -> Task| -> Result<Option<u64>, Invalid> {
        let below = found.saturating_sub(1);
        Ok((below > 0 && !fits(at(below))?).then_some(below))
    };
    let remedies = match run.fits() {
        true => Vec::new(),
        false => remedies(q, largest_batch),
    };
    Ok(Answer {
        run,
        largest_batch,
        longest_prompt,
        batch_below_fails: below_fails(largest_batch, &at_batch)?,
        prompt_below_fails: below_fails(longest_prompt, &at_tokens)?,
        remedies,
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
