//! `optimizer.step()` and `optimizer.zero_grad()`: lazy state at the first
//! step (`torch.optim`'s, or bitsandbytes' 8-bit state with its
//! quantization maps), Adam's foreach temporaries, and what `set_to_none`
//! frees.

use super::autograd::grad_of;
use super::frame::PyFrame;
use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::optim::QMAP_VALUES;
use crate::train::{update, OptimizerSpec, TrainState};
use crate::types::{Category, Dtype};

/// `optimizer.step()`. Returns whether the update was computed.
pub fn optimizer_step(
    k: &mut Process,
    frame: &mut PyFrame,
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

fn param_shape(k: &Process, p: ObjId) -> (Vec<u64>, crate::types::Dtype) {
    let t = k.runtime.tensor(p).expect("parameter tensor");
    (t.shape.clone(), t.dtype)
}

/// The state tensors, allocated at the first step per parameter in order
/// (bitsandbytes' quantization maps before the first 8-bit state); the
/// optimizer holds them.
fn lazy_state(
    k: &mut Process,
    frame: &mut PyFrame,
    optimizer: ObjId,
    label: &str,
    spec: OptimizerSpec,
    with_grad: &[(usize, ObjId)],
) -> Result<Vec<ObjId>, AllocFailure> {
    let mut state = Vec::new();
    let mut hold = |k: &mut Process, label: String, shape: &[u64], dtype| {
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
    k: &mut Process,
    frame: &mut PyFrame,
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
pub fn update_values(ts: &mut TrainState, optimizer: ObjId, model: ObjId) -> bool {
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
    o.steps += 1;
    for i in with_grad {
        let (p, g) = (
            &mut values[i],
            model.grad_values[i].as_deref().unwrap_or_default(),
        );
        let state = &mut o.state_values[i * slots..(i + 1) * slots];
        update::update(o.kind, p, g, state, o.steps, o.lr);
    }
    true
}

/// `optimizer.zero_grad(set_to_none=...)`; returns the bytes freed.
pub fn zero_grad(k: &mut Process, ts: &mut TrainState, optimizer: ObjId, set_to_none: bool) -> u64 {
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
