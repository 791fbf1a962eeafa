//! Autograd's graph as the engine keeps it, for every kind of step: the
//! graph a loss leads to, a parameter's `.grad`, and PyTorch's messages for
//! a backward that cannot run.

use vramlab_process::process::Process;
use vramlab_process::runtime::{Class, ObjId, ObjectKind};

/// PyTorch's message for a second backward through a freed graph.
pub const BACKWARD_TWICE: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";
/// PyTorch's message for backward on a tensor without history.
pub const NO_GRAD_FN: &str =
    "element 0 of tensors does not require grad and does not have a grad_fn";

/// The autograd graph a tensor's history leads to, if any.
pub fn find_graph(k: &Process, tensor: ObjId) -> Option<ObjId> {
    let mut stack = vec![tensor];
    let mut seen = 0;
    while let Some(id) = stack.pop() {
        seen += 1;
        if seen > 64 {
            return None;
        }
        let o = k.runtime.get(id)?;
        if o.kind == ObjectKind::Instance(Class::Graph) {
            return Some(id);
        }
        if matches!(o.kind, ObjectKind::Tensor(_)) {
            stack.extend(o.refs.iter().rev());
        }
    }
    None
}

/// A parameter's `.grad`, if set.
pub fn grad_of(k: &Process, param: ObjId) -> Option<ObjId> {
    k.runtime
        .get(param)?
        .refs
        .iter()
        .copied()
        .find(|&r| k.runtime.tensor(r).is_some())
}
