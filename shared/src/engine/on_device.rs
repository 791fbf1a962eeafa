//! A step's values on a device that holds bytes (a real GPU): the
//! interpreter's seam between the CPU's arithmetic and a device's.
//!
//! The memory play placed every tensor ([`Placement`]); here each op runs
//! on the CPU, and on a device that runs code also on the device, by its
//! kernels (`train::kernels`): the device's value, held to the CPU's from
//! the same operands, becomes the value; where the device has no kernel
//! for the op, the CPU's is written, in its own type, to the block the
//! allocator gave it. Every operand an op reads is first read back from
//! its block and held to the value it has, so a placement that let two
//! live tensors share bytes is caught at the op; the loss is the one read
//! back from the device. The parameters and the batch are written
//! where their tensors live before the ops run (a batch of a set on the
//! device at its rows), each `.grad` after the gradients are added; the
//! optimizers' states stay the host's. A device's kernels take the CPU's place op by op:
//! the addresses, the operands and the check stay.

use super::placement::Placement;
use crate::compute::Call;
use crate::device::DeviceMemory;
use crate::train::cpu::{self, Inputs, Unrunnable, Values};
use crate::train::kernels::{self, Place};
use crate::train::kinds::step::{Arg, Batch, Calc, Op, Program};
use crate::types::Dtype;
use std::ops::Range;

/// What the device interpreter reads besides the program: the CPU's
/// inputs, the parameters' and the batch's types.
pub(super) struct DeviceInputs<'a> {
    pub cpu: &'a Inputs<'a>,
    pub param_dtypes: &'a [Dtype],
    /// The batch's inputs' type (token ids, images); targets are int64.
    pub input_dtype: Dtype,
    /// Where the batch's inputs and targets live.
    pub batch_at: [Option<u64>; 2],
    /// The targets' shape (one label a row or a token).
    pub targets_shape: Vec<u64>,
}

/// What ran where in a step on a device that holds values: ops its own
/// kernels computed, ops the CPU computed and copied there, and the first
/// op whose value the device could not give (then the step computed
/// nothing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub on_device: u64,
    pub copied: u64,
    /// The steps ran on the device alone (`engine::device_step`): too big
    /// for the CPU to check.
    pub alone: bool,
    pub fault: Option<String>,
}

/// Runs `program.ops[range]` as [`cpu::run`] does, with every value on the
/// device at its place: computed there by its kernels where the device
/// runs code and has a kernel for the op, held to the CPU's value.
pub(super) fn run(
    memory: &mut dyn DeviceMemory,
    program: &Program,
    range: Range<usize>,
    inputs: &DeviceInputs,
    values: &mut Values,
    placement: &Placement,
    tally: &mut Tally,
) -> Result<(), Unrunnable> {
    let mut device = OnDevice {
        memory,
        program,
        inputs,
        placement,
        ran: vec![false; program.allocs.len()],
    };
    let ran = device.run(range, values, tally);
    if let Err(e) = &ran {
        tally.fault.get_or_insert_with(|| e.0.clone());
    }
    ran
}

/// The calls that compute allocation `i` (made at op `at`) and its later
/// outputs (the `Part`s right after it) where `place` finds each tensor,
/// with the workspace of the cuBLAS call that follows it: `None` where a
/// tensor has no place or no kernel computes the op.
pub(super) fn plan_alloc<'p>(
    program: &'p Program,
    placement: &Placement,
    (at, i): (usize, usize),
    place: impl Fn(Arg) -> Option<Place<'p>>,
) -> Option<Vec<Call>> {
    let out = place(Arg::T(i))?;
    let mut parts = vec![];
    for op in &program.ops[at + 1..] {
        match *op {
            Op::Alloc(j) if matches!(program.allocs[j].calc, Calc::Part { of, .. } if of == i) => {
                parts.push(place(Arg::T(j))?)
            }
            _ => break,
        }
    }
    let calc = &program.allocs[i].calc;
    let args: Vec<Place> = calc
        .operands()
        .into_iter()
        .flatten()
        .map(&place)
        .collect::<Option<_>>()?;
    let workspace = match program.ops.get(at + 1) {
        Some(Op::Blas(..)) => (placement.workspaces.iter())
            .find(|w| w.0 == at + 1)
            .map(|&(_, at, bytes)| (at, bytes)),
        _ => None,
    };
    kernels::plan(calc, out, &parts, &args, workspace)
}

