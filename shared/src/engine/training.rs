//! Training: `forward`, `backward`, `opt.step()`, `zero_grad` and the
//! training loop, each a [`step`] in the process inside a [`Frame`] whose
//! locals an OOM leaves on `last_exception`.

use super::program::{Player, Target};
use super::{error, Engine, Outcome, Progress, MAX_BATCH_SIZE, MAX_TRAIN_STEPS};
use crate::command::{LossHistory, TrainArgs};
use crate::error::{CommandError, ErrorKind};
use crate::process::{AllocFailure, Process};
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::train::frame::PyFrame;
use crate::train::kinds::step::sdp::{self, Kernel};
use crate::train::kinds::step::{Attention, Options, Program};
use crate::train::optimizer;
use crate::train::spec::Kind;
use crate::train::{DataSpec, ModelSpec};
use crate::types::{Category, Dtype, Framework};
use serde_json::{json, Value};

/// What a training loop runs on, once its arguments are checked.
pub(super) struct Plan {
    pub model: ObjId,
    pub spec: ModelSpec,
    pub optimizer: ObjId,
    pub data: ObjId,
    pub micro_batch: u64,
    pub compute: bool,
    /// Too big for the CPU, but every op has the device's kernels: the
    /// step runs on the device alone (`engine::device_step`).
    #[cfg(feature = "device-values")]
    pub device_only: bool,
    /// What one micro-batch's arithmetic costs, when that is why it does
    /// not run (`None`: this build computes no program).
    flops: Option<u64>,
    /// The micro-batch's step, written once for the loop.
    pub program: Program,
    /// The kernel fused attention runs, and for which card and type.
    attention_kernel: Option<(Kernel, String)>,
}

impl Engine {
    /// Turns a failed training step into Python's state after the raise:
    /// the exception (bound to `last_exception`) keeps the frame's locals.
    pub(super) fn raise_in_frame(
        &mut self,
        frame: PyFrame,
        failure: &AllocFailure,
    ) -> CommandError {
        self.raise_with(
            frame,
            failure,
            "The exception's frame keeps the failed step's tensors alive: `del last_exception` frees them.",
        )
    }

    /// [`Engine::raise_in_frame`], the message ending with `held`: what
    /// the raise left alive.
    pub(super) fn raise_with(
        &mut self,
        mut frame: PyFrame,
        failure: &AllocFailure,
        held: &str,
    ) -> CommandError {
        let exc = self
            .process
            .runtime
            .new_local(ObjectKind::Instance(Class::Exception), "last_exception");
        for id in std::mem::take(&mut frame.locals) {
            self.process.attach_local(exc, id);
        }
        self.process.bind_local("last_exception", exc);
        let mut e = self.alloc_error(failure);
        e.message.push_str(&format!("\n({held})"));
        e
    }

    pub(super) fn train_loop(&mut self, a: &TrainArgs) -> Result<Outcome, CommandError> {
        #[cfg(feature = "hf-models")]
        if let Some(m) = self.hf_model_id(&a.model) {
            return self.hf_train(a, m);
        }
        let plan = self.train_plan(a)?;
        self.take_computed_where();
        let in_session = self.train.models[&plan.model].session.is_some();
        let compiled = self.compiles(in_session) && a.jit_compile;
        let executable = compiled.then(|| self.executable(a, &plan));
        #[cfg(feature = "tf-executor")]
        let executor = !compiled && !in_session && self.framework() == Framework::Tensorflow;
        let mut steps = StepLog::default();
        let mut stopped = false;
        for s in 0..a.steps {
            let step = match &executable {
                Some(e) => Some(self.jitted_step(&plan, e)?),
                #[cfg(feature = "tf-executor")]
                None if executor => Some(self.executor_step(&plan)?),
                None => self.train_step(a, &plan, s)?,
            };
            let Some(loss) = step else {
                stopped = true;
                break;
            };
            // The last step's graph died with its loss: a step's work
            // stays the same however many came before.
            self.forget_dead();
            steps.push(json!({
                "step": s,
                "loss": loss,
                "peak_allocated_bytes": self.process.window_peak_allocated(),
                "peak_reserved_bytes": self.process.window_peak_reserved(),
                "allocated_bytes": self.process.stats().allocated_bytes,
            }));
            let go_on = self.report_progress(&Progress {
                done: s + 1,
                total: a.steps,
                loss,
            });
            if !go_on && s + 1 < a.steps {
                stopped = true;
                break;
            }
        }
        let computed = self.take_computed_where();
        Ok(train_outcome(a, &plan, steps, stopped, computed))
    }

