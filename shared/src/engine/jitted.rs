//! A training step compiled by XLA (`jax.jit(train_step)`, a Keras `fit`
//! step under `jit_compile`): the batch is put on the device, the
//! executable's new buffers and its temp allocation are made, the temp is
//! freed as the call returns, and the new parameters and state take the
//! old ones' places (the old die at the rebinding `params, opt_state, loss
//! = train_step(...)`), or, donated, were written over them. No gradient
//! outlives the call ([`crate::train::xla`]).

use super::placement::Placement;
use super::training::Plan;
use super::Engine;
use crate::error::CommandError;
use crate::process::AllocFailure;
use crate::runtime::ObjId;
use crate::train::frame::PyFrame;
use crate::train::kinds::step::Program;
use crate::train::optimizer::update_values;
use crate::train::xla::{self, Compile, Executable};
use crate::types::{Category, Dtype, Framework};

/// XLA's buffer alignment on a GPU (`kXlaAllocatedBufferAlignBytes`).
const GPU_ALIGNMENT: u64 = 128;

impl Engine {
    /// Whether a model's step is compiled by XLA: under JAX and
    /// TensorFlow, but not in a TF1 session (its graph runs op by op).
    pub(super) fn compiles(&self, in_session: bool) -> bool {
        self.framework() != Framework::Pytorch && !in_session
    }

    /// Whether the step writes its new parameters and state over the old:
    /// JAX when asked (`donate_argnums`); Keras always (`XlaLocalLaunchBase`
    /// compiles with `alias_resource_update`).
    fn donates(&self, asked: bool) -> bool {
        asked || self.framework() == Framework::Tensorflow
    }

    /// The compiled step of `spec` at `batch` on `program`.
    fn compile(
        &self,
        (spec, program, batch): (&crate::train::ModelSpec, &Program, u64),
        optimizer: crate::train::OptimizerKind,
        donate: bool,
    ) -> Executable {
        let c = Compile {
            optimizer,
            donate: self.donates(donate),
            alignment: GPU_ALIGNMENT,
        };
        xla::executable(spec, program, batch, c)
    }

    /// What one compiled step of `plan` allocates.
    pub(super) fn executable(&self, a: &crate::command::TrainArgs, plan: &Plan) -> Executable {
        let optimizer = self.train.optimizers[&plan.optimizer].kind;
        let step = (&plan.spec, &plan.program, plan.micro_batch);
        self.compile(step, optimizer, a.donate)
    }

    /// What `estimate` predicts for a compiled step (see [`Self::compiles`]):
    /// the step of `spec` at `batch` (its state from `optimizer`, SGD's none
    /// without one), and the step's peak over what lived before it: the new
    /// buffers and the temp, or the temp alone when donated, and the loss;
    /// not donated (unless Keras), then donated.
    pub(super) fn compiled_estimate(
        &self,
        spec: &crate::train::ModelSpec,
        optimizer: Option<crate::train::OptimizerKind>,
        (batch, options): (u64, crate::train::kinds::step::Options),
    ) -> [(Executable, u64); 2] {
        let program = spec.step_program(batch, options);
        let optimizer = optimizer.unwrap_or(crate::train::OptimizerKind::Sgd);
        [false, true].map(|donate| {
            let e = self.compile((spec, &program, batch), optimizer, donate);
            (e, e.new_buffers + e.temp)
        })
    }

    /// One compiled step; its loss, when computed. The optimizer's state
    /// is made before the first (`opt_state = optimizer.init(params)`; a
    /// Keras optimizer builds its variables as `fit` starts).
    pub(super) fn jitted_step(
        &mut self,
        plan: &Plan,
        executable: &Executable,
    ) -> Result<Option<f32>, CommandError> {
        self.step_without_grad(plan, |engine, frame| {
            engine.call_executable(frame, plan, executable)
        })
    }