/// Writes each `.grad` (its value, at its tensor's place).
pub(super) fn write_grads(
    memory: &mut dyn DeviceMemory,
    grads: &[Option<Vec<f32>>],
    places: &[Option<u64>],
    dtypes: &[Dtype],
) -> Result<(), Unrunnable> {
    for ((grad, place), &dtype) in grads.iter().zip(places).zip(dtypes) {
        if let (Some(grad), Some(at)) = (grad, place) {
            write(memory, *at, &encode(dtype, grad))?;
        }
    }
    Ok(())
}

struct OnDevice<'a> {
    memory: &'a mut dyn DeviceMemory,
    program: &'a Program,
    inputs: &'a DeviceInputs<'a>,
    placement: &'a Placement,
    /// Which allocations the device's kernels computed (their parts
    /// included) in this run.
    ran: Vec<bool>,
}

impl<'a> OnDevice<'a> {
    fn run(
        &mut self,
        range: Range<usize>,
        values: &mut Values,
        tally: &mut Tally,
    ) -> Result<(), Unrunnable> {
        self.write_inputs()?;
        // A statement's labels may lie where a forward temporary was: they
        // are written again just before the loss reads them.
        let targets_read = self.program.targets_read();
        for at in range {
            if at == targets_read {
                self.write_batch(Batch::Targets)?;
            }
            let Op::Alloc(i) = self.program.ops[at] else {
                cpu::run(self.program, at..at + 1, self.inputs.cpu, values)?;
                continue;
            };
            self.check_operands(i, values)?;
            cpu::run(self.program, at..at + 1, self.inputs.cpu, values)?;
            let computed = match self.program.allocs[i].calc {
                Calc::Part { of, .. } => self.ran.get(of).copied().unwrap_or(false),
                _ => self.compute(at, i)?,
            };
            if computed {
                self.ran[i] = true;
                tally.on_device +=
                    u64::from(!matches!(self.program.allocs[i].calc, Calc::Part { .. }));
                self.compare(i, values)?;
            } else {
                tally.copied += 1;
                self.store(i, values)?;
            }
        }
        Ok(())
    }

    /// Allocation `i` (made at op `at`) computed by the device's kernels,
    /// where it runs code and has them: `false` when it does not.
    fn compute(&mut self, at: usize, i: usize) -> Result<bool, Unrunnable> {
        let program = self.program;
        let Some(calls) = plan_alloc(program, self.placement, (at, i), |a| self.place(a)) else {
            return Ok(false);
        };
        let Some(compute) = self.memory.compute() else {
            return Ok(false);
        };
        for call in &calls {
            call.run(compute)
                .map_err(|e| Unrunnable(format!("{} on the GPU: {e}", program.allocs[i].op)))?;
        }
        Ok(true)
    }

    /// Where operand `arg` lives: its address, shape and type.
    fn place(&self, arg: Arg) -> Option<Place<'a>> {
        let (program, inputs): (&'a Program, &'a DeviceInputs<'a>) = (self.program, self.inputs);
        let cpu = inputs.cpu;
        match arg {
            Arg::T(j) => Some(Place {
                at: self.placement.allocs.get(j).copied().flatten()?,
                shape: &program.allocs[j].shape,
                dtype: program.allocs[j].dtype,
            }),
            Arg::Param(p) => Some(Place {
                at: self.placement.params.get(p).copied().flatten()?,
                shape: cpu.shapes.get(p)?,
                dtype: *self.inputs.param_dtypes.get(p)?,
            }),
            Arg::Batch(part) => Some(Place {
                at: self.inputs.batch_at[part as usize]?,
                shape: match part {
                    Batch::Inputs => &cpu.batch.input_shape,
                    Batch::Targets => &inputs.targets_shape,
                },
                dtype: self.batch(part).1,
            }),
            Arg::Grad(_) | Arg::State { .. } => None,
        }
    }

