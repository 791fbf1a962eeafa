//! A tensor of a Hugging Face program (`generate`, a training step) made in
//! the process: labelled by its op, in the category of what it holds, and a
//! matrix product's cuBLAS workspace as the PyTorch release gives it.

use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::cublas::{BlasThread, CublasWorkspaces, Gemm};
use crate::train::program::{Alloc, Holds};
use crate::types::{Category, Dtype};

/// The category a program's tensor counts in.
pub(super) fn category(holds: Holds) -> Category {
    match holds {
        Holds::KvCache => Category::KvCache,
        Holds::Gradient => Category::Gradient,
        Holds::Optimizer => Category::OptimizerState,
        Holds::Workspace => Category::Workspace,
        Holds::Ids => Category::Input,
        _ => Category::Activation,
    }
}

/// Makes `m` (a matrix product's output, then its workspace on `thread`).
/// A workspace refused frees the output, as the op unwinds.
pub(super) fn alloc(
    k: &mut Process,
    cublas: &mut CublasWorkspaces,
    m: &Alloc,
    thread: BlasThread,
) -> Result<ObjId, AllocFailure> {
    let label = match m.layer {
        Some(l) => format!("{} (layer {l}, {})", m.op, m.holds.name()),
        None => format!("{} ({})", m.op, m.holds.name()),
    };
    let id = k.alloc_tensor(
        &label,
        m.bytes(),
        vec![m.bytes()],
        Dtype::Uint8,
        category(m.holds),
    )?;
    let gemm = match m.op {
        "mm" | "bmm" => Some(Gemm::Cublas),
        "addmm" => Some(Gemm::Lt),
        _ => None,
    };
    if let Some(gemm) = gemm {
        if let Err(f) = cublas.call(k, thread, gemm) {
            k.drop_local(id);
            return Err(f);
        }
    }
    Ok(id)
}
