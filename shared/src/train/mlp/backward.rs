//! `loss.backward()`: the criterion's gradient, then each layer in reverse,
//! allocating gradient buffers, accumulating into `.grad`, and releasing
//! what each node saved as it runs.

use super::forward::SavedPlan;
use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::autograd::{find_graph, grad_of};
use crate::train::cublas::{BlasThread, CublasWorkspaces};
use crate::train::frame::PyFrame;
use crate::train::{math, Saved, TrainState};
use crate::types::{Category, Dtype};

/// Why backward could not run (not an OOM).
#[derive(Debug)]
pub enum BackwardError {
    NoGraph,
    Consumed,
    Oom(AllocFailure),
}

impl From<AllocFailure> for BackwardError {
    fn from(e: AllocFailure) -> Self {
        BackwardError::Oom(e)
    }
}

/// `loss.backward(retain_graph=...)`.
pub fn backward(
    k: &mut Process,
    frame: &mut PyFrame,
    ts: &mut TrainState,
    loss: ObjId,
    retain: bool,
) -> Result<(), BackwardError> {
    let graph = find_graph(k, loss).ok_or(BackwardError::NoGraph)?;
    let g = ts.graphs.get(&graph).ok_or(BackwardError::NoGraph)?;
    if g.consumed {
        return Err(BackwardError::Consumed);
    }
    let Saved::Mlp { plan, .. } = &g.saved else {
        return Err(BackwardError::NoGraph);
    };
    let model = ts.models.get(&g.model).ok_or(BackwardError::NoGraph)?;
    let spec = model.spec;
    let mut bw = Backward {
        blas: &mut ts.cublas,
        graph,
        retain,
        params: &model.params,
        plan,
        dims: spec.dims(),
        classes: spec.classes,
        param_dtype: spec.dtype,
        adt: plan.amp.unwrap_or(spec.dtype),
    };
    let mark = frame.mark();
    let tag = k
        .runtime
        .get(loss)
        .map(|o| o.label.clone())
        .unwrap_or_default();
    let (seed, grad) = bw.criterion(k, frame, &tag)?;
    bw.layers(k, frame, grad)?;
    // `torch.autograd.backward` returns: the seed gradient goes.
    frame.drop(k, seed);
    frame.finish_from(k, mark);

    accumulate_grad_values(ts, graph);
    if !retain {
        k.clear_refs(graph);
        if let Some(state) = ts.graphs.get_mut(&graph) {
            state.consumed = true;
            if let Saved::Mlp { cache, .. } = &mut state.saved {
                *cache = None;
            }
        }
    }
    Ok(())
}

/// The numbers: the gradients computed on the CPU are added into `.grad`'s
/// values, when the forward pass computed its own.
fn accumulate_grad_values(ts: &mut TrainState, graph: ObjId) {
    let Some(g) = ts.graphs.get(&graph) else {
        return;
    };
    let Saved::Mlp {
        cache: Some(cache), ..
    } = &g.saved
    else {
        return;
    };
    let Some(state) = ts.models.get_mut(&g.model) else {
        return;
    };
    let grads = math::backward(state.values_mut(), cache);
    state.grad_values.resize(grads.len(), None);
    for (slot, new) in state.grad_values.iter_mut().zip(grads) {
        match slot {
            Some(old) => old.iter_mut().zip(&new).for_each(|(o, n)| *o += n),
            None => *slot = Some(new),
        }
    }
}

/// One backward pass in progress over a graph's saved tensors.
struct Backward<'a> {
    /// The autograd thread's cuBLAS workspace, made at its first matmul.
    blas: &'a mut CublasWorkspaces,
    graph: ObjId,
    retain: bool,
    params: &'a [ObjId],
    plan: &'a SavedPlan,
    dims: Vec<u64>,
    classes: u64,
    param_dtype: Dtype,
    /// The dtype activation gradients are computed in.
    adt: Dtype,
}