    /// Checks a `train` command's objects and numbers.
    fn train_plan(&mut self, a: &TrainArgs) -> Result<Plan, CommandError> {
        let (model, state) = self.model_state(&a.model)?;
        let spec = state.spec;
        let optimizer = self.instance(&a.optimizer, Class::Optimizer)?;
        let data = self.instance(&a.data, Class::Dataset)?;
        if a.steps == 0 || a.steps > MAX_TRAIN_STEPS {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("steps must be 1 to {MAX_TRAIN_STEPS}, not {}", a.steps),
            ));
        }
        let micro_batches = a.steps.saturating_mul(a.accumulate);
        if micro_batches > MAX_TRAIN_STEPS {
            return Err(error(
                ErrorKind::InvalidValue,
                format!(
                    "steps x accumulate must be at most {MAX_TRAIN_STEPS} micro-batches, not {} x {}",
                    a.steps, a.accumulate
                ),
            ));
        }
        let micro_batch = micro_batch(a.batch_size, a.accumulate)?;
        self.check_jit(a)?;
        check_batch(micro_batch, &self.train.datasets[&data].spec, &spec)?;
        check_attention(a.attention, &spec)?;
        let options = self.step_options(a.attention, a.checkpointing, a.amp, a.accumulate);
        let program = spec.step_program(micro_batch, options);
        let attention_kernel = match spec.kind {
            Kind::Transformer(t) if a.attention == Attention::Sdpa => {
                let dtype = options.amp.unwrap_or(Dtype::Float32);
                let kernel = sdp::select(options.gpu, dtype, t.width / t.heads, true);
                let (major, minor) = self.settings.compute_capability;
                let on = format!("compute capability {major}.{minor}, {}", dtype.torch_name());
                Some((kernel, on))
            }
            _ => None,
        };
        let (compute, flops) = match self.program_arithmetic(&spec, &program) {
            Ok(()) => (true, None),
            Err(why) => (false, why),
        };
        #[cfg(feature = "device-values")]
        let device_only = !compute && self.device_runs(&program, optimizer);
        Ok(Plan {
            model,
            spec,
            optimizer,
            data,
            micro_batch,
            compute,
            #[cfg(feature = "device-values")]
            device_only,
            flops,
            program,
            attention_kernel,
        })
    }

    /// One optimizer step: `accumulate` micro-batches, `opt.step()`,
    /// `opt.zero_grad()`. Returns the mean loss, when computed.
    /// `Ok(None)` when a stop came between micro-batches: the step is
    /// abandoned before the optimizer runs, its frame's locals dropped.
    fn train_step(
        &mut self,
        a: &TrainArgs,
        plan: &Plan,
        done: u64,
    ) -> Result<Option<Option<f32>>, CommandError> {
        self.process.begin_window();
        let mut frame = PyFrame::default();
        let (mut sum, mut count) = (0.0f32, 0u32);
        for m in 0..a.accumulate {
            match self.micro_batch(&mut frame, a, plan) {
                Ok(loss) => {
                    sum += loss.unwrap_or(0.0);
                    count += u32::from(loss.is_some());
                }
                Err(f) => return Err(self.raise_in_frame(frame, &f)),
            }
            let between = m + 1 < a.accumulate;
            let progress = Progress {
                done,
                total: a.steps,
                loss: None,
            };
            if between && !self.report_progress(&progress) {
                frame.finish(&mut self.process);
                return Ok(None);
            }
        }
        let opt = plan.optimizer;
        if let Err(f) = self.optimizer_step_in(&mut frame, opt) {
            return Err(self.raise_in_frame(frame, &f));
        }
        optimizer::zero_grad(&mut self.process, &mut self.train, opt, a.set_to_none);
        frame.finish(&mut self.process);
        Ok(Some((count > 0).then(|| sum / count as f32)))
    }

    /// `for x, y in loader: x, y = x.cuda(), y.cuda()`: the new batch is
    /// copied in, then the names are rebound (the last batch dies then, not
    /// before), and it stays bound after the loop. Nothing when the set is
    /// on the device (the batch is a view of it).
    pub(super) fn loop_batch(
        &mut self,
        frame: &mut PyFrame,
        plan: &Plan,
    ) -> Result<(), AllocFailure> {
        if self.train.datasets[&plan.data].on_device.is_some() {
            return Ok(());
        }
        let k = &mut self.process;
        let (x_shape, x_dtype, y_shape) = plan.spec.batch(plan.micro_batch);
        // JAX's integers are 32-bit unless x64 is on.
        let labels = match self.settings.framework {
            Framework::Jax => Dtype::Int32,
            _ => Dtype::Int64,
        };
        let x = frame.alloc(k, "x", &x_shape, x_dtype, Category::Input)?;
        let y = frame.alloc(k, "y", &y_shape, labels, Category::Input)?;
        for (name, t) in [("x", x), ("y", y)] {
            frame.take(t);
            k.bind_local(name, t);
        }
        Ok(())
    }

    /// Forward and backward of one micro-batch: `loss = criterion(...)`
    /// (`/ accumulate` when accumulating), `loss.backward()`, and
    /// `total_loss += loss` when the loop keeps tensors.
    fn micro_batch(
        &mut self,
        frame: &mut PyFrame,
        a: &TrainArgs,
        plan: &Plan,
    ) -> Result<Option<f32>, AllocFailure> {
        self.loop_batch(frame, plan)?;
        let p = &plan.program;
        let params = self.train.models[&plan.model].params.clone();
        let name = self
            .process
            .runtime
            .get(plan.model)
            .map(|m| m.label.clone());
        let target = Target {
            name: name.as_deref().unwrap_or("model"),
            params: &params,
            loss: "loss",
            holder: None,
        };
        let blas = &mut self.train.cublas;
        let mut player = Player::in_loop(p);
        player.play(&mut self.process, frame, blas, 0..p.ops.len(), &target)?;
        if let Some(loss) = self.process.runtime.lookup("loss") {
            keep_history(&mut self.process, frame, a.loss_history, loss)?;
        }
        let mut placement = player.placement;
        let names = || ["x", "y"].map(|name| self.process.runtime.lookup(name));
        placement.place_batch(self, (plan.data, &plan.spec), names);
        let step = (p, plan.micro_batch);
        #[cfg(feature = "device-values")]
        if plan.device_only {
            return Ok(self.device_step((plan.model, &placement), plan.data, step));
        }
        Ok(plan
            .compute
            .then(|| self.compute_step((plan.model, &placement), plan.data, step))
            .flatten())
    }

    /// What a step compiled by XLA does not take: `donate` outside JAX,
    /// gradient accumulation.
    fn check_jit(&self, a: &TrainArgs) -> Result<(), CommandError> {
        let framework = self.framework();
        let executor = framework == Framework::Tensorflow && cfg!(feature = "tf-executor");
        let why = if !a.jit_compile && !executor {
            NO_EXECUTOR
        } else if a.donate && framework != Framework::Jax {
            "donate is jax.jit's donate_argnums: JAX only (Keras writes its variables in place)"
        } else if a.accumulate > 1 && framework != Framework::Pytorch {
            "accumulate is PyTorch's loop: XLA's accumulates in the executable (optax.MultiSteps), not modelled; use accumulate 1"
        } else {
            return Ok(());
        };
        Err(error(ErrorKind::InvalidValue, why))
    }

    /// Calls the progress hook; `false` when it asks to stop.
    pub(super) fn report_progress(&mut self, progress: &Progress) -> bool {
        let mut hook = self.progress.take();
        let go_on = hook.as_mut().is_none_or(|h| h(self, progress));
        self.progress = hook;
        go_on
    }
}

