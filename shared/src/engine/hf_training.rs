//! Training a Hugging Face model in the process, one statement at a time:
//! `loss = model(input_ids=ids, labels=ids).loss`, `loss.backward()`,
//! `opt.step()`, `opt.zero_grad(set_to_none=True)`, and the loop of them.
//! The step is transformers 5.24's own op sequence (`hf::step`, the
//! plan's), collected once at the forward and played a phase per
//! statement: the forward's tensors held by the loss's graph, the
//! gradients by the model, AdamW's state (made at its first `step()`) by
//! the optimizer; an out-of-memory leaves the statement's tensors on
//! `last_exception`.

use super::{check_name, error, Engine, Outcome};
use crate::command::{ForwardArgs, OptimizerArgs};
use crate::error::{CommandError, ErrorKind};
use crate::hf::params::parameters;
use crate::hf::plan::{adam_state, step_of, Training};
use crate::hf::state::{HfOptimizer, HfStep};
use crate::hf::step;
use crate::process::AllocFailure;
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::train::cublas::BlasThread;
use crate::train::frame::PyFrame;
use crate::train::kinds::step::Attention;
use crate::train::program::{Holds, Op, Program};
use crate::train::OptimizerKind;
use crate::types::{Category, Dtype};
use crate::units::format_size;

/// Where a phase of the program ends.
fn phase_end(p: &Program, from: usize, phase: &'static str) -> usize {
    (p.ops[from..].iter())
        .position(|s| *s == Op::Phase(phase))
        .map_or(p.ops.len(), |i| from + i)
}

fn invalid(message: impl Into<String>) -> CommandError {
    error(ErrorKind::InvalidValue, message)
}

impl Engine {
    /// The Hugging Face model `name` names, if it is one.
    pub(super) fn hf_model_id(&self, name: &str) -> Option<ObjId> {
        let id = self.lookup(name).ok()?;
        self.hf.models.contains_key(&id).then_some(id)
    }

