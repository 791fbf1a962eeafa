//! The step's kernels on the GPU: `train::kernels::SOURCE` compiled by
//! NVRTC to a cubin for the GPU's compute capability (once per capability
//! in a process, and kept on disk for the next: `cubin_cache`), loaded
//! into a kernel's CUDA context beside a cuBLAS
//! handle; launches and `GemmEx` calls on the legacy default stream, the
//! one `cuMemcpyHtoD`/`DtoH` order against, so a value read back is the
//! one computed.

use super::cubin_cache;
use super::timing::{self, CallTimes};
use cudarc::cublas::sys as blas;
use cudarc::driver::{result as driver, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::{Mutex, OnceLock};
use vramlab_shared::compute::{GemmEx, KernelArg, Launch, Matrix, BLOCK_THREADS};
use vramlab_shared::train::kernels::{NAMES, SOURCE};
use vramlab_shared::types::Dtype;
use vramlab_shared::DeviceError;

/// The compute capabilities CI compiles the kernels for: Turing (T4),
/// Ampere (A100), Ada (L4, RTX 4090) and Hopper (H100, H200).
pub const ARCHITECTURES: [(u32, u32); 4] = [(7, 5), (8, 0), (8, 9), (9, 0)];

/// NVRTC's options for compute capability `cc`. Every function is device
/// code (the source has no host code), the generic lambdas of its type
/// dispatch included.
fn options(cc: (u32, u32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{}{}", cc.0, cc.1),
        "--device-as-default-execution-space".to_string(),
    ]
}

/// The kernels compiled for compute capability `cc`: a cubin, or why
/// NVRTC could not make one (its library missing, or its log).
pub fn compile(cc: (u32, u32)) -> Result<Vec<u8>, String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(
            "the NVRTC library (libnvrtc.so.13) is not installed: put the CUDA toolkit's or \
             the nvidia-cuda-nvrtc wheel's lib folder on LD_LIBRARY_PATH"
                .into(),
        );
    }
    let source = CString::new(SOURCE).map_err(|e| e.to_string())?;
    let name = CString::new("vramlab_kernels.cu").map_err(|e| e.to_string())?;
    let program = nvrtc::create_program(&source, Some(&name)).map_err(|e| format!("{e:?}"))?;
    let options = options(cc);
    // SAFETY: `program` was just created and is destroyed below, once.
    let cubin = unsafe {
        let compiled = nvrtc::compile_program(program, &options);
        let out = match compiled {
            Ok(()) => cubin_of(program),
            Err(e) => Err(format!("NVRTC: {e:?}: {}", log_of(program))),
        };
        let _ = nvrtc::destroy_program(program);
        out
    };
    cubin.map_err(|e| format!("compiling the kernels for sm_{}{}: {e}", cc.0, cc.1))
}

/// # Safety
/// `program` compiled.
unsafe fn cubin_of(program: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    let status = unsafe { nvrtc_sys::nvrtcGetCUBINSize(program, &mut size) };
    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(format!("no cubin: {status:?}"));
    }
    let mut cubin = vec![0u8; size];
    let status = unsafe { nvrtc_sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast()) };
    match status {
        nvrtc_sys::nvrtcResult::NVRTC_SUCCESS => Ok(cubin),
        other => Err(format!("no cubin: {other:?}")),
    }
}

