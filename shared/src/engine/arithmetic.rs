//! A step program's numbers: the next batch drawn from the dataset, the
//! program's arithmetic run on the CPU over the model's values, the
//! gradients added into `.grad`. The memory of the same ops is played by
//! `engine::program`; this runs after it, in the same order on the places
//! the play gave each tensor (so a step that ran out of memory computes
//! nothing). On a device that holds bytes, the values go to those places
//! (`engine::on_device`).

use super::placement::Placement;
use super::Engine;
use crate::runtime::ObjId;
#[cfg(feature = "device-values")]
use crate::train::autograd::grad_of;
use crate::train::cpu::{self, BatchValues, Computed, Inputs, Values};
use crate::train::data::Synthetic;
use crate::train::kinds::step::Program;
use crate::train::spec::Kind;
use crate::train::{ModelSpec, ARITHMETIC_HOST_LIMIT};
use std::ops::Range;

impl Engine {
    /// Whether `program`'s arithmetic runs here: `Ok` when it does, else
    /// why not: `Some(flops)`, too big a step; `None`, this build does not
    /// compute its ops (the page's own engine: a CNN's, a transformer's).
    pub(super) fn program_arithmetic(
        &self,
        spec: &ModelSpec,
        program: &Program,
    ) -> Result<(), Option<u64>> {
        let cost = program_cost(spec, program);
        if cost.flops > self.flop_limit || cost.host_bytes > ARITHMETIC_HOST_LIMIT {
            return Err(Some(cost.flops));
        }
        match program.allocs.iter().all(|a| cpu::in_this_build(&a.calc)) {
            true => Ok(()),
            false => Err(None),
        }
    }

    /// The next `batch` samples of `data` as a program reads them (token
    /// ids and next tokens, or images and labels); the cursor moves past
    /// them.
    pub(super) fn next_batch(&mut self, data: ObjId, spec: &ModelSpec, batch: u64) -> BatchValues {
        let (synthetic, start) = self.next_rows(data, batch).expect("dataset exists");
        let (input_shape, ..) = spec.batch(batch);
        let (inputs, targets) = match spec.kind {
            Kind::Transformer(_) => synthetic.sequences(start, batch),
            Kind::Cnn(_) | Kind::Mlp => {
                let (x, y) = synthetic.batch(start, batch);
                (x, y.into_iter().map(|c| c as f32).collect())
            }
        };
        BatchValues {
            inputs,
            input_shape,
            targets,
        }
    }

    /// The set `data` draws from and where its next `rows` samples start;
    /// the cursor moves past them.
    pub(super) fn next_rows(&mut self, data: ObjId, rows: u64) -> Option<(Synthetic, u64)> {
        let d = self.train.datasets.get_mut(&data)?;
        let start = d.cursor;
        d.cursor = (d.cursor + rows) % d.spec.samples.max(1);
        let synthetic = Synthetic {
            samples: d.spec.samples,
            features: d.spec.features,
            classes: d.spec.classes,
            seed: d.seed,
        };
        Some((synthetic, start))
    }

    /// Runs `program.ops[range]` on `values` with `model`'s parameters,
    /// the tensors where `placement` says. `None` (nothing computed) only
    /// if the program's arithmetic is faulty, which the interpreter's tests
    /// rule out, or the device refused its values.
    pub(super) fn run_arithmetic(
        &mut self,
        (model, placement): (ObjId, &Placement),
        program: &Program,
        range: Range<usize>,
        computed: &mut Computed,
    ) -> Option<()> {
        let state = self.train.models.get_mut(&model)?;
        #[cfg(feature = "device-values")]
        let spec = state.spec;
        let shapes: Vec<Vec<u64>> = state
            .spec
            .parameters()
            .into_iter()
            .map(|t| t.shape)
            .collect();
        let inputs = Inputs {
            shapes: &shapes,
            params: state.values_mut(),
            batch: &computed.batch,
            state: &[],
        };
        // A device that refuses a value, or gives another back, computes
        // nothing: the step runs shape-only, never with wrong numbers.
        #[cfg(feature = "device-values")]
        if let Some(memory) = self.process.device.memory() {
            let dtypes = param_dtypes(&spec);
            let device = super::on_device::DeviceInputs {
                cpu: &inputs,
                param_dtypes: &dtypes,
                input_dtype: spec.batch(0).1,
                batch_at: computed.batch_at,
                targets_shape: vec![computed.batch.targets.len() as u64],
            };
            let values = &mut computed.values;
            let tally = &mut self.tally;
            return super::on_device::run(
                memory, program, range, &device, values, placement, tally,
            )
            .ok();
        }
        let _ = placement;
        let ran = cpu::run(program, range, &inputs, &mut computed.values);
        debug_assert!(ran.is_ok(), "{ran:?}");
        ran.ok()
    }