    /// Operand `arg`'s place on the device, its value on the host and its
    /// type (`None`: `opt.step()`'s operands, whose update runs on the
    /// host).
    fn operand<'v>(&self, arg: Arg, values: &'v Values) -> Option<Operand<'v>>
    where
        'a: 'v,
    {
        Some(match arg {
            Arg::T(j) => (
                self.placement.allocs[j],
                values.tensor(j),
                self.program.allocs[j].dtype,
            ),
            Arg::Param(p) => (
                self.placement.params.get(p).copied().flatten(),
                self.inputs.cpu.params.get(p).map(Vec::as_slice),
                self.inputs.param_dtypes[p],
            ),
            Arg::Batch(part) => {
                let (value, dtype) = self.batch(part);
                (self.inputs.batch_at[part as usize], Some(value), dtype)
            }
            Arg::Grad(_) | Arg::State { .. } => return None,
        })
    }

    /// What a sum into one of allocation `i`'s `len` elements may keep of
    /// rounding alone, whatever it adds to: its op's first operand (a
    /// backward's gradient) summed, its elements per output element the
    /// terms, float32's epsilon each. A sum that cancels (a bias's
    /// gradient before batch norm is zero but for rounding) is held to
    /// this, not to its own magnitude.
    fn rounding_floor(&self, i: usize, len: usize, values: &Values) -> f32 {
        let calc = match self.program.allocs[i].calc {
            Calc::Part { of, .. } => self.program.allocs[of].calc,
            calc => calc,
        };
        let first = calc.operands()[0].and_then(|arg| self.operand(arg, values));
        let Some((_, Some(terms), _)) = first else {
            return 0.0;
        };
        let largest = terms.iter().fold(0f32, |m, v| m.max(v.abs()));
        let per_element = terms.len().div_ceil(len.max(1)) as f32;
        f32::EPSILON * per_element * largest
    }

    /// The device's value of allocation `i` is the CPU's (computed from
    /// the same operands), within what the element type and a different
    /// order of sums allow; then it is the value, for the ops after it and
    /// the gradients, and the loss is the device's.
    fn compare(&mut self, i: usize, values: &mut Values) -> Result<(), Unrunnable> {
        let Some(want) = values.tensor(i).filter(|v| !v.is_empty()) else {
            return Ok(());
        };
        let alloc = &self.program.allocs[i];
        let at = self.placement.allocs[i].ok_or_else(|| unplaced(alloc.op, Arg::T(i)))?;
        let mut have = vec![0; want.len() * alloc.dtype.size_bytes() as usize];
        read(self.memory, at, &mut have)?;
        let have = decode(alloc.dtype, &have);
        let floor = self.rounding_floor(i, want.len(), values);
        close(alloc.dtype, &have, want, floor).map_err(|e| {
            Unrunnable(format!(
                "{} ({:?}) computed on the GPU: {e}",
                alloc.op, alloc.shape
            ))
        })?;
        if let Calc::Nll { .. } = alloc.calc {
            values.loss = have.first().copied();
        }
        values.adopt(self.program, i, have);
        Ok(())
    }

    /// The parameters and the batch, as the host holds them.
    fn write_inputs(&mut self) -> Result<(), Unrunnable> {
        let cpu = self.inputs.cpu;
        let params = cpu.params.iter().zip(self.inputs.param_dtypes);
        for ((value, &dtype), at) in params.zip(&self.placement.params) {
            if let Some(at) = at {
                write(self.memory, *at, &encode(dtype, value))?;
            }
        }
        for part in [Batch::Inputs, Batch::Targets] {
            self.write_batch(part)?;
        }
        Ok(())
    }

    fn write_batch(&mut self, part: Batch) -> Result<(), Unrunnable> {
        if let Some(at) = self.inputs.batch_at[part as usize] {
            let (value, dtype) = self.batch(part);
            write(self.memory, at, &encode(dtype, value))?;
        }
        Ok(())
    }

    fn batch(&self, part: Batch) -> (&'a [f32], Dtype) {
        let inputs: &'a DeviceInputs<'a> = self.inputs;
        let batch = inputs.cpu.batch;
        match part {
            Batch::Inputs => (&batch.inputs, self.inputs.input_dtype),
            Batch::Targets => (&batch.targets, Dtype::Int64),
        }
    }

    /// Allocation `i`'s operands, read back from their blocks, are the
    /// values the CPU holds.
    fn check_operands(&mut self, i: usize, values: &Values) -> Result<(), Unrunnable> {
        let alloc = &self.program.allocs[i];
        if let Calc::Part { .. } = alloc.calc {
            return Ok(());
        }
        for arg in alloc.calc.operands().into_iter().flatten() {
            let Some((place, value, dtype)) = self.operand(arg, values) else {
                continue;
            };
            let Some(value) = value.filter(|v| !v.is_empty()) else {
                continue;
            };
            let at = place.ok_or_else(|| unplaced(alloc.op, arg))?;
            let want = encode(dtype, value);
            let mut have = vec![0; want.len()];
            read(self.memory, at, &mut have)?;
            if have != want {
                return Err(Unrunnable(format!(
                    "{}: its operand {arg:?} read back from {at:#x} is not the value made \
                     there (another live tensor shares its bytes)",
                    alloc.op
                )));
            }
        }
        Ok(())
    }

    /// Writes allocation `i`'s value to its block; the loss is read back.
    fn store(&mut self, i: usize, values: &mut Values) -> Result<(), Unrunnable> {
        let Some(value) = values.tensor(i).filter(|v| !v.is_empty()) else {
            return Ok(());
        };
        let op = self.program.allocs[i].op;
        let at = self.placement.allocs[i].ok_or_else(|| unplaced(op, Arg::T(i)))?;
        let dtype = self.program.allocs[i].dtype;
        let bytes = encode(dtype, value);
        write(self.memory, at, &bytes)?;
        if let Calc::Nll { .. } = self.program.allocs[i].calc {
            let mut back = vec![0; bytes.len()];
            read(self.memory, at, &mut back)?;
            values.loss = decode(dtype, &back).first().copied();
        }
        Ok(())
    }
}

