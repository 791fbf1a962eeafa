//! A Keras training step without XLA (`model.compile(jit_compile=False)`,
//! a `@tf.function` train step), as
//! TensorFlow's executor runs its graph: each value is a tensor of its own
//! in the BFC allocator, freed when its last consumer has run; nothing
//! like PyTorch's `.grad` stays, each gradient dies once its variable's
//! update has read it; and the update runs as soon as the gradient is
//! complete, in the middle of backward.
//!
//! What TensorFlow's own allocator records of such a step
//! (`tests/reference/tf_executor_step.py`, Keras 3 on TensorFlow's CPU
//! executor with its BFC allocator) shows the rest:
//! - Ops that read variables only run first (the executor runs whatever is
//!   ready): SGD with momentum's `m * momentum` for every variable, and
//!   Adam's per-variable scalars, live from the step's start until their
//!   variable's update.
//! - Keras's updates are written as ops (`m.assign_add((g - m) * (1 -
//!   beta_1))`, ...); an op whose input has no other reader writes into
//!   that input's buffer (`forward_input`), so what remains are Adam's
//!   `square(g)`, `sqrt(v)` and `m * alpha`, momentum's `m * momentum`.
//! - A variable assigned while backward still holds its value (a matrix
//!   product's weight, for its input's gradient) is copied first
//!   (`AssignSubVariableOp`'s copy-on-write): the new value gets a buffer
//!   of its own and the old one dies with its last reader.

use crate::kinds::step::{Arg, Batch, Calc, Op, Program, Role};
use crate::OptimizerKind;

/// A tensor the step makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// Allocation `i` of the step program.
    Step(usize),
    /// A temporary of parameter `param`'s update, as Keras computes it;
    /// `scalar`: a float32 scalar, else of the parameter's shape.
    Temp {
        param: usize,
        name: &'static str,
        scalar: bool,
    },
    /// Parameter `p`'s value written by its update into a buffer of its
    /// own (copy-on-write): allocated, it becomes the parameter; freed,
    /// the old buffer dies.
    Copy(usize),
}

/// One event of the step, in the executor's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Alloc(Value),
    Free(Value),
    /// An elementwise op writes into its operand's buffer, the operand's
    /// last reader (`forward_input_or_allocate_output`): allocation `to`
    /// takes over allocation `from`'s buffer.
    Forward {
        from: usize,
        to: usize,
    },
    /// The last reader of a part of the batch has run.
    Release(Batch),
    /// A cuDNN convolution's workspace, allocated and freed in the call.
    Workspace(u64),
}

/// The events of one step of `program`: `trained` is each parameter's
/// bytes in `parameters()` order (0 when frozen: no update). The step's
/// values are made in the program's order and die at their last reader.
pub fn schedule(program: &Program, trained: &[u64], optimizer: OptimizerKind) -> Vec<Event> {
    let n = trained.len();
    let done = program.gradients_done(n);
    let reads = program.last_backward_reads(n);
    let death = deaths(program);
    let updated = |p: usize| trained[p] > 0 && done[p].is_some();
    // What dies, and which updates run, after each op.
    let mut dying: Vec<Vec<usize>> = vec![Vec::new(); program.ops.len()];
    for (i, t) in death.iter().enumerate() {
        t.inspect(|&t| dying[t].push(i));
    }
    let mut updates: Vec<Vec<usize>> = vec![Vec::new(); program.ops.len()];
    for p in (0..n).filter(|&p| updated(p)) {
        done[p].inspect(|&t| updates[t].push(p));
    }
    let mut events: Vec<Event> = (0..n)
        .filter(|&p| updated(p))
        .filter_map(|p| prelude(p, optimizer))
        .collect();
    let mut grads: Vec<Vec<usize>> = vec![Vec::new(); n];
    // Old buffers to free once backward's last read of them has run.
    let mut old: Vec<(usize, usize)> = Vec::new();
    for (t, op) in program.ops.iter().enumerate() {
        let mut forwarded = None;
        match *op {
            Op::Alloc(i) => match forwardable(program, &death, i, t) {
                Some(from) => {
                    forwarded = Some(from);
                    events.push(Event::Forward { from, to: i });
                }
                None => events.push(Event::Alloc(Value::Step(i))),
            },
            Op::Release(part) => events.push(Event::Release(part)),
            Op::Workspace(bytes) => events.push(Event::Workspace(bytes)),
            _ => {}
        }
        if let Op::Alloc(i) = *op {
            if let Role::Grad(p) = program.allocs[i].role {
                grads[p].push(i);
            }
        }
        for &i in dying[t].iter().filter(|&&i| forwarded != Some(i)) {
            events.push(Event::Free(Value::Step(i)));
            if let Role::Grad(p) = program.allocs[i].role {
                grads[p].retain(|&g| g != i);
            }
        }
        old.retain(|&(last, p)| {
            let dead = last <= t;
            if dead {
                events.push(Event::Free(Value::Copy(p)));
            }
            !dead
        });
        for &p in &updates[t] {
            let copied = reads[p].is_some();
            let gradient = std::mem::take(&mut grads[p]);
            update(&mut events, p, optimizer, &gradient, copied);
            match reads[p] {
                Some(last) if last > t => old.push((last, p)),
                Some(_) => events.push(Event::Free(Value::Copy(p))),
                None => {}
            }
        }
    }
    events.extend(old.into_iter().map(|(_, p)| Event::Free(Value::Copy(p))));
    events
}