    /// `opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])`.
    pub(super) fn hf_optimizer(
        &mut self,
        a: &OptimizerArgs,
        model: ObjId,
    ) -> Result<Outcome, CommandError> {
        check_name(&a.name)?;
        if !matches!(a.kind, OptimizerKind::Adamw | OptimizerKind::Adam) {
            return Err(invalid("a Hugging Face model trains here with AdamW (torch.optim.AdamW, or bitsandbytes' AdamW8bit with \"bits\": 8)"));
        }
        let state = &self.hf.models[&model];
        let trained: Vec<ObjId> = (state.tensors.iter())
            .filter(|(n, _)| trainable(state.lora.is_some(), n))
            .map(|(_, id)| *id)
            .collect();
        let opt = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Optimizer), &a.name);
        for &p in &trained {
            self.process.runtime.add_ref(opt, p);
        }
        self.hf.optimizers.insert(
            opt,
            HfOptimizer {
                model,
                adam8bit: a.bits == 8,
                state: false,
            },
        );
        self.process.bind_local(&a.name, opt);
        Ok(Outcome::note(format!(
            "`{}` holds the {} tensors that train; AdamW's state (two of each, {}) comes at its first step.",
            a.name,
            trained.len(),
            if a.bits == 8 { "8-bit, with a float32 maximum per block of 256" } else { "in float32 as each parameter" }
        )))
    }

    /// `loss = model(input_ids=ids, labels=ids).loss`: on the tensor the
    /// code made, or (from a dataset) `ids = inputs.cuda()` first.
    pub(super) fn hf_forward(
        &mut self,
        a: &ForwardArgs,
        model: ObjId,
    ) -> Result<Outcome, CommandError> {
        check_name(&a.name)?;
        if a.no_grad {
            return Err(invalid(
                "a Hugging Face model without gradients runs here as `generate`",
            ));
        }
        let (batch, seq, given) = self.hf_batch(a)?;
        let ids = match given {
            Some(ids) => ids,
            None => self.hf_ids(model, a, batch, seq)?,
        };
        self.hf_forward_on(&a.name, model, a, ids)?;
        Ok(Outcome::note(format!(
            "The forward pass of {batch} x {seq} tokens: its graph (`{}`) holds what backward will read. Allocated now {}.",
            a.name,
            format_size(self.stats().allocated_bytes)
        )))
    }

    /// `ids = inputs.cuda()`: a batch of the dataset's sequences copied in,
    /// then `ids` rebound (the last batch dies then).
    fn hf_ids(
        &mut self,
        model: ObjId,
        a: &ForwardArgs,
        batch: u64,
        seq: u64,
    ) -> Result<ObjId, CommandError> {
        let data = self.instance(&a.data, Class::Dataset)?;
        let (spec, vocab) = (
            self.train.datasets[&data].spec,
            self.hf.models[&model].config.vocab,
        );
        if spec.classes != vocab {
            return Err(invalid(format!(
                "the dataset's classes ({}) are the model's vocabulary ({vocab}) for a language model's tokens",
                spec.classes
            )));
        }
        let shape = [batch, seq];
        let ids = self
            .process
            .alloc_shaped("ids", &shape, Dtype::Int64, Category::Input)
            .map_err(|f| self.alloc_error(&f))?;
        self.process.bind_local("ids", ids);
        Ok(ids)
    }

    /// The forward of the step on the token ids `ids`, its graph bound to
    /// `name`.
    fn hf_forward_on(
        &mut self,
        name: &str,
        model: ObjId,
        a: &ForwardArgs,
        ids: ObjId,
    ) -> Result<(), CommandError> {
        let state = self.hf.models[&model].clone();
        if state.quant.is_some() && !state.prepared {
            return Err(invalid(
                "a 4-bit model trains after prepare_model_for_kbit_training",
            ));
        }
        let Some(ObjectKind::Tensor(t)) = self.process.runtime.get(ids).map(|o| &o.kind) else {
            return Err(invalid("input_ids is a tensor"));
        };
        let [batch, seq] = t.shape[..] else {
            return Err(invalid(format!(
                "input_ids is (batch, sequence length), not {:?}",
                t.shape
            )));
        };
        let adam8bit = (self.hf.optimizers.values())
            .find(|o| o.model == model)
            .is_some_and(|o| o.adam8bit);
        let t = Training {
            batch,
            seq,
            attention: a.attention,
            checkpointing: a.checkpointing,
            lora: state.lora,
            adam8bit,
            quant: state.quant,
            amp: a.amp.dtype(),
        };
        let (stepped, run) = step_of(
            &state.config,
            &t,
            self.kernel_gpu(),
            self.settings.torch_version,
        );
        let onto_grads = !state.grads.is_empty();
        let run = step::Run {
            grads_exist: onto_grads,
            ..run
        };
        let mut program = Program::default();
        step::play_with(&stepped, run, &parameters(&state.config), &mut program)?;
        let graph = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Graph), name);
        let mut frame = PyFrame::default();
        let mut pending = HfStep {
            model,
            program,
            at: 0,
            slots: Vec::new(),
            backward: false,
            onto_grads,
        };
        let end = phase_end(&pending.program, 0, "backward");
        let played = self.hf_play(&mut pending, &mut frame, end, BlasThread::Main, graph);
        if let Err(f) = played {
            self.process.drop_local(graph);
            return Err(self.raise_in_frame(frame, &f));
        }
        self.hf.steps.insert(graph, pending);
        self.process.bind_local(name, graph);
        Ok(())
    }

    /// The batch and sequence length a forward takes: the token ids the
    /// code made, or the dataset's sequences.
    fn hf_batch(&self, a: &ForwardArgs) -> Result<(u64, u64, Option<ObjId>), CommandError> {
        if let Some(names) = &a.batch {
            let ids = names
                .first()
                .ok_or_else(|| invalid("batch names the token ids"))?;
            let id = self.lookup(ids)?;
            let o = self.process.runtime.get(id).expect("bound objects exist");
            let shape = match &o.kind {
                ObjectKind::Tensor(t) if t.block.is_some() => t.shape.clone(),
                _ => return Err(invalid(format!("`{ids}` is not token ids on the GPU"))),
            };
            let [b, s] = shape[..] else {
                return Err(invalid(format!(
                    "input_ids is (batch, sequence length): `{ids}` has shape {shape:?}"
                )));
            };
            return Ok((b, s, Some(id)));
        }
        let data = self.instance(&a.data, Class::Dataset)?;
        Ok((a.batch_size, self.train.datasets[&data].spec.features, None))
    }

    /// Plays `pending` up to step `end`: each tensor made a local of
    /// `frame` until the statement ends (then held by `holder`, or a
    /// gradient by the model), each one freed let go by who holds it.
    fn hf_play(
        &mut self,
        pending: &mut HfStep,
        frame: &mut PyFrame,
        end: usize,
        thread: BlasThread,
        holder: ObjId,
    ) -> Result<(), AllocFailure> {
        let k = &mut self.process;
        let cublas = &mut self.train.cublas;
        let mut made_here = Vec::new();
        let mut failed = None;
        while pending.at < end {
            let s = pending.program.ops[pending.at];
            pending.at += 1;
            match s {
                Op::Alloc(i) => {
                    let m = &pending.program.allocs[i];
                    let id = match super::made::alloc(k, cublas, m, thread) {
                        Ok(id) => id,
                        Err(f) => {
                            failed = Some(f);
                            break;
                        }
                    };
                    frame.locals.push(id);
                    if pending.slots.len() <= i {
                        pending.slots.resize(i + 1, None);
                    }
                    pending.slots[i] = Some((id, ObjId::MAX));
                    made_here.push(i);
                }
                Op::Free(i) => {
                    if let Some((id, owner)) = pending.slots.get_mut(i).and_then(Option::take) {
                        match owner {
                            ObjId::MAX => frame.drop(k, id),
                            owner => {
                                k.detach(owner, id);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        // A forward that fails leaves its tensors on the exception's
        // frame; a backward that fails, as autograd's engine unwinds, frees
        // the gradients it was computing, and each parameter's `.grad`
        // made so far stays.
        let unwinding = failed.is_some() && thread == BlasThread::Autograd;
        if !unwinding {
            if let Some(f) = failed {
                return Err(f);
            }
        }
        // What lives on: a gradient with the model, the rest with the graph.
        for i in made_here {
            let Some((id, ObjId::MAX)) = pending.slots[i] else {
                continue;
            };
            let gradient = pending.program.allocs[i].holds == Holds::Gradient;
            if unwinding && !gradient {
                frame.drop(k, id);
                pending.slots[i] = None;
                continue;
            }
            let owner = match gradient {
                true => pending.model,
                false => holder,
            };
            frame.take(id);
            k.attach_local(owner, id);
            pending.slots[i] = Some((id, owner));
            if owner == pending.model {
                if let Some(m) = self.hf.models.get_mut(&pending.model) {
                    m.grads.push(id);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// Whether the tensor `name` trains: with LoRA the adapters; else every
/// parameter that is not 4-bit (buffers and quantized pieces never do).
fn trainable(lora: bool, name: &str) -> bool {
    if lora {
        return name.contains(".lora_");
    }
    let quantized_piece = name.contains(" (") && !name.ends_with(" (float32)");
    let buffer = name.ends_with("inv_freq") || name.ends_with("embed_scale");
    !quantized_piece && !buffer
}

impl Engine {
    /// The step under way that the graph `name` holds, if it is a
    /// Hugging Face model's.
    pub(super) fn hf_graph(&self, name: &str) -> Option<ObjId> {
        let id = self.lookup(name).ok()?;
        self.hf.steps.contains_key(&id).then_some(id)
    }

    /// `loss.backward()`: the backward of the step (autograd's thread),
    /// each parameter's gradient left on the model.
    pub(super) fn hf_backward(&mut self, graph: ObjId) -> Result<Outcome, CommandError> {
        let s = &self.hf.steps[&graph];
        if s.backward {
            return Err(error(
                ErrorKind::RuntimeError,
                crate::train::autograd::BACKWARD_TWICE,
            ));
        }
        let grads_now = self
            .hf
            .models
            .get(&s.model)
            .is_some_and(|m| !m.grads.is_empty());
        if grads_now != s.onto_grads {
            return Err(invalid("the model's gradients changed between this loss's forward and its backward (a zero_grad or another backward in between): vramlab plays a step's backward as its forward found them; run the forward again"));
        }
        let mut pending = self.hf.steps.remove(&graph).expect("checked above");
        let before = self.stats().allocated_bytes;
        let mut frame = PyFrame::default();
        let end = phase_end(&pending.program, pending.at, "optimizer step");
        let played = self.hf_play(&mut pending, &mut frame, end, BlasThread::Autograd, graph);
        pending.backward = true;
        self.hf.steps.insert(graph, pending);
        if let Err(f) = played {
            return Err(self.raise_with(frame, &f, "Autograd freed the gradients it was computing as it unwound; the graph, with the activations it saved, is still the loss's: `del loss` frees them."));
        }
        let grads: u64 = self.hf.models[&self.hf.steps[&graph].model]
            .grads
            .iter()
            .map(|&g| self.process.block_size(g))
            .sum();
        let left = match grads_now {
            true => format!("added each gradient into the parameter's .grad in place and let it go (the gradients stay {})", format_size(grads)),
            false => format!("left a gradient on each trainable parameter ({})", format_size(grads)),
        };
        Ok(Outcome::note(format!(
            "backward freed the saved activations as it went and {left}: allocated {} → {}.",
            format_size(before),
            format_size(self.stats().allocated_bytes)
        )))
    }

    /// `opt.step()`: AdamW's state at the first step, then its update's
    /// temporaries (PyTorch's foreach, or bitsandbytes' 8-bit kernels).
    pub(super) fn hf_step(&mut self, opt: ObjId) -> Result<Outcome, CommandError> {
        let o = self.hf.optimizers[&opt].clone();
        let Some(graph) = (self.hf.steps.iter())
            .find(|(_, s)| s.model == o.model && s.backward && s.at < s.program.ops.len())
            .map(|(g, _)| *g)
        else {
            return Ok(Outcome::note(
                "No parameter has a gradient: step() changed nothing.",
            ));
        };
        let mut pending = self.hf.steps.remove(&graph).expect("found above");
        let before = self.stats().allocated_bytes;
        let mut frame = PyFrame::default();
        let mut made_state = 0;
        if !o.state {
            let m = &self.hf.models[&o.model];
            let t = Training {
                batch: 1,
                seq: 1,
                attention: Attention::Sdpa,
                checkpointing: false,
                lora: m.lora,
                adam8bit: o.adam8bit,
                quant: m.quant,
                amp: None,
            };
            let sizes = adam_state(&m.config, &parameters(&m.config), &t);
            for bytes in sizes {
                match self.process.alloc_tensor(
                    "AdamW state",
                    bytes,
                    vec![bytes],
                    Dtype::Uint8,
                    Category::OptimizerState,
                ) {
                    Ok(id) => {
                        self.process.attach_local(opt, id);
                        made_state += bytes;
                    }
                    Err(f) => {
                        self.hf.steps.insert(graph, pending);
                        return Err(self.raise_in_frame(frame, &f));
                    }
                }
            }
            if let Some(o) = self.hf.optimizers.get_mut(&opt) {
                o.state = true;
            }
        }
        let end = phase_end(&pending.program, pending.at, "zero_grad");
        let played = self.hf_play(&mut pending, &mut frame, end, BlasThread::Main, graph);
        // The rest (zero_grad, the graph freed) is the code's next lines.
        pending.at = pending.program.ops.len();
        self.hf.steps.insert(graph, pending);
        if let Err(f) = played {
            return Err(self.raise_in_frame(frame, &f));
        }
        let mut note = String::new();
        if made_state > 0 {
            note.push_str(&format!(
                "The first step made AdamW's state: {}. ",
                format_size(made_state)
            ));
        }
        note.push_str(&format!(
            "The update's temporaries came and went: allocated {} → {}.",
            format_size(before),
            format_size(self.stats().allocated_bytes)
        ));
        Ok(Outcome::note(note))
    }

    /// `opt.zero_grad(set_to_none=True)`: every gradient goes;
    /// `set_to_none=False` zeroes them in place.
    pub(super) fn hf_zero_grad(
        &mut self,
        opt: ObjId,
        set_to_none: bool,
    ) -> Result<Outcome, CommandError> {
        let model = self.hf.optimizers[&opt].model;
        if !set_to_none {
            let held: u64 = (self.hf.models.get(&model).into_iter())
                .flat_map(|m| m.grads.iter())
                .map(|&g| self.process.block_size(g))
                .sum();
            return Ok(Outcome::note(format!(
                "The gradients were zeroed in place: nothing freed, {} of them stay for the next backward to add into.",
                format_size(held)
            )));
        }
        let grads = self
            .hf
            .models
            .get_mut(&model)
            .map(|m| std::mem::take(&mut m.grads))
            .unwrap_or_default();
        let mut freed = 0;
        for g in grads {
            freed += self.process.detach(model, g);
        }
        for s in self.hf.steps.values_mut().filter(|s| s.model == model) {
            for slot in s.slots.iter_mut() {
                if slot.is_some_and(|(_, owner)| owner == model) {
                    *slot = None;
                }
            }
        }
        Ok(Outcome::note(format!(
            "The gradients went: {} freed.",
            format_size(freed)
        )))
    }
}