/// What the loop keeps of each step's `loss` (after `loss.backward()`).
/// `total_loss += loss`: the first step makes `total_loss` a tensor
/// (`0 + loss`, a new scalar), later steps add into it in place; its
/// history (`AddBackward0` nodes, which save nothing, and graphs whose
/// saved tensors backward already freed) is host memory, so the GPU keeps
/// this one scalar. `losses.append(loss)`: the list keeps every step's
/// scalar. Both as PyTorch's own loop keeps them
/// (`tests/reference/loss_history.py`).
pub(super) fn keep_history(
    k: &mut Process,
    frame: &mut PyFrame,
    history: LossHistory,
    loss: ObjId,
) -> Result<(), AllocFailure> {
    match history {
        LossHistory::Item => {}
        LossHistory::Tensor if k.runtime.lookup("total_loss").is_some() => {}
        LossHistory::Tensor => {
            let total = frame.alloc(k, "total_loss", &[], Dtype::Float32, Category::Other)?;
            frame.take(total);
            k.bind_local("total_loss", total);
        }
        LossHistory::List => {
            let list = match k.runtime.lookup("losses") {
                Some(list)
                    if k.runtime
                        .get(list)
                        .is_some_and(|o| o.kind == ObjectKind::List) =>
                {
                    list
                }
                _ => {
                    let list = k.runtime.new_list(&[], false, "losses");
                    k.bind_local("losses", list);
                    list
                }
            };
            k.runtime.add_ref(list, loss);
        }
    }
    Ok(())
}

