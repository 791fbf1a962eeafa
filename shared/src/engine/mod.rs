//! The engine: carries out commands on one kernel. Each command is one line
//! of Python; the engine validates it, runs it on the [`Process`], and
//! reports the stats after it. By concern:
//!
//! - [`tensors`]: `alloc`, `del`, `hold`, `gc`, `empty_cache`, `clear_session`.
//! - [`objects`]: models, optimizers, datasets.
//! - [`training`]: forward, backward, step, zero_grad, the training loop.
//! - [`planning`]: `estimate` and `find_batch_size`.
//! - [`tf1`]: TensorFlow 1's sessions.

mod arithmetic;
#[cfg(feature = "device-values")]
mod device_step;
#[cfg(feature = "tf-executor")]
mod executor;
#[cfg(feature = "hf-models")]
mod generate_sink;
#[cfg(feature = "hf-models")]
mod generating;
#[cfg(feature = "hf-models")]
mod hf_loop;
#[cfg(feature = "hf-models")]
mod hf_training;
mod jitted;
#[cfg(feature = "hf-models")]
mod made;
mod objects;
#[cfg(feature = "device-values")]
mod on_device;
mod placement;
mod planning;
mod program;
#[cfg(feature = "hf-models")]
mod serving;
mod step_words;
mod stepwise;
mod tensors;
mod tf1;
mod training;
mod update;

use crate::alloc::AllocError;
use crate::command::{Command, RestartSettings};
use crate::device::{Device, DeviceInfo};
#[cfg(debug_assertions)]
use crate::error::Broken;
use crate::error::{CommandError, ErrorKind};
use crate::framework::{make_allocator, oom_message, Settings, TensorDesc};
use crate::process::{AllocFailure, Process};
use crate::snapshot::{self, Event, Snapshot, Stats};
use crate::train::{self, TrainState};
use crate::types::Framework;
use crate::units::format_size;
use serde_json::Value;

pub use crate::process::DEFAULT_EVENT_CAPACITY;

/// The longest name accepted.
pub const MAX_NAME_LEN: usize = 64;
/// The most steps one `train` command runs.
pub const MAX_TRAIN_STEPS: u64 = 1_000_000;

/// The largest batch a step may take.
pub const MAX_BATCH_SIZE: u64 = 1 << 24;

/// Starts a device for a kernel: the simulated GPU, or a real one.
pub trait DeviceFactory: Send {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError>;
}

/// Starts simulated GPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimDeviceFactory;