/// Where each of the program's values dies under the executor: after its
/// last reader; one nothing reads, where the program frees it; a
/// gradient at its update, the loss never (`None`: it outlives the step).
fn deaths(program: &Program) -> Vec<Option<usize>> {
    let n = program.allocs.len();
    let (mut read, mut freed) = (vec![None; n], vec![None; n]);
    for (t, op) in program.ops.iter().enumerate() {
        match *op {
            Op::Alloc(i) => {
                for arg in program.allocs[i].calc.operands().into_iter().flatten() {
                    if let Arg::T(j) = arg {
                        read[j] = Some(t);
                    }
                }
            }
            Op::Free(i) => freed[i] = Some(t),
            _ => {}
        }
    }
    (0..n)
        .map(|i| match program.allocs[i].role {
            Role::Grad(_) | Role::Loss => None,
            _ => read[i].or(freed[i]),
        })
        .collect()
}

/// The operand allocation `i` (made at op `t`) writes into: an
/// elementwise op's operand of its size whose last reader it is.
fn forwardable(program: &Program, death: &[Option<usize>], i: usize, t: usize) -> Option<usize> {
    let a = &program.allocs[i];
    if !elementwise(&a.calc) {
        return None;
    }
    a.calc
        .operands()
        .into_iter()
        .flatten()
        .find_map(|arg| match arg {
            Arg::T(j) if death[j] == Some(t) && program.allocs[j].bytes() == a.bytes() => Some(j),
            _ => None,
        })
}

/// TensorFlow's elementwise kernels, which write into an input they may.
fn elementwise(calc: &Calc) -> bool {
    use Calc::*;
    matches!(
        calc,
        Add(..)
            | Scale(..)
            | Relu(_)
            | ReluBackward { .. }
            | Gelu(_)
            | GeluBackward { .. }
            | MaskedFill { .. }
            | Softmax(_)
            | SoftmaxBackward { .. }
            | Sqrt(_)
    )
}

/// What runs for parameter `p` before the forward pass: the update's
/// parts that read variables only.
fn prelude(p: usize, optimizer: OptimizerKind) -> Option<Event> {
    match optimizer {
        OptimizerKind::Sgd => None,
        OptimizerKind::Momentum => Some(Event::Alloc(temp(p, "m * momentum"))),
        OptimizerKind::Adam | OptimizerKind::Adamw => Some(Event::Alloc(scalar(p))),
    }
}

/// Keras's update of parameter `p` from its gradient's pieces, onto
/// `events`; `copied`: backward still reads the parameter, so the new
/// value is written into a buffer of its own.
fn update(
    events: &mut Vec<Event>,
    p: usize,
    optimizer: OptimizerKind,
    gradient: &[usize],
    copied: bool,
) {
    use Event::{Alloc, Free};
    let free_gradient = |events: &mut Vec<Event>| {
        events.extend(gradient.iter().map(|&i| Free(Value::Step(i))));
    };
    let copy = |events: &mut Vec<Event>| {
        if copied {
            events.push(Alloc(Value::Copy(p)));
        }
    };
    match optimizer {
        // `variable.assign_sub(gradient * lr)`.
        OptimizerKind::Sgd => {
            copy(events);
            free_gradient(events);
        }
        // `m.assign(-gradient * lr + m * momentum)`;
        // `variable.assign_add(m)`.
        OptimizerKind::Momentum => {
            events.push(Free(temp(p, "m * momentum")));
            free_gradient(events);
            copy(events);
        }
        // `v.assign_add((square(g) - v) * (1 - beta_2))`, `m` likewise;
        // `variable.assign_sub(m * alpha / (sqrt(v) + epsilon))`.
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            let (square, sqrt, step) = (
                temp(p, "square(gradient)"),
                temp(p, "sqrt(v)"),
                temp(p, "m * alpha"),
            );
            events.extend_from_slice(&[Alloc(square), Free(square), Alloc(sqrt)]);
            free_gradient(events);
            events.extend_from_slice(&[Alloc(step), Free(scalar(p)), Free(sqrt)]);
            copy(events);
            events.push(Free(step));
        }
    }
}

fn temp(param: usize, name: &'static str) -> Value {
    Value::Temp {
        param,
        name,
        scalar: false,
    }
}

/// Adam's per-variable scalar (its bias correction's power).
fn scalar(param: usize) -> Value {
    Value::Temp {
        param,
        name: "bias correction",
        scalar: true,
    }
}

/// The most bytes the step holds at once over what lived before it,
/// its values sized by `bytes`.
pub fn peak(events: &[Event], bytes: impl Fn(Value) -> u64) -> u64 {
    let (mut now, mut most) = (0i128, 0i128);
    for e in events {
        match *e {
            Event::Alloc(v) => now += i128::from(bytes(v)),
            Event::Free(v) => now -= i128::from(bytes(v)),
            Event::Workspace(b) => most = most.max(now + i128::from(b)),
            Event::Forward { .. } | Event::Release(_) => {}
        }
        most = most.max(now);
    }
    most as u64
}

#[cfg(test)]
mod tests;
