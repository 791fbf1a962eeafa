//! `optimizer.step()` and `optimizer.zero_grad()`: lazy state at the first
//! step (`torch.optim`'s, or bitsandbytes' 8-bit state with its
//! quantization maps), Adam's foreach temporaries, and what `set_to_none`
//! frees.

use super::autograd::grad_of;
use super::frame::Frame;
use crate::kernel::{AllocFailure, Kernel};
use crate::runtime::ObjId;
use crate::train::optim::QMAP_VALUES;
use crate::train::{math, OptimizerKind, OptimizerSpec, OptimizerState, TrainState};
use crate::types::{Category, Dtype};

/// `optimizer.step()`. Returns whether the update was computed.
pub fn optimizer_step(
    k: &mut Kernel,
    frame: &mut Frame,
    ts: &mut TrainState,
    optimizer: ObjId,
) -> Result<bool, AllocFailure> {
    let mark = frame.mark();
    let opt = &ts.optimizers[&optimizer];
    let (spec, model, first_step) = (opt.spec(), opt.model, opt.state.is_empty());
    let label = k
        .runtime
        .get(optimizer)
        .map(|o| o.label.clone())
        .unwrap_or_default();
    let with_grad: Vec<(usize, ObjId)> = opt
        .params
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, p)| grad_of(k, p).is_some())
        .collect();
    if first_step && spec.kind.state_per_param() > 0 && !with_grad.is_empty() {
        let state = lazy_state(k, frame, optimizer, &label, spec, &with_grad)?;
        if let Some(o) = ts.optimizers.get_mut(&optimizer) {
            o.state = state;
        }
    }
    if spec.step_temporary_bytes(1) > 0 {
        foreach_sqrt(k, frame, &label, &with_grad)?;
    }
    frame.finish_from(k, mark);
    Ok(update_values(ts, optimizer, model))
}

fn param_shape(k: &Kernel, p: ObjId) -> (Vec<u64>, crate::types::Dtype) {
    let t = k.runtime.tensor(p).expect("parameter tensor");
    (t.shape.clone(), t.dtype)
}

/// The state tensors, allocated at the first step per parameter in order
/// (bitsandbytes' quantization maps before the first 8-bit state); the
/// optimizer holds them.
fn lazy_state(
    k: &mut Kernel,
    frame: &mut Frame,
    optimizer: ObjId,
    label: &str,
    spec: OptimizerSpec,
    with_grad: &[(usize, ObjId)],
) -> Result<Vec<ObjId>, AllocFailure> {
    let mut state = Vec::new();
    let mut hold = |k: &mut Kernel, label: String, shape: &[u64], dtype| {
        let t = frame.alloc(k, &label, shape, dtype, Category::OptimizerState)?;
        frame.take(t);
        k.attach_local(optimizer, t);
        state.push(t);
        Ok(())
    };
    let mut maps_moved = false;
    for &(i, p) in with_grad {
        let (shape, dtype) = param_shape(k, p);
        if !maps_moved && spec.quantizes(shape.iter().product()) {
            maps_moved = true;
            for map in spec.qmaps() {
                let shape = [QMAP_VALUES];
                hold(
                    k,
                    format!("{label}.name2qmap['{map}']"),
                    &shape,
                    Dtype::Float32,
                )?;
            }
        }
        for t in spec.state(&shape, dtype) {
            hold(
                k,
                format!("{label}.state[{i}].{}", t.name),
                &t.shape,
                t.dtype,
            )?;
        }
    }
    Ok(state)
}

/// `_multi_tensor_adam`: `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`,
/// one temporary per parameter; the list dies at the end of the update, its
/// items last first.
fn foreach_sqrt(
    k: &mut Kernel,
    frame: &mut Frame,
    label: &str,
    with_grad: &[(usize, ObjId)],
) -> Result<(), AllocFailure> {
    let mut temps = Vec::new();
    for &(i, p) in with_grad {
        let (shape, dtype) = param_shape(k, p);
        let label = format!("{label}.exp_avg_sq_sqrt[{i}]");
        temps.push(frame.alloc(k, &label, &shape, dtype, Category::Temporary)?);
    }
    for t in temps.into_iter().rev() {
        frame.drop(k, t);
    }
    Ok(())
}

