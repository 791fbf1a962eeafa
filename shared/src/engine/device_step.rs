//! A step on the device alone: a step too big for the CPU to compute (so
//! too big to check against it), on a GPU whose kernels compute every op
//! of it. The parameters start there, drawn as `train::init` draws them
//! on the host; each batch is drawn there from the synthetic set; each op
//! runs by its kernels (`train::kernels`) on the places the memory play
//! gave it, in the program's order; `opt.step()`'s temporaries and
//! updates by the optimizers' kernels; the loss is read back. The ops and
//! kernels are the ones the checked steps hold to the CPU, op by op.

use super::on_device::plan_alloc;
use super::placement::Placement;
use super::Engine;
use crate::compute::Call;
use crate::runtime::ObjId;
use crate::train::autograd::grad_of;
use crate::train::init;
use crate::train::kernels::{self, Place};
use crate::train::kinds::step::{Arg, Calc, Op, Program, Role};
use crate::train::spec::Kind;
use crate::types::Dtype;

/// Where a program's operands live beyond its own tensors.
struct Places<'a> {
    program: &'a Program,
    allocs: &'a [Option<u64>],
    /// Each parameter's address, shape and type.
    params: &'a [(Option<u64>, Vec<u64>, Dtype)],
    /// Each parameter's `.grad`.
    grads: &'a [Option<u64>],
    /// The optimizer's state, `slots` tensors a parameter.
    state: &'a [Option<u64>],
    slots: usize,
    batch: [Option<(u64, &'a [u64], Dtype)>; 2],
}

impl<'a> Places<'a> {
    fn of(&self, arg: Arg) -> Option<Place<'a>> {
        let param = |p: usize, at: Option<u64>| {
            let (_, shape, dtype) = self.params.get(p)?;
            Some(Place {
                at: at?,
                shape,
                dtype: *dtype,
            })
        };
        match arg {
            Arg::T(i) => Some(Place {
                at: (*self.allocs.get(i)?)?,
                shape: &self.program.allocs[i].shape,
                dtype: self.program.allocs[i].dtype,
            }),
            Arg::Param(p) => param(p, self.params.get(p)?.0),
            Arg::Grad(p) => param(p, *self.grads.get(p)?),
            Arg::State { param: p, slot } => param(p, *self.state.get(p * self.slots + slot)?),
            Arg::Batch(part) => {
                let (at, shape, dtype) = self.batch[part as usize]?;
                Some(Place { at, shape, dtype })
            }
        }
    }
}

impl Engine {
    /// Whether `program` can run on the device alone: the device runs
    /// code, a kernel computes each of its ops, and the optimizer's
    /// update has one (`torch.optim`'s, not bitsandbytes').
    pub(super) fn device_runs(&mut self, program: &Program, optimizer: ObjId) -> bool {
        let kernels = program.allocs.iter().all(|a| kernels::has_kernel(&a.calc));
        let optimizer = self
            .train
            .optimizers
            .get(&optimizer)
            .is_some_and(|o| o.bits == 32);
        let device = self
            .process
            .device
            .memory()
            .is_some_and(|m| m.compute().is_some());
        kernels && optimizer && device
    }

    /// One micro-batch's step on the device alone: its loss, or `None`
    /// with the fault in the tally.
    pub(super) fn device_step(
        &mut self,
        (model, placement): (ObjId, &Placement),
        data: ObjId,
        (program, rows): (&Program, u64),
    ) -> Option<f32> {
        self.tally.alone = true;
        let ran = self.try_device_step((model, placement), data, (program, rows));
        match ran {
            Ok(loss) => loss,
            Err(fault) => {
                self.tally.fault.get_or_insert(fault);
                None
            }
        }
    }

