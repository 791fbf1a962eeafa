//! The engine: carries out commands on one kernel. Each command is one line
//! of Python; the engine validates it, runs it on the [`Kernel`] (tensor
//! commands here, training commands through [`crate::train`]), and reports
//! the stats after it.

use crate::device::{Device, DeviceInfo, SimDevice, SimDeviceConfig};
use crate::framework::{make_allocator, oom_message, Settings, TensorDesc};
use crate::kernel::{AllocFailure, Kernel};
use crate::protocol::{
    parse_line, Category, Command, CommandError, Dtype, ErrorKind, Framework, LossHistory,
    RestartSettings, StepRecord,
};
use crate::runtime::{Class, ObjId, ObjectKind};
use crate::snapshot::{BlockSnapshot, Event, ObjectSnapshot, SegmentSnapshot, Snapshot, Stats};
use crate::train::step::{self, BackwardError, ForwardArgs, Frame};
use crate::train::{
    self, DataSpec, DatasetState, ModelSpec, ModelState, OptimizerKind, OptimizerState,
    SessionState, TrainState,
};
use crate::units::{format_size, EIB};
use serde_json::{json, Value};

pub use crate::kernel::DEFAULT_EVENT_CAPACITY;

/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 64;
/// The most steps one `train` command runs.
pub const MAX_TRAIN_STEPS: u64 = 1_000_000;

/// Starts a device for a kernel: the simulated GPU, or a real one.
pub trait DeviceFactory: Send {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError>;
}

/// Starts simulated GPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimDeviceFactory;

impl DeviceFactory for SimDeviceFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        let config = SimDeviceConfig {
            total_bytes: settings.device_total_bytes,
            context_bytes: settings.context_bytes,
            other_processes_bytes: settings.other_processes_bytes,
        };
        config
            .validate()
            .map_err(|m| CommandError::new(ErrorKind::InvalidValue, m))?;
        Ok(Box::new(SimDevice::new(config)))
    }
}

/// Where a long command is, for the hook that streams it.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Training steps done so far.
    pub done: u64,
    pub total: u64,
    pub loss: Option<f32>,
}

/// Called after each training step of a long command; returning `false`
/// stops the command there (the steps done so far stay done).
pub type ProgressHook = Box<dyn FnMut(&mut Engine, &Progress) -> bool + Send>;

/// What a command did, beyond the stats.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// A short explanation of what happened.
    pub note: Option<String>,
    /// What the command returns (losses, estimates, trials).
    pub value: Option<Value>,
}

impl Outcome {
    fn note(note: impl Into<String>) -> Self {
        Self {
            note: Some(note.into()),
            value: None,
        }
    }
}

pub struct Engine {
    settings: Settings,
    factory: Box<dyn DeviceFactory>,
    kernel: Kernel,
    train: TrainState,
    /// Steps executed so far (the next step's index).
    step: u64,
    /// Training steps up to this many FLOPs compute their numbers.
    flop_limit: u64,
    progress: Option<ProgressHook>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("settings", &self.settings)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

fn error(kind: ErrorKind, message: impl Into<String>) -> CommandError {
    CommandError::new(kind, message)
}

fn name_error(name: &str) -> CommandError {
    error(
        ErrorKind::NameError,
        format!("name '{name}' is not defined"),
    )
}

fn check_name(name: &str) -> Result<(), CommandError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME_LEN;
    if ok {
        Ok(())
    } else {
        Err(error(
            ErrorKind::InvalidValue,
            format!(
                "{name:?} is not a Python name: use letters, digits and _, not starting with a digit, at most {MAX_NAME_LEN} characters"
            ),
        ))
    }
}

impl Engine {
    /// A kernel on the simulated GPU with default settings.
    pub fn new_simulated() -> Self {
        Self::new(Box::new(SimDeviceFactory), Settings::default())
            .expect("default settings start a simulated device")
    }

