//! A Keras step without XLA (`model.compile(jit_compile=False)`) played
//! on the process as TensorFlow's executor runs its graph
//! ([`crate::train::executor`]): the batch copied in, each value a tensor
//! of its own that dies with its last reader, each gradient read by its
//! variable's update as soon as it is complete and then gone, Keras's
//! update temporaries, and a variable written while backward still reads
//! it moved to a new buffer. After the step only the variables and the
//! optimizer's state remain.

use super::program::{label, Target};
use super::training::Plan;
use super::Engine;
use crate::error::CommandError;
use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::executor::{schedule, Event, Value};
use crate::train::frame::PyFrame;
use crate::train::kinds::step::{Batch, Role};
use crate::types::{Category, Dtype};

impl Engine {
    /// One step run by TensorFlow's executor; its loss, when computed.
    /// The optimizer's variables are made before the first, as `fit`
    /// builds them.
    pub(super) fn executor_step(&mut self, plan: &Plan) -> Result<Option<f32>, CommandError> {
        self.step_without_grad(plan, |engine, frame| engine.run_graph(frame, plan))
    }

    /// The step's events on the allocator, in the executor's order.
    fn run_graph(&mut self, frame: &mut PyFrame, plan: &Plan) -> Result<(), AllocFailure> {
        let params = self.train.models[&plan.model].params.clone();
        let kind = self.train.optimizers[&plan.optimizer].kind;
        let trained: Vec<u64> = (plan.spec.parameters().iter())
            .map(|t| u64::from(!t.frozen) * t.numel() * t.dtype.size_bytes())
            .collect();
        let events = schedule(&plan.program, &trained, kind);
        let model = self
            .process
            .runtime
            .get(plan.model)
            .map(|m| m.label.clone());
        let target = Target {
            name: model.as_deref().unwrap_or("model"),
            params: &params,
            loss: "loss",
            holder: None,
        };
        let mut graph = Graph {
            k: &mut self.process,
            frame,
            target: &target,
            plan,
            values: vec![None; plan.program.allocs.len()],
            temps: Vec::new(),
            old: vec![None; params.len()],
            batch: [None, None],
        };
        graph.copy_batch()?;
        for e in events {
            graph.run(e)?;
        }
        let loss = plan
            .program
            .allocs
            .iter()
            .position(|a| a.role == Role::Loss);
        if let Some(id) = loss.and_then(|i| graph.values[i].take()) {
            graph.frame.take(id);
            graph.k.bind_local("loss", id);
        }
        Ok(())
    }
}

/// The executor's tensors while a step runs.
struct Graph<'a> {
    k: &'a mut Process,
    frame: &'a mut PyFrame,
    target: &'a Target<'a>,
    plan: &'a Plan,
    /// The step program's values, by allocation.
    values: Vec<Option<ObjId>>,
    /// The update temporaries alive.
    temps: Vec<(Value, ObjId)>,
    /// Each parameter's old buffer, after a copy-on-write update.
    old: Vec<Option<ObjId>>,
    /// The batch copied in: inputs, targets.
    batch: [Option<ObjId>; 2],
}

impl Graph<'_> {
    /// The executor copies the batch to the device for the step's first
    /// readers (`_Recv`).
    fn copy_batch(&mut self) -> Result<(), AllocFailure> {
        let (x_shape, x_dtype, y_shape) = self.plan.spec.batch(self.plan.micro_batch);
        let x = self
            .frame
            .alloc(self.k, "x", &x_shape, x_dtype, Category::Input)?;
        let y = self
            .frame
            .alloc(self.k, "y", &y_shape, Dtype::Int64, Category::Input)?;
        self.batch = [Some(x), Some(y)];
        Ok(())
    }

    fn run(&mut self, e: Event) -> Result<(), AllocFailure> {
        match e {
            Event::Alloc(Value::Step(i)) => {
                let a = &self.plan.program.allocs[i];
                let (name, category) = match a.role {
                    Role::Grad(p) => (
                        format!("gradient of {}", self.param_label(p)),
                        Category::Gradient,
                    ),
                    _ => label(self.k, a, self.plan.program.scope, self.target),
                };
                let id = self
                    .frame
                    .alloc(self.k, &name, &a.shape, a.dtype, category)?;
                self.values[i] = Some(id);
            }
            Event::Forward { from, to } => self.values[to] = self.values[from].take(),
            Event::Free(Value::Step(i)) => {
                let id = self.values[i].take();
                self.drop(id);
            }
            Event::Alloc(
                v @ Value::Temp {
                    param,
                    name,
                    scalar,
                },
            ) => {
                let label = format!("optimizer: {name} of {}", self.param_label(param));
                let (shape, dtype) = self.param_shape(param);
                let shape = if scalar { Vec::new() } else { shape };
                let id = self
                    .frame
                    .alloc(self.k, &label, &shape, dtype, Category::Temporary)?;
                self.temps.push((v, id));
            }
            Event::Free(v @ Value::Temp { .. }) => {
                let at = self.temps.iter().position(|(t, _)| *t == v);
                let id = at.map(|at| self.temps.swap_remove(at).1);
                self.drop(id);
            }
            Event::Alloc(Value::Copy(p)) => {
                let param = self.target.params[p];
                let Some(t) = self.k.runtime.tensor(param).cloned() else {
                    return Ok(());
                };
                let label = self.param_label(p);
                let new = self
                    .frame
                    .alloc(self.k, &label, &t.shape, t.dtype, t.category)?;
                // The variable now reads the new buffer; `new` keeps the old.
                self.k.swap_blocks(param, new);
                self.old[p] = Some(new);
            }
            Event::Free(Value::Copy(p)) => {
                let id = self.old[p].take();
                self.drop(id);
            }
            Event::Release(part) => {
                let slot = match part {
                    Batch::Inputs => 0,
                    Batch::Targets => 1,
                };
                let id = self.batch[slot].take();
                self.drop(id);
            }
            Event::Workspace(bytes) => {
                let label = "cuDNN workspace (cudnn_workspace_bytes)";
                let w =
                    self.frame
                        .alloc(self.k, label, &[bytes], Dtype::Uint8, Category::Workspace)?;
                self.frame.drop(self.k, w);
            }
        }
        Ok(())
    }

    fn drop(&mut self, id: Option<ObjId>) {
        if let Some(id) = id {
            self.frame.drop(self.k, id);
        }
    }

    fn param_label(&self, p: usize) -> String {
        let id = self.target.params[p];
        self.k
            .runtime
            .get(id)
            .map(|o| o.label.clone())
            .unwrap_or_default()
    }

    /// Parameter `p`'s shape and type (its update's are the same).
    fn param_shape(&self, p: usize) -> (Vec<u64>, Dtype) {
        let id = self.target.params[p];
        let t = self.k.runtime.tensor(id);
        t.map_or((Vec::new(), Dtype::Float32), |t| (t.shape.clone(), t.dtype))
    }
}
