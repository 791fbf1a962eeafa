//! Planning before running: `estimate` (the closed-form prediction of a
//! step's memory) and `find_batch_size` (trial steps on a fresh simulated
//! kernel with this one's settings).

use super::training::check_attention;
use super::{error, Engine, Outcome, SimDeviceFactory};
use crate::command::{
    Command, DataArgs, EstimateArgs, FindBatchSizeArgs, OptimizerArgs, TrainArgs,
};
use crate::error::{CommandError, ErrorKind};
use crate::runtime::Class;
use crate::train::spec::{estimate, StepShape};
use crate::train::{DataSpec, ModelSpec, OptimizerSpec};
use crate::units::format_size;
use serde_json::json;

impl Engine {
    pub(super) fn estimate(&self, a: &EstimateArgs) -> Result<Outcome, CommandError> {
        let shape = &StepShape {
            batch_size: a.batch_size,
            set_to_none: a.set_to_none,
            blas: self.settings.blas_workspaces(),
            options: self.step_options(a.attention, a.checkpointing, a.amp, a.accumulate),
        };
        let (_, state) = self.model_state(&a.model)?;
        check_attention(a.attention, &state.spec)?;
        let optimizer = match a.optimizer.as_deref() {
            Some(o) => Some(self.train.optimizers[&self.instance(o, Class::Optimizer)?].spec()),
            None => None,
        };
        let data = match a.data.as_deref() {
            Some(d) => Some(self.train.datasets[&self.instance(d, Class::Dataset)?].spec),
            None => None,
        };
        super::training::micro_batch(shape.batch_size, shape.options.accumulate)?;
        let mut e = estimate(&state.spec, optimizer, data.as_ref(), shape);
        // XLA compiles one micro-batch's step (no PyTorch kernel, no cuDNN
        // workspace: `kernel_gpu` is none there).
        let options = crate::train::kinds::step::Options {
            accumulate: 1,
            ..shape.options
        };
        let compiled = self.compiles(state.session.is_some()).then(|| {
            let kind = optimizer.map(|o| o.kind);
            self.compiled_estimate(&state.spec, kind, (a.batch_size, options))
        });
        if let Some([(x, peak), (_, donated)]) = compiled {
            // No `.grad`, no cuBLAS workspace kept: what lived before the
            // step, and the call's own.
            e.gradient_bytes = 0;
            e.workspace_bytes = 0;
            let before =
                e.parameter_bytes + e.optimizer_state_bytes + e.input_bytes + e.dataset_bytes;
            e.peak_bytes = before + peak;
            e.xla_temp_bytes = Some(x.temp);
            e.donated_peak_bytes = Some(before + donated);
        }
        let attention = if e.attention_bytes > 0 {
            format!(" (of which attention {})", format_size(e.attention_bytes))
        } else {
            String::new()
        };
        Ok(Outcome {
            note: Some(format!(
                "Predicted: parameters {}, gradients {}, optimizer state {}, activations {}{attention}, batch {}, cuBLAS workspaces {}; peak about {}.",
                format_size(e.parameter_bytes),
                format_size(e.gradient_bytes),
                format_size(e.optimizer_state_bytes),
                format_size(e.activation_bytes),
                format_size(e.input_bytes),
                format_size(e.workspace_bytes),
                format_size(e.peak_bytes)
            )),
            value: Some(serde_json::to_value(&e).expect("an estimate serializes")),
        })
    }

    pub(super) fn find_batch_size(
        &mut self,
        a: &FindBatchSizeArgs,
    ) -> Result<Outcome, CommandError> {
        let (model, optimizer, data, threshold) = (&a.model, &a.optimizer, &a.data, a.threshold);
        if !(threshold > 0.0 && threshold <= 1.0) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("threshold must be in (0, 1], not {threshold}"),
            ));
        }
        let (_, state) = self.model_state(model)?;
        let spec = state.spec;
        check_attention(a.attention, &spec)?;
        let optimizer = self.train.optimizers[&self.instance(optimizer, Class::Optimizer)?].spec();
        let data_spec = self.train.datasets[&self.instance(data, Class::Dataset)?].spec;
        let budget = self.settings.memory_budget(self.process.device.as_ref());
        let limit = (threshold * budget as f64) as u64;
        let mut tried = Vec::new();
        let mut best = None;
        let mut batch = 1u64;
        while batch <= data_spec.samples.min(1 << 24) {
            let train = TrainArgs {
                amp: a.amp,
                checkpointing: a.checkpointing,
                attention: a.attention,
                ..TrainArgs::plain("model", "opt", "data", 1, batch)
            };
            let peak = self.trial_peak(&spec, optimizer, &data_spec, &train);
            let fits = peak.is_some_and(|p| p <= limit);
            tried.push(json!({"batch_size": batch, "peak_allocated_bytes": peak, "fits": fits}));
            if !fits {
                break;
            }
            best = Some(batch);
            batch *= 2;
        }
        Ok(Outcome {
            note: Some(match best {
                Some(b) => format!(
                    "Batch {b} is the largest power of two whose step peak stays under {} ({threshold} of {}).",
                    format_size(limit),
                    format_size(budget)
                ),
                None => format!("Not even batch 1 fits under {}.", format_size(limit)),
            }),
            value: Some(json!({
                "batch_size": best,
                "limit_bytes": limit,
                "budget_bytes": budget,
                "tried": tried,
            })),
        })
    }

    /// The peak allocated of two training steps (`train`, on the names
    /// `model`, `opt`, `data`), on a fresh simulated kernel with this
    /// one's settings; `None` on OOM or a technique the model refuses.
    pub(super) fn trial_peak(
        &self,
        spec: &ModelSpec,
        optimizer: OptimizerSpec,
        data: &DataSpec,
        train: &TrainArgs,
    ) -> Option<u64> {
        let mut trial = Engine::new(Box::new(SimDeviceFactory), self.settings.clone()).ok()?;
        trial.set_event_capacity(0);
        trial.set_tracing(false);
        let keras = self.settings.framework == crate::types::Framework::Tensorflow;
        trial.build_model("model", *spec, keras).ok()?;
        let setup = [
            Command::Optimizer(OptimizerArgs {
                name: "opt".into(),
                model: "model".into(),
                kind: optimizer.kind,
                lr: None,
                bits: optimizer.bits,
            }),
            Command::Data(DataArgs {
                name: "data".into(),
                samples: data.samples,
                features: data.features,
                classes: data.classes,
                on_device: data.on_device,
            }),
        ];
        for c in &setup {
            trial.execute(c).ok()?;
        }
        let mut peak = 0;
        for _ in 0..2 {
            trial.execute(&Command::Train(train.clone())).ok()?;
            peak = peak.max(trial.stats().step_peak_allocated_bytes);
        }
        Some(peak)
    }
}
