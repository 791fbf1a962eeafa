//! The command vocabulary and the result records: the one definition of the
//! JSON that the headless runner, the lesson files and (later) the websocket
//! speak. A command is a JSON object with a `"cmd"` field.

use crate::snapshot::Stats;
pub use crate::train::OptimizerKind;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// Version of the wire format; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// The framework whose allocator the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    Pytorch,
    Tensorflow,
    Jax,
}

impl Framework {
    pub fn display_name(self) -> &'static str {
        match self {
            Framework::Pytorch => "PyTorch",
            Framework::Tensorflow => "TensorFlow",
            Framework::Jax => "JAX",
        }
    }
}

/// Element types a tensor can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Float64,
    Float32,
    Float16,
    Bfloat16,
    Int64,
    Int32,
    Int16,
    Int8,
    Uint8,
    Bool,
}

impl Dtype {
    pub fn size_bytes(self) -> u64 {
        match self {
            Dtype::Float64 | Dtype::Int64 => 8,
            Dtype::Float32 | Dtype::Int32 => 4,
            Dtype::Float16 | Dtype::Bfloat16 | Dtype::Int16 => 2,
            Dtype::Int8 | Dtype::Uint8 | Dtype::Bool => 1,
        }
    }

    /// The name `torch` uses (`torch.float32`).
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::Float64 => "float64",
            Dtype::Float32 => "float32",
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Int64 => "int64",
            Dtype::Int32 => "int32",
            Dtype::Int16 => "int16",
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Bool => "bool",
        }
    }

    /// The name TensorFlow prints in its OOM message (`DataTypeString`).
    pub fn tf_name(self) -> &'static str {
        match self {
            Dtype::Float64 => "double",
            Dtype::Float32 => "float",
            Dtype::Float16 => "half",
            other => other.torch_name(),
        }
    }
}

/// What a block of memory holds (the memory_viz legend).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Input,
    Temporary,
    #[default]
    Other,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
        Category::Temporary,
        Category::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Input => "input",
            Category::Temporary => "temporary",
            Category::Other => "other",
        }
    }
}

/// Deserializes a field that may be absent (keep the old value), `null`
/// (back to the default) or a value.
fn nullable<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// `restart`: every field optional; an omitted one keeps its value, a
/// nullable one set to `null` goes back to its default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<Framework>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_bytes: Option<u64>,
    /// Memory other processes hold on the same GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_processes_bytes: Option<u64>,
    /// TensorFlow `allow_growth` / `set_memory_growth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_growth: Option<bool>,
    /// TensorFlow's memory limit (a logical device's `memory_limit`); `null`
    /// for the default rule.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_limit_bytes: Option<Option<u64>>,
    /// `TF_ENABLE_GPU_GARBAGE_COLLECTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_garbage_collection: Option<bool>,
    /// `XLA_PYTHON_CLIENT_PREALLOCATE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocate: Option<bool>,
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_fraction: Option<f64>,
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING=1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_caching: Option<bool>,
    /// `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N`; `null` for unlimited.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_split_size_mb: Option<Option<u64>>,
    /// `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:F`; 0 is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub garbage_collection_threshold: Option<f64>,
    /// `torch.cuda.set_per_process_memory_fraction(F)`; `null` for none.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub per_process_memory_fraction: Option<Option<f64>>,
}

