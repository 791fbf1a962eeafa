//! cuBLAS workspaces: PyTorch gives each (cuBLAS handle, stream) a workspace
//! it allocates through the caching allocator at the first cuBLAS call
//! (`getCurrentCUDABlasHandle` → `setWorkspaceForHandle` → `getNewWorkspace`
//! in `aten/src/ATen/cuda/CublasHandlePool.cpp`). Handles are per thread,
//! and autograd runs CUDA backward on a thread of its own, so the first
//! backward's matrix product makes a second workspace. Both count in
//! `memory_allocated`, survive `del` and `empty_cache`, and go only with
//! `torch._C._cuda_clearCublasWorkspaces()` (`clearCublasWorkspaces`) or the
//! process.

use crate::process::{AllocFailure, Process};
use crate::runtime::{Holder, ObjId};
use crate::train::TrainState;
use crate::types::{Category, Dtype};

/// The thread a cuBLAS call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlasThread {
    /// The Python thread: forward passes, `no_grad` included.
    Main,
    /// Autograd's device thread: backward.
    Autograd,
}

/// Each thread's workspace, once it made a cuBLAS call.
#[derive(Clone, Debug, Default)]
pub struct CublasWorkspaces {
    /// Bytes of one workspace (`getChosenWorkspaceSize`); 0: none.
    pub bytes: u64,
    pub main: Option<ObjId>,
    pub autograd: Option<ObjId>,
}

impl CublasWorkspaces {
    pub fn new(bytes: u64) -> Self {
        CublasWorkspaces {
            bytes,
            ..Default::default()
        }
    }

    fn slot(&mut self, thread: BlasThread) -> &mut Option<ObjId> {
        match thread {
            BlasThread::Main => &mut self.main,
            BlasThread::Autograd => &mut self.autograd,
        }
    }

    /// A cuBLAS call on `thread`: the first one allocates the thread's
    /// workspace (after the op's own output, which it allocated first).
    pub fn call(&mut self, k: &mut Process, thread: BlasThread) -> Result<(), AllocFailure> {
        let bytes = self.bytes;
        let slot = self.slot(thread);
        if bytes == 0 || slot.is_some() {
            return Ok(());
        }
        let label = match thread {
            BlasThread::Main => "cuBLAS workspace (main thread)",
            BlasThread::Autograd => "cuBLAS workspace (autograd thread)",
        };
        let id = k.alloc_shaped(label, &[bytes], Dtype::Uint8, Category::Workspace)?;
        k.runtime.hold(Holder::CublasWorkspaces, id);
        k.drop_local(id);
        *slot = Some(id);
        Ok(())
    }
}

/// `torch._C._cuda_clearCublasWorkspaces()`: the map is cleared, every
/// workspace goes back to the allocator's cache. Returns the bytes freed.
pub fn clear_cublas_workspaces(k: &mut Process, ts: &mut TrainState) -> u64 {
    let released = k.runtime.release_holder(Holder::CublasWorkspaces);
    ts.cublas = CublasWorkspaces::new(ts.cublas.bytes);
    k.release(&released)
}
