//! A CNN's or a transformer's step (a [`Program`] from `train::kinds`)
//! played on the kernel: each allocation through the allocator with its
//! label and category, each free when the program says, the cuBLAS
//! workspaces at their threads' first matrix product, each parameter's
//! gradient into `.grad` (or added into the one there, then freed), and the
//! loop's `loss` rebound where PyTorch drops the previous one.

use crate::kernel::{AllocFailure, Kernel};
use crate::runtime::ObjId;
use crate::train::cublas::CublasWorkspaces;
use crate::train::kinds::step::{Alloc, Op, Program, Role};
use crate::train::step::{grad_of, Frame};
use crate::types::Category;

/// The model a program runs on.
pub(super) struct Target<'a> {
    /// Its name, the labels' prefix.
    pub name: &'a str,
    /// Its parameters, in `parameters()` order.
    pub params: &'a [ObjId],
    /// The name the loss is bound to.
    pub loss: &'a str,
}

/// Plays `program`; on an allocation failure the frame keeps what was
/// live (the caller raises it into `last_exception`).
pub(super) fn play(
    k: &mut Kernel,
    frame: &mut Frame,
    blas: &mut CublasWorkspaces,
    program: &Program,
    target: &Target,
) -> Result<(), AllocFailure> {
    let mut live: Vec<Option<ObjId>> = vec![None; program.allocs.len()];
    let mut loss = None;
    for op in &program.ops {
        match *op {
            Op::Alloc(i) => {
                let a = &program.allocs[i];
                let id = alloc(k, frame, a, program.scope, target)?;
                match a.role {
                    Role::Grad(p) => into_grad(k, frame, target.params[p], id),
                    Role::Loss => loss = Some(id),
                    Role::Forward | Role::Backward => live[i] = Some(id),
                }
            }
            Op::Free(i) => {
                if let Some(id) = live[i].take() {
                    frame.drop(k, id);
                }
            }
            Op::Blas(thread) => blas.call(k, thread)?,
            Op::Rebind => {
                if let Some(id) = loss {
                    frame.take(id);
                    k.bind_local(target.loss, id);
                }
            }
        }
    }
    Ok(())
}

/// Allocates `a`, labelled by the op that made it and its block (`scope`:
/// the transformer's `h`, the CNN's `block`), or as its parameter's grad.
fn alloc(
    k: &mut Kernel,
    frame: &mut Frame,
    a: &Alloc,
    scope: &str,
    target: &Target,
) -> Result<ObjId, AllocFailure> {
    let (label, category) = match a.role {
        Role::Grad(p) => {
            let param = k.runtime.get(target.params[p]).map(|o| o.label.as_str());
            let fresh = grad_of(k, target.params[p]).is_none();
            let label = format!("{}.grad", param.unwrap_or(target.name));
            if fresh {
                (label, Category::Gradient)
            } else {
                (format!("{label} (new)"), Category::Temporary)
            }
        }
        Role::Forward | Role::Loss | Role::Backward => {
            let label = match a.layer {
                Some(l) => format!("{}.{scope}.{l}.{}", target.name, a.op),
                None => format!("{}.{}", target.name, a.op),
            };
            let category = if a.role == Role::Backward {
                Category::Temporary
            } else {
                Category::Activation
            };
            (label, category)
        }
    };
    frame.alloc(k, &label, &a.shape, a.dtype, category)
}

/// `AccumulateGrad`: the gradient becomes `.grad`, or is added into the
/// `.grad` there (`zero_grad(set_to_none=False)`, accumulation) and dies.
fn into_grad(k: &mut Kernel, frame: &mut Frame, param: ObjId, g: ObjId) {
    if grad_of(k, param).is_some() {
        frame.drop(k, g);
    } else {
        frame.take(g);
        k.attach_local(param, g);
    }
}