impl Backward<'_> {
    /// A node ran: it lets go of one saved tensor.
    fn release(&self, k: &mut Process, saved: Option<ObjId>) {
        if let (false, Some(id)) = (self.retain, saved) {
            k.detach(self.graph, id);
        }
    }

    /// A gradient tensor of the step (a local of the frame).
    fn temp(
        &self,
        k: &mut Process,
        frame: &mut PyFrame,
        label: &str,
        width: u64,
        dtype: Dtype,
    ) -> Result<ObjId, AllocFailure> {
        let shape = [self.plan.batch, width];
        frame.alloc(k, label, &shape, dtype, Category::Temporary)
    }

    /// The seed gradient (`ones_like(loss)`, alive for the whole backward),
    /// NLL's and log-softmax's backward; returns the seed and the logits'
    /// gradient.
    fn criterion(
        &self,
        k: &mut Process,
        frame: &mut PyFrame,
        tag: &str,
    ) -> Result<(ObjId, ObjId), AllocFailure> {
        let seed = frame.alloc(
            k,
            &format!("{tag}.grad"),
            &[],
            Dtype::Float32,
            Category::Temporary,
        )?;
        let g_nll = self.temp(k, frame, "grad log_softmax", self.classes, Dtype::Float32)?;
        self.release(k, self.plan.targets);
        self.release(k, self.plan.total_weight);
        let grad = self.temp(k, frame, "grad logits", self.classes, self.adt)?;
        frame.drop(k, g_nll);
        self.release(k, self.plan.log_probs);
        Ok((seed, grad))
    }

    /// The output layer, then the hidden layers in reverse.
    fn layers(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        mut grad: ObjId,
    ) -> Result<(), AllocFailure> {
        let layers = self.dims.len() - 2;
        let mut recomputed: Vec<Option<ObjId>> = vec![None; layers];
        for l in (0..=layers).rev() {
            if l < layers {
                if let Some(&(start, end, _)) = self.plan.segments.iter().find(|s| s.1 == l + 1) {
                    self.recompute(k, frame, start..end, &mut recomputed)?;
                }
                grad = self.relu(k, frame, l, grad, recomputed[l].take())?;
            }
            match self.linear(k, frame, l, grad)? {
                Some(g_in) => grad = g_in,
                None => break,
            }
        }
        Ok(())
    }

    /// Recomputes a checkpointed segment, saving as forward would.
    fn recompute(
        &self,
        k: &mut Process,
        frame: &mut PyFrame,
        hidden: std::ops::Range<usize>,
        recomputed: &mut [Option<ObjId>],
    ) -> Result<(), AllocFailure> {
        for j in hidden {
            let width = self.dims[j + 1];
            let z = frame.alloc(
                k,
                &format!("recompute {}.out", 2 * j),
                &[self.plan.batch, width],
                self.adt,
                Category::Activation,
            )?;
            let h = frame.alloc(
                k,
                &format!("recompute {}.relu", 2 * j + 1),
                &[self.plan.batch, width],
                self.adt,
                Category::Activation,
            )?;
            frame.drop(k, z);
            recomputed[j] = Some(h);
        }
        Ok(())
    }

    /// ReLU backward: the pre-activation's gradient; the output gradient and
    /// the saved (or recomputed) output go.
    fn relu(
        &self,
        k: &mut Process,
        frame: &mut PyFrame,
        l: usize,
        grad: ObjId,
        recomputed: Option<ObjId>,
    ) -> Result<ObjId, AllocFailure> {
        let label = format!("grad {}.out", 2 * l);
        let g_pre = self.temp(k, frame, &label, self.dims[l + 1], self.adt)?;
        frame.drop(k, grad);
        match recomputed {
            Some(h) => frame.drop(k, h),
            None => self.release(k, self.plan.relu[l]),
        }
        Ok(g_pre)
    }

    /// `AddmmBackward0`: the input's gradient (mat1; not for the batch
    /// itself), the weight's (mat2), then the bias's (`sum_to` in
    /// `validate_outputs`). The node returns: the output's gradient goes,
    /// then what it saved; then `AccumulateGrad` for each parameter.
    /// Returns the input's gradient.
    fn linear(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        l: usize,
        grad: ObjId,
    ) -> Result<Option<ObjId>, AllocFailure> {
        let g_in = if l > 0 {
            let label = format!("grad {}.relu", 2 * l - 1);
            let g_in = self.temp(k, frame, &label, self.dims[l], self.adt)?;
            self.blas.call(k, BlasThread::Autograd)?;
            Some(g_in)
        } else {
            None
        };
        let weight = self.param_grad(k, frame, 2 * l)?;
        let bias = self.param_grad(k, frame, 2 * l + 1)?;
        frame.drop(k, grad);
        self.release(k, self.plan.weight_casts[l]);
        // The layer's saved input goes (the previous ReLU output, or the
        // batch); at a segment's first layer, the segment's input.
        self.release(k, self.plan.mat1[l]);
        if let Some(&(_, _, input)) = self.plan.segments.iter().find(|s| s.0 == l) {
            self.release(k, Some(input));
        }
        self.accumulate(k, frame, 2 * l, weight)?;
        self.accumulate(k, frame, 2 * l + 1, bias)?;
        Ok(g_in)
    }

    /// A parameter's shape and name.
    fn param_info(&self, k: &Process, index: usize) -> (ObjId, Vec<u64>, String) {
        let param = self.params[index];
        let shape = k
            .runtime
            .tensor(param)
            .expect("parameter tensor")
            .shape
            .clone();
        let label = k.runtime.get(param).expect("parameter").label.clone();
        (param, shape, label)
    }

    /// One parameter's gradient as `AddmmBackward0` computes it: in float16
    /// under autocast; otherwise what becomes `.grad` when there is none.
    fn param_grad(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        index: usize,
    ) -> Result<ObjId, AllocFailure> {
        let (param, shape, label) = self.param_info(k, index);
        let g = if let Some(low) = self.plan.amp {
            let label = format!("{label}.grad_{}", super::forward::short(low));
            frame.alloc(k, &label, &shape, low, Category::Temporary)?
        } else {
            self.grad_buffer(k, frame, param, &shape, &label)?
        };
        if index % 2 == 0 {
            // The weight's gradient is a matmul (the bias's a sum): the
            // thread's first cuBLAS call if no input gradient came before.
            self.blas.call(k, BlasThread::Autograd)?;
        }
        Ok(g)
    }

    /// A gradient in the parameter's dtype: `.grad` to be, or a temporary
    /// to add into the existing `.grad`.
    fn grad_buffer(
        &self,
        k: &mut Process,
        frame: &mut PyFrame,
        param: ObjId,
        shape: &[u64],
        label: &str,
    ) -> Result<ObjId, AllocFailure> {
        let (label, category) = match grad_of(k, param) {
            Some(_) => (format!("{label}.grad (new)"), Category::Temporary),
            None => (format!("{label}.grad"), Category::Gradient),
        };
        frame.alloc(k, &label, shape, self.param_dtype, category)
    }

    /// `AccumulateGrad` (after `ToCopyBackward0` back to the parameter's
    /// dtype under autocast): the gradient becomes `.grad` when there is
    /// none, or is added into it and dies.
    fn accumulate(
        &mut self,
        k: &mut Process,
        frame: &mut PyFrame,
        index: usize,
        g: ObjId,
    ) -> Result<(), AllocFailure> {
        let (param, shape, label) = self.param_info(k, index);
        let g = if self.plan.amp.is_some() {
            let full = self.grad_buffer(k, frame, param, &shape, &label)?;
            frame.drop(k, g);
            full
        } else {
            g
        };
        if grad_of(k, param).is_some() {
            frame.drop(k, g);
        } else {
            frame.take(g);
            k.attach_local(param, g);
        }
        Ok(())
    }
}
