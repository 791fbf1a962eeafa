//! Where `generate` plays in the process a token at a time: each tensor a
//! local of the call's frame, a handle freed given again.

use crate::process::{AllocFailure, Process};
use crate::runtime::ObjId;
use crate::train::cublas::{BlasThread, CublasWorkspaces};
use crate::train::frame::PyFrame;
use crate::train::program::{Alloc, Holds, Op, Sink};
use crate::types::Category;

/// `generate`'s tensors made in the process: each a local of the call's
/// frame, labelled by its op; a matrix product's cuBLAS workspace as the
/// PyTorch release gives it; the peak of each forward.
pub(super) struct EngineSink<'a> {
    pub process: &'a mut Process,
    pub cublas: &'a mut CublasWorkspaces,
    pub frame: &'a mut PyFrame,
    pub state: &'a mut Played,
}

/// What the sink keeps between tokens. A handle freed is given again to
/// the next tensor made, so that what a run holds is what lives, however
/// long it runs.
#[derive(Default)]
pub(super) struct Played {
    /// Each handle's tensor while it lives, with when it was made.
    pub slots: Vec<Option<(u64, ObjId)>>,
    /// Handles free to give again.
    pub free: Vec<usize>,
    pub made: u64,
    pub failure: Option<AllocFailure>,
    pub by_forward: Vec<u64>,
    pub kv_peak: u64,
    /// Handles of the values on the frames' stacks ([`Sink::on_stack`]).
    pub stack: Vec<usize>,
}

impl EngineSink<'_> {
    fn kv_held(&self) -> u64 {
        self.process
            .categories()
            .get(&Category::KvCache)
            .copied()
            .unwrap_or(0)
    }
}

impl Sink for EngineSink<'_> {
    fn alloc(&mut self, m: &Alloc) -> usize {
        let s = &mut *self.state;
        if s.failure.is_some() {
            return usize::MAX;
        }
        let made = super::made::alloc(self.process, self.cublas, m, BlasThread::Main);
        let id = match made {
            Ok(id) => id,
            Err(f) => {
                s.failure = Some(f);
                return usize::MAX;
            }
        };
        self.frame.locals.push(id);
        if m.holds == Holds::KvCache {
            let kv = self.kv_held();
            self.state.kv_peak = self.state.kv_peak.max(kv);
        }
        let s = &mut *self.state;
        s.made += 1;
        let slot = Some((s.made, id));
        match s.free.pop() {
            Some(h) => {
                s.slots[h] = slot;
                h
            }
            None => {
                s.slots.push(slot);
                s.slots.len() - 1
            }
        }
    }

    fn free(&mut self, handle: usize) {
        let s = &mut *self.state;
        // After the raise nothing more runs: what the call held stays
        // with the exception.
        if s.failure.is_some() {
            return;
        }
        if let Some((_, id)) = s.slots.get_mut(handle).and_then(Option::take) {
            s.free.push(handle);
            // No longer a value waiting on a frame's stack.
            if let Some(at) = s.stack.iter().rposition(|&h| h == handle) {
                s.stack.remove(at);
            }
            self.frame.drop(self.process, id);
        }
    }

    fn mark(&mut self, op: Op) {
        if self.state.failure.is_some() {
            return;
        }
        match op {
            Op::Forward(_) => self.process.begin_window(),
            Op::Returned(_) => (self.state.by_forward).push(self.process.window_peak_allocated()),
            _ => {}
        }
    }

    fn stopped(&self) -> bool {
        self.state.failure.is_some()
    }

    fn on_stack(&mut self, handle: usize) {
        if self.state.failure.is_none() {
            self.state.stack.push(handle);
        }
    }
}