    /// A step that leaves no `.grad` (a compiled one, or Keras's without
    /// XLA): the optimizer's state first, then `play` in the step's window,
    /// then its numbers on the CPU when it is small enough.
    pub(super) fn step_without_grad(
        &mut self,
        plan: &Plan,
        play: impl FnOnce(&mut Self, &mut PyFrame) -> Result<(), AllocFailure>,
    ) -> Result<Option<f32>, CommandError> {
        let mut frame = PyFrame::default();
        if let Err(f) = self.init_state(&mut frame, plan) {
            return Err(self.raise_in_frame(frame, &f));
        }
        self.process.begin_window();
        if let Err(f) = play(self, &mut frame) {
            return Err(self.raise_in_frame(frame, &f));
        }
        frame.finish(&mut self.process);
        Ok(plan
            .compute
            .then(|| self.compute_without_grad(plan))
            .flatten())
    }

    /// The state tensors, per parameter in order, held by the optimizer.
    pub(super) fn init_state(
        &mut self,
        frame: &mut PyFrame,
        plan: &Plan,
    ) -> Result<(), AllocFailure> {
        let opt = &self.train.optimizers[&plan.optimizer];
        if !opt.state.is_empty() {
            return Ok(());
        }
        let (kind, params) = (opt.kind, opt.params.clone());
        let jax = self.framework() == Framework::Jax;
        // optax's state, or a Keras 3 optimizer's variable lists.
        let (owner, names): (&str, &[&str]) = match (kind.state_per_param(), jax) {
            (0, _) => ("", &[]),
            (1, true) => ("opt_state[0]", &["trace"]),
            (1, false) => ("optimizer", &["momentums"]),
            (_, true) => ("opt_state[0]", &["mu", "nu"]),
            (_, false) => ("optimizer", &["momentums", "velocities"]),
        };
        let k = &mut self.process;
        let mut state = Vec::new();
        for (i, &p) in params.iter().enumerate() {
            let Some(t) = k.runtime.tensor(p).cloned() else {
                continue;
            };
            for name in names {
                let label = format!("{owner}.{name}[{i}]");
                let id = frame.alloc(k, &label, &t.shape, t.dtype, Category::OptimizerState)?;
                frame.take(id);
                k.attach_local(plan.optimizer, id);
                state.push(id);
            }
        }
        if let Some(o) = self.train.optimizers.get_mut(&plan.optimizer) {
            o.state = state;
        }
        Ok(())
    }

    /// The batch, then the call: its new buffers and its temp; then the
    /// rebinding.
    fn call_executable(
        &mut self,
        frame: &mut PyFrame,
        plan: &Plan,
        executable: &Executable,
    ) -> Result<(), AllocFailure> {
        self.loop_batch(frame, plan)?;
        let updated: Vec<ObjId> = {
            let opt = &self.train.optimizers[&plan.optimizer];
            opt.params.iter().chain(&opt.state).copied().collect()
        };
        let k = &mut self.process;
        let mut fresh = Vec::new();
        if executable.aliases == 0 {
            for &old in &updated {
                let Some(t) = k.runtime.tensor(old).cloned() else {
                    continue;
                };
                let label = label_of(k, old);
                fresh.push((old, frame.alloc(k, &label, &t.shape, t.dtype, t.category)?));
            }
        }
        let loss = frame.alloc(k, "loss", &[], Dtype::Float32, Category::Other)?;
        let temp_label = "XLA temp buffer (the step's activations and gradients)";
        let temp = frame.alloc(
            k,
            temp_label,
            &[executable.temp],
            Dtype::Uint8,
            Category::Temporary,
        )?;
        frame.drop(k, temp);
        for (old, new) in fresh {
            k.swap_blocks(old, new);
            frame.drop(k, new);
        }
        frame.take(loss);
        k.bind_local("loss", loss);
        Ok(())
    }

    /// The step's numbers on the CPU: the loss, the gradients, the
    /// update; no `.grad` stays.
    pub(super) fn compute_without_grad(&mut self, plan: &Plan) -> Option<f32> {
        let step = (&plan.program, plan.micro_batch);
        let loss = self.compute_step((plan.model, &Placement::new()), plan.data, step);
        let all: Vec<usize> = (0..self.train.models[&plan.model].params.len()).collect();
        update_values(&mut self.train, plan.optimizer, plan.model, &all);
        if let Some(m) = self.train.models.get_mut(&plan.model) {
            m.grad_values.clear();
        }
        loss
    }
}

fn label_of(k: &crate::process::Process, id: ObjId) -> String {
    k.runtime
        .get(id)
        .map(|o| o.label.clone())
        .unwrap_or_default()
}