impl DeviceFactory for SimDeviceFactory {
    fn start(&mut self, settings: &Settings) -> Result<Box<dyn Device>, CommandError> {
        Ok(Box::new(crate::framework::sim_device(settings)?))
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
    pub(crate) fn note(note: impl Into<String>) -> Self {
        Self {
            note: Some(note.into()),
            value: None,
        }
    }
}

pub struct Engine {
    settings: Settings,
    factory: Box<dyn DeviceFactory>,
    process: Process,
    train: TrainState,
    /// Its Hugging Face models, optimizers, steps and vLLM engines.
    #[cfg(feature = "hf-models")]
    hf: crate::hf::state::HfObjects,
    /// Steps executed so far (the next step's index).
    step: u64,
    /// Training steps up to this many FLOPs compute their numbers.
    flop_limit: u64,
    progress: Option<ProgressHook>,
    /// Where a device that holds values computed the steps since the
    /// last `train`'s start.
    #[cfg(feature = "device-values")]
    tally: on_device::Tally,
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
        let train = TrainState::new(settings.blas_workspaces());
        let mut process = Process::new(device, allocator);
        process.first_kernel_scratch = settings.first_kernel_scratch_bytes();
        Ok(Self {
            settings,
            factory,
            process,
            train,
            #[cfg(feature = "hf-models")]
            hf: Default::default(),
            step: 0,
            flop_limit: train::ARITHMETIC_FLOP_LIMIT,
            progress: None,
            #[cfg(feature = "device-values")]
            tally: on_device::Tally::default(),
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn framework(&self) -> Framework {
        self.settings.framework
    }

    pub fn device_info(&self) -> DeviceInfo {
        self.process.device.info()
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.process.set_event_capacity(capacity);
    }

    /// Switches event recording in the allocator (benchmarks switch it off).
    pub fn set_tracing(&mut self, on: bool) {
        self.process.allocator.set_tracing(on);
    }

    /// Events with `seq >= since`, oldest first.
    pub fn events_since(&self, since: u64) -> impl Iterator<Item = &Event> {
        self.process.events_since(since)
    }

    pub fn stats(&self) -> Stats {
        self.process.stats()
    }

    /// The peaks since the last call (allocated, reserved); see
    /// [`Process::take_sample_peaks`].
    pub fn take_sample_peaks(&mut self) -> (u64, u64) {
        self.process.take_sample_peaks()
    }

    /// Executes one command. On error nothing changed, except what the
    /// framework itself changes on the way to an OOM (PyTorch returns its
    /// cached segments to the driver before it gives up; a failed training
    /// step leaves `last_exception`). In debug builds every invariant of
    /// the process is checked after every command.
    pub fn execute(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        self.process.begin_command(self.step);
        self.step += 1;
        let result = self.dispatch(cmd);
        self.forget_dead();
        #[cfg(debug_assertions)]
        assert_eq!(self.check_invariants(), Ok(()), "after {}", cmd.name());
        result
    }

    /// Forgets the training state of objects that died (a loop calls it
    /// every step: each step's graph dies as the next loss is bound).
    fn forget_dead(&mut self) {
        let dead = self.process.take_dead_instances();
        #[cfg(feature = "hf-models")]
        self.llms_exit(&dead);
        self.train.forget(&dead);
        #[cfg(feature = "hf-models")]
        self.hf.forget(&dead);
    }

    /// Counts a line that is not a command as a step, and gives back its error.
    pub fn reject(&mut self, error: CommandError) -> CommandError {
        self.process.begin_command(self.step);
        self.step += 1;
        error
    }

    fn dispatch(&mut self, cmd: &Command) -> Result<Outcome, CommandError> {
        match cmd {
            Command::Restart(patch) => self.restart(patch),
            Command::Alloc(a) => self.alloc(a),
            Command::Del(a) => self.del(&a.name),
            Command::Hold(a) => self.hold(a),
            Command::Assign(a) => self.assign(a),
            Command::Append(a) => self.append(a),
            Command::Gc {} => Ok(self.gc()),
            Command::EmptyCache {} => Ok(self.empty_cache()),
            Command::ClearCublasWorkspaces {} => Ok(self.clear_cublas_workspaces()),
            Command::ClearSession {} => Ok(self.clear_session()),
            Command::ResetPeakMemoryStats {} => {
                self.process.allocator.reset_peak_stats();
                Ok(Outcome::note("Peaks now equal the current values."))
            }
            #[cfg(feature = "hf-models")]
            Command::Model(a) if a.kind == crate::command::ModelKind::Hf => self.hf_model(a),
            Command::Model(a) => self.model(a),
            Command::Optimizer(a) => self.optimizer(a),
            Command::Data(a) => self.data(a),
            Command::Forward(a) => self.forward(a),
            Command::Backward(a) => self.backward(a),
            Command::Step(a) => self.optimizer_step(a),
            Command::ZeroGrad(a) => self.zero_grad(a),
            Command::Train(a) => self.train_loop(a),
            Command::FindBatchSize(a) => self.find_batch_size(a),
            Command::Estimate(a) => self.estimate(a),
            #[cfg(feature = "hf-models")]
            Command::Generate(a) => self.generate(a),
            #[cfg(feature = "hf-models")]
            Command::PrepareKbit(a) => self.prepare_kbit(a),
            #[cfg(feature = "hf-models")]
            Command::Lora(a) => self.lora(a),
            #[cfg(feature = "hf-models")]
            Command::Serve(a) => self.serve(a),
            #[cfg(not(feature = "hf-models"))]
            Command::Generate(_) | Command::PrepareKbit(_) | Command::Lora(_) | Command::Serve(_) => Err(error(
                ErrorKind::InvalidValue,
                "Hugging Face models run on a server (`vramlab serve`) or in `vramlab run`: this build leaves them out",
            )),
            Command::TfSession(a) => self.tf_session(&a.name),
            Command::Close(a) => self.close(&a.name),
        }
    }

    fn restart(&mut self, patch: &RestartSettings) -> Result<Outcome, CommandError> {
        let settings = self.settings.patched(patch)?;
        // The old process exits first: the driver takes back its context
        // and segments before the new one starts and reads the free memory
        // (TensorFlow sizes its pool from it).
        self.process.exit();
        self.train = TrainState::new(Default::default());
        #[cfg(feature = "hf-models")]
        {
            self.hf = Default::default();
        }
        let (settings, failed) = match self.factory.start(&settings) {
            Ok(device) => (self.start(settings, device), None),
            Err(e) => match self.factory.start(&self.settings) {
                Ok(device) => (self.start(self.settings.clone(), device), Some(e)),
                Err(_) => return Err(no_process(e)),
            },
        };
        self.settings = settings;
        if let Some(mut e) = failed {
            e.message.push_str(
                " (the old process had exited: a new one started with the previous settings)",
            );
            return Err(e);
        }
        Ok(Outcome::note(format!(
            "The kernel restarted with {}: the process exited, so the driver took back everything, context included; the new process holds only its CUDA context ({}).",
            self.settings.framework.display_name(),
            format_size(self.process.device.context_bytes())
        )))
    }

    /// A new process on `device`: its allocator, workspaces and scratch as
    /// `settings` say. Returns the settings.
    fn start(&mut self, settings: Settings, device: Box<dyn Device>) -> Settings {
        let allocator = make_allocator(&settings, device.as_ref());
        self.process.start(device, allocator);
        self.process.first_kernel_scratch = settings.first_kernel_scratch_bytes();
        self.train = TrainState::new(settings.blas_workspaces());
        #[cfg(feature = "hf-models")]
        {
            self.hf = Default::default();
        }
        settings
    }

    /// The error for a failed allocation: the framework's out-of-memory
    /// text, or the driver's failure.
    fn alloc_error(&self, failure: &AllocFailure) -> CommandError {
        self.op_alloc_error(failure, None)
    }

    /// A failed allocation inside a named eager op (TensorFlow frames its
    /// OOM with the op).
    fn op_alloc_error(&self, failure: &AllocFailure, op: Option<&str>) -> CommandError {
        match &failure.error {
            AllocError::OutOfMemory(oom) => {
                let desc = TensorDesc {
                    shape: &failure.shape,
                    dtype: failure.dtype,
                    op,
                };
                error(
                    ErrorKind::OutOfMemory,
                    oom_message(&self.settings, oom, &desc),
                )
            }
            AllocError::Driver(message) => {
                error(ErrorKind::DeviceError, format!("CUDA error: {message}"))
            }
        }
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

    /// Everything the views draw, with the last `max_events` events.
    pub fn snapshot(&self, max_events: usize) -> Snapshot {
        snapshot::capture(
            &self.process,
            self.step,
            self.settings.framework,
            self.device_info(),
            max_events,
        )
    }

    #[cfg(debug_assertions)]
    /// Checks every invariant of the allocator, the runtime and their
    /// agreement; `Err` names the first broken one.
    pub fn check_invariants(&self) -> Result<(), Broken> {
        self.process.check_invariants()
    }
}

/// A restart whose new process and the previous settings' both failed to
/// start: no process runs until a restart succeeds.
fn no_process(mut e: CommandError) -> CommandError {
    e.message.push_str(
        " (the old process had exited and none could start again: restart to try once more)",
    );
    e
}

#[cfg(all(test, feature = "tf-executor"))]
mod executor_tests;
#[cfg(test)]
mod export_tests;
#[cfg(all(test, feature = "hf-models"))]
mod generating_tests;
#[cfg(all(test, feature = "hf-models"))]
mod hf_training_tests;
#[cfg(test)]
mod jitted_tests;
#[cfg(test)]
mod kinds_tests;
#[cfg(all(test, feature = "kinds-arithmetic"))]
mod learning_tests;
#[cfg(all(test, feature = "kinds-arithmetic", feature = "device-values"))]
mod on_device_attention_tests;
#[cfg(all(test, feature = "kinds-arithmetic", feature = "device-values"))]
mod on_device_cnn_tests;
#[cfg(all(test, feature = "kinds-arithmetic", feature = "device-values"))]
mod on_device_compute_tests;
#[cfg(all(test, feature = "kinds-arithmetic", feature = "device-values"))]
mod on_device_tests;
#[cfg(all(test, feature = "kinds-arithmetic", feature = "device-values"))]
mod on_device_transformer_tests;
#[cfg(test)]
mod optim_tests;
#[cfg(all(test, not(feature = "kinds-arithmetic")))]
mod page_build_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod stepwise_tests;
#[cfg(test)]
mod tests;