/// One command: one line of Python.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Restart the kernel with these settings.
    Restart(RestartSettings),
    /// `x = torch.empty(...)` on the GPU: `bytes`, or `shape` and `dtype`.
    Alloc {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shape: Option<Vec<u64>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dtype: Option<Dtype>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        category: Option<Category>,
    },
    /// `del x`
    Del { name: String },
    /// `h = [x, y]` and, with `cycle`, `h.append(h)`.
    Hold {
        name: String,
        items: Vec<String>,
        #[serde(default)]
        cycle: bool,
    },
    /// `gc.collect()`
    Gc {},
    /// `torch.cuda.empty_cache()`
    EmptyCache {},
    /// `tf.keras.backend.clear_session()`
    ClearSession {},
    /// `torch.cuda.reset_peak_memory_stats()` / `tf.config.experimental.reset_memory_stats`.
    ResetPeakMemoryStats {},
    /// `model = MLP(...).cuda()`: `layers` hidden layers of `width`. With
    /// `keras` (always under TensorFlow) Keras's global state holds it too.
    Model {
        name: String,
        #[serde(default = "default_layers")]
        layers: u32,
        #[serde(default = "default_width")]
        width: u64,
        #[serde(default = "default_features")]
        input_dim: u64,
        #[serde(default = "default_classes")]
        classes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dtype: Option<Dtype>,
        #[serde(default)]
        keras: bool,
    },
    /// `opt = torch.optim.Adam(model.parameters())`; state comes at the first step.
    Optimizer {
        name: String,
        model: String,
        kind: OptimizerKind,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lr: Option<f32>,
    },
    /// A synthetic, learnable classification set; `on_device` puts all of it on the GPU.
    Data {
        name: String,
        #[serde(default = "default_samples")]
        samples: u64,
        #[serde(default = "default_features")]
        features: u64,
        #[serde(default = "default_classes")]
        classes: u64,
        #[serde(default)]
        on_device: bool,
    },
    /// `loss = criterion(model(x), y)`: the loss keeps the graph alive.
    Forward {
        name: String,
        model: String,
        data: String,
        #[serde(default = "default_batch")]
        batch_size: u64,
        #[serde(default)]
        no_grad: bool,
        #[serde(default)]
        amp: bool,
        #[serde(default)]
        checkpointing: bool,
    },
    /// `loss.backward(retain_graph=...)`
    Backward {
        name: String,
        #[serde(default)]
        retain_graph: bool,
    },
    /// `opt.step()`
    Step { optimizer: String },
    /// `opt.zero_grad(set_to_none=...)`
    ZeroGrad {
        optimizer: String,
        #[serde(default = "yes")]
        set_to_none: bool,
    },
    /// The training loop.
    Train {
        model: String,
        optimizer: String,
        data: String,
        #[serde(default = "default_steps")]
        steps: u64,
        #[serde(default = "default_batch")]
        batch_size: u64,
        #[serde(default = "one")]
        accumulate: u64,
        #[serde(default)]
        checkpointing: bool,
        #[serde(default)]
        amp: bool,
        #[serde(default = "yes")]
        set_to_none: bool,
        #[serde(default)]
        loss_history: LossHistory,
    },
    /// The largest batch whose step peak stays under `threshold` of the memory limit.
    FindBatchSize {
        model: String,
        optimizer: String,
        data: String,
        #[serde(default = "default_threshold")]
        threshold: f64,
    },
    /// Predicts a training step's memory from the shapes, before running it.
    Estimate {
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        optimizer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(default = "default_batch")]
        batch_size: u64,
        #[serde(default = "one")]
        accumulate: u64,
        #[serde(default)]
        amp: bool,
        #[serde(default)]
        checkpointing: bool,
        #[serde(default = "yes")]
        set_to_none: bool,
    },
    /// `sess = tf.compat.v1.Session()`: owns the variables of models built while it is open.
    TfSession { name: String },
    /// `sess.close()`
    Close { name: String },
}

/// How the loop keeps its running loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossHistory {
    /// `total_loss += loss.item()`: a Python float.
    #[default]
    Item,
    /// `total_loss += loss`: a tensor whose history keeps every step's loss.
    Tensor,
}

fn default_layers() -> u32 {
    4
}
fn default_width() -> u64 {
    1024
}
fn default_features() -> u64 {
    784
}
fn default_classes() -> u64 {
    10
}
fn default_samples() -> u64 {
    60_000
}
fn default_batch() -> u64 {
    64
}
fn default_steps() -> u64 {
    10
}
fn default_threshold() -> f64 {
    0.8
}
fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}

