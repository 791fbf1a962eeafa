//! A step's values on a device that holds bytes (a real GPU): the
//! interpreter's seam between the CPU's arithmetic and a device's.
//!
//! The memory play placed every tensor ([`Placement`]); here each op runs
//! on the CPU and what it makes is written, in its own type, to the block
//! the allocator gave it; every operand an op reads is first read back
//! from its block and held to the value the CPU has, so a placement that
//! let two live tensors share bytes is caught at the op; the loss is the
//! one read back from the device. The parameters and the batch are written
//! where their tensors live before the ops run (a batch of a set on the
//! device at its rows), each `.grad` after the gradients are added; the
//! optimizers' states stay the host's. A device's kernels take the CPU's place op by op:
//! the addresses, the operands and the check stay.

use super::placement::Placement;
use crate::device::DeviceMemory;
use crate::train::cpu::{self, Inputs, Unrunnable, Values};
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
}

/// Runs `program.ops[range]` as [`cpu::run`] does, with every value on the
/// device at its place.
pub(super) fn run(
    memory: &mut dyn DeviceMemory,
    program: &Program,
    range: Range<usize>,
    inputs: &DeviceInputs,
    values: &mut Values,
    placement: &Placement,
) -> Result<(), Unrunnable> {
    let mut device = OnDevice {
        memory,
        program,
        inputs,
        placement,
    };
    device.write_inputs()?;
    for at in range {
        if let Op::Alloc(i) = program.ops[at] {
            device.check_operands(i, values)?;
        }
        cpu::run(program, at..at + 1, inputs.cpu, values)?;
        if let Op::Alloc(i) = program.ops[at] {
            device.store(i, values)?;
        }
    }
    Ok(())
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
}

impl OnDevice<'_> {
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
            if let Some(at) = self.inputs.batch_at[part as usize] {
                let (value, dtype) = self.batch(part);
                let bytes = encode(dtype, value);
                write(self.memory, at, &bytes)?;
            }
        }
        Ok(())
    }

    fn batch(&self, part: Batch) -> (&[f32], Dtype) {
        let batch = self.inputs.cpu.batch;
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
            let (place, value, dtype) = match arg {
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
                // `opt.step()`'s operands: its update runs on the host.
                Arg::Grad(_) | Arg::State { .. } => continue,
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
                    "{}: its operand {arg:?} read back from {at:#x} is not the value written \
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
            values.loss = decode_first(dtype, &back);
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

/// The first element of a floating-point tensor's bytes.
fn decode_first(dtype: Dtype, bytes: &[u8]) -> Option<f32> {
    let two = || Some([*bytes.first()?, *bytes.get(1)?]);
    match dtype {
        Dtype::Float32 => Some(f32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)),
        Dtype::Float64 => Some(f64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as f32),
        Dtype::Float16 => Some(half::f16::from_le_bytes(two()?).to_f32()),
        Dtype::Bfloat16 => Some(half::bf16::from_le_bytes(two()?).to_f32()),
        _ => None,
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
            assert_eq!(decode_first(dtype, &bytes), Some(-2.25), "{dtype:?}");
        }
    }
}
