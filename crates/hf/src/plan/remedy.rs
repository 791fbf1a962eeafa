//! What makes a run that does not fit fit: the changes people make to it,
//! cheapest first, each checked by playing the changed run. For a
//! training step: gradient checkpointing (more compute), a smaller batch
//! with gradient accumulation (more steps, the same samples an update),
//! bitsandbytes' 8-bit AdamW, LoRA, QLoRA (another way of training); for
//! `generate`, a smaller batch; then the smallest larger GPU. When no one
//! change fits, the training changes together, in that order, up to the
//! first that fits.

use super::{run, Question, Task, Training};
use crate::config::Arch;
use crate::step::Quant4;
use vramlab_device::gpu::GpuModel;

/// A change to the question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `model.gradient_checkpointing_enable()`.
    Checkpointing,
    /// `micro` samples a step and `steps` steps an optimizer step
    /// (`gradient_accumulation_steps`): the same samples an update.
    Accumulate { micro: u64, steps: u64 },
    /// bitsandbytes' `AdamW8bit` for `torch.optim.AdamW`.
    Adam8bit,
    /// peft's LoRA of rank 16 on the model type's default targets instead
    /// of training every parameter.
    Lora,
    /// QLoRA: the weights in 4 bits (nf4, double quantization), LoRA on
    /// every linear layer, checkpointing as `prepare_model_for_kbit_training`
    /// leaves it.
    Qlora,
    /// `generate` of a smaller batch.
    Batch(u64),
    /// The same run on a GPU with more memory.
    Gpu(GpuModel),
}

impl Change {
    /// The change in words, as the planner's form and `vramlab plan`'s
    /// flags say it.
    pub fn words(self) -> String {
        match self {
            Change::Checkpointing => "gradient checkpointing (--checkpointing)".into(),
            Change::Accumulate { micro, steps } => format!(
                "a batch of {micro} with gradient accumulation over {steps} steps (--batch {micro}, the same samples an update)"
            ),
            Change::Adam8bit => "8-bit AdamW (--optimizer adamw8bit)".into(),
            Change::Lora => "LoRA of rank 16 (--task lora)".into(),
            Change::Qlora => "QLoRA: 4-bit weights and LoRA (--task qlora)".into(),
            Change::Batch(b) => format!("a batch of {b} (--batch {b})"),
            Change::Gpu(g) => format!("a GPU with more memory: {} (--gpu {})", g.spec().name, g.id()),
        }
    }

    /// The question with this change.
    fn apply(self, q: &Question) -> Question {
        let task = match (self, q.task) {
            (Change::Gpu(gpu), _) => return Question { gpu, ..*q },
            (Change::Batch(batch), Task::Generate(g)) => {
                Task::Generate(crate::generate::Generation { batch, ..g })
            }
            (_, Task::Generate(g)) => Task::Generate(g),
            (change, Task::Train(t)) => Task::Train(trained(change, t, q.dtype)),
        };
        Question { task, ..*q }
    }
}

/// A training step with `change`.
fn trained(change: Change, t: Training, dtype: vramlab_core::types::Dtype) -> Training {
    match change {
        Change::Checkpointing => Training {
            checkpointing: true,
            ..t
        },
        Change::Accumulate { micro, .. } => Training { batch: micro, ..t },
        Change::Adam8bit => Training {
            adam8bit: true,
            ..t
        },
        Change::Lora => Training {
            lora: Some(t.lora.unwrap_or(16)),
            ..t
        },
        Change::Qlora => Training {
            lora: Some(t.lora.unwrap_or(16)),
            quant: Some(Quant4 {
                nf4: true,
                double_quant: true,
                compute: dtype,
            }),
            checkpointing: true,
            ..t
        },
        Change::Batch(_) | Change::Gpu(_) => t,
    }
}

/// Changes that together make the question fit, and the run's peaks then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remedy {
    pub changes: Vec<Change>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// What `cudaMemGetInfo` reports on the GPU it runs on.
    pub total: u64,
}