/// The note and value of a finished (or stopped) training loop.
/// The per-step records a result carries: every step up to
/// [`StepLog::KEEP`], else the first and the last half of that many (a
/// long run's result and memory stay bounded).
#[derive(Default)]
struct StepLog {
    first: Vec<Value>,
    last: std::collections::VecDeque<Value>,
    omitted: u64,
}

impl StepLog {
    const KEEP: usize = 1000;

    fn push(&mut self, step: Value) {
        if self.first.len() < Self::KEEP / 2 {
            self.first.push(step);
            return;
        }
        if self.last.len() == Self::KEEP / 2 {
            self.last.pop_front();
            self.omitted += 1;
        }
        self.last.push_back(step);
    }

    fn len(&self) -> u64 {
        (self.first.len() + self.last.len()) as u64 + self.omitted
    }

    fn first_loss(&self) -> Option<f64> {
        self.first.first().and_then(|s| s["loss"].as_f64())
    }

    fn last_loss(&self) -> Option<f64> {
        self.last
            .back()
            .or(self.first.last())
            .and_then(|s| s["loss"].as_f64())
    }
}

/// A `train`'s outcome; `computed`: where its numbers were computed, and
/// why a device gave none.
fn train_outcome(
    a: &TrainArgs,
    plan: &Plan,
    steps: StepLog,
    stopped: bool,
    (computed, fault): (String, Option<String>),
) -> Outcome {
    let (first, last) = (steps.first_loss(), steps.last_loss());
    let mut note = match (first, last) {
        (Some(f), Some(l)) => format!(
            "{} of batch {}: loss {f:.4} -> {l:.4}, computed {computed}.",
            plural(a.steps, "step"),
            a.batch_size
        ),
        _ => format!(
            "{} of batch {}, shape-only: every allocation is the one a computed step makes, but {}, so no loss was computed.",
            plural(a.steps, "step"),
            a.batch_size,
            match (fault, plan.flops) {
                (Some(why), _) => why,
                (None, Some(flops)) => format!("a step of {:.0} MFLOP is too big to compute here", flops as f64 / 1e6),
                (None, None) => crate::train::cpu::NOT_IN_THIS_BUILD.into(),
            }
        ),
    };
    if let Some((kernel, on)) = &plan.attention_kernel {
        note = format!("{note} Attention ran {} ({on}).", kernel.name());
    }
    if stopped {
        note = format!("Stopped after {} of {} steps. {note}", steps.len(), a.steps);
    }
    Outcome {
        note: Some(note),
        value: Some(json!({
            "stopped": stopped,
            "loss_computed": first.is_some(),
            "first_loss": first,
            "last_loss": last,
            "steps_omitted": steps.omitted,
            "steps": steps.first.into_iter().chain(steps.last).collect::<Vec<_>>(),
        })),
    }
}

