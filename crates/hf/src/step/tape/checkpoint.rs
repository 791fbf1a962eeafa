//! Non-reentrant checkpoint regions on the tape: a region keeps its
//! inputs until its last node has run, and the first of its nodes to run
//! recomputes its forward (the module's own docs tell the rules).

use super::{Frame, Recomputation, Recompute, Tape, T};

impl Tape<'_> {
    /// `checkpoint(fn, *inputs)` begins: the region keeps `inputs` (its
    /// arguments) until its last node has run.
    pub fn checkpoint(&mut self, inputs: &[T]) -> usize {
        for t in inputs {
            self.hold(t.s);
        }
        self.frames.push(Frame {
            inputs: inputs.iter().map(|t| t.s).collect(),
            holders: Vec::new(),
            waiting: 0,
            recompute: None,
        });
        let f = self.frames.len() - 1;
        self.region = Some(f);
        f
    }

    /// The region's forward has returned; `recompute` runs it again.
    pub fn checkpoint_end(&mut self, f: usize, recompute: Recomputation) {
        self.region = None;
        let frame = &mut self.frames[f];
        frame.recompute = Some(recompute);
        if frame.waiting == 0 {
            self.free_frame(f);
        }
    }

    pub(super) fn free_frame(&mut self, f: usize) {
        let inputs = std::mem::take(&mut self.frames[f].inputs);
        for s in inputs {
            self.release(s);
        }
    }

    pub(super) fn recompute(&mut self, f: usize) {
        let Some(run) = self.frames[f].recompute.take() else {
            return;
        };
        let grad = self.set_grad(true);
        self.recompute = Some(Recompute {
            frame: f,
            packed: 0,
            live: Vec::new(),
            stopped: false,
        });
        run(self);
        // A region that saved less than it did the first time ends here.
        self.stop_recompute();
        self.recompute = None;
        // Its autocast region exits.
        self.clear_amp_cache();
        self.set_grad(grad);
    }
}
