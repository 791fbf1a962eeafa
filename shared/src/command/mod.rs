//! The command vocabulary: one command is one line of Python, a JSON object
//! with a `"cmd"` field. Each command's arguments are one struct
//! ([`args`]); [`parse`] reads a line, lesson annotations split off.

mod amp;
pub mod args;
pub mod parse;
mod read;

pub use crate::framework::RestartSettings;
pub use amp::Amp;
pub use args::*;
pub use parse::{parse_line, parse_value, Annotations, CommandLine, ANNOTATION_KEYS};
pub use read::FIELDS_BY_HAND;
use serde::Serialize;

/// One command: one line of Python.
///
/// Written with its `"cmd"` tag by serde; read by [`parse`], which names
/// every problem (unknown commands and unknown fields included).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Restart the kernel with these settings.
    Restart(RestartSettings),
    Alloc(AllocArgs),
    Del(NameArgs),
    Hold(HoldArgs),
    Assign(AssignArgs),
    Append(AppendArgs),
    /// `gc.collect()`
    Gc {},
    /// `torch.cuda.empty_cache()`
    EmptyCache {},
    /// `torch._C._cuda_clearCublasWorkspaces()`
    ClearCublasWorkspaces {},
    /// `tf.keras.backend.clear_session()`
    ClearSession {},
    /// `torch.cuda.reset_peak_memory_stats()` / `tf.config.experimental.reset_memory_stats`.
    ResetPeakMemoryStats {},
    Model(ModelArgs),
    Optimizer(OptimizerArgs),
    Data(DataArgs),
    Forward(ForwardArgs),
    Backward(BackwardArgs),
    Step(StepArgs),
    ZeroGrad(ZeroGradArgs),
    Train(TrainArgs),
    FindBatchSize(FindBatchSizeArgs),
    Estimate(EstimateArgs),
    /// `sess = tf.compat.v1.Session()`: owns the variables of models built while it is open.
    TfSession(NameArgs),
    /// `sess.close()`
    Close(NameArgs),
}

impl Command {
    /// Every command's name, as [`Command::name`] gives it.
    pub const NAMES: [&'static str; 23] = [
        "restart",
        "alloc",
        "del",
        "hold",
        "assign",
        "append",
        "gc",
        "empty_cache",
        "clear_cublas_workspaces",
        "clear_session",
        "reset_peak_memory_stats",
        "model",
        "optimizer",
        "data",
        "forward",
        "backward",
        "step",
        "zero_grad",
        "train",
        "find_batch_size",
        "estimate",
        "tf_session",
        "close",
    ];

    /// The command's name as it appears in `"cmd"`.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Restart(_) => "restart",
            Command::Alloc(_) => "alloc",
            Command::Del(_) => "del",
            Command::Hold(_) => "hold",
            Command::Assign(_) => "assign",
            Command::Append(_) => "append",
            Command::Gc {} => "gc",
            Command::EmptyCache {} => "empty_cache",
            Command::ClearCublasWorkspaces {} => "clear_cublas_workspaces",
            Command::ClearSession {} => "clear_session",
            Command::ResetPeakMemoryStats {} => "reset_peak_memory_stats",
            Command::Model(_) => "model",
            Command::Optimizer(_) => "optimizer",
            Command::Data(_) => "data",
            Command::Forward(_) => "forward",
            Command::Backward(_) => "backward",
            Command::Step(_) => "step",
            Command::ZeroGrad(_) => "zero_grad",
            Command::Train(_) => "train",
            Command::FindBatchSize(_) => "find_batch_size",
            Command::Estimate(_) => "estimate",
            Command::TfSession(_) => "tf_session",
            Command::Close(_) => "close",
        }
    }
}
