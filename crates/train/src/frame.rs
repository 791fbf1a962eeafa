//! The frame a step runs in: its locals are references, and they die when
//! the frame returns (or live on in `last_exception` if the step raises).

use vramlab_core::types::{Category, Dtype};
use vramlab_process::process::{AllocFailure, Process};
use vramlab_process::runtime::{Class, ObjId, ObjectKind};

/// The Python frame a step runs in (not a stack frame of a memory
/// snapshot): its local variables. If the step raises,
/// they become the exception's (`last_exception` keeps them alive).
#[derive(Debug, Default)]
pub struct PyFrame {
    pub locals: Vec<ObjId>,
}

impl PyFrame {
    pub fn alloc(
        &mut self,
        k: &mut Process,
        label: &str,
        shape: &[u64],
        dtype: Dtype,
        category: Category,
    ) -> Result<ObjId, AllocFailure> {
        let id = k.alloc_shaped(label, shape, dtype, category)?;
        self.locals.push(id);
        Ok(id)
    }

    /// Adds an existing object as a local (a new reference to it).
    pub fn hold(&mut self, k: &mut Process, id: ObjId) -> ObjId {
        k.runtime.take_local(id);
        self.locals.push(id);
        id
    }

    /// A new non-tensor object held by this frame.
    pub fn instance(&mut self, k: &mut Process, class: Class, label: &str) -> ObjId {
        let id = k.runtime.new_local(ObjectKind::Instance(class), label);
        self.locals.push(id);
        id
    }

    /// The local goes out of scope.
    pub fn drop(&mut self, k: &mut Process, id: ObjId) {
        self.take(id);
        k.drop_local(id);
    }

    /// Moves a local out of the frame (the caller now owns the reference).
    pub fn take(&mut self, id: ObjId) -> ObjId {
        if let Some(p) = self.locals.iter().rposition(|&x| x == id) {
            self.locals.remove(p);
        }
        id
    }

    /// The frame returns: its locals die, last first.
    pub fn finish(&mut self, k: &mut Process) {
        self.finish_from(k, 0);
    }

    /// A nested call returns: the locals it added (from `mark` on) die.
    pub fn finish_from(&mut self, k: &mut Process, mark: usize) {
        while self.locals.len() > mark {
            let id = self.locals.pop().expect("above the mark");
            k.drop_local(id);
        }
    }

    /// Where a nested call's locals will start.
    pub fn mark(&self) -> usize {
        self.locals.len()
    }
}
