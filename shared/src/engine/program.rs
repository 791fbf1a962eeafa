//! A step (a [`Program`] from `train::kinds`: an MLP's, a CNN's or a
//! transformer's) played on the process: each allocation through the allocator with its
//! label and category, each free when the program says, the cuBLAS
//! workspaces at their threads' first matrix product, each parameter's
//! gradient into `.grad` (or added into the one there, then freed), and the
//! loop's `loss` rebound where PyTorch drops the previous one.
//!
//! A training loop plays the whole program in one frame. `forward` plays it
//! up to [`Op::ForwardEnd`] and hands what lives to an autograd graph;
//! `backward` plays the rest over the graph's saved tensors, letting go of
//! each (unless the graph is retained) where the program frees it.

use super::placement::Placement;
use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::autograd::grad_of;
use crate::train::cublas::CublasWorkspaces;
use crate::train::frame::PyFrame;
use crate::train::kinds::step::{Alloc, Batch, Op, Program, Role};
use crate::types::{Category, Dtype};

/// The model a program runs on.
pub(super) struct Target<'a> {
    /// Its name, the labels' prefix.
    pub name: &'a str,
    /// Its parameters, in `parameters()` order.
    pub params: &'a [ObjId],
    /// The name the loss is bound to.
    pub loss: &'a str,
    /// Who holds the state an optimizer's step makes (the optimizer).
    pub holder: Option<ObjId>,
}

/// Who holds a tensor the program made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// A local of the frame the program runs in.
    Frame(ObjId),
    /// Saved by the autograd graph (made by an earlier `forward`).
    Graph(ObjId),
}

/// A program being played: which tensor each allocation made, while it
/// lives.
pub(super) struct Player<'p> {
    program: &'p Program,
    live: Vec<Option<Slot>>,
    /// Where each tensor went.
    pub placement: Placement,
    /// The graph holding the saved tensors and the batch (`backward`).
    graph: Option<ObjId>,
    /// The batch the graph saved: inputs, targets.
    batch: [Option<ObjId>; 2],
    /// `backward(retain_graph=True)`: the graph keeps what it saved.
    retain: bool,
    /// The loss, once made (a local of the frame).
    pub loss: Option<ObjId>,
    /// A loop's `loss = ...` rebinds the name where the program says; a
    /// `forward` command binds it when the statement ends.
    rebind: bool,
    /// The optimizer state the program made, in order.
    pub state: Vec<ObjId>,
}

impl<'p> Player<'p> {
    /// A training loop's step: its batch is held by the loop's names.
    pub fn in_loop(program: &'p Program) -> Self {
        Player {
            program,
            live: vec![None; program.allocs.len()],
            placement: Placement::new(),
            graph: None,
            batch: [None, None],
            retain: false,
            loss: None,
            rebind: true,
            state: Vec::new(),
        }
    }

    /// A `forward` statement: the loss is bound when it returns.
    pub fn statement(program: &'p Program) -> Self {
        Player {
            rebind: false,
            ..Self::in_loop(program)
        }
    }

