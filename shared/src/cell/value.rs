//! What an expression stands for, worked out without running Python: a
//! number, a new tensor (on the GPU or the host), a name in the kernel, a
//! layer, a model, an optimizer, a data loader, a forward pass.

use crate::command::ModelArgs;
use crate::train::OptimizerSpec;
use crate::types::Dtype;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i128),
    Float(f64),
    Str(String),
    Bool(bool),
    None,
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dtype(Dtype),
    /// `"cuda"`, `torch.device("cuda")`: true on the GPU.
    Device(bool),
    /// A function or module not called yet, by its full path.
    Func(String),
    /// An object in the kernel, by name.
    Object(String),
    /// A new tensor; `gpu: false` is a host array (no GPU memory).
    Tensor(TensorInfo),
    /// `nn.Linear(784, 1024)`, `layers.Dense(1024)`; `None` for layers without weights.
    Layer(Option<(Option<u64>, u64)>),
    Model(ModelArgs),
    /// The kind, `lr`, and the model whose `parameters()` it was given.
    Optimizer(OptimizerSpec, Option<f32>, Option<String>),
    /// `TensorDataset(X, y)`: samples and features, and whether it is on the GPU.
    Dataset(u64, u64, bool),
    /// `DataLoader(dataset, batch_size=...)`.
    Loader(Loader),
    /// One batch drawn from the loader of that name (`x, y` in a loop).
    Batch(String),
    /// `model(x)`, then `criterion(model(x), y)`, maybe `/ k`.
    Forward(Forward),
    /// `nn.CrossEntropyLoss()`, `F.cross_entropy`: a loss function.
    Criterion,
    /// `keras.Input(shape=(784,))`, `Flatten(input_shape=(28, 28))`: the input features.
    Input(u64),
    /// `model.parameters()`
    Params(String),
    /// `tf.compat.v1.Session()`
    Session,
    /// `receiver.method`, not called yet.
    Method(Box<Value>, String),
    /// A call done for what it does: the commands it stands for.
    Effect(Vec<crate::command::Command>),
    /// Keras's `model.compile(...)`: its commands, and `jit_compile`.
    Compile(Vec<crate::command::Command>, bool),
    /// Anything else the cell keeps but does not use.
    Opaque,
}

/// What the cell knows of an array: its shape, type and device (the
/// runtime's tensor object is `runtime::Tensor`).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub gpu: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Loader {
    pub samples: u64,
    pub features: u64,
    pub batch: u64,
    pub on_device: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub model: String,
    pub loader: String,
    pub checkpointing: bool,
    pub loss: bool,
}

impl Value {
    pub fn int(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i128::from(*b)),
            _ => None,
        }
    }

    /// A positive whole number (a size, a count of steps).
    pub fn count(&self) -> Option<u64> {
        self.int()
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&i| i > 0)
    }

    pub fn float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            other => other.int().map(|i| i as f64),
        }
    }

    /// A shape: `3`, `(3, 4)`, `[3, 4]`.
    pub fn shape(&self) -> Option<Vec<u64>> {
        match self {
            Value::Tuple(items) | Value::List(items) => items
                .iter()
                .map(|v| v.int().and_then(|i| u64::try_from(i).ok()))
                .collect(),
            v => Some(vec![u64::try_from(v.int()?).ok()?]),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Value::Object(n) => format!("`{n}`"),
            Value::Tensor(t) if t.gpu => "a GPU tensor".into(),
            Value::Tensor(_) => "a host (CPU) array".into(),
            Value::Func(f) => format!("`{f}`"),
            other => other.kind().into(),
        }
    }

    /// The variant's name in lower case: what a message calls the value.
    fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bool(_) => "bool",
            Value::None => "none",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dtype(_) => "dtype",
            Value::Device(_) => "device",
            Value::Func(_) => "func",
            Value::Object(_) => "object",
            Value::Tensor(_) => "tensor",
            Value::Layer(_) => "layer",
            Value::Model(_) => "model",
            Value::Optimizer(..) => "optimizer",
            Value::Dataset(..) => "dataset",
            Value::Loader(_) => "loader",
            Value::Batch(_) => "batch",
            Value::Forward(_) => "forward",
            Value::Criterion => "criterion",
            Value::Input(_) => "input",
            Value::Params(_) => "params",
            Value::Session => "session",
            Value::Method(..) => "method",
            Value::Effect(_) | Value::Compile(..) => "effect",
            Value::Opaque => "opaque",
        }
    }
}

/// The arguments of a call, evaluated.
pub struct Args {
    pub pos: Vec<Value>,
    pub kw: Vec<(String, Value)>,
}

impl Args {
    pub fn get(&self, i: usize, key: &str) -> Option<&Value> {
        self.kw
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .or_else(|| self.pos.get(i))
    }

    pub fn kw(&self, key: &str) -> Option<&Value> {
        self.kw.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The GPU or host from `device=` (a string or `torch.device`).
    pub fn device(&self) -> Option<bool> {
        match self.kw("device")? {
            Value::Device(gpu) => Some(*gpu),
            Value::Str(s) => Some(is_cuda(s)),
            _ => None,
        }
    }

    pub fn dtype(&self, key: &str) -> Result<Option<Dtype>, String> {
        match self.kw(key) {
            None => Ok(None),
            Some(Value::Dtype(d)) => Ok(Some(*d)),
            Some(Value::Str(s)) => dtype_named(s)
                .map(Some)
                .ok_or_else(|| format!("unknown dtype {s:?}")),
            Some(other) => Err(format!("{key}= must be a dtype, not {}", other.describe())),
        }
    }
}

pub fn is_cuda(s: &str) -> bool {
    s == "cuda" || s.starts_with("cuda:") || s == "gpu"
}

/// `float32`, `half`, `bfloat16`, `uint8`, ... by their Python names.
pub fn dtype_named(name: &str) -> Option<Dtype> {
    Some(match name {
        "float32" | "float" => Dtype::Float32,
        "float16" | "half" => Dtype::Float16,
        "bfloat16" => Dtype::Bfloat16,
        "float64" | "double" => Dtype::Float64,
        "int64" | "long" => Dtype::Int64,
        "int32" | "int" => Dtype::Int32,
        "uint8" => Dtype::Uint8,
        "int8" => Dtype::Int8,
        "bool" => Dtype::Bool,
        _ => return None,
    })
}