    fn try_device_step(
        &mut self,
        (model, placement): (ObjId, &Placement),
        data: ObjId,
        (program, rows): (&Program, u64),
    ) -> Result<Option<f32>, String> {
        let state = self.train.models.get(&model).ok_or("no model")?;
        let (spec, seed, fresh) = (state.spec, state.seed, !state.device_resident);
        let named = spec.parameters();
        let params: Vec<_> = (named.iter().zip(&placement.params))
            .map(|(t, &at)| (at, t.shape.clone(), t.dtype))
            .collect();
        let mut calls = vec![];
        if fresh {
            for (index, (rule, (at, shape, dtype))) in
                init::rules(&named).into_iter().zip(&params).enumerate()
            {
                let at = at.ok_or("a parameter has no place")?;
                let place = Place {
                    at,
                    shape,
                    dtype: *dtype,
                };
                calls.push(kernels::init(place, rule, seed, index as u64));
            }
        }
        calls.push(self.draw_batch(data, &spec, placement, rows)?);
        self.launch_all(&calls)?;
        if let Some(m) = self.train.models.get_mut(&model) {
            m.device_resident = true;
            m.values = None;
        }
        let grads: Vec<Option<u64>> = {
            let state = &self.train.models[&model];
            let k = &self.process;
            state
                .params
                .iter()
                .map(|&p| grad_of(k, p).and_then(|g| k.address(g)))
                .collect()
        };
        let (x_shape, x_dtype, y_shape) = spec.batch(rows);
        let batch = placement.batch;
        let places = Places {
            program,
            allocs: &placement.allocs,
            params: &params,
            grads: &grads,
            state: &[],
            slots: 0,
            batch: [
                batch[0].map(|at| (at, x_shape.as_slice(), x_dtype)),
                batch[1].map(|at| (at, y_shape.as_slice(), labels_dtype(&self.settings))),
            ],
        };
        let loss = self.run_ops(program, placement, &places)?;
        if let Some(m) = self.train.models.get_mut(&model) {
            m.device_grads = true;
        }
        Ok(loss)
    }

    /// The next `rows` samples drawn into the batch's places; the cursor
    /// moves past them (as `next_batch`).
    fn draw_batch(
        &mut self,
        data: ObjId,
        spec: &crate::train::ModelSpec,
        placement: &Placement,
        rows: u64,
    ) -> Result<Call, String> {
        let (set, start) = self.next_rows(data, rows).ok_or("no dataset")?;
        let (x_shape, x_dtype, y_shape) = spec.batch(rows);
        let [Some(x), Some(y)] = placement.batch else {
            return Err("the batch has no place".into());
        };
        let labels = labels_dtype(&self.settings);
        let sequences = matches!(spec.kind, Kind::Transformer(_));
        let places = [
            Place {
                at: x,
                shape: &x_shape,
                dtype: x_dtype,
            },
            Place {
                at: y,
                shape: &y_shape,
                dtype: labels,
            },
        ];
        Ok(kernels::batch(sequences, places, &set, (start, rows)))
    }

    /// Each allocation of `program` computed by its kernels, in order; a
    /// gradient added into its parameter's `.grad` where that is another
    /// tensor (accumulation). Returns the criterion's value, read back
    /// as soon as it is computed.
    fn run_ops(
        &mut self,
        program: &Program,
        placement: &Placement,
        places: &Places,
    ) -> Result<Option<f32>, String> {
        let (mut loss, mut kept) = (None, None);
        for (at, op) in program.ops.iter().enumerate() {
            let Op::Alloc(i) = *op else { continue };
            let alloc = &program.allocs[i];
            if let Calc::Part { .. } = alloc.calc {
                continue;
            }
            let mut calls =
                plan_alloc(program, placement, (at, i), |a| places.of(a)).ok_or_else(|| {
                    format!(
                        "{} ({:?}): no kernel computes it where its tensors are",
                        alloc.op, alloc.shape
                    )
                })?;
            let out = places.of(Arg::T(i)).ok_or("a tensor has no place")?;
            if let Role::Grad(p) = alloc.role {
                if let Some(grad) = places.of(Arg::Grad(p)).filter(|g| g.at != out.at) {
                    let add = Calc::Add(Arg::T(0), Arg::T(0));
                    calls.extend(
                        kernels::plan(&add, grad, &[], &[grad, out], None)
                            .into_iter()
                            .flatten(),
                    );
                }
            }
            self.launch_all(&calls)
                .map_err(|e| format!("{}: {e}", alloc.op))?;
            self.tally.on_device += 1;
            if let Calc::Nll { .. } = alloc.calc {
                // Read now only where the step frees it (`/ accumulate`):
                // a read waits for the GPU, which then idles while the
                // rest is launched.
                match program.ops.contains(&Op::Free(i)) {
                    true => loss = Some(self.read_value(out)?),
                    false => kept = Some(out),
                }
            }
        }
        match kept {
            Some(out) => self.read_value(out),
            None => Ok(loss.flatten()),
        }
    }