/// The numbers, when the gradients were computed: the update on the CPU
/// of every parameter that has a `.grad` (as `torch.optim` skips a
/// parameter whose `.grad` is `None`: a frozen one).
fn update_values(ts: &mut TrainState, optimizer: ObjId, model: ObjId) -> bool {
    let Some(model) = ts.models.get_mut(&model) else {
        return false;
    };
    let Some(values) = model.values.as_mut() else {
        return false;
    };
    let with_grad: Vec<usize> = (0..values.len())
        .filter(|&i| model.grad_values.get(i).is_some_and(Option::is_some))
        .collect();
    if with_grad.is_empty() {
        return false;
    }
    let o = ts.optimizers.get_mut(&optimizer).expect("optimizer exists");
    let slots = o.kind.state_per_param() as usize;
    if o.state_values.len() != values.len() * slots {
        o.state_values = values
            .iter()
            .flat_map(|p| std::iter::repeat_n(vec![0f32; p.len()], slots))
            .collect();
    }
    // The parameters with gradients, their gradients and state, moved out
    // for the update and back after it.
    let take = |all: &mut math::Params, i: usize| std::mem::take(&mut all[i]);
    let mut params: math::Params = with_grad.iter().map(|&i| take(values, i)).collect();
    let mut grads: math::Params = with_grad
        .iter()
        .map(|&i| model.grad_values[i].take().unwrap_or_default())
        .collect();
    let state_of = |i: usize| (0..slots).map(move |s| i * slots + s);
    let mut state: math::Params = with_grad
        .iter()
        .flat_map(|&i| state_of(i))
        .map(|k| take(&mut o.state_values, k))
        .collect();
    apply(o, &mut params, &grads, &mut state);
    for (n, &i) in with_grad.iter().enumerate() {
        values[i] = take(&mut params, n);
        model.grad_values[i] = Some(take(&mut grads, n));
        for (s, k) in state_of(i).enumerate() {
            o.state_values[k] = take(&mut state, n * slots + s);
        }
    }
    true
}

/// One update of `values` by the optimizer's rule; `state`: each
/// parameter's state tensors, in order.
fn apply(
    o: &mut OptimizerState,
    values: &mut math::Params,
    grads: &math::Params,
    state: &mut math::Params,
) {
    o.steps += 1;
    match o.kind {
        OptimizerKind::Sgd => math::sgd(values, grads, o.lr),
        OptimizerKind::Momentum => math::momentum(values, grads, state, o.steps == 1, o.lr),
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            let (mut m, mut v): (math::Params, math::Params) = (Vec::new(), Vec::new());
            for (i, s) in state.drain(..).enumerate() {
                if i % 2 == 0 {
                    m.push(s);
                } else {
                    v.push(s);
                }
            }
            let adamw = o.kind == OptimizerKind::Adamw;
            math::adam(values, grads, &mut m, &mut v, o.steps as i32, o.lr, adamw);
            *state = m.into_iter().zip(v).flat_map(|(a, b)| [a, b]).collect();
        }
    }
}

/// `optimizer.zero_grad(set_to_none=...)`; returns the bytes freed.
pub fn zero_grad(k: &mut Kernel, ts: &mut TrainState, optimizer: ObjId, set_to_none: bool) -> u64 {
    let opt = &ts.optimizers[&optimizer];
    let mut freed = 0;
    for &p in &opt.params {
        if let Some(g) = grad_of(k, p) {
            if set_to_none {
                freed += k.detach(p, g);
            }
        }
    }
    if let Some(model) = ts.models.get_mut(&opt.model) {
        if set_to_none {
            model.grad_values.iter_mut().for_each(|g| *g = None);
        } else {
            model
                .grad_values
                .iter_mut()
                .flatten()
                .for_each(|g| g.iter_mut().for_each(|v| *v = 0.0));
        }
    }
    freed
}