impl Command {
    /// The command's name as it appears in `"cmd"`.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Restart(_) => "restart",
            Command::Alloc { .. } => "alloc",
            Command::Del { .. } => "del",
            Command::Hold { .. } => "hold",
            Command::Gc {} => "gc",
            Command::EmptyCache {} => "empty_cache",
            Command::ClearSession {} => "clear_session",
            Command::ResetPeakMemoryStats {} => "reset_peak_memory_stats",
            Command::Model { .. } => "model",
            Command::Optimizer { .. } => "optimizer",
            Command::Data { .. } => "data",
            Command::Forward { .. } => "forward",
            Command::Backward { .. } => "backward",
            Command::Step { .. } => "step",
            Command::ZeroGrad { .. } => "zero_grad",
            Command::Train { .. } => "train",
            Command::FindBatchSize { .. } => "find_batch_size",
            Command::Estimate { .. } => "estimate",
            Command::TfSession { .. } => "tf_session",
            Command::Close { .. } => "close",
        }
    }
}

/// Kinds of error a command can end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The line is not JSON.
    ParseError,
    /// JSON, but not a command: unknown command, missing or wrong field.
    InvalidCommand,
    /// A value out of range: a size, a fraction, a setting.
    InvalidValue,
    /// Python's `NameError`: the name is not bound.
    NameError,
    /// The framework ran out of device memory.
    OutOfMemory,
    /// What Python raises as a `RuntimeError`: a second backward through a
    /// freed graph, a closed session.
    RuntimeError,
    /// A websocket message that is not a valid client message.
    BadMessage,
    /// The message is larger than the server accepts.
    TooLarge,
    /// More commands per second than the server accepts from one connection.
    RateLimited,
    /// The session is running a command and its queue is full.
    Busy,
    /// A watcher tried to change the session.
    ReadOnly,
    /// The session or watch id is not known (or expired).
    UnknownSession,
    /// The server holds as many sessions as it may.
    SessionLimit,
}

/// An error as a value: what went wrong, in words a user understands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CommandError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for CommandError {}

/// Fields a lesson file may add to any command line; the runner ignores
/// them, the lesson checker reads them.
pub const ANNOTATION_KEYS: [&str; 3] = ["say", "expect", "why"];

/// A lesson step's words and expected observation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Annotations {
    /// What the step asks the learner to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub say: Option<String>,
    /// Why the numbers move as they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Stats (and `ok`, `error_kind`, `error_contains`, `note_contains`)
    /// expected after the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<BTreeMap<String, Value>>,
}

/// One parsed input line: the command as written (annotations removed),
/// the command, and any lesson annotations.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandLine {
    /// The JSON as written, minus annotations (echoed in results).
    pub raw: Value,
    pub command: Result<Command, CommandError>,
    pub annotations: Annotations,
}

/// Parses one JSON line into a command, keeping what was written for the
/// echo even when it is not a valid command.
pub fn parse_line(line: &str) -> CommandLine {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return CommandLine {
                raw: Value::String(line.to_string()),
                command: Err(CommandError::new(
                    ErrorKind::ParseError,
                    format!("not JSON: {e}"),
                )),
                annotations: Annotations::default(),
            }
        }
    };
    parse_value(value)
}

/// Like [`parse_line`], from a JSON value.
pub fn parse_value(mut value: Value) -> CommandLine {
    let mut annotations = Annotations::default();
    let mut annotation_error = None;
    if let Value::Object(map) = &mut value {
        let mut taken = serde_json::Map::new();
        for key in ANNOTATION_KEYS {
            if let Some(v) = map.remove(key) {
                taken.insert(key.to_string(), v);
            }
        }
        match serde_json::from_value(Value::Object(taken)) {
            Ok(a) => annotations = a,
            Err(e) => {
                annotation_error = Some(CommandError::new(
                    ErrorKind::InvalidCommand,
                    format!("bad lesson annotation: {e}"),
                ))
            }
        }
    }
    let command = match annotation_error {
        Some(e) => Err(e),
        None => command_from_value(&value),
    };
    CommandLine {
        raw: value,
        command,
        annotations,
    }
}