    /// The first element of a tensor on the device.
    fn read_value(&mut self, at: Place) -> Result<Option<f32>, String> {
        let mut bytes = vec![0; at.dtype.size_bytes() as usize];
        let memory = self
            .process
            .device
            .memory()
            .ok_or("the device holds no values")?;
        memory
            .read(at.at, &mut bytes)
            .map_err(|e| format!("reading the loss: {e}"))?;
        Ok(super::on_device::decode(at.dtype, &bytes).first().copied())
    }

    /// `opt.step()` on the device: its program's allocations (the state
    /// the first step makes, Adam's temporaries) by their kernels, then
    /// each update in place. `false` where the model's values are not the
    /// device's alone (the host's update runs instead).
    pub(super) fn device_update(
        &mut self,
        optimizer: ObjId,
        program: &Program,
        placement: &Placement,
    ) -> bool {
        let Some(o) = self.train.optimizers.get_mut(&optimizer) else {
            return false;
        };
        let model = o.model;
        if !self
            .train
            .models
            .get(&model)
            .is_some_and(|m| m.device_resident)
        {
            return false;
        }
        o.steps += 1;
        let (kind, steps, lr, slots) = (o.kind, o.steps, o.lr, o.kind.state_per_param() as usize);
        let k = &self.process;
        let state_at: Vec<Option<u64>> = o.state.iter().map(|&s| k.address(s)).collect();
        let m = &self.train.models[&model];
        let named = m.spec.parameters();
        let params: Vec<_> = (named.iter().zip(&m.params))
            .map(|(t, &p)| (k.address(p), t.shape.clone(), t.dtype))
            .collect();
        let grads: Vec<Option<u64>> = m
            .params
            .iter()
            .map(|&p| grad_of(k, p).and_then(|g| k.address(g)))
            .collect();
        // The state, `slots` tensors for each parameter in order.
        let state: Vec<Option<u64>> = match state_at.len() == params.len() * slots {
            true => state_at,
            false => vec![None; params.len() * slots],
        };
        let places = Places {
            program,
            allocs: &placement.allocs,
            params: &params,
            grads: &grads,
            state: &state,
            slots,
            batch: [None, None],
        };
        let mut ran = self.run_ops(program, placement, &places).map(|_| ());
        // Gradients a shape-only step allocated hold nothing computed:
        // the parameters stay.
        let fresh = self
            .train
            .models
            .get_mut(&model)
            .is_some_and(|m| std::mem::take(&mut m.device_grads));
        for op in program.ops.iter().filter(|_| fresh) {
            let Op::Update(p) = *op else { continue };
            let (Some(param), Some(grad)) = (places.of(Arg::Param(p)), places.of(Arg::Grad(p)))
            else {
                continue;
            };
            let tensors: Option<Vec<Place>> = (0..slots)
                .map(|slot| places.of(Arg::State { param: p, slot }))
                .collect();
            let call = tensors.and_then(|t| kernels::update(kind, (param, grad), &t, steps, lr));
            let launched = match call {
                Some(call) => self.launch_all(&[call]),
                None => Err("no update kernel fits its state".into()),
            };
            ran = ran.and(launched.map_err(|e| format!("opt.step(): {e}")));
        }
        if let Err(fault) = ran {
            self.tally.fault.get_or_insert(fault);
        }
        true
    }

    fn launch_all(&mut self, calls: &[Call]) -> Result<(), String> {
        let memory = self
            .process
            .device
            .memory()
            .ok_or("the device holds no values")?;
        let compute = memory.compute().ok_or("the device runs no code")?;
        for call in calls {
            call.run(compute).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The labels' type: int64, int32 under JAX (as `loop_batch` makes them).
fn labels_dtype(settings: &crate::framework::Settings) -> Dtype {
    match settings.framework {
        crate::types::Framework::Jax => Dtype::Int32,
        _ => Dtype::Int64,
    }
}