/// The changes that fit a question that does not, cheapest first, each
/// played: every single change that fits; before them, where changes
/// cheaper than the first of those fit together, the set whose dearest
/// change is cheapest (and of those the smallest); then the smallest GPU
/// with more memory where the question fits as asked. `largest_batch` is
/// the largest batch that fits as asked.
pub fn remedies(q: &Question, largest_batch: u64) -> Vec<Remedy> {
    let candidates = candidates(q, largest_batch);
    let singles: Vec<(usize, Remedy)> = (candidates.iter().enumerate())
        .filter_map(|(i, &change)| Some((i, fitted(q, &[change])?)))
        .collect();
    let cheaper = singles.first().map_or(candidates.len(), |(i, _)| *i);
    let together = (1..cheaper).find_map(|dearest| together(q, &candidates, dearest));
    let mut found: Vec<Remedy> = together.into_iter().collect();
    found.extend(singles.into_iter().map(|(_, r)| r));
    let mut larger: Vec<GpuModel> = (GpuModel::ALL.iter().copied())
        .filter(|g| g.spec().total_bytes > q.gpu.spec().total_bytes)
        .collect();
    larger.sort_by_key(|g| g.spec().total_bytes);
    found.extend(
        larger
            .into_iter()
            .find_map(|gpu| fitted(q, &[Change::Gpu(gpu)])),
    );
    found
}

/// The fewest changes cheaper than `candidates[dearest]` that fit with
/// it (8-bit AdamW never beside LoRA, whose state is small), if any.
fn together(q: &Question, candidates: &[Change], dearest: usize) -> Option<Remedy> {
    let cheaper = &candidates[..dearest];
    let mut sets: Vec<Vec<Change>> = (1..1u32 << cheaper.len())
        .map(|bits| {
            let mut set: Vec<Change> = (cheaper.iter().enumerate())
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, &c)| c)
                .collect();
            set.push(candidates[dearest]);
            set
        })
        .filter(|set| !(set.contains(&Change::Adam8bit) && set.contains(&Change::Lora)))
        .collect();
    sets.sort_by_key(Vec::len);
    sets.iter().find_map(|set| fitted_accumulating(q, set))
}

/// `fitted`, where the set accumulates gradients with the largest
/// micro-batch that divides the batch and fits with the rest of it.
fn fitted_accumulating(q: &Question, set: &[Change]) -> Option<Remedy> {
    let (Task::Train(t), Some(at)) = (q.task, set.iter().position(is_accumulate)) else {
        return fitted(q, set);
    };
    (1..t.batch)
        .rev()
        .filter(|m| t.batch % m == 0)
        .find_map(|micro| {
            let mut set = set.to_vec();
            set[at] = Change::Accumulate {
                micro,
                steps: t.batch / micro,
            };
            fitted(q, &set)
        })
}

fn is_accumulate(c: &Change) -> bool {
    matches!(c, Change::Accumulate { .. })
}

/// The changes to try on this GPU, cheapest first.
fn candidates(q: &Question, largest_batch: u64) -> Vec<Change> {
    let mut out = Vec::new();
    match q.task {
        Task::Generate(g) => {
            if g.batch > 1 && largest_batch >= 1 {
                out.push(Change::Batch(largest_batch.min(g.batch - 1)));
            }
        }
        Task::Train(t) => {
            if !t.checkpointing {
                out.push(Change::Checkpointing);
            }
            if t.batch > 1 {
                // The largest micro-batch that divides the batch and fits
                // (1 when none is known to: tried, and then combined).
                let micro = (1..t.batch)
                    .rev()
                    .find(|m| t.batch % m == 0 && *m <= largest_batch.max(1))
                    .unwrap_or(1);
                let steps = t.batch / micro;
                out.push(Change::Accumulate { micro, steps });
            }
            let full = t.lora.is_none();
            if full && !t.adam8bit {
                out.push(Change::Adam8bit);
            }
            if full {
                out.push(Change::Lora);
            }
            if t.quant.is_none() && q.config.arch != Arch::Gpt2 {
                out.push(Change::Qlora);
            }
        }
    }
    out
}

/// The question with `changes`, played: its peaks if it fits (a change
/// whose run is refused, a tensor beyond any GPU, does not).
fn fitted(q: &Question, changes: &[Change]) -> Option<Remedy> {
    let changed = changes.iter().fold(*q, |q, c| c.apply(&q));
    let r = run(&changed).ok().filter(|r| r.fits())?;
    Some(Remedy {
        changes: changes.to_vec(),
        peak_allocated: r.peak_allocated,
        peak_reserved: r.peak_reserved,
        total: r.total,
    })
}
