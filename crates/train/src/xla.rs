//! A jitted training step as XLA compiles it (`jax.jit(train_step)`, a
//! Keras `fit` step under `jit_compile`): one executable. Its arguments are
//! the parameters, the optimizer's state and the batch; its outputs the new
//! parameters and state and the loss, each a buffer of its own unless its
//! argument was donated (`donate_argnums`), then written in place (an
//! alias); every value in between lives in an output buffer not yet
//! written or in one temp allocation, made and freed by the call. Nothing
//! like PyTorch's `.grad` stays after it.
//!
//! The values are the step program's ([`Program`]: what autograd saves
//! and what backward makes), on its order; each parameter's update (the
//! optimizer's arithmetic, fused into its new value and state) runs as
//! soon as its gradient is complete, and then the gradient dies. A donated
//! parameter that backward reads is copied (XLA's copy insertion).
//! [`heap`] packs them as XLA's buffer assignment does. Numbers against
//! XLA's own `compile().memory_analysis()`: `tests/reference/xla_step.py`.

pub mod heap;

use crate::kinds::step::{Op, Program, Role};
use crate::{ModelSpec, OptimizerKind};
use heap::{Output, Value};
use vramlab_core::types::Dtype;

/// XLA's `memory_analysis()` of a step's executable, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Executable {
    /// Every argument: parameters, optimizer state, the batch.
    pub arguments: u64,
    /// Every output (new parameters and state, the loss) and the output
    /// tuple's index table (8 bytes a leaf).
    pub outputs: u64,
    /// Outputs written into their donated arguments.
    pub aliases: u64,
    /// The temp allocation.
    pub temp: u64,
    /// Outputs in buffers of their own: what the call allocates besides
    /// the temp (no index table).
    pub new_buffers: u64,
}

/// What a step is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compile {
    pub optimizer: OptimizerKind,
    /// `donate_argnums=(0, 1)`: the parameters and the state.
    pub donate: bool,
    /// The platform's buffer alignment (64 bytes on the CPU).
    pub alignment: u64,
}

/// Bytes of the output tuple's index table per leaf (a pointer).
const TUPLE_ENTRY: u64 = 8;

/// The executable of one training step of `spec` at `batch` samples.
pub fn executable(spec: &ModelSpec, program: &Program, batch: u64, c: Compile) -> Executable {
    // Each parameter's bytes in `parameters()` order, 0 when frozen (it
    // is an argument, not an output).
    let params = spec.parameters();
    let all: u64 = params
        .iter()
        .map(|t| t.numel() * t.dtype.size_bytes())
        .sum();
    let trained: Vec<u64> = params
        .iter()
        .map(|t| u64::from(!t.frozen) * t.numel() * t.dtype.size_bytes())
        .collect();
    let per_param = c.optimizer.state_per_param();
    // optax's Adam keeps its step `count` (an int32 scalar).
    let count = if per_param == 2 { 4 } else { 0 };
    let state: u64 = trained.iter().sum::<u64>() * per_param + count;
    let trained_bytes: u64 = trained.iter().sum();
    let leaves = trained.iter().filter(|&&b| b > 0).count() as u64 * (1 + per_param)
        + u64::from(count > 0)
        + 1;
    let aliases = if c.donate { trained_bytes + state } else { 0 };
    let updated = trained_bytes + state + 4;
    let (values, outputs) = schedule(program, &trained, per_param, c.donate);
    Executable {
        arguments: all + state + batch_bytes(spec, batch),
        outputs: updated + TUPLE_ENTRY * leaves,
        aliases,
        temp: heap::temp_bytes(&values, &outputs, c.alignment),
        new_buffers: updated - aliases,
    }
}

/// A batch as JAX holds it: 32-bit integers (x64 is off by default).
fn batch_bytes(spec: &ModelSpec, batch: u64) -> u64 {
    let (x, x_dtype, y) = spec.batch(batch);
    let bytes = |shape: &[u64], dtype: Dtype| {
        let size = if dtype == Dtype::Int64 {
            4
        } else {
            dtype.size_bytes()
        };
        shape.iter().product::<u64>() * size
    };
    bytes(&x, x_dtype) + bytes(&y, Dtype::Int64)
}

/// The step's values with their live ranges, and its output buffers.
/// Positions are twice the program's op index: an update writes the new
/// state at its gradient's last position and the new parameter just after,
/// once the gradient is dead, so the gradient may use that buffer (an
/// elementwise update writes over its operand; Adam's new parameter is
/// made from the new moments alone).
fn schedule(
    program: &Program,
    trained: &[u64],
    per_param: u64,
    donate: bool,
) -> (Vec<Value>, Vec<Output>) {
    let n = program.allocs.len();
    let (mut start, mut end) = (vec![None; n], vec![None; n]);
    for (t, op) in program.ops.iter().enumerate() {
        let t = 2 * t as u32;
        match *op {
            Op::Alloc(i) => start[i] = Some(t),
            Op::Free(i) => end[i] = Some(t),
            _ => {}
        }
    }
    let last = 2 * program.ops.len() as u32;
    // Each parameter's update: when the last piece of its gradient is made
    // or added in.
    let update: Vec<u32> = (program.gradients_done(trained.len()).into_iter())
        .map(|t| t.map_or(last, |t| 2 * t as u32))
        .collect();
    let mut values = Vec::new();
    let made = program.ops.iter().filter_map(|op| match *op {
        Op::Alloc(i) => Some(i),
        _ => None,
    });
    for i in made {
        let a = &program.allocs[i];
        let Some(s) = start[i] else { continue };
        let e = match a.role {
            Role::Loss => continue,
            Role::Grad(p) => end[i].unwrap_or(update.get(p).copied().unwrap_or(last)),
            Role::Forward | Role::Backward => end[i].unwrap_or(last),
            // An optimizer's program, not a step's: XLA's update is its own.
            Role::State { .. } | Role::QuantMap(_) | Role::Scratch { .. } => continue,
        };
        values.push(Value {
            bytes: a.bytes(),
            start: s,
            end: e,
        });
    }
    if donate && per_param > 0 {
        values.extend(copies(program, trained, &update, last));
    }
    let mut outputs = Vec::new();
    for (p, &bytes) in trained.iter().enumerate().filter(|(_, &b)| b > 0) {
        let state = Output {
            bytes,
            written: update[p],
            donated: donate,
        };
        outputs.extend(std::iter::repeat_n(state, per_param as usize));
        outputs.push(Output {
            written: update[p] + 1,
            ..state
        });
    }
    (values, outputs)
}

/// XLA's copy insertion for donated parameters whose update has state:
/// one that backward reads (a matrix product's weight, for its input's
/// gradient) is read by ops its in-place update is not ordered against,
/// so XLA copies it and reads the copy, which its schedule keeps until
/// late in the backward pass (after the gradients of the layers below).
/// Modelled as a buffer of the parameter's size from its update to the
/// step's end. Plain SGD's update is ordered after those reads: no copy.
fn copies(program: &Program, trained: &[u64], update: &[u32], last: u32) -> Vec<Value> {
    let read = program.last_backward_reads(trained.len());
    (0..trained.len())
        .filter(|&p| read[p].is_some() && trained[p] > 0)
        .map(|p| Value {
            bytes: trained[p],
            start: update[p] + 1,
            end: last,
        })
        .collect()
}

#[cfg(test)]
mod tests;
