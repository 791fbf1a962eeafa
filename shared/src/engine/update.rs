//! `opt.step()` for every kind: its program (`kinds::step::optim_step`:
//! the state the first step makes, Adam's foreach temporaries, one update
//! per parameter that has a `.grad`) played in the caller's frame, the
//! state held by the optimizer from then on; then the updates' numbers,
//! when the step computed gradients.

use super::program::{Player, Target};
use super::Engine;
use crate::process::AllocFailure;
use crate::runtime::ObjId;
use crate::train::autograd::grad_of;
use crate::train::frame::PyFrame;
use crate::train::kinds::step::optim_step::{self, Param};
use crate::train::kinds::step::{Op, Program};
use crate::train::optimizer::update_values;
use std::sync::Arc;

impl Engine {
    /// Plays `optimizer.step()` in `frame`. Returns whether the update's
    /// numbers were computed.
    pub(super) fn optimizer_step_in(
        &mut self,
        frame: &mut PyFrame,
        optimizer: ObjId,
    ) -> Result<bool, AllocFailure> {
        let mark = frame.mark();
        let program = self.optimizer_program(optimizer);
        let opt = &self.train.optimizers[&optimizer];
        let (params, model) = (opt.params.clone(), opt.model);
        let label = self.process.runtime.get(optimizer).map(|o| o.label.clone());
        let target = Target {
            name: label.as_deref().unwrap_or("opt"),
            params: &params,
            loss: "loss",
            holder: Some(optimizer),
        };
        let mut player = Player::in_loop(&program);
        let (k, blas) = (&mut self.process, &mut self.train.cublas);
        player.play(k, frame, blas, 0..program.ops.len(), &target)?;
        if !player.state.is_empty() {
            if let Some(o) = self.train.optimizers.get_mut(&optimizer) {
                o.state = player.state;
            }
        }
        frame.finish_from(&mut self.process, mark);
        #[cfg(feature = "device-values")]
        if self.device_update(optimizer, &program, &player.placement) {
            return Ok(true);
        }
        Ok(update_values(
            &mut self.train,
            optimizer,
            model,
            &updates(&program),
        ))
    }

    /// The step's program over the parameters that have a `.grad` now
    /// (a later step's, built once and kept by the optimizer).
    fn optimizer_program(&mut self, optimizer: ObjId) -> Arc<Program> {
        let k = &self.process;
        let Some(opt) = self.train.optimizers.get_mut(&optimizer) else {
            return Arc::default();
        };
        let with_grad: Vec<usize> = (opt.params.iter().enumerate())
            .filter(|&(_, &p)| grad_of(k, p).is_some())
            .map(|(index, _)| index)
            .collect();
        let first = opt.state.is_empty();
        if let Some((updates, program)) = &opt.later_step {
            if !first && *updates == with_grad {
                return Arc::clone(program);
            }
        }
        let params: Vec<Param> = (with_grad.iter())
            .filter_map(|&index| {
                let t = k.runtime.tensor(opt.params[index])?;
                Some(Param {
                    index,
                    shape: &t.shape,
                    dtype: t.dtype,
                })
            })
            .collect();
        let program = Arc::new(optim_step::program(opt.spec(), &params, first));
        if !first {
            opt.later_step = Some((with_grad, Arc::clone(&program)));
        }
        program
    }
}

/// The parameters a program updates, in order.
fn updates(program: &Program) -> Vec<usize> {
    (program.ops.iter())
        .filter_map(|op| match *op {
            Op::Update(i) => Some(i),
            _ => None,
        })
        .collect()
}