    /// Where the steps since the last call computed their numbers, as a
    /// `train` note says it, and why a device gave none (its fault).
    pub(super) fn take_computed_where(&mut self) -> (String, Option<String>) {
        #[cfg(feature = "device-values")]
        {
            let t = std::mem::take(&mut self.tally);
            if t.alone && t.on_device > 0 {
                // A failed `opt.step()` leaves the losses computed, and says so.
                let failed = (t.fault.as_ref()).map_or(String::new(), |f| format!("; then {f}"));
                let said = format!(
                    "on the GPU alone ({} ops by its kernels and cuBLAS, opt.step() by its update kernels; a step this big is not checked against the CPU, its kernels are on smaller steps{failed})",
                    t.on_device
                );
                return (said, why_none(t.fault));
            }
            if t.on_device > 0 {
                let said = format!(
                    "on the GPU ({} ops by its kernels and cuBLAS, {} on the CPU and copied there; every value held to the CPU's)",
                    t.on_device, t.copied
                );
                return (said, why_none(t.fault));
            }
            ("on the CPU".into(), why_none(t.fault))
        }
        #[cfg(not(feature = "device-values"))]
        ("on the CPU".into(), None)
    }

    /// Writes each `.grad` of `model` to its tensor on a device that holds
    /// bytes.
    #[cfg(feature = "device-values")]
    fn write_grads(&mut self, model: ObjId) {
        let Some(state) = self.train.models.get(&model) else {
            return;
        };
        let k = &mut self.process;
        let places: Vec<Option<u64>> = (state.params.iter())
            .map(|&p| grad_of(k, p).and_then(|g| k.address(g)))
            .collect();
        let dtypes = param_dtypes(&state.spec);
        if let Some(memory) = k.device.memory() {
            let wrote = super::on_device::write_grads(memory, &state.grad_values, &places, &dtypes);
            debug_assert!(wrote.is_ok(), "{wrote:?}");
        }
    }

    /// Adds the gradients `values` made into the model's `.grad` values.
    pub(super) fn add_grads(&mut self, model: ObjId, values: &mut Values) {
        let Some(state) = self.train.models.get_mut(&model) else {
            return;
        };
        state.grad_values.resize(values.grads.len(), None);
        for (slot, grad) in state.grad_values.iter_mut().zip(values.grads.iter_mut()) {
            let Some(grad) = grad.take() else {
                continue;
            };
            match slot {
                Some(have) => have.iter_mut().zip(&grad).for_each(|(h, g)| *h += g),
                None => *slot = Some(grad),
            }
        }
        #[cfg(feature = "device-values")]
        self.write_grads(model);
    }

    /// A whole step program's arithmetic on the next `batch` samples: its
    /// loss (the criterion's, before any `/ accumulate`), the gradients
    /// added into `.grad`.
    pub(super) fn compute_step(
        &mut self,
        (model, placement): (ObjId, &Placement),
        data: ObjId,
        (program, batch): (&Program, u64),
    ) -> Option<f32> {
        let spec = self.train.models.get(&model)?.spec;
        let mut computed = Computed {
            values: Values::default(),
            batch: self.next_batch(data, &spec, batch),
            #[cfg(feature = "device-values")]
            batch_at: placement.batch(),
        };
        let all = 0..program.ops.len();
        self.run_arithmetic((model, placement), program, all, &mut computed)?;
        self.add_grads(model, &mut computed.values);
        computed.values.loss
    }
}

#[cfg(feature = "device-values")]
fn param_dtypes(spec: &ModelSpec) -> Vec<crate::types::Dtype> {
    spec.parameters().into_iter().map(|t| t.dtype).collect()
}

fn program_cost(spec: &ModelSpec, program: &Program) -> cpu::Cost {
    let shapes: Vec<Vec<u64>> = spec.parameters().into_iter().map(|t| t.shape).collect();
    cpu::cost(program, &shapes)
}

/// Why a step on a device computed no loss: its first fault.
#[cfg(feature = "device-values")]
fn why_none(fault: Option<String>) -> Option<String> {
    fault.map(|f| format!("the GPU's values were not the CPU's ({f})"))
}
