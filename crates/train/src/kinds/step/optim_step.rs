//! `optimizer.step()` as a program, the same for every model kind: at the
//! first step each parameter's state as `torch.optim` (or bitsandbytes)
//! makes it, held by the optimizer from then on; Adam's foreach
//! temporaries; and each parameter's update ([`Op::Update`]), for the
//! parameters that have a `.grad` (a frozen one is skipped, as
//! `torch.optim` skips a `.grad` of `None`).
//!
//! `torch.optim`: `_multi_tensor_adam` makes `exp_avg` and `exp_avg_sq`
//! with `zeros_like` per parameter at the first step, then
//! `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)` (one temporary per
//! parameter, the list dying last first at the end), then the updates;
//! SGD's momentum buffer is `torch.clone(grad)` at the first step.
//! bitsandbytes' 8-bit optimizers copy their quantization maps
//! (`create_dynamic_map`) to the device before the first 8-bit state.

use super::{Alloc, Arg, Calc, Op, Program, Role};
use crate::optim::{OptimizerKind, OptimizerSpec, QMAP_VALUES};
use vramlab_core::types::Dtype;

/// A parameter that has a `.grad`: its index in `parameters()` order.
#[derive(Clone, Copy, Debug)]
pub struct Param<'a> {
    pub index: usize,
    pub shape: &'a [u64],
    pub dtype: Dtype,
}

/// `opt.step()` over `params` (those with a `.grad`, in order); `first`:
/// the optimizer keeps no state yet.
pub fn program(spec: OptimizerSpec, params: &[Param], first: bool) -> Program {
    let mut p = Program::default();
    if first {
        first_state(&mut p, spec, params);
    }
    let sqrt: Vec<usize> = if spec.step_temporary_bytes(1) > 0 {
        let exp_avg_sq = |q: &Param| Arg::State {
            param: q.index,
            slot: 1,
        };
        let temp = |q: &Param| {
            let role = Role::Scratch {
                param: q.index,
                name: "exp_avg_sq_sqrt",
            };
            (Calc::Sqrt(exp_avg_sq(q)), role)
        };
        let op = "_foreach_sqrt";
        params
            .iter()
            .map(|q| push(&mut p, op, temp(q), q))
            .collect()
    } else {
        Vec::new()
    };
    p.ops.extend(params.iter().map(|q| Op::Update(q.index)));
    p.ops.extend(sqrt.into_iter().rev().map(Op::Free));
    p
}

/// The state the first step makes, parameter by parameter.
fn first_state(p: &mut Program, spec: OptimizerSpec, params: &[Param]) {
    let mut maps_moved = false;
    for q in params {
        if !maps_moved && spec.quantizes(q.shape.iter().product()) {
            maps_moved = true;
            for &name in spec.qmaps() {
                let calc = Calc::DynamicMap {
                    signed: name == "dynamic",
                };
                let map = Param {
                    shape: &[QMAP_VALUES],
                    dtype: Dtype::Float32,
                    ..*q
                };
                push(p, "_to_copy", (calc, Role::QuantMap(name)), &map);
            }
        }
        for t in spec.state(q.shape, q.dtype) {
            let (op, calc) = match spec.kind {
                OptimizerKind::Momentum if !spec.is_8bit() => {
                    ("clone", Calc::Copy(Arg::Grad(q.index)))
                }
                _ => ("zeros_like", Calc::Zeros),
            };
            let role = Role::State {
                param: q.index,
                name: t.name,
            };
            let state = Param {
                shape: &t.shape,
                dtype: t.dtype,
                ..*q
            };
            push(p, op, (calc, role), &state);
        }
    }
}