fn command_from_value(value: &Value) -> Result<Command, CommandError> {
    let Value::Object(map) = value else {
        return Err(CommandError::new(
            ErrorKind::InvalidCommand,
            format!(
                "a command is a JSON object with a \"cmd\" field, not {}",
                json_type(value)
            ),
        ));
    };
    match map.get("cmd") {
        None => {
            return Err(CommandError::new(
                ErrorKind::InvalidCommand,
                "missing field `cmd`: say which command, e.g. {\"cmd\":\"alloc\",\"name\":\"x\",\"bytes\":1024}",
            ))
        }
        Some(Value::String(_)) => {}
        Some(other) => {
            return Err(CommandError::new(
                ErrorKind::InvalidCommand,
                format!("`cmd` must be a string, not {}", json_type(other)),
            ))
        }
    }
    Command::deserialize(value).map_err(|e| {
        let cmd = map.get("cmd").and_then(Value::as_str).unwrap_or("?");
        let text = e.to_string();
        let message = if text.starts_with("unknown variant") {
            format!("unknown command {cmd:?}: {text}")
        } else {
            format!("bad {cmd:?} command: {text}")
        };
        CommandError::new(ErrorKind::InvalidCommand, message)
    })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One line of `vramlab run` output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u64,
    pub cmd: Value,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CommandError>,
    /// A short explanation of what the command did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the command returns, for commands that return something
    /// (losses, estimates, batch-size trials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    pub stats: Stats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_design_examples() {
        let c = parse_line(r#"{"cmd":"alloc", "name":"x", "bytes":1024}"#);
        assert_eq!(
            c.command.unwrap(),
            Command::Alloc {
                name: "x".into(),
                bytes: Some(1024),
                shape: None,
                dtype: None,
                category: None
            }
        );
        let c = parse_line(r#"{"cmd":"hold", "name":"h", "items":["x","y"], "cycle":true}"#);
        assert!(matches!(
            c.command.unwrap(),
            Command::Hold { cycle: true, .. }
        ));
        let c = parse_line(r#"{"cmd":"restart","framework":"jax","preallocate":false}"#);
        let Command::Restart(s) = c.command.unwrap() else {
            panic!()
        };
        assert_eq!(s.framework, Some(Framework::Jax));
        assert_eq!(s.preallocate, Some(false));
        assert_eq!(s.memory_limit_bytes, None);
        let c = parse_line(r#"{"cmd":"restart","memory_limit_bytes":null}"#);
        let Command::Restart(s) = c.command.unwrap() else {
            panic!()
        };
        assert_eq!(s.memory_limit_bytes, Some(None));
        assert_eq!(
            parse_line(r#"{"cmd":"gc"}"#).command.unwrap(),
            Command::Gc {}
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let msg = |line: &str| parse_line(line).command.unwrap_err();
        assert_eq!(msg("nope").kind, ErrorKind::ParseError);
        let e = msg(r#"{"cmd":"launch"}"#);
        assert_eq!(e.kind, ErrorKind::InvalidCommand);
        assert!(
            e.message.contains("unknown command \"launch\""),
            "{}",
            e.message
        );
        assert!(msg(r#"{"cmd":"del"}"#)
            .message
            .contains("missing field `name`"));
        assert!(msg(r#"{"cmd":"alloc","name":"x","bytes":-1}"#)
            .message
            .contains("invalid value"));
        assert!(msg(r#"{"cmd":"alloc","name":"x","byts":1}"#)
            .message
            .contains("unknown field `byts`"));
        assert!(msg(r#"{"cmd":"gc","now":true}"#)
            .message
            .contains("unknown field"));
        assert!(msg(r#"[1,2]"#).message.contains("not an array"));
        assert!(msg(r#"{"name":"x"}"#)
            .message
            .contains("missing field `cmd`"));
        assert!(msg(r#"{"cmd":7}"#).message.contains("must be a string"));
    }

    #[test]
    fn annotations_are_split_off() {
        let c = parse_line(r#"{"cmd":"gc","say":"collect","expect":{"allocated_bytes":0}}"#);
        assert_eq!(c.command.unwrap(), Command::Gc {});
        assert_eq!(c.raw, serde_json::json!({"cmd":"gc"}));
        assert_eq!(c.annotations.say.as_deref(), Some("collect"));
        assert_eq!(c.annotations.expect.unwrap()["allocated_bytes"], 0);
    }

    #[test]
    fn commands_round_trip() {
        for line in [
            r#"{"cmd":"alloc","name":"x","shape":[2,3],"dtype":"float16","category":"activation"}"#,
            r#"{"cmd":"del","name":"x"}"#,
            r#"{"cmd":"empty_cache"}"#,
            r#"{"cmd":"restart","framework":"tensorflow","allow_growth":true}"#,
        ] {
            let c = parse_line(line).command.unwrap();
            let back = serde_json::to_string(&c).unwrap();
            assert_eq!(parse_line(&back).command.unwrap(), c, "{back}");
        }
    }
}

// ----- the websocket --------------------------------------------------------

/// Messages from a client to the server, tagged by `"type"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Run a command; its result comes back with the same `id`.
    Command {
        id: u64,
        command: Value,
    },
    /// Receive live snapshots and events.
    Subscribe {},
    Unsubscribe {},
    /// Send a full snapshot now.
    Snapshot {},
    /// Stop the running command after its current step.
    Stop {},
    Ping {
        #[serde(default)]
        nonce: u64,
    },
}

/// Whether a connection may change the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Owner,
    /// Sees everything live, changes nothing (team demos).
    Watcher,
}

/// The server's limits, as the client should know them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_message_bytes: u64,
    pub commands_per_second: u32,
    pub snapshot_interval_ms: u64,
    pub session_ttl_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_quota_bytes: Option<u64>,
}

/// The first message on every connection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub session_id: String,
    /// Owners get the id a watcher joins with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch_id: Option<String>,
    pub role: Role,
    /// The session existed before this connection.
    pub resumed: bool,
    /// `sim` or `cuda`.
    pub backend: String,
    pub device: crate::device::DeviceInfo,
    pub framework: Framework,
    pub settings: crate::framework::Settings,
    pub limits: Limits,
}

/// Messages from the server, tagged by `"type"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    Hello(Box<Hello>),
    /// The result of the command with this id (never dropped).
    Result {
        id: u64,
        #[serde(flatten)]
        record: Box<StepRecord>,
    },
    /// A running command finished another step.
    Progress {
        id: u64,
        done: u64,
        total: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loss: Option<f32>,
    },
    /// Everything, on connect and on request.
    Snapshot {
        snapshot: Box<crate::snapshot::Snapshot>,
    },
    /// What changed since the last snapshot or delta this client received,
    /// with the exact peaks in between.
    Delta(Box<crate::snapshot::SnapshotDelta>),
    /// Events since the last batch; `dropped` counts events this client
    /// missed because it was slow.
    Events {
        events: Vec<crate::snapshot::Event>,
        dropped: u64,
    },
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        error: CommandError,
    },
    Pong {
        nonce: u64,
    },
}

/// Parses a client message; the error names the problem.
pub fn parse_client_message(text: &str) -> Result<ClientMessage, CommandError> {
    serde_json::from_str(text).map_err(|e| {
        CommandError::new(
            ErrorKind::BadMessage,
            format!("not a client message ({e}); expected e.g. {{\"type\":\"command\",\"id\":1,\"command\":{{\"cmd\":\"gc\"}}}}"),
        )
    })
}
