//! What a device that runs code is asked to run: a kernel by name over a
//! grid, with its arguments, or a matrix product as cuBLAS's `GemmEx`
//! takes it (column-major). `train::kernels` decides which calls compute
//! a step's op; a GPU backend carries them out on the addresses the
//! allocator gave each tensor ([`DeviceCompute`]).

use vramlab_core::error::DeviceError;
use vramlab_core::types::Dtype;

/// A device's own kernels and BLAS, on its memory.
pub trait DeviceCompute {
    fn launch(&mut self, launch: &Launch) -> Result<(), DeviceError>;
    fn gemm(&mut self, gemm: &GemmEx) -> Result<(), DeviceError>;
}

/// One call on the device.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    Launch(Launch),
    Gemm(GemmEx),
}

impl Call {
    /// Carries the call out on `device`.
    pub fn run(&self, device: &mut dyn DeviceCompute) -> Result<(), DeviceError> {
        match self {
            Call::Launch(l) => device.launch(l),
            Call::Gemm(g) => device.gemm(g),
        }
    }
}

/// A kernel of `train::kernels::SOURCE`, by name, over `grid`.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: Grid,
    pub args: Vec<KernelArg>,
}

/// How many blocks of [`BLOCK_THREADS`] a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// Enough to cover `n` elements (the kernel loops over the rest).
    Elements(u64),
    /// One block per row.
    Rows(u64),
}

/// Threads per block, every kernel's (the reductions' shared arrays are
/// this long).
pub const BLOCK_THREADS: u32 = 256;

/// Blocks at most in a launch over elements (each kernel strides over
/// the rest).
pub const MAX_BLOCKS: u64 = 1 << 16;

impl Grid {
    /// The launch's blocks.
    pub fn blocks(self) -> u64 {
        match self {
            Grid::Elements(n) => n.div_ceil(u64::from(BLOCK_THREADS)).clamp(1, MAX_BLOCKS),
            Grid::Rows(rows) => rows.max(1),
        }
    }
}

/// One argument of a kernel, as its parameter is declared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// A device address (`void*`).
    Ptr(u64),
    /// `long long`.
    I64(i64),
    /// `int`: an element type's code ([`type_code`]), a flag.
    I32(i32),
    /// `float`.
    F32(f32),
}

/// The code the kernels read an element type by (`ld` and `st` in the
/// kernels' source).
pub fn type_code(dtype: Dtype) -> i32 {
    match dtype {
        Dtype::Float32 => 0,
        Dtype::Float16 => 1,
        Dtype::Bfloat16 => 2,
        Dtype::Float64 => 3,
        Dtype::Int64 => 4,
        Dtype::Int32 => 5,
        Dtype::Int16 => 6,
        Dtype::Int8 => 7,
        Dtype::Uint8 | Dtype::Bool => 8,
    }
}

/// `cublasGemmEx`/`cublasGemmStridedBatchedEx`, column-major:
/// `c = alpha · op(a) · op(b) + beta · c`, `op(a)` m x k, `op(b)` k x n,
/// `batch` times at the strides given; computed in float32
/// (`CUBLAS_COMPUTE_32F`) with `workspace` as cuBLAS's, when the
/// allocator gave the call one.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmEx {
    pub transa: bool,
    pub transb: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: Matrix,
    pub b: Matrix,
    pub c: Matrix,
    pub batch: u64,
    pub alpha: f32,
    pub beta: f32,
    pub workspace: Option<(u64, u64)>,
}

/// A matrix operand: its address, element type, leading dimension and
/// the stride between a batch's matrices (elements).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matrix {
    pub at: u64,
    pub dtype: Dtype,
    pub ld: u64,
    pub stride: u64,
}