fn unplaced(op: &str, arg: Arg) -> Unrunnable {
    Unrunnable(format!(
        "{op}: {arg:?} has a value but no place on the device"
    ))
}

fn write(memory: &mut dyn DeviceMemory, at: u64, bytes: &[u8]) -> Result<(), Unrunnable> {
    memory
        .write(at, bytes)
        .map_err(|e| Unrunnable(format!("writing {} bytes at {at:#x}: {e}", bytes.len())))
}

fn read(memory: &mut dyn DeviceMemory, at: u64, out: &mut [u8]) -> Result<(), Unrunnable> {
    memory
        .read(at, out)
        .map_err(|e| Unrunnable(format!("reading {} bytes at {at:#x}: {e}", out.len())))
}

/// `values` as a tensor of `dtype` holds them (little-endian; integers and
/// booleans from the floats the interpreter keeps them as).
pub(super) fn encode(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes() as usize);
    for &v in values {
        match dtype {
            Dtype::Float64 => out.extend((v as f64).to_le_bytes()),
            Dtype::Float32 => out.extend(v.to_le_bytes()),
            Dtype::Float16 => out.extend(half::f16::from_f32(v).to_le_bytes()),
            Dtype::Bfloat16 => out.extend(half::bf16::from_f32(v).to_le_bytes()),
            Dtype::Int64 => out.extend((v as i64).to_le_bytes()),
            Dtype::Int32 => out.extend((v as i32).to_le_bytes()),
            Dtype::Int16 => out.extend((v as i16).to_le_bytes()),
            Dtype::Int8 => out.extend((v as i8).to_le_bytes()),
            Dtype::Uint8 => out.push(v as u8),
            Dtype::Bool => out.push(u8::from(v != 0.0)),
        }
    }
    out
}