impl Engine {
    /// The GPU whose CUDA kernels PyTorch picks (`Options::gpu`): the
    /// device's compute capability under PyTorch; none where XLA compiles
    /// the step.
    /// A step's options: the techniques a command asks for, on this
    /// process's GPU (its kernels and cuDNN's workspaces).
    pub(super) fn step_options(
        &self,
        attention: Attention,
        checkpointing: bool,
        amp: crate::command::Amp,
        accumulate: u64,
    ) -> Options {
        Options {
            attention,
            checkpointing,
            amp: amp.dtype(),
            accumulate,
            gpu: self.kernel_gpu(),
            conv_workspace: self.conv_workspace(),
        }
    }

    pub(super) fn kernel_gpu(&self) -> Option<(u32, u32)> {
        let pytorch = self.framework() == Framework::Pytorch;
        pytorch.then_some(self.settings.compute_capability)
    }

    /// The workspace each cuDNN convolution takes (`Options::conv_workspace`):
    /// the setting under PyTorch.
    pub(super) fn conv_workspace(&self) -> u64 {
        self.kernel_gpu()
            .map_or(0, |_| self.settings.cudnn_workspace_bytes)
    }
}

/// Refuses fused attention for a kind that has no attention, saying so.
pub(super) fn check_attention(attention: Attention, spec: &ModelSpec) -> Result<(), CommandError> {
    if attention == Attention::Sdpa && !matches!(spec.kind, Kind::Transformer(_)) {
        return Err(error(
            ErrorKind::InvalidValue,
            format!(
                "the {} has no attention: `attention` is for a transformer",
                spec.kind_name()
            ),
        ));
    }
    Ok(())
}

/// The micro-batch of a step of `batch_size` in `accumulate` micro-batches
/// (`loss / accumulate; loss.backward()` each, then one `opt.step()`):
/// checked once for every command that takes the two.
pub(super) fn micro_batch(batch_size: u64, accumulate: u64) -> Result<u64, CommandError> {
    if batch_size == 0 || accumulate == 0 || batch_size % accumulate != 0 {
        return Err(error(
            ErrorKind::InvalidValue,
            format!(
                "batch_size {batch_size} does not split into {accumulate} micro-batches: both are at least 1, and accumulate divides batch_size"
            ),
        ));
    }
    Ok(batch_size / accumulate)
}

pub(super) fn check_batch(
    batch: u64,
    data: &DataSpec,
    model: &ModelSpec,
) -> Result<(), CommandError> {
    if batch == 0 || batch > MAX_BATCH_SIZE {
        return Err(error(
            ErrorKind::InvalidValue,
            format!("batch_size must be 1 to {MAX_BATCH_SIZE}, not {batch}"),
        ));
    }
    if data.features != model.input_dim || data.classes != model.classes {
        let hint = match model.kind {
            Kind::Mlp => "",
            Kind::Cnn(_) => " (a CNN's features are its images' channels x height x width)",
            Kind::Transformer(_) => {
                " (a transformer's features are its sequence length, its classes its vocabulary)"
            }
        };
        return Err(error(
            ErrorKind::InvalidValue,
            format!(
                "the data has {} features and {} classes but the model expects {} and {}{hint}",
                data.features, data.classes, model.input_dim, model.classes
            ),
        ));
    }
    if data.on_device && model.kind != Kind::Mlp {
        return Err(error(
            ErrorKind::InvalidValue,
            format!(
                "a dataset on the device holds an MLP's float features; the {}'s batches are copied in each step: make the data without on_device",
                model.kind_name()
            ),
        ));
    }
    Ok(())
}

/// Why `jit_compile` off is refused: PyTorch, JAX, or the page's build.
pub const NO_EXECUTOR: &str = "jit_compile=False is Keras's, run by TensorFlow's executor on a vramlab server (jax.jit always compiles; PyTorch runs eagerly)";

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}