/// # Safety
/// `program` is live.
unsafe fn log_of(program: nvrtc_sys::nvrtcProgram) -> String {
    match unsafe { nvrtc::get_program_log(program) } {
        Ok(log) => {
            let bytes: Vec<u8> = log
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// A compute capability's cubin, or why there is none.
type Compiled = BTreeMap<(u32, u32), Result<Vec<u8>, String>>;

/// Each capability's cubin, compiled once in this process: read from
/// the cache folder when an earlier process stored it (`cubin_cache`),
/// else compiled and stored there. `fresh` compiles it again whatever
/// the folder holds.
fn cubin_for(cc: (u32, u32), fresh: bool) -> Result<Vec<u8>, String> {
    static CACHE: OnceLock<Mutex<Compiled>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if fresh {
        cache.remove(&cc);
    }
    cache
        .entry(cc)
        .or_insert_with(|| {
            let file =
                cubin_cache::folder().map(|dir| cubin_cache::file(&dir, cc, SOURCE, &options(cc)));
            if let Some(cubin) = file
                .as_deref()
                .filter(|_| !fresh)
                .and_then(cubin_cache::read)
            {
                return Ok(cubin);
            }
            let compiled = compile(cc);
            if let (Some(file), Ok(cubin)) = (&file, &compiled) {
                cubin_cache::write(file, cubin);
            }
            compiled
        })
        .clone()
}

/// The kernels loaded in one CUDA context, and its cuBLAS handle. The
/// context must be current whenever one is used or dropped.
pub struct Kernels {
    module: sys::CUmodule,
    functions: BTreeMap<&'static str, sys::CUfunction>,
    handle: blas::cublasHandle_t,
    /// Each call's GPU time, when the environment asks (`timing`).
    times: RefCell<Option<CallTimes>>,
}

// SAFETY: the handles are used only by the engine thread that owns the
// device, with its context bound (`CudaDevice` checks before each call).
unsafe impl Send for Kernels {}

impl Kernels {
    /// Compiles (or takes the compiled) kernels for `cc` and loads them
    /// into the current context, with a cuBLAS handle on the default
    /// stream.
    pub fn load(cc: (u32, u32)) -> Result<Self, String> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { blas::is_culib_present() } {
            return Err(
                "the cuBLAS library (libcublas.so.13) is not installed: put its folder on \
                 LD_LIBRARY_PATH"
                    .into(),
            );
        }
        // A stored cubin the driver refuses is compiled again, once.
        let module = match load_module(&cubin_for(cc, false)?) {
            Ok(module) => module,
            Err(_) => load_module(&cubin_for(cc, true)?)?,
        };
        let mut functions = BTreeMap::new();
        for &name in NAMES {
            let c_name = CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: `module` was just loaded.
            match unsafe { driver::module::get_function(module, c_name) } {
                Ok(f) => {
                    functions.insert(name, f);
                }
                Err(e) => {
                    // SAFETY: loaded above, unloaded once.
                    let _ = unsafe { driver::module::unload(module) };
                    return Err(format!("the kernel {name} is not in the cubin: {e:?}"));
                }
            }
        }
        let handle = match cudarc::cublas::result::create_handle() {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: as above.
                let _ = unsafe { driver::module::unload(module) };
                return Err(format!("cublasCreate: {e:?}"));
            }
        };
        Ok(Self {
            module,
            functions,
            handle,
            times: RefCell::new(CallTimes::from_env()),
        })
    }

    /// Carries `call` out, timed when the environment asks.
    fn timed<T>(&self, name: impl FnOnce() -> String, call: impl FnOnce() -> T) -> T {
        match self.times.borrow_mut().as_mut() {
            Some(times) => times.around(name(), call),
            None => call(),
        }
    }

    /// Launches `l` on the default stream.
    pub fn launch(&self, l: &Launch) -> Result<(), DeviceError> {
        self.timed(|| timing::launch_name(l), || self.launch_untimed(l))
    }

    fn launch_untimed(&self, l: &Launch) -> Result<(), DeviceError> {
        let f = *self
            .functions
            .get(l.kernel)
            .ok_or_else(|| DeviceError::Driver(format!("no kernel named {}", l.kernel)))?;
        // Each argument's bytes, kept alive while the launch reads them.
        let mut storage: Vec<[u8; 8]> = l.args.iter().map(arg_bytes).collect();
        let mut params: Vec<*mut c_void> =
            storage.iter_mut().map(|b| b.as_mut_ptr().cast()).collect();
        let blocks = u32::try_from(l.grid.blocks())
            .map_err(|_| DeviceError::Driver(format!("{}: too many blocks", l.kernel)))?;
        // SAFETY: the arguments match the kernel's parameters (the
        // planner's tests check each against the source), every pointer
        // is inside a live segment the play placed, and `params` points
        // into `storage`, alive until the launch has copied them.
        unsafe {
            driver::launch_kernel(
                f,
                (blocks, 1, 1),
                (BLOCK_THREADS, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| DeviceError::Driver(format!("launching {}: {e:?}", l.kernel)))
    }

    /// `cublasGemmEx` (or its strided batched form) in float32 compute,
    /// with the call's workspace.
    pub fn gemm(&self, g: &GemmEx) -> Result<(), DeviceError> {
        self.timed(|| timing::gemm_name(g), || self.gemm_untimed(g))
    }

    fn gemm_untimed(&self, g: &GemmEx) -> Result<(), DeviceError> {
        let int = |v: u64| {
            i32::try_from(v)
                .map_err(|_| DeviceError::Driver(format!("a product dimension of {v} is too big")))
        };
        let op = |t: bool| match t {
            true => blas::cublasOperation_t::CUBLAS_OP_T,
            false => blas::cublasOperation_t::CUBLAS_OP_N,
        };
        let fail = |what: &str, s: blas::cublasStatus_t| -> Result<(), DeviceError> {
            match s {
                blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
                other => Err(DeviceError::Driver(format!("{what}: {other:?}"))),
            }
        };
        let (at, bytes) = g.workspace.unwrap_or((0, 0));
        // SAFETY: the workspace lies in a block the play gave this call.
        fail("cublasSetWorkspace", unsafe {
            blas::cublasSetWorkspace_v2(self.handle, at as *mut c_void, bytes as usize)
        })?;
        let (m, n, k) = (int(g.m)?, int(g.n)?, int(g.k)?);
        let (lda, ldb, ldc) = (int(g.a.ld)?, int(g.b.ld)?, int(g.c.ld)?);
        let (alpha, beta) = (g.alpha, g.beta);
        let ptr = |x: &Matrix| x.at as *const c_void;
        let compute = blas::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        let (ta, tb) = (op(g.transa), op(g.transb));
        let (at_, bt, ct) = (
            data_type(g.a.dtype)?,
            data_type(g.b.dtype)?,
            data_type(g.c.dtype)?,
        );
        let alpha_p = (&alpha as *const f32).cast::<c_void>();
        let beta_p = (&beta as *const f32).cast::<c_void>();
        // SAFETY: every matrix lies in a block the play placed, sized by
        // its shape (the planner derives m, n, k and the leading
        // dimensions from the same shapes); alpha and beta are host
        // floats, as CUBLAS_COMPUTE_32F takes them.
        let status = unsafe {
            if g.batch <= 1 {
                blas::cublasGemmEx(
                    self.handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    alpha_p,
                    ptr(&g.a),
                    at_,
                    lda,
                    ptr(&g.b),
                    bt,
                    ldb,
                    beta_p,
                    g.c.at as *mut c_void,
                    ct,
                    ldc,
                    compute,
                    algo,
                )
            } else {
                blas::cublasGemmStridedBatchedEx(
                    self.handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    alpha_p,
                    ptr(&g.a),
                    at_,
                    lda,
                    g.a.stride as i64,
                    ptr(&g.b),
                    bt,
                    ldb,
                    g.b.stride as i64,
                    beta_p,
                    g.c.at as *mut c_void,
                    ct,
                    ldc,
                    g.c.stride as i64,
                    int(g.batch)?,
                    compute,
                    algo,
                )
            }
        };
        fail("cublasGemmEx", status)
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // The owner binds their context first.
        if let Some(times) = self.times.get_mut() {
            times.finish();
        }
        // SAFETY: both were made in `load` and are released once.
        unsafe {
            let _ = cudarc::cublas::result::destroy_handle(self.handle);
            let _ = driver::module::unload(self.module);
        }
    }
}

/// `cubin` loaded into the current context.
fn load_module(cubin: &[u8]) -> Result<sys::CUmodule, String> {
    // SAFETY: `cubin` is a complete image (NVRTC's, or one stored whole
    // with its checksum) that outlives the call.
    unsafe { driver::module::load_data(cubin.as_ptr().cast()) }
        .map_err(|e| format!("loading the kernels' cubin: {e:?}"))
}

/// A kernel argument's bytes, as its parameter is declared.
fn arg_bytes(a: &KernelArg) -> [u8; 8] {
    let mut b = [0u8; 8];
    match *a {
        KernelArg::Ptr(p) => b.copy_from_slice(&p.to_ne_bytes()),
        KernelArg::I64(v) => b.copy_from_slice(&v.to_ne_bytes()),
        KernelArg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        KernelArg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
    }
    b
}

/// cuBLAS's name for an element type.
fn data_type(dtype: Dtype) -> Result<blas::cudaDataType, DeviceError> {
    Ok(match dtype {
        Dtype::Float32 => blas::cudaDataType::CUDA_R_32F,
        Dtype::Float16 => blas::cudaDataType::CUDA_R_16F,
        Dtype::Bfloat16 => blas::cudaDataType::CUDA_R_16BF,
        Dtype::Float64 => blas::cudaDataType::CUDA_R_64F,
        other => {
            return Err(DeviceError::Driver(format!(
                "no matrix product of {other:?} tensors"
            )))
        }
    })
}
