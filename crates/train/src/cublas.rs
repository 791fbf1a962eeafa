//! cuBLAS workspaces, as the PyTorch release the process follows gives
//! them (`Settings::blas_workspaces`).
//!
//! - 2.15 (the default): a matrix product allocates its workspace through
//!   the caching allocator for the call and frees it when the op returns:
//!   `gemm`/`bgemm` through `getCurrentCUDABlasHandleWithWorkspace` (an
//!   eager workspace of `getChosenWorkspaceSize`), cuBLASLt's
//!   `gemm_and_bias` (every `nn.Linear`'s `addmm`) through
//!   `CublasLtWorkspace` (1 MiB). Nothing stays; the step's peak carries
//!   one call's workspace, and its block stays cached.
//! - 2.9, or 2.15 with `TORCH_CUBLAS_WORKSPACE_CACHE=1`: each (cuBLAS
//!   handle, stream) keeps a workspace from its first call
//!   (`setWorkspaceForHandle` → `getNewWorkspace`), and cuBLASLt one of
//!   its own from its first call (`getCUDABlasLtWorkspace`) unless
//!   `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`. Handles are per thread, and
//!   autograd runs CUDA backward on a thread of its own, so backward makes
//!   a second set. They count in `memory_allocated`, survive `del` and
//!   `empty_cache`, and go only with `torch._C._cuda_clearCublasWorkspaces()`
//!   (`clearCublasWorkspaces`) or the process.

use crate::TrainState;
use vramlab_core::types::{Category, Dtype};
use vramlab_device::framework::BlasWorkspaces;
use vramlab_process::process::{AllocFailure, Process};
use vramlab_process::runtime::{Holder, ObjId};

/// The thread a cuBLAS call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlasThread {
    /// The Python thread: forward passes, `no_grad` included.
    Main,
    /// Autograd's device thread: backward.
    Autograd,
}

/// The library entry a matrix product takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemm {
    /// `mm`, `bmm`: cuBLAS through its handle.
    Cublas,
    /// `addmm` with a 1-D bias (`nn.Linear`): cuBLASLt's `gemm_and_bias`.
    Lt,
}

/// The workspaces kept, per thread and library, and the rule for new ones.
#[derive(Clone, Debug, Default)]
pub struct CublasWorkspaces {
    pub config: BlasWorkspaces,
    /// Kept workspaces: (main, autograd) for cuBLAS, then for cuBLASLt.
    kept: [[Option<ObjId>; 2]; 2],
}

impl CublasWorkspaces {
    pub fn new(config: BlasWorkspaces) -> Self {
        CublasWorkspaces {
            config,
            kept: Default::default(),
        }
    }

    /// A matrix product on `thread` (its output already allocated): a
    /// workspace for the call, allocated and freed; or the thread's kept
    /// workspaces, made at its first call. Returns the workspace the call
    /// computes with (its address and size), if it has one.
    pub fn call(
        &mut self,
        k: &mut Process,
        thread: BlasThread,
        gemm: Gemm,
    ) -> Result<Option<(u64, u64)>, AllocFailure> {
        let c = self.config;
        if c.per_call {
            let bytes = match gemm {
                Gemm::Cublas => c.cublas_bytes,
                Gemm::Lt => c.lt_bytes,
            };
            if bytes > 0 {
                let label = match gemm {
                    Gemm::Cublas => "cuBLAS workspace (this call)",
                    Gemm::Lt => "cuBLASLt workspace (this call)",
                };
                let id = k.alloc_shaped(label, &[bytes], Dtype::Uint8, Category::Workspace)?;
                let at = place(k, id, bytes);
                k.drop_local(id);
                return Ok(at);
            }
            return Ok(None);
        }
        // cuBLASLt's handle is the cuBLAS one: its first call sets the
        // handle's workspace too.
        self.keep(k, thread, Gemm::Cublas, c.cublas_bytes)?;
        let own = gemm == Gemm::Lt && !c.lt_shares_cublas;
        if own {
            self.keep(k, thread, Gemm::Lt, c.lt_bytes)?;
        }
        let (library, bytes) = match own {
            true => (Gemm::Lt, c.lt_bytes),
            false => (Gemm::Cublas, c.cublas_bytes),
        };
        let kept = self.kept[library as usize][thread as usize];
        Ok(kept.and_then(|id| place(k, id, bytes)))
    }

    /// The thread's kept workspace for `gemm`, made if it has none.
    fn keep(
        &mut self,
        k: &mut Process,
        thread: BlasThread,
        gemm: Gemm,
        bytes: u64,
    ) -> Result<(), AllocFailure> {
        let slot = &mut self.kept[gemm as usize][thread as usize];
        if bytes == 0 || slot.is_some() {
            return Ok(());
        }
        let label = match (gemm, thread) {
            (Gemm::Cublas, BlasThread::Main) => "cuBLAS workspace (main thread)",
            (Gemm::Cublas, BlasThread::Autograd) => "cuBLAS workspace (autograd thread)",
            (Gemm::Lt, BlasThread::Main) => "cuBLASLt workspace (main thread)",
            (Gemm::Lt, BlasThread::Autograd) => "cuBLASLt workspace (autograd thread)",
        };
        let id = k.alloc_shaped(label, &[bytes], Dtype::Uint8, Category::Workspace)?;
        k.runtime.hold(Holder::CublasWorkspaces, id);
        k.drop_local(id);
        *slot = Some(id);
        Ok(())
    }

    /// Whether any workspace is kept.
    pub fn any_kept(&self) -> bool {
        self.kept.iter().flatten().any(Option::is_some)
    }
}

/// Where workspace `id` of `bytes` is, where a device can hold values
/// (the page's engine records no place).
fn place(k: &Process, id: ObjId, bytes: u64) -> Option<(u64, u64)> {
    #[cfg(feature = "device-values")]
    return (k.device.holds_values())
        .then(|| k.address(id))
        .flatten()
        .map(|at| (at, bytes));
    #[cfg(not(feature = "device-values"))]
    {
        let _ = (k, id, bytes);
        None
    }
}

/// `torch._C._cuda_clearCublasWorkspaces()`: both maps are cleared, every
/// kept workspace goes back to the allocator's cache. Returns the bytes
/// freed.
pub fn clear_cublas_workspaces(k: &mut Process, ts: &mut TrainState) -> u64 {
    let released = k.runtime.release_holder(Holder::CublasWorkspaces);
    ts.cublas = CublasWorkspaces::new(ts.cublas.config);
    k.release(&released)
}
