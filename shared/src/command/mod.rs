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

/// The command table: each command's variant, arguments and name, once.
/// It makes the enum (whose serde tag is the name), [`Command::NAMES`],
/// [`Command::name`] and the reader that picks the arguments by name.
macro_rules! commands {
    ($($(#[$doc:meta])* $variant:ident $(($args:ty))? $({$($unit:tt)?})? = $name:literal,)*) => {
        /// One command: one line of Python.
        ///
        /// Written with its `"cmd"` tag by serde; read by [`parse`], which
        /// names every problem (unknown commands and unknown fields
        /// included).
        #[derive(Clone, Debug, PartialEq, Serialize)]
        #[serde(tag = "cmd")]
        pub enum Command {
            $($(#[$doc])* #[serde(rename = $name)] $variant $(($args))? $({$($unit)?})?,)*
        }

        impl Command {
            /// Every command's name, as [`Command::name`] gives it.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The command's name as it appears in `"cmd"`.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Command::$variant $((commands!(@ignore $args)))? $({$($unit)?})? => $name,)*
                }
            }

            /// The command `name` with these fields (`None`: no such command).
            fn read(
                name: &str,
                fields: serde_json::Map<String, serde_json::Value>,
            ) -> Option<Result<Command, serde_json::Error>> {
                Some(match name {
                    $($name => commands!(@read fields, $variant $(, $args)?),)*
                    _ => return None,
                })
            }
        }
    };
    (@ignore $args:ty) => { _ };
    (@read $fields:ident, $variant:ident, $args:ty) => {
        <$args as serde::Deserialize>::deserialize(serde_json::Value::Object($fields)).map(Command::$variant)
    };
    (@read $fields:ident, $variant:ident) => {
        match $fields.keys().next() {
            Some(k) => Err(<serde_json::Error as serde::de::Error>::unknown_field(k, &[])),
            None => Ok(Command::$variant {}),
        }
    };
}

commands! {
    /// Restart the kernel with these settings.
    Restart(RestartSettings) = "restart",
    Alloc(AllocArgs) = "alloc",
    Del(NameArgs) = "del",
    Hold(HoldArgs) = "hold",
    Assign(AssignArgs) = "assign",
    Append(AppendArgs) = "append",
    /// `gc.collect()`
    Gc {} = "gc",
    /// `torch.cuda.empty_cache()`
    EmptyCache {} = "empty_cache",
    /// `torch._C._cuda_clearCublasWorkspaces()`
    ClearCublasWorkspaces {} = "clear_cublas_workspaces",
    /// `tf.keras.backend.clear_session()`
    ClearSession {} = "clear_session",
    /// `torch.cuda.reset_peak_memory_stats()` / `tf.config.experimental.reset_memory_stats`.
    ResetPeakMemoryStats {} = "reset_peak_memory_stats",
    Model(ModelArgs) = "model",
    Optimizer(OptimizerArgs) = "optimizer",
    Data(DataArgs) = "data",
    Forward(ForwardArgs) = "forward",
    Backward(BackwardArgs) = "backward",
    Step(StepArgs) = "step",
    ZeroGrad(ZeroGradArgs) = "zero_grad",
    Train(TrainArgs) = "train",
    FindBatchSize(FindBatchSizeArgs) = "find_batch_size",
    Estimate(EstimateArgs) = "estimate",
    /// `out = model.generate(input_ids, max_new_tokens=N)`: a Hugging Face model's.
    Generate(GenerateArgs) = "generate",
    /// `model = prepare_model_for_kbit_training(model)` (peft).
    PrepareKbit(ModelRef) = "prepare_kbit",
    /// `model = get_peft_model(model, LoraConfig(r=rank))` on a Hugging Face model.
    Lora(LoraArgs) = "lora",
    /// `llm = LLM(model=...)`: vLLM's engine in a process of its own.
    Serve(ServeArgs) = "serve",
    /// `sess = tf.compat.v1.Session()`: owns the variables of models built while it is open.
    TfSession(NameArgs) = "tf_session",
    /// `sess.close()`
    Close(NameArgs) = "close",
}