    pub fn new(
        mut factory: Box<dyn DeviceFactory>,
        settings: Settings,
    ) -> Result<Self, CommandError> {
        settings.validate()?;
        let device = factory.start(&settings)?;
        let allocator = make_allocator(&settings, device.as_ref());
        Ok(Self {
            settings,
            factory,
            kernel: Kernel::new(device, allocator),
            train: TrainState::default(),
            step: 0,
            flop_limit: train::ARITHMETIC_FLOP_LIMIT,
            progress: None,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn framework(&self) -> Framework {
        self.settings.framework
    }

    pub fn device_info(&self) -> DeviceInfo {
        self.kernel.device.info()
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.kernel.set_event_capacity(capacity);
    }

    /// Switches event recording in the allocator (benchmarks switch it off).
    pub fn set_tracing(&mut self, on: bool) {
        self.kernel.allocator.set_tracing(on);
    }

    /// Events with `seq >= since`, oldest first.
    pub fn events_since(&self, since: u64) -> impl Iterator<Item = &Event> {
        self.kernel.events_since(since)
    }

    pub fn stats(&self) -> Stats {
        self.kernel.stats()
    }

    /// The peaks since the last call (allocated, reserved); see
    /// [`Kernel::take_sample_peaks`].
    pub fn take_sample_peaks(&mut self) -> (u64, u64) {
        self.kernel.take_sample_peaks()
    }

    /// Executes a command given as JSON (as the websocket carries it).
    pub fn run_value(&mut self, value: Value) -> StepRecord {
        self.run_parsed(crate::protocol::parse_value(value))
    }

    /// Parses and executes one line, as `vramlab run` does.
    pub fn run_line(&mut self, line: &str) -> StepRecord {
        self.run_parsed(parse_line(line))
    }

    fn run_parsed(&mut self, parsed: crate::protocol::CommandLine) -> StepRecord {
        let result = match &parsed.command {
            Ok(cmd) => self.execute(cmd),
            Err(e) => {
                self.kernel.begin_command(self.step);
                self.step += 1;
                Err(e.clone())
            }
        };
        let (ok, error, note, value) = match result {
            Ok(o) => (true, None, o.note, o.value),
            Err(e) => (false, Some(e), None, None),
        };
        StepRecord {
            step: self.step - 1,
            cmd: parsed.raw,
            ok,
            error,
            note,
            value,
            stats: self.stats(),
        }
    }

    /// Executes one command. On error nothing changed, except what the
    /// framework itself changes on the way to an OOM (PyTorch returns its
    /// cached segments to the driver before it gives up; a failed training
    /// step leaves `last_exception`).
    pub fn execute(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        self.kernel.begin_command(self.step);
        self.step += 1;
        let result = self.dispatch(cmd);
        let dead = self.kernel.take_dead_instances();
        self.train.forget(&dead);
        result
    }

    fn dispatch(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        match cmd {
            Command::Restart(patch) => self.restart(patch),
            Command::Alloc {
                name,
                bytes,
                shape,
                dtype,
                category,
            } => self.alloc(
                name,
                *bytes,
                shape.as_deref(),
                *dtype,
                category.unwrap_or_default(),
            ),
            Command::Del { name } => self.del(name),
            Command::Hold { name, items, cycle } => self.hold(name, items, *cycle),
            Command::Gc {} => Ok(self.gc()),
            Command::EmptyCache {} => Ok(self.empty_cache()),
            Command::ClearSession {} => Ok(self.clear_session()),
            Command::ResetPeakMemoryStats {} => {
                self.kernel.allocator.reset_peak_stats();
                Ok(Outcome::note("Peaks now equal the current values."))
            }
            Command::Model {
                name,
                layers,
                width,
                input_dim,
                classes,
                dtype,
                keras,
            } => self.model(
                name,
                ModelSpec {
                    layers: *layers,
                    width: *width,
                    input_dim: *input_dim,
                    classes: *classes,
                    dtype: dtype.unwrap_or(Dtype::Float32),
                },
                *keras,
            ),
            Command::Optimizer {
                name,
                model,
                kind,
                lr,
            } => self.optimizer(name, model, *kind, *lr),
            Command::Data {
                name,
                samples,
                features,
                classes,
                on_device,
            } => self.data(
                name,
                DataSpec {
                    samples: *samples,
                    features: *features,
                    classes: *classes,
                    on_device: *on_device,
                },
            ),
            Command::Forward {
                name,
                model,
                data,
                batch_size,
                no_grad,
                amp,
                checkpointing,
            } => self.forward(
                name,
                model,
                data,
                *batch_size,
                *no_grad,
                *amp,
                *checkpointing,
            ),
            Command::Backward { name, retain_graph } => self.backward(name, *retain_graph),
            Command::Step { optimizer } => self.optimizer_step(optimizer),
            Command::ZeroGrad {
                optimizer,
                set_to_none,
            } => self.zero_grad(optimizer, *set_to_none),
            Command::Train {
                model,
                optimizer,
                data,
                steps,
                batch_size,
                accumulate,
                checkpointing,
                amp,
                set_to_none,
                loss_history,
            } => self.train_loop(&TrainArgs {
                model,
                optimizer,
                data,
                steps: *steps,
                batch_size: *batch_size,
                accumulate: *accumulate,
                checkpointing: *checkpointing,
                amp: *amp,
                set_to_none: *set_to_none,
                loss_history: *loss_history,
            }),
            Command::FindBatchSize {
                model,
                optimizer,
                data,
                threshold,
            } => self.find_batch_size(model, optimizer, data, *threshold),
            Command::Estimate {
                model,
                optimizer,
                data,
                batch_size,
                accumulate,
                amp,
                checkpointing,
                set_to_none,
            } => self.estimate(
                model,
                optimizer.as_deref(),
                data.as_deref(),
                &train::spec::StepShape {
                    batch_size: *batch_size,
                    accumulate: *accumulate,
                    amp: *amp,
                    checkpointing: *checkpointing,
                    set_to_none: *set_to_none,
                },
            ),
            Command::TfSession { name } => self.tf_session(name),
            Command::Close { name } => self.close(name),
        }
    }

    fn restart(&mut self, patch: &RestartSettings) -> Result<Outcome, CommandError> {
        let settings = self.settings.patched(patch)?;
        let device = self.factory.start(&settings)?;
        let allocator = make_allocator(&settings, device.as_ref());
        // The old process exits: its context and segments go back to the driver.
        self.kernel.restart(device, allocator);
        self.train = TrainState::default();
        self.settings = settings;
        Ok(Outcome::note(format!(
            "The kernel restarted with {}: the process exited, so the driver took back everything, context included; the new process holds only its CUDA context ({}).",
            self.settings.framework.display_name(),
            format_size(self.kernel.device.context_bytes())
        )))
    }

    /// The framework's error for a failed allocation.
    fn oom_error(&self, failure: &AllocFailure) -> CommandError {
        let desc = TensorDesc {
            shape: &failure.shape,
            dtype: failure.dtype,
        };
        error(
            ErrorKind::OutOfMemory,
            oom_message(&self.settings, &failure.oom, &desc),
        )
    }

    fn alloc(
        &mut self,
        name: &str,
        bytes: Option<u64>,
        shape: Option<&[u64]>,
        dtype: Option<Dtype>,
        category: Category,
    ) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let invalid = |m: String| error(ErrorKind::InvalidValue, m);
        let (bytes, shape, dtype) = match (bytes, shape, dtype) {
            (Some(b), None, None) => (b, vec![b], Dtype::Uint8),
            (None, Some(shape), dtype) => {
                let dtype = dtype.unwrap_or(Dtype::Float32);
                let total = shape
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                    .and_then(|n| n.checked_mul(dtype.size_bytes()));
                match total {
                    Some(b) => (b, shape.to_vec(), dtype),
                    None => {
                        return Err(invalid(format!(
                            "shape {shape:?} of {} has more bytes than a 64-bit size can hold",
                            dtype.torch_name()
                        )))
                    }
                }
            }
            (Some(_), Some(_), _) => {
                return Err(error(
                    ErrorKind::InvalidCommand,
                    "give either `bytes` or `shape` (with `dtype`), not both",
                ))
            }
            (Some(_), None, Some(_)) => {
                return Err(error(
                    ErrorKind::InvalidCommand,
                    "`dtype` goes with `shape`; `bytes` alone allocates uint8",
                ))
            }
            (None, None, _) => {
                return Err(error(
                    ErrorKind::InvalidCommand,
                    "alloc needs `bytes`, or `shape` and `dtype`",
                ))
            }
        };
        if bytes >= EIB {
            return Err(invalid(format!(
                "{bytes} bytes is absurd: no GPU has 1 EiB (PyTorch refuses it with \"CUDA out of memory. Tried to allocate more than 1EB memory.\")"
            )));
        }
        let id = self
            .kernel
            .alloc_tensor(name, bytes, shape, dtype, category)
            .map_err(|f| self.oom_error(&f))?;
        let block_size = self.kernel.block_size(id);
        let had_old = self.kernel.runtime.lookup(name).is_some();
        let freed = self.kernel.bind_local(name, id);
        let mut note = format!(
            "`{name}` holds a block of {} ({} asked).",
            format_size(block_size),
            format_size(bytes)
        );
        if had_old && freed > 0 {
            note.push_str(&format!(
                " Rebinding `{name}` dropped the old object's last reference: {} freed, after the new block was taken.",
                format_size(freed)
            ));
        }
        Ok(Outcome::note(note))
    }

    fn lookup(&self, name: &str) -> Result<ObjId, CommandError> {
        self.kernel
            .runtime
            .lookup(name)
            .ok_or_else(|| name_error(name))
    }

    fn del(&mut self, name: &str) -> Result<Outcome, CommandError> {
        let id = self.lookup(name)?;
        let holders = self.kernel.runtime.holders_of(id, Some(name));
        let children = self
            .kernel
            .runtime
            .get(id)
            .map(|o| o.refs.clone())
            .unwrap_or_default();
        let released = self
            .kernel
            .runtime
            .unbind(name)
            .ok_or_else(|| name_error(name))?;
        let freed = self.kernel.release(&released);
        let note = if released.is_empty() {
            format!(
                "`del {name}` removed the name only: the object is still referenced (by {}), so nothing was freed.",
                holders.join(", ")
            )
        } else if freed == 0 {
            // The object died; what it referred to may live on elsewhere.
            let survivor = children
                .iter()
                .find(|&&c| self.kernel.runtime.get(c).is_some() && c != id);
            match survivor {
                Some(&c) => format!(
                    "`{name}` died, but no memory was freed: what it held is still referenced (by {}).",
                    self.kernel.runtime.holders_of(c, None).join(", ")
                ),
                None => format!("`{name}` was the last reference: the object died, but it held no device memory."),
            }
        } else {
            format!(
                "`{name}` was the last reference: {} went back to the allocator's cache (allocated fell; reserved did not).",
                format_size(freed)
            )
        };
        Ok(Outcome::note(note))
    }

    fn hold(&mut self, name: &str, items: &[String], cycle: bool) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let ids = items
            .iter()
            .map(|item| self.lookup(item))
            .collect::<Result<Vec<ObjId>, _>>()?;
        let list = self.kernel.runtime.new_list(&ids, cycle, name);
        self.kernel.bind_local(name, list);
        let mut note = format!("`{name}` is a list holding {} reference(s)", ids.len());
        if cycle {
            note.push_str(" and itself: a reference cycle that only gc.collect() can break");
        }
        note.push('.');
        Ok(Outcome::note(note))
    }

    fn gc(&mut self) -> Outcome {
        let (found, released) = self.kernel.runtime.collect();
        let freed = self.kernel.release(&released);
        Outcome::note(if found == 0 {
            "gc.collect() found no unreachable objects: every live tensor is still referenced, so nothing was freed.".to_string()
        } else {
            format!(
                "gc.collect() found {found} unreachable object(s) kept alive only by reference cycles and freed {}.",
                format_size(freed)
            )
        })
    }

    fn empty_cache(&mut self) -> Outcome {
        let released = self
            .kernel
            .allocator
            .empty_cache(self.kernel.device.as_mut());
        self.kernel.drain_allocator_events();
        Outcome::note(match released {
            Some(0) if self.settings.no_caching => {
                "With caching off there is no cache: every tensor already went back to the driver when it died.".to_string()
            }
            Some(0) => {
                "empty_cache() released nothing: no segment was entirely free. Live tensors keep their blocks, and free pieces of partly used segments cannot be returned.".to_string()
            }
            Some(bytes) => format!(
                "empty_cache() returned {} of entirely free segments to the driver: reserved and nvidia-smi fell; allocated did not move.",
                format_size(bytes)
            ),
            None => format!(
                "{} has no empty_cache(): its BFC pool keeps every byte until the process exits. Nothing changed.",
                self.settings.framework.display_name()
            ),
        })
    }

    fn clear_session(&mut self) -> Outcome {
        let dropped = self.kernel.runtime.clear_framework_state();
        let mut freed = self.kernel.release(&dropped);
        let (found, collected) = self.kernel.runtime.collect();
        freed += self.kernel.release(&collected);
        Outcome::note(format!(
            "clear_session() dropped the framework's global state and ran gc.collect() ({found} unreachable object(s)): {} freed inside the pool. The pool itself and nvidia-smi did not shrink.",
            format_size(freed)
        ))
    }

    // ----- training objects -------------------------------------------------

    /// The object bound to `name`, which must be of `class`.
    fn instance(&self, name: &str, class: Class) -> Result<ObjId, CommandError> {
        let id = self.lookup(name)?;
        let o = self.kernel.runtime.get(id).expect("bound objects exist");
        if o.kind != ObjectKind::Instance(class) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!(
                    "`{name}` is a {}, not a {}",
                    o.kind.type_name(),
                    class.name()
                ),
            ));
        }
        Ok(id)
    }

    fn model_state(&self, name: &str) -> Result<(ObjId, &ModelState), CommandError> {
        let id = self.instance(name, Class::Model)?;
        let state = &self.train.models[&id];
        if let Some(session) = state.session {
            if self.train.sessions.get(&session).is_none_or(|s| s.closed) {
                return Err(error(
                    ErrorKind::RuntimeError,
                    format!("Attempted to use a closed Session. (`{name}` was built in a tf.Session that was closed; its variables are gone.)"),
                ));
            }
        }
        Ok((id, state))
    }

    fn model(&mut self, name: &str, spec: ModelSpec, keras: bool) -> Result<Outcome, CommandError> {
        check_name(name)?;
        spec.validate()
            .map_err(|m| error(ErrorKind::InvalidValue, m))?;
        if spec.param_bytes() >= EIB / 1024 {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("{} parameters is absurd", spec.param_count()),
            ));
        }
        let session = self
            .train
            .open_session
            .filter(|_| self.settings.framework == Framework::Tensorflow);
        let mut frame = Frame::default();
        let model = frame.instance(&mut self.kernel, Class::Model, name);
        let mut params = Vec::new();
        for (suffix, shape) in spec.param_shapes() {
            let label = format!("{name}.{suffix}");
            match frame.alloc(
                &mut self.kernel,
                &label,
                &shape,
                spec.dtype,
                Category::Parameter,
            ) {
                Ok(p) => {
                    frame.take(p);
                    self.kernel.attach_local(session.unwrap_or(model), p);
                    params.push(p);
                }
                Err(f) => {
                    let e = self.oom_error(&f);
                    frame.finish(&mut self.kernel);
                    return Err(e);
                }
            }
        }
        let keras = keras || self.settings.framework == Framework::Tensorflow;
        if keras && session.is_none() {
            self.kernel.runtime.hold_in_framework_state(model);
        }
        self.train.models.insert(
            model,
            ModelState {
                spec,
                params,
                values: None,
                grad_values: Vec::new(),
                session,
                seed: u64::from(model) ^ 0x6d6f_64656c,
            },
        );
        frame.take(model);
        self.kernel.bind_local(name, model);
        let mut note = format!(
            "`{name}` has {} parameters: {} on the device.",
            spec.param_count(),
            format_size(spec.param_bytes())
        );
        if session.is_some() {
            note.push_str(
                " Its variables belong to the open tf.Session: closing the session frees them.",
            );
        } else if keras {
            note.push_str(" Keras's global state holds the model too: `del` alone will not free it; clear_session() will.");
        }
        Ok(Outcome::note(note))
    }

    fn optimizer(
        &mut self,
        name: &str,
        model: &str,
        kind: OptimizerKind,
        lr: Option<f32>,
    ) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let lr = lr.unwrap_or(kind.default_lr());
        if !(lr.is_finite() && lr > 0.0) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("lr must be a positive number, not {lr}"),
            ));
        }
        let (model_id, state) = self.model_state(model)?;
        let params = state.params.clone();
        let opt = self
            .kernel
            .runtime
            .new_local(ObjectKind::Instance(Class::Optimizer), name);
        for &p in &params {
            self.kernel.runtime.add_ref(opt, p);
        }
        self.train.optimizers.insert(
            opt,
            OptimizerState {
                kind,
                model: model_id,
                params,
                lr,
                state: Vec::new(),
                state_values: Vec::new(),
                steps: 0,
            },
        );
        self.kernel.bind_local(name, opt);
        Ok(Outcome::note(format!(
            "`{name}` = {}: it holds references to the parameters; its state ({}) is allocated at the first step.",
            kind.python(),
            match kind.state_per_param() {
                0 => "none".to_string(),
                n => format!("{n}x the parameters"),
            }
        )))
    }

    fn data(&mut self, name: &str, spec: DataSpec) -> Result<Outcome, CommandError> {
        check_name(name)?;
        if spec.samples == 0 || spec.features == 0 || spec.classes < 2 {
            return Err(error(
                ErrorKind::InvalidValue,
                "a dataset needs at least 1 sample, 1 feature and 2 classes",
            ));
        }
        if spec
            .samples
            .checked_mul(spec.features)
            .is_none_or(|n| n >= EIB / 8)
        {
            return Err(error(
                ErrorKind::InvalidValue,
                "that dataset is absurdly large",
            ));
        }
        let mut frame = Frame::default();
        let ds = frame.instance(&mut self.kernel, Class::Dataset, name);
        let mut on_device = None;
        if spec.on_device {
            let k = &mut self.kernel;
            let x = frame.alloc(
                k,
                &format!("{name}.x"),
                &[spec.samples, spec.features],
                Dtype::Float32,
                Category::Input,
            );
            let x = match x {
                Ok(x) => x,
                Err(f) => {
                    frame.finish(k);
                    return Err(self.oom_error(&f));
                }
            };
            let y = match frame.alloc(
                k,
                &format!("{name}.y"),
                &[spec.samples],
                Dtype::Int64,
                Category::Input,
            ) {
                Ok(y) => y,
                Err(f) => {
                    frame.finish(k);
                    return Err(self.oom_error(&f));
                }
            };
            for t in [x, y] {
                frame.take(t);
                k.attach_local(ds, t);
            }
            on_device = Some((x, y));
        }
        self.train.datasets.insert(
            ds,
            DatasetState {
                spec,
                on_device,
                cursor: 0,
                seed: u64::from(ds) ^ 0xda7a,
            },
        );
        frame.take(ds);
        self.kernel.bind_local(name, ds);
        Ok(Outcome::note(if spec.on_device {
            format!(
                "All of `{name}` is on the device: {} held for as long as the dataset lives.",
                format_size(spec.device_bytes())
            )
        } else {
            format!("`{name}` stays in host memory; each batch is copied to the device when used.")
        }))
    }

    /// Whether a step of this model at this batch computes numbers.
    fn computes(&self, spec: &ModelSpec, batch: u64) -> bool {
        spec.step_flops(batch) <= self.flop_limit
    }

    /// Installs the hook long commands call after each step.
    pub fn set_progress_hook(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook;
    }

    /// Sets the size (in FLOPs) up to which training steps compute their
    /// numbers on the CPU; above it they run shape-only.
    pub fn set_arithmetic_flop_limit(&mut self, flops: u64) {
        self.flop_limit = flops;
    }

    /// Turns a failed training step into Python's state after the raise:
    /// the exception (bound to `last_exception`) keeps the frame's locals.
    fn raise_in_frame(&mut self, mut frame: Frame, failure: &AllocFailure) -> CommandError {
        let exc = self
            .kernel
            .runtime
            .new_local(ObjectKind::Instance(Class::Exception), "last_exception");
        for id in std::mem::take(&mut frame.locals) {
            self.kernel.attach_local(exc, id);
        }
        self.kernel.bind_local("last_exception", exc);
        let mut e = self.oom_error(failure);
        e.message.push_str(
            "\n(The exception's frame keeps the failed step's tensors alive: `del last_exception` frees them.)",
        );
        e
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        name: &str,
        model: &str,
        data: &str,
        batch: u64,
        no_grad: bool,
        amp: bool,
        checkpointing: bool,
    ) -> Result<Outcome, CommandError> {
        check_name(name)?;
        let (model_id, state) = self.model_state(model)?;
        let spec = state.spec;
        let data_id = self.instance(data, Class::Dataset)?;
        check_batch(batch, &self.train.datasets[&data_id].spec, &spec)?;
        let compute = self.computes(&spec, batch);
        let mut frame = Frame::default();
        let args = ForwardArgs {
            tag: name,
            model: model_id,
            data: data_id,
            batch,
            no_grad,
            amp,
            checkpointing,
            compute,
        };
        let out = match step::forward(&mut self.kernel, &mut frame, &mut self.train, &args) {
            Ok(out) => out,
            Err(f) => return Err(self.raise_in_frame(frame, &f)),
        };
        self.kernel.bind_local(name, out.loss);
        let saved: u64 = step::find_graph(&self.kernel, out.loss)
            .and_then(|g| self.kernel.runtime.get(g))
            .map(|g| g.refs.iter().map(|&t| self.kernel.block_size(t)).sum())
            .unwrap_or(0);
        let mut note = if no_grad {
            "Under torch.no_grad() nothing is saved: every activation died as soon as the next layer had used it.".to_string()
        } else {
            format!(
                "`{name}` keeps its autograd graph alive, and with it {} of saved tensors (activations and the batch) until backward runs or `{name}` dies.",
                format_size(saved)
            )
        };
        note.push_str(&loss_note(out.value));
        Ok(Outcome {
            note: Some(note),
            value: Some(json!({"loss": out.value, "loss_computed": out.value.is_some()})),
        })
    }

    fn backward(&mut self, name: &str, retain: bool) -> Result<Outcome, CommandError> {
        let loss = self.lookup(name)?;
        let mut frame = Frame::default();
        let before = self.kernel.stats().allocated_bytes;
        match step::backward(&mut self.kernel, &mut frame, &mut self.train, loss, retain) {
            Ok(()) => {}
            Err(BackwardError::NoGraph) => {
                return Err(error(ErrorKind::RuntimeError, step::NO_GRAD_FN));
            }
            Err(BackwardError::Consumed) => {
                return Err(error(ErrorKind::RuntimeError, step::BACKWARD_TWICE));
            }
            Err(BackwardError::Oom(f)) => return Err(self.raise_in_frame(frame, &f)),
        }
        let after = self.kernel.stats().allocated_bytes;
        Ok(Outcome::note(if retain {
            "Backward ran with retain_graph=True: the gradients were added to .grad and the saved tensors stay for another backward.".to_string()
        } else {
            format!(
                "Backward released the saved tensors as it walked the graph and put the gradients in .grad (allocated {} {}).",
                if after >= before { "rose by" } else { "fell by" },
                format_size(after.abs_diff(before))
            )
        }))
    }

    fn optimizer_step(&mut self, optimizer: &str) -> Result<Outcome, CommandError> {
        let opt = self.instance(optimizer, Class::Optimizer)?;
        let first = self.train.optimizers[&opt].state.is_empty();
        let mut frame = Frame::default();
        let before = self.kernel.stats().allocated_bytes;
        if let Err(f) = step::optimizer_step(&mut self.kernel, &mut frame, &mut self.train, opt) {
            return Err(self.raise_in_frame(frame, &f));
        }
        let grown = self.kernel.stats().allocated_bytes.saturating_sub(before);
        Ok(Outcome::note(if first && grown > 0 {
            format!(
                "The first step allocated the optimizer's state: {}.",
                format_size(grown)
            )
        } else {
            "The parameters were updated in place.".to_string()
        }))
    }

    fn zero_grad(&mut self, optimizer: &str, set_to_none: bool) -> Result<Outcome, CommandError> {
        let opt = self.instance(optimizer, Class::Optimizer)?;
        let freed = step::zero_grad(&mut self.kernel, &mut self.train, opt, set_to_none);
        Ok(Outcome::note(if set_to_none {
            format!(
                "zero_grad(set_to_none=True) dropped every .grad: {} freed.",
                format_size(freed)
            )
        } else {
            "zero_grad(set_to_none=False) zeroed the gradients in place: their memory stays allocated.".to_string()
        }))
    }

    fn train_loop(&mut self, a: &TrainArgs) -> Result<Outcome, CommandError> {
        let (model_id, state) = self.model_state(a.model)?;
        let spec = state.spec;
        let opt = self.instance(a.optimizer, Class::Optimizer)?;
        let data_id = self.instance(a.data, Class::Dataset)?;
        if a.steps == 0 || a.steps > MAX_TRAIN_STEPS {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("steps must be 1 to {MAX_TRAIN_STEPS}, not {}", a.steps),
            ));
        }
        if a.accumulate == 0 || a.batch_size % a.accumulate != 0 {
            return Err(error(
                ErrorKind::InvalidValue,
                format!(
                    "accumulate must divide batch_size ({} micro-batches of {} / {})",
                    a.accumulate, a.batch_size, a.accumulate
                ),
            ));
        }
        let micro = a.batch_size / a.accumulate;
        check_batch(micro, &self.train.datasets[&data_id].spec, &spec)?;
        let compute = self.computes(&spec, micro);
        let mut steps = Vec::new();
        let mut stopped = false;
        for s in 0..a.steps {
            self.kernel.begin_window();
            let mut frame = Frame::default();
            let mut losses = Vec::new();
            for _ in 0..a.accumulate {
                let args = ForwardArgs {
                    tag: "loss",
                    model: model_id,
                    data: data_id,
                    batch: micro,
                    no_grad: false,
                    amp: a.amp,
                    checkpointing: a.checkpointing,
                    compute,
                };
                let out = match step::forward(&mut self.kernel, &mut frame, &mut self.train, &args)
                {
                    Ok(out) => out,
                    Err(f) => return Err(self.raise_in_frame(frame, &f)),
                };
                let mut loss = out.loss;
                frame.locals.push(loss);
                if a.accumulate > 1 {
                    // loss = loss / accumulate
                    let scaled = match frame.alloc(
                        &mut self.kernel,
                        "loss",
                        &[],
                        Dtype::Float32,
                        Category::Activation,
                    ) {
                        Ok(t) => t,
                        Err(f) => return Err(self.raise_in_frame(frame, &f)),
                    };
                    self.kernel.runtime.add_ref(scaled, loss);
                    frame.drop(&mut self.kernel, loss);
                    loss = scaled;
                }
                match step::backward(&mut self.kernel, &mut frame, &mut self.train, loss, false) {
                    Ok(()) => {}
                    Err(BackwardError::Oom(f)) => return Err(self.raise_in_frame(frame, &f)),
                    Err(_) => unreachable!("a fresh graph has not been consumed"),
                }
                if a.loss_history == LossHistory::Tensor {
                    // total_loss += loss: a new tensor whose history holds both.
                    let total = match frame.alloc(
                        &mut self.kernel,
                        "total_loss",
                        &[],
                        Dtype::Float32,
                        Category::Other,
                    ) {
                        Ok(t) => t,
                        Err(f) => return Err(self.raise_in_frame(frame, &f)),
                    };
                    if let Some(prev) = self.kernel.runtime.lookup("total_loss") {
                        self.kernel.runtime.add_ref(total, prev);
                    }
                    self.kernel.runtime.add_ref(total, loss);
                    frame.take(total);
                    self.kernel.bind_local("total_loss", total);
                }
                frame.take(loss);
                self.kernel.bind_local("loss", loss);
                losses.extend(out.value);
            }
            let updated =
                match step::optimizer_step(&mut self.kernel, &mut frame, &mut self.train, opt) {
                    Ok(u) => u,
                    Err(f) => return Err(self.raise_in_frame(frame, &f)),
                };
            step::zero_grad(&mut self.kernel, &mut self.train, opt, a.set_to_none);
            frame.finish(&mut self.kernel);
            let _ = updated;
            let loss =
                (!losses.is_empty()).then(|| losses.iter().sum::<f32>() / losses.len() as f32);
            steps.push(json!({
                "step": s,
                "loss": loss,
                "peak_allocated_bytes": self.kernel.window_peak_allocated(),
                "peak_reserved_bytes": self.kernel.window_peak_reserved(),
                "allocated_bytes": self.kernel.stats().allocated_bytes,
            }));
            let mut hook = self.progress.take();
            let go_on = hook.as_mut().is_none_or(|h| {
                h(
                    self,
                    &Progress {
                        done: s + 1,
                        total: a.steps,
                        loss,
                    },
                )
            });
            self.progress = hook;
            if !go_on && s + 1 < a.steps {
                stopped = true;
                break;
            }
        }
        let first = steps.first().and_then(|s| s["loss"].as_f64());
        let last = steps.last().and_then(|s| s["loss"].as_f64());
        let mut note = match (first, last) {
            (Some(f), Some(l)) => format!(
                "{} of batch {}: loss {f:.4} -> {l:.4}, computed on the CPU.",
                plural(a.steps, "step"),
                a.batch_size
            ),
            _ => format!(
                "{} of batch {}, shape-only: every allocation is exact, but a step of {:.0} MFLOP is too big to compute here, so no loss was computed.",
                plural(a.steps, "step"),
                a.batch_size,
                spec.step_flops(micro) as f64 / 1e6
            ),
        };
        if stopped {
            note = format!("Stopped after {} of {} steps. {note}", steps.len(), a.steps);
        }
        Ok(Outcome {
            note: Some(note),
            value: Some(json!({
                "stopped": stopped,
                "loss_computed": first.is_some(),
                "first_loss": first,
                "last_loss": last,
                "steps": steps,
            })),
        })
    }

    fn estimate(
        &self,
        model: &str,
        optimizer: Option<&str>,
        data: Option<&str>,
        shape: &train::spec::StepShape,
    ) -> Result<Outcome, CommandError> {
        let (_, state) = self.model_state(model)?;
        let kind = match optimizer {
            Some(o) => Some(self.train.optimizers[&self.instance(o, Class::Optimizer)?].kind),
            None => None,
        };
        let data = match data {
            Some(d) => Some(self.train.datasets[&self.instance(d, Class::Dataset)?].spec),
            None => None,
        };
        if shape.accumulate == 0
            || shape.batch_size % shape.accumulate != 0
            || shape.batch_size == 0
        {
            return Err(error(
                ErrorKind::InvalidValue,
                "batch_size must be positive and a multiple of accumulate",
            ));
        }
        let e = train::spec::estimate(&state.spec, kind, data.as_ref(), shape);
        Ok(Outcome {
            note: Some(format!(
                "Predicted: parameters {}, gradients {}, optimizer state {}, activations {}, batch {}; peak about {}.",
                format_size(e.parameter_bytes),
                format_size(e.gradient_bytes),
                format_size(e.optimizer_state_bytes),
                format_size(e.activation_bytes),
                format_size(e.input_bytes),
                format_size(e.peak_bytes)
            )),
            value: Some(serde_json::to_value(&e).expect("an estimate serializes")),
        })
    }

    /// The most the framework lets this process hold.
    fn memory_budget(&self) -> u64 {
        let (free, total) = self.kernel.device.mem_get_info();
        let start_free = free + self.kernel.device.segment_bytes();
        match self.settings.framework {
            Framework::Pytorch => self
                .settings
                .per_process_memory_fraction
                .map_or(start_free, |f| ((f * total as f64) as u64).min(start_free)),
            _ => self.settings.bfc_memory_limit(self.kernel.device.as_ref()),
        }
    }

    fn find_batch_size(
        &mut self,
        model: &str,
        optimizer: &str,
        data: &str,
        threshold: f64,
    ) -> Result<Outcome, CommandError> {
        if !(threshold > 0.0 && threshold <= 1.0) {
            return Err(error(
                ErrorKind::InvalidValue,
                format!("threshold must be in (0, 1], not {threshold}"),
            ));
        }
        let (_, state) = self.model_state(model)?;
        let spec = state.spec;
        let kind = self.train.optimizers[&self.instance(optimizer, Class::Optimizer)?].kind;
        let data_spec = self.train.datasets[&self.instance(data, Class::Dataset)?].spec;
        let budget = self.memory_budget();
        let limit = (threshold * budget as f64) as u64;
        let mut tried = Vec::new();
        let mut best = None;
        let mut batch = 1u64;
        while batch <= data_spec.samples.min(1 << 24) {
            let peak = self.trial_peak(&spec, kind, &data_spec, batch);
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

    /// The peak allocated of two training steps at `batch`, on a fresh
    /// simulated kernel with this one's settings; `None` on OOM.
    fn trial_peak(
        &self,
        spec: &ModelSpec,
        kind: OptimizerKind,
        data: &DataSpec,
        batch: u64,
    ) -> Option<u64> {
        let mut trial = Engine::new(Box::new(SimDeviceFactory), self.settings.clone()).ok()?;
        trial.set_event_capacity(0);
        trial.set_tracing(false);
        let setup = [
            Command::Model {
                name: "model".into(),
                layers: spec.layers,
                width: spec.width,
                input_dim: spec.input_dim,
                classes: spec.classes,
                dtype: Some(spec.dtype),
                keras: false,
            },
            Command::Optimizer {
                name: "opt".into(),
                model: "model".into(),
                kind,
                lr: None,
            },
            Command::Data {
                name: "data".into(),
                samples: data.samples,
                features: data.features,
                classes: data.classes,
                on_device: data.on_device,
            },
        ];
        for c in &setup {
            trial.execute(c).ok()?;
        }
        let mut peak = 0;
        for _ in 0..2 {
            trial
                .execute(&Command::Train {
                    model: "model".into(),
                    optimizer: "opt".into(),
                    data: "data".into(),
                    steps: 1,
                    batch_size: batch,
                    accumulate: 1,
                    checkpointing: false,
                    amp: false,
                    set_to_none: true,
                    loss_history: LossHistory::Item,
                })
                .ok()?;
            peak = peak.max(trial.stats().step_peak_allocated_bytes);
        }
        Some(peak)
    }

    fn tf_session(&mut self, name: &str) -> Result<Outcome, CommandError> {
        check_name(name)?;
        if self.settings.framework != Framework::Tensorflow {
            return Err(error(
                ErrorKind::InvalidValue,
                "tf.compat.v1.Session needs the tensorflow framework: restart with {\"framework\":\"tensorflow\"}",
            ));
        }
        let s = self
            .kernel
            .runtime
            .new_local(ObjectKind::Instance(Class::Session), name);
        self.train
            .sessions
            .insert(s, SessionState { closed: false });
        self.train.open_session = Some(s);
        self.kernel.bind_local(name, s);
        Ok(Outcome::note(format!(
            "`{name}` is open: the variables of models built now belong to it."
        )))
    }

    fn close(&mut self, name: &str) -> Result<Outcome, CommandError> {
        let s = self.instance(name, Class::Session)?;
        let freed = self.kernel.clear_refs(s);
        if let Some(state) = self.train.sessions.get_mut(&s) {
            state.closed = true;
        }
        if self.train.open_session == Some(s) {
            self.train.open_session = None;
        }
        Ok(Outcome::note(format!(
            "Closing `{name}` freed its variables inside the pool ({}): bytes_in_use fell, the pool and nvidia-smi did not.",
            format_size(freed)
        )))
    }

    // ----- views -------------------------------------------------------------

    /// Everything the views draw, with the last `max_events` events.
    pub fn snapshot(&self, max_events: usize) -> Snapshot {
        let k = &self.kernel;
        let owners = k.owners();
        let segments = k
            .allocator
            .segments()
            .into_iter()
            .map(|s| {
                let mut allocated_size = 0;
                let mut requested_size = 0;
                let blocks = s
                    .blocks
                    .into_iter()
                    .map(|b| {
                        let owner = b.id.and_then(|id| owners.get(&id));
                        if b.id.is_some() {
                            allocated_size += b.size;
                            requested_size += b.requested_size;
                        }
                        BlockSnapshot {
                            address: b.address,
                            size: b.size,
                            requested_size: b.requested_size,
                            state: b.state,
                            owner: owner.map(|(n, _)| n.to_string()),
                            category: owner.map(|(_, c)| *c),
                        }
                    })
                    .collect();
                SegmentSnapshot {
                    address: s.address,
                    total_size: s.total_size,
                    allocated_size,
                    requested_size,
                    pool: s.pool.to_string(),
                    blocks,
                }
            })
            .collect();
        let names = k.runtime.names_of();
        let why = k.runtime.retention();
        let objects = k
            .runtime
            .objects()
            .iter()
            .map(|(&id, o)| {
                let category = match &o.kind {
                    ObjectKind::Tensor(t) => Some(t.category),
                    _ => None,
                };
                ObjectSnapshot {
                    id,
                    kind: o.kind.type_name().into(),
                    label: o.label.clone(),
                    names: names.get(&id).cloned().unwrap_or_default(),
                    bytes: k.block_size(id),
                    requested_bytes: match &o.kind {
                        ObjectKind::Tensor(t) => t.bytes,
                        _ => 0,
                    },
                    refcount: o.refcount,
                    category,
                    kept_alive_by: why.get(&id).cloned().unwrap_or_default(),
                }
            })
            .collect();
        let events = k.events();
        let skip = events.len().saturating_sub(max_events);
        let stats = self.stats();
        Snapshot {
            step: self.step,
            framework: self.settings.framework,
            device: self.device_info(),
            stats,
            segments,
            objects,
            events: events.iter().skip(skip).cloned().collect(),
        }
    }

    /// Checks every invariant of the allocator, the runtime and their
    /// agreement; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.kernel.check_invariants()
    }
}