/// Appends an allocation of `like`'s shape and type.
fn push(p: &mut Program, op: &'static str, (calc, role): (Calc, Role), like: &Param) -> usize {
    p.allocs.push(Alloc {
        op,
        calc,
        shape: like.shape.into(),
        dtype: like.dtype,
        role,
        holds: role.holds(),
        layer: None,
        temporary_until: None,
    });
    let i = p.allocs.len() - 1;
    p.ops.push(Op::Alloc(i));
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::blocks;
    use serde_json::Value;

    const PYTORCH: &str = include_str!("../../../../../tests/reference/optim_step.json");

    fn reference() -> Value {
        serde_json::from_str(PYTORCH).unwrap()
    }

    /// The recorded model's parameters that have a `.grad`.
    fn trained(all: &Value) -> Vec<(usize, Vec<u64>)> {
        let params = all["parameters"].as_array().unwrap();
        (params.iter().enumerate())
            .filter(|(_, p)| p["requires_grad"].as_bool().unwrap())
            .map(|(i, p)| {
                let shape = p["shape"].as_array().unwrap();
                (i, shape.iter().map(|d| d.as_u64().unwrap()).collect())
            })
            .collect()
    }

    fn events(program: &Program) -> Vec<(String, i64)> {
        (program.events().into_iter())
            .map(|e| (e.op.to_string(), e.bytes))
            .collect()
    }

    #[test]
    fn first_and_later_steps_are_torch_optims_event_by_event() {
        let all = reference();
        let shapes = trained(&all);
        let params: Vec<Param> = (shapes.iter())
            .map(|(index, shape)| Param {
                index: *index,
                shape,
                dtype: Dtype::Float32,
            })
            .collect();
        for kind in ["sgd", "momentum", "adam", "adamw"] {
            let name = Value::String(kind.into());
            let spec = OptimizerSpec::torch(serde_json::from_value(name).unwrap());
            for (step, first) in [("first", true), ("second", false)] {
                let theirs: Vec<(String, i64)> = (all["steps"][kind][step].as_array().unwrap())
                    .iter()
                    .map(|e| {
                        let op = e[0].as_str().unwrap();
                        (
                            op.trim_end_matches(".default").to_string(),
                            e[1].as_i64().unwrap(),
                        )
                    })
                    .collect();
                let program = program(spec, &params, first);
                assert_eq!(events(&program), theirs, "{kind}, {step} step");
                let updated: Vec<usize> = (program.ops.iter())
                    .filter_map(|op| match op {
                        Op::Update(i) => Some(*i),
                        _ => None,
                    })
                    .collect();
                assert_eq!(updated, [2, 3, 4, 5], "{kind}: the frozen layer is skipped");
                // The temporaries are what the estimate's closed form adds.
                let scratch: u64 = (program.allocs.iter())
                    .filter(|a| matches!(a.role, Role::Scratch { .. }))
                    .map(Alloc::bytes)
                    .sum();
                let param_bytes = shapes.iter().map(|(_, s)| 4 * s.iter().product::<u64>());
                assert_eq!(scratch, spec.step_temporary_bytes(param_bytes.sum()));
            }
        }
    }

    #[test]
    fn eight_bit_state_moves_its_maps_first_and_quantizes_large_parameters_only() {
        let spec = OptimizerSpec::new(OptimizerKind::Adam, 8).unwrap();
        let (big, small) = ([64u64, 128], [64u64]);
        let params = [
            Param {
                index: 0,
                shape: &small,
                dtype: Dtype::Float32,
            },
            Param {
                index: 1,
                shape: &big,
                dtype: Dtype::Float32,
            },
        ];
        let p = program(spec, &params, true);
        let made: Vec<(Role, u64)> = (p.allocs.iter()).map(|a| (a.role, a.bytes())).collect();
        let state = |param, name| Role::State { param, name };
        assert_eq!(
            made,
            [
                (state(0, "state1"), 256),
                (state(0, "state2"), 256),
                (Role::QuantMap("dynamic"), 1024),
                (Role::QuantMap("udynamic"), 1024),
                (state(1, "state1"), 8192),
                (state(1, "state2"), 8192),
                (state(1, "absmax1"), 128),
                (state(1, "absmax2"), 128),
            ]
        );
        // The state's bytes are what the estimate's closed form counts.
        let shapes = [(&small[..], Dtype::Float32), (&big[..], Dtype::Float32)];
        let walked: u64 = p.allocs.iter().map(|a| blocks(a.bytes())).sum();
        assert_eq!(walked, spec.state_bytes(shapes, blocks));
        assert!(
            !p.ops.iter().any(|op| matches!(op, Op::Free(_))),
            "no temporaries"
        );
    }

    #[cfg(feature = "kinds-arithmetic")]
    #[test]
    fn the_quantization_maps_are_bitsandbytes() {
        use crate::cpu::{run, BatchValues, Inputs, Values};
        let all = reference();
        let spec = OptimizerSpec::new(OptimizerKind::Adam, 8).unwrap();
        let shape = [4096u64];
        let params = [Param {
            index: 0,
            shape: &shape,
            dtype: Dtype::Float32,
        }];
        let p = program(spec, &params, true);
        let batch = BatchValues {
            inputs: vec![],
            input_shape: vec![],
            targets: vec![],
        };
        let inputs = Inputs {
            shapes: &[shape.to_vec()],
            params: &[vec![0.5; 4096]],
            batch: &batch,
            state: &[],
        };
        let mut values = Values::default();
        run(&p, 0..p.ops.len(), &inputs, &mut values).unwrap();
        for (i, key) in [(0, "dynamic_map"), (1, "udynamic_map")] {
            let theirs: Vec<f32> = (all[key].as_array().unwrap().iter())
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(values.tensor(i).unwrap(), theirs, "{key}");
        }
    }

    #[cfg(feature = "kinds-arithmetic")]
    #[test]
    fn the_updates_temporaries_read_the_state_and_the_momentum_clones_the_grad() {
        use crate::cpu::{run, BatchValues, Inputs, Values};
        let shape = [3u64];
        let params = [Param {
            index: 0,
            shape: &shape,
            dtype: Dtype::Float32,
        }];
        let batch = BatchValues {
            inputs: vec![],
            input_shape: vec![],
            targets: vec![],
        };
        let state = [vec![0.1, 0.2, 0.3], vec![4.0, 9.0, 16.0]];
        let inputs = Inputs {
            shapes: &[shape.to_vec()],
            params: &[vec![1.0; 3]],
            batch: &batch,
            state: &state,
        };
        let adam = program(OptimizerSpec::torch(OptimizerKind::Adam), &params, false);
        let mut values = Values::default();
        run(&adam, 0..1, &inputs, &mut values).unwrap();
        assert_eq!(values.tensor(0).unwrap(), [2.0, 3.0, 4.0]);

        let momentum = program(OptimizerSpec::torch(OptimizerKind::Momentum), &params, true);
        let mut values = Values::default();
        values.grads = vec![Some(vec![0.5, -1.0, 2.0])];
        run(&momentum, 0..momentum.ops.len(), &inputs, &mut values).unwrap();
        assert_eq!(values.tensor(0).unwrap(), [0.5, -1.0, 2.0]);
    }
}