/// A tensor's bytes as the floats the interpreter holds it as.
pub(super) fn decode(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    let width = dtype.size_bytes() as usize;
    let element = |b: &[u8]| -> f32 {
        let two = [b[0], *b.get(1).unwrap_or(&0)];
        match dtype {
            Dtype::Float32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Dtype::Float64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32,
            Dtype::Float16 => half::f16::from_le_bytes(two).to_f32(),
            Dtype::Bfloat16 => half::bf16::from_le_bytes(two).to_f32(),
            Dtype::Int64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32,
            Dtype::Int32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            Dtype::Int16 => i16::from_le_bytes(two) as f32,
            Dtype::Int8 => b[0] as i8 as f32,
            Dtype::Uint8 => b[0] as f32,
            Dtype::Bool => f32::from(b[0] != 0),
        }
    };
    bytes.chunks_exact(width).map(element).collect()
}

/// How far a value the device computed may be from the CPU's, from the
/// same operands, as a fraction of the tensor's largest magnitude:
/// float32's sums in another order (a sum that cancels loses digits of
/// its own magnitude); a half type's last bits, rounded at another step.
fn tolerance(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float32 | Dtype::Float64 => 1e-3,
        Dtype::Float16 => 1e-2,
        Dtype::Bfloat16 => 4e-2,
        // Integers, booleans: exactly.
        _ => 0.0,
    }
}

/// An operand's place on the device, its value on the host, its type.
type Operand<'v> = (Option<u64>, Option<&'v [f32]>, Dtype);

/// `have` (the device's) is `want` (the CPU's) within [`tolerance`]: no
/// NaN or infinity where the CPU has a number, no element further than
/// the tolerance times the largest magnitude, or than `floor` (what a sum
/// whose terms cancel keeps of rounding alone).
fn close(dtype: Dtype, have: &[f32], want: &[f32], floor: f32) -> Result<(), String> {
    if have.len() != want.len() {
        return Err(format!("{} elements, not {}", have.len(), want.len()));
    }
    let scale = want
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let allowed = (tolerance(dtype) * scale).max(floor);
    let mut worst = (0usize, 0f32);
    for (i, (h, w)) in have.iter().zip(want).enumerate() {
        let off = if w.is_finite() {
            (h - w).abs()
        } else if h.to_bits() == w.to_bits() || (h.is_nan() && w.is_nan()) {
            0.0
        } else {
            f32::INFINITY
        };
        // A NaN the CPU does not have is as far as can be.
        let off = if off.is_nan() { f32::INFINITY } else { off };
        if off > worst.1 {
            worst = (i, off);
        }
    }
    match worst.1 <= allowed {
        true => Ok(()),
        false => Err(format!(
            "element {} is {} where the CPU has {} (allowed {allowed:e} of values up to {scale:e})",
            worst.0, have[worst.0], want[worst.0]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_is_written_as_torch_stores_it() {
        assert_eq!(encode(Dtype::Float32, &[1.5]), 1.5f32.to_le_bytes());
        // float16 1.5: sign 0, exponent 15, mantissa 0x200.
        assert_eq!(encode(Dtype::Float16, &[1.5]), 0x3e00u16.to_le_bytes());
        assert_eq!(encode(Dtype::Bfloat16, &[1.5]), 0x3fc0u16.to_le_bytes());
        assert_eq!(encode(Dtype::Int64, &[7.0]), 7i64.to_le_bytes());
        assert_eq!(encode(Dtype::Bool, &[0.0, 2.0]), [0, 1]);
        for dtype in [
            Dtype::Float32,
            Dtype::Float16,
            Dtype::Bfloat16,
            Dtype::Float64,
        ] {
            let bytes = encode(dtype, &[-2.25, 9.0]);
            assert_eq!(bytes.len() as u64, 2 * dtype.size_bytes());
            assert_eq!(decode(dtype, &bytes), [-2.25, 9.0], "{dtype:?}");
        }
    }
}