/// Arguments of `train`.
struct TrainArgs<'a> {
    model: &'a str,
    optimizer: &'a str,
    data: &'a str,
    steps: u64,
    batch_size: u64,
    accumulate: u64,
    checkpointing: bool,
    amp: bool,
    set_to_none: bool,
    loss_history: LossHistory,
}

fn check_batch(batch: u64, data: &DataSpec, model: &ModelSpec) -> Result<(), CommandError> {
    if batch == 0 || batch > 1 << 24 {
        return Err(error(
            ErrorKind::InvalidValue,
            format!("batch_size must be 1 to {}, not {batch}", 1u64 << 24),
        ));
    }
    if data.features != model.input_dim || data.classes != model.classes {
        return Err(error(
            ErrorKind::InvalidValue,
            format!(
                "the data has {} features and {} classes but the model expects {} and {}",
                data.features, data.classes, model.input_dim, model.classes
            ),
        ));
    }
    Ok(())
}

fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn loss_note(value: Option<f32>) -> String {
    match value {
        Some(v) => format!(" Loss {v:.4} (computed on the CPU)."),
        None => " The step is too large to compute here: shape-only, loss not computed.".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::EventAction;
    use crate::units::MIB;

    fn run(engine: &mut Engine, line: &str) -> StepRecord {
        let r = engine.run_line(line);
        engine.check_invariants().unwrap();
        r
    }

    #[test]
    fn del_vs_empty_cache_vs_context() {
        let mut e = Engine::new_simulated();
        let r = run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
        assert!(r.ok);
        assert_eq!(r.stats.allocated_bytes, 64 * MIB);
        assert_eq!(r.stats.device_used_bytes, 364 * MIB);
        let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        assert_eq!(r.stats.allocated_bytes, 0);
        assert_eq!(r.stats.reserved_bytes, 64 * MIB);
        let r = run(&mut e, r#"{"cmd":"empty_cache"}"#);
        assert_eq!(r.stats.reserved_bytes, 0);
        assert_eq!(r.stats.device_used_bytes, 300 * MIB);
        assert_eq!(r.step, 2);
    }

    #[test]
    fn errors_change_nothing() {
        let mut e = Engine::new_simulated();
        run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
        run(
            &mut e,
            r#"{"cmd":"model","name":"m","layers":1,"width":8,"input_dim":4,"classes":2}"#,
        );
        let before = e.snapshot(usize::MAX);
        for line in [
            "not json",
            r#"{"cmd":"del","name":"nope"}"#,
            r#"{"cmd":"alloc","name":"9x","bytes":1}"#,
            r#"{"cmd":"alloc","name":"y","bytes":2305843009213693952}"#,
            r#"{"cmd":"alloc","name":"y","shape":[4294967296,4294967296,16]}"#,
            r#"{"cmd":"hold","name":"h","items":["x","ghost"]}"#,
            r#"{"cmd":"restart","mem_fraction":7}"#,
            r#"{"cmd":"optimizer","name":"o","model":"x","kind":"adam"}"#,
            r#"{"cmd":"model","name":"m2","layers":0}"#,
            r#"{"cmd":"train","model":"m","optimizer":"nope","data":"nope"}"#,
            r#"{"cmd":"close","name":"x"}"#,
        ] {
            let r = run(&mut e, line);
            assert!(!r.ok, "{line}");
            let mut after = e.snapshot(usize::MAX);
            after.step = before.step;
            after.stats.step_peak_allocated_bytes = before.stats.step_peak_allocated_bytes;
            after.stats.step_peak_reserved_bytes = before.stats.step_peak_reserved_bytes;
            assert_eq!(after, before, "{line}");
        }
    }

    #[test]
    fn name_error_text_is_pythons() {
        let mut e = Engine::new_simulated();
        let r = run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        let err = r.error.unwrap();
        assert_eq!(err.kind, ErrorKind::NameError);
        assert_eq!(err.message, "name 'x' is not defined");
    }

    #[test]
    fn events_are_tagged_with_their_step() {
        let mut e = Engine::new_simulated();
        run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":1000}"#);
        run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        run(&mut e, r#"{"cmd":"empty_cache"}"#);
        let ev: Vec<(u64, EventAction, Option<String>)> = e
            .events_since(0)
            .map(|e| (e.step, e.action, e.name.clone()))
            .collect();
        assert_eq!(
            ev,
            vec![
                (0, EventAction::SegmentAlloc, None),
                (0, EventAction::Alloc, Some("x".into())),
                (1, EventAction::Free, Some("x".into())),
                (2, EventAction::SegmentFree, None),
            ]
        );
    }

    #[test]
    fn snapshot_names_owners_and_chains() {
        let mut e = Engine::new_simulated();
        run(
            &mut e,
            r#"{"cmd":"alloc","name":"x","shape":[1024,1024],"dtype":"float32","category":"activation"}"#,
        );
        run(
            &mut e,
            r#"{"cmd":"hold","name":"h","items":["x"],"cycle":true}"#,
        );
        run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        let s = e.snapshot(100);
        assert_eq!(s.stats.categories[&Category::Activation], 4 * MIB);
        let owner = s.segments[0].blocks[0].owner.clone();
        assert_eq!(owner.as_deref(), Some("x"));
        let x = s.objects.iter().find(|o| o.label == "x").unwrap();
        assert_eq!(x.kept_alive_by, "name `h` -> list `h`");
        assert_eq!(x.refcount, 1);
    }

    #[test]
    fn reset_peak_memory_stats_brings_peaks_down_to_current() {
        let mut e = Engine::new_simulated();
        run(&mut e, r#"{"cmd":"alloc","name":"x","bytes":67108864}"#);
        run(&mut e, r#"{"cmd":"del","name":"x"}"#);
        let r = run(&mut e, r#"{"cmd":"empty_cache"}"#);
        assert_eq!(r.stats.peak_allocated_bytes, 64 * MIB);
        let r = run(&mut e, r#"{"cmd":"reset_peak_memory_stats"}"#);
        assert_eq!(r.stats.peak_allocated_bytes, 0);
        assert_eq!(r.stats.peak_reserved_bytes, 0);
    }

    #[test]
    fn del_model_keeps_parameters_the_optimizer_holds() {
        let mut e = Engine::new_simulated();
        run(
            &mut e,
            r#"{"cmd":"model","name":"m","layers":1,"width":1024,"input_dim":1024,"classes":10}"#,
        );
        let built = e.stats().allocated_bytes;
        run(
            &mut e,
            r#"{"cmd":"optimizer","name":"opt","model":"m","kind":"sgd"}"#,
        );
        let r = run(&mut e, r#"{"cmd":"del","name":"m"}"#);
        assert_eq!(r.stats.allocated_bytes, built);
        assert!(r.note.unwrap().contains("optimizer `opt`"));
        let r = run(&mut e, r#"{"cmd":"del","name":"opt"}"#);
        assert_eq!(r.stats.allocated_bytes, 0);
    }
}
