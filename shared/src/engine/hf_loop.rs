//! The training loop on a Hugging Face model (`train`): each step its
//! micro-batches' forwards and backwards, `opt.step()`, `zero_grad()`, as
//! `hf_training` plays each statement; one step's graph held at a time, a
//! report after each step and micro-batch, a stop honoured there.

use super::{error, Engine, Outcome};
use crate::command::{ForwardArgs, TrainArgs};
use crate::error::{CommandError, ErrorKind};
use crate::runtime::{Class, ObjId};
use crate::train::frame::PyFrame;
use crate::units::format_size;

fn invalid(message: impl Into<String>) -> CommandError {
    error(ErrorKind::InvalidValue, message)
}

impl Engine {
    /// The training loop on a Hugging Face model: each step its forward,
    /// `backward()`, `opt.step()` and `zero_grad()`, the loss rebound.
    pub(super) fn hf_train(
        &mut self,
        a: &TrainArgs,
        model: ObjId,
    ) -> Result<Outcome, CommandError> {
        let opt = self.instance(&a.optimizer, Class::Optimizer)?;
        if self
            .hf
            .optimizers
            .get(&opt)
            .is_none_or(|o| o.model != model)
        {
            return Err(invalid(format!(
                "`{}` is not an optimizer over `{}`",
                a.optimizer, a.model
            )));
        }
        let micro_batch = super::training::micro_batch(a.batch_size, a.accumulate)?;
        if a.steps == 0 || a.steps > 1000 {
            return Err(invalid("steps is from 1 to 1,000 for a Hugging Face model"));
        }
        let forward = ForwardArgs {
            name: "loss".into(),
            model: a.model.clone(),
            data: a.data.clone(),
            batch_size: micro_batch,
            no_grad: false,
            amp: a.amp,
            checkpointing: a.checkpointing,
            attention: a.attention,
            batch: None,
        };
        let (mut peak, mut done) = (0, 0);
        while done < a.steps {
            self.process.begin_window();
            if !self.hf_train_step(&forward, (model, opt), a, done)? {
                break;
            }
            done += 1;
            peak = self.process.window_peak_allocated();
            // The last step's graph died with its loss: what a step holds
            // stays the same however many came before.
            self.forget_dead();
            let progress = super::Progress {
                done,
                total: a.steps,
                loss: None,
            };
            if done < a.steps && !self.report_progress(&progress) {
                break;
            }
        }
        // The loop's last `loss` lives on, as the loop variable does.
        let stopped = done < a.steps;
        let mut note = format!(
            "{} steps at batch {}: the last step peaked at {}.",
            a.steps,
            a.batch_size,
            format_size(peak)
        );
        if stopped {
            note = format!("Stopped after {done} of {} steps. {note}", a.steps);
        }
        Ok(Outcome {
            note: Some(note),
            value: Some(serde_json::json!({
                "last_step_peak_allocated_bytes": peak,
                "stopped": stopped,
                "steps_done": done,
            })),
        })
    }

    /// One step of the loop: its micro-batches' forwards and backwards,
    /// `opt.step()`, `zero_grad()`. `false` when a stop came between
    /// micro-batches (the step abandoned before the optimizer runs, as
    /// `KeyboardInterrupt` there leaves it: the gradients so far stay).
    fn hf_train_step(
        &mut self,
        forward: &ForwardArgs,
        (model, opt): (ObjId, ObjId),
        a: &TrainArgs,
        done: u64,
    ) -> Result<bool, CommandError> {
        let accumulate = a.accumulate.max(1);
        for m in 0..accumulate {
            self.hf_forward(forward, model)?;
            let graph = self.hf_graph("loss").expect("the forward bound it");
            self.hf_backward(graph)?;
            // `total_loss += loss` or `losses.append(loss)`, as the loop on
            // any model keeps them.
            let mut frame = PyFrame::default();
            super::training::keep_history(&mut self.process, &mut frame, a.loss_history, graph)
                .map_err(|f| self.alloc_error(&f))?;
            self.forget_dead();
            let progress = super::Progress {
                done,
                total: a.steps,
                loss: None,
            };
            if m + 1 < accumulate && !self.report_progress(&progress) {
                return Ok(false);
            }
        }
        self.hf_step(opt)?;
        self.hf_zero_grad(opt, a.set_to_none)?;
        Ok(true)
    }
}