    /// `backward` over a graph: `saved` holds its tensors by allocation.
    pub fn over_graph(
        (k, program): (&Process, &'p Program),
        graph: ObjId,
        saved: &[Option<ObjId>],
        batch: [Option<ObjId>; 2],
        retain: bool,
    ) -> Self {
        let mut placement = Placement::new();
        placement.begin(k, saved.len(), &[]);
        for (i, id) in saved.iter().enumerate() {
            id.inspect(|&id| placement.place(i, k, id));
        }
        Player {
            live: saved.iter().map(|s| s.map(Slot::Graph)).collect(),
            placement,
            graph: Some(graph),
            batch,
            retain,
            ..Self::statement(program)
        }
    }

    /// Plays `ops` (a range of the program's); on an allocation failure the
    /// frame keeps what was live (the caller raises it into
    /// `last_exception`).
    pub fn play(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        blas: &mut CublasWorkspaces,
        ops: std::ops::Range<usize>,
        target: &Target,
    ) -> Result<(), AllocFailure> {
        let program = self.program;
        let allocs = program.allocs.len();
        self.placement.begin(k, allocs, target.params);
        // A gradient added into a `.grad` there dies once its product
        // (and that product's workspace) is done.
        let mut added: Option<ObjId> = None;
        for position in ops {
            let op = &program.ops[position];
            if !matches!(op, Op::Blas(..)) {
                added.take().inspect(|&g| frame.drop(k, g));
            }
            match *op {
                Op::Alloc(i) => {
                    let a = &program.allocs[i];
                    let id = match alloc(k, frame, a, program.scope, target) {
                        Ok(id) => id,
                        Err(failure) => {
                            self.unwind(k, frame, position);
                            return Err(failure);
                        }
                    };
                    self.placement.place(i, k, id);
                    match a.role {
                        Role::Grad(p) => added = into_grad(k, frame, target.params[p], id),
                        Role::Loss => self.loss = Some(id),
                        Role::State { .. } | Role::QuantMap(_) => {
                            frame.take(id);
                            target.holder.inspect(|&h| k.attach_local(h, id));
                            self.state.push(id);
                        }
                        Role::Forward | Role::Backward | Role::Scratch { .. } => {
                            self.live[i] = Some(Slot::Frame(id))
                        }
                    }
                }
                Op::Free(i) => self.free(k, frame, i),
                Op::Blas(thread, gemm) => {
                    let workspace = blas.call(k, thread, gemm)?;
                    self.placement.place_workspace(position, workspace);
                    added.take().inspect(|&g| frame.drop(k, g));
                }
                Op::Rebind => {
                    if let (true, Some(id)) = (self.rebind, self.loss) {
                        frame.take(id);
                        k.bind_local(target.loss, id);
                    }
                }
                Op::Release(part) => self.release(k, part),
                Op::Workspace(bytes) => {
                    let label = "cuDNN workspace (cudnn_workspace_bytes)";
                    let w = frame.alloc(k, label, &[bytes], Dtype::Uint8, Category::Workspace)?;
                    frame.drop(k, w);
                }
                Op::ForwardEnd | Op::Begin(_) | Op::End(_) | Op::Update(_) => {}
                Op::Forward(_) | Op::Returned(_) | Op::Phase(_) => {}
            }
        }
        added.inspect(|&g| frame.drop(k, g));
        Ok(())
    }

    /// An allocation failed at op `position`: as the exception unwinds,
    /// the temporaries of the expression being evaluated go.
    fn unwind(&mut self, k: &mut Process, frame: &mut PyFrame, position: usize) {
        for i in 0..self.live.len() {
            if matches!(self.live[i], Some(Slot::Frame(_)))
                && self.program.temporary_at(i, position)
            {
                self.free(k, frame, i);
            }
        }
    }

    fn free(&mut self, k: &mut Process, frame: &mut PyFrame, i: usize) {
        match self.live[i].take() {
            Some(Slot::Frame(id)) => frame.drop(k, id),
            Some(Slot::Graph(id)) if self.retain => self.live[i] = Some(Slot::Graph(id)),
            Some(Slot::Graph(id)) => {
                if let Some(g) = self.graph {
                    k.detach(g, id);
                }
            }
            None => {}
        }
    }

    /// A node lets go of the part of the batch it saved.
    fn release(&mut self, k: &mut Process, part: Batch) {
        let slot = &mut self.batch[part as usize];
        if let (Some(g), false, Some(id)) = (self.graph, self.retain, *slot) {
            *slot = None;
            k.detach(g, id);
        }
    }

    /// The forward pass ends: `graph` saves what lives (moved out of the
    /// frame) and the parts of `batch` that backward will let go of.
    /// Returns the saved tensors by allocation.
    pub fn save_into(
        mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        graph: ObjId,
        batch: [ObjId; 2],
    ) -> (Vec<Option<ObjId>>, [Option<ObjId>; 2]) {
        let saved = std::mem::take(&mut self.live)
            .into_iter()
            .map(|slot| {
                slot.map(|(Slot::Frame(id) | Slot::Graph(id))| {
                    frame.take(id);
                    k.attach_local(graph, id);
                    id
                })
            })
            .collect();
        let parts = [Batch::Inputs, Batch::Targets];
        let held = parts.map(|part| {
            let id = batch[part as usize];
            self.program.saves(part).then(|| {
                k.runtime.add_ref(graph, id);
                id
            })
        });
        (saved, held)
    }
}

/// Allocates `a`, labelled by the op that made it and its block (`scope`:
/// the transformer's `h`, the CNN's `block`; none for the MLP's
/// Sequential), or as its parameter's grad.
fn alloc(
    k: &mut Process,
    frame: &mut PyFrame,
    a: &Alloc,
    scope: &str,
    target: &Target,
) -> Result<ObjId, AllocFailure> {
    let (label, category) = label(k, a, scope, target);
    frame.alloc(k, &label, &a.shape, a.dtype, category)
}

/// The label and category of `a`'s tensor.
pub(super) fn label(k: &Process, a: &Alloc, scope: &str, target: &Target) -> (String, Category) {
    match a.role {
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
        Role::Loss => (target.loss.to_string(), Category::Activation),
        Role::State { param, name } => (
            format!("{}.state[{param}].{name}", target.name),
            Category::OptimizerState,
        ),
        Role::QuantMap(name) => (
            format!("{}.name2qmap['{name}']", target.name),
            Category::OptimizerState,
        ),
        Role::Scratch { param, name } => (
            format!("{}.{name}[{param}]", target.name),
            Category::Temporary,
        ),
        Role::Forward | Role::Backward => {
            let label = match a.layer {
                // An MLP's modules are the Sequential's own: `model.0`.
                Some(l) if scope.is_empty() => format!("{}.{l}.{}", target.name, a.op),
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
    }
}

/// `AccumulateGrad`: the gradient becomes `.grad`, or is added into the
/// `.grad` there (`zero_grad(set_to_none=False)`, accumulation) and is
/// returned, to die once its op is done.
fn into_grad(k: &mut Process, frame: &mut PyFrame, param: ObjId, g: ObjId) -> Option<ObjId> {
    if grad_of(k, param).is_some() {
        return Some(g);
    }
    frame.take(g);
    k.attach_local(param, g);
    None
}
