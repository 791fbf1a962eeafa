//! `optimizer.step()`'s numbers (its memory is a program,
//! `kinds::step::optim_step`, the engine plays) and
//! `optimizer.zero_grad()`: what `set_to_none` frees.

use super::autograd::grad_of;
use crate::{update, TrainState};
use vramlab_process::process::Process;
use vramlab_process::runtime::ObjId;

/// The numbers, when the gradients were computed: the update on the CPU
/// of each parameter of `updates` (the step program's [`Op::Update`]s:
/// those with a `.grad`, as `torch.optim` skips a `.grad` of `None`).
///
/// [`Op::Update`]: crate::kinds::step::Op::Update
pub fn update_values(
    ts: &mut TrainState,
    optimizer: ObjId,
    model: ObjId,
    updates: &[usize],
) -> bool {
    let Some(model) = ts.models.get_mut(&model) else {
        return false;
    };
    let Some(values) = model.values.as_mut() else {
        return false;
    };
    let with_grad: Vec<usize> = (updates.iter().copied())
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
    #[cfg(feature = "device-values")]
    if !set_to_none {
        zero_on_device(k, ts, optimizer);
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

/// `zero_grad(set_to_none=False)` of a model whose values live on the
/// device alone: each `.grad` filled with zeros there, as PyTorch's
/// `zero_()` does (the host holds no values to write).
#[cfg(feature = "device-values")]
fn zero_on_device(k: &mut Process, ts: &TrainState, optimizer: ObjId) {
    use crate::kernels::{plan, Place};
    use crate::kinds::step::Calc;
    let opt = &ts.optimizers[&optimizer];
    if !ts.models.get(&opt.model).is_some_and(|m| m.device_resident) {
        return;
    }
    let grads: Vec<(u64, Vec<u64>, vramlab_core::types::Dtype)> = (opt.params.iter())
        .filter_map(|&p| {
            let g = grad_of(k, p)?;
            let t = k.runtime.tensor(g)?;
            Some((k.address(g)?, t.shape.clone(), t.dtype))
        })
        .collect();
    let Some(compute) = k.device.memory().and_then(|m| m.compute()) else {
        return;
    };
    for (at, shape, dtype) in &grads {
        let place = Place {
            at: *at,
            shape,
            dtype: *dtype,
        };
        for call in plan(&Calc::Zeros, place, &[], &[], None).unwrap_or_default() {
            // A launch that fails leaves the next step's check to say so.
            let _ = call.run(compute);
        }
    }
}
