//! The plain words of the domain, used by every layer above: which
//! framework, which element type, what a block of memory holds.

use serde::Serialize;

/// The framework whose allocator the process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    Pytorch,
    Tensorflow,
    Jax,
}

crate::read_by_name!(Framework {
    Pytorch = "pytorch",
    Tensorflow = "tensorflow",
    Jax = "jax",
});

impl Framework {
    pub const ALL: [Framework; 3] = [Framework::Pytorch, Framework::Tensorflow, Framework::Jax];

    /// The name on the wire and in URLs: `pytorch`, `tensorflow`, `jax`.
    pub fn id(self) -> &'static str {
        match self {
            Framework::Pytorch => "pytorch",
            Framework::Tensorflow => "tensorflow",
            Framework::Jax => "jax",
        }
    }

    /// The framework a wire name stands for.
    pub fn from_id(id: &str) -> Option<Framework> {
        Framework::ALL.into_iter().find(|f| f.id() == id)
    }

    pub fn display_name(self) -> &'static str {
        match self {
            Framework::Pytorch => "PyTorch",
            Framework::Tensorflow => "TensorFlow",
            Framework::Jax => "JAX",
        }
    }
}

/// Element types a tensor can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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

crate::read_by_name!(Dtype {
    Float64 = "float64",
    Float32 = "float32",
    Float16 = "float16",
    Bfloat16 = "bfloat16",
    Int64 = "int64",
    Int32 = "int32",
    Int16 = "int16",
    Int8 = "int8",
    Uint8 = "uint8",
    Bool = "bool",
});

impl Dtype {
    #[inline]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Activation,
    Input,
    Temporary,
    /// A library's scratch memory allocated through the framework's
    /// allocator: PyTorch's cuBLAS workspaces.
    Workspace,
    /// A language model's keys and values kept for the next tokens
    /// (transformers' `DynamicCache`, `StaticCache`).
    KvCache,
    #[default]
    Other,
}

crate::read_by_name!(Category {
    Parameter = "parameter",
    Gradient = "gradient",
    OptimizerState = "optimizer_state",
    Activation = "activation",
    Input = "input",
    Temporary = "temporary",
    Workspace = "workspace",
    KvCache = "kv_cache",
    Other = "other",
});

impl Category {
    pub const ALL: [Category; 9] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Input,
        Category::Temporary,
        Category::Workspace,
        Category::KvCache,
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
            Category::Workspace => "workspace",
            Category::KvCache => "kv_cache",
            Category::Other => "other",
        }
    }
}
