//! Reentrant `torch.utils.checkpoint` (`use_reentrant=True`, what peft's
//! `prepare_model_for_kbit_training` leaves: it passes no
//! `use_reentrant`, and PyTorch then defaults to it): `CheckpointFunction`
//! runs the region under `no_grad`, saving only its tensor arguments; its
//! backward detaches them, runs the region again with grad, calls
//! `torch.autograd.backward` on the new output with the gradient it was
//! given (a nested walk of the engine), and returns the detached inputs'
//! `.grad`.

use super::{Sid, Tape, ACCUMULATE, T};

/// The region's forward from its input: its output.
pub(in crate::step) type Region = Box<dyn Fn(&mut Tape<'_>, T) -> T>;

impl Tape<'_> {
    /// `checkpoint(region, x)` with `use_reentrant=True`; `kept` are what
    /// the region's `partial` holds (the positions, cos and sin, the
    /// mask), which live as long as the graph.
    pub fn reentrant(&mut self, x: T, kept: &[T], region: Region) -> T {
        let grad = self.set_grad(false);
        let out = region(self, x);
        self.set_grad(grad);
        if self.halted() || !grad || x.fun.is_none() {
            return out;
        }
        // The node's `ctx.run_function` keeps them until the graph goes.
        for t in kept {
            self.hold(t.s);
            self.graph_kept.push(t.s);
        }
        let seq = self.nodes.len() as u64;
        let backward = Box::new(move |t: &mut Tape<'_>, g: &[Option<Sid>]| {
            let gx = g
                .first()
                .copied()
                .flatten()
                .and_then(|g| t.again(x, &region, g));
            vec![gx]
        });
        let fun = self.node(seq, vec![x.fun], Some(backward), None, 1);
        self.hold(x.s);
        self.nodes[fun.node].saved.push(x.s);
        T {
            fun: Some(fun),
            ..out
        }
    }

    /// `CheckpointFunction.backward`: the region run again from its
    /// detached input, the nested backward from its output with `g`, and
    /// the input's `.grad`.
    fn again(&mut self, x: T, region: &Region, g: Sid) -> Option<Sid> {
        // `detach_variable`: a view of the input that is a leaf needing a
        // gradient, kept in its own `.grad`.
        self.hold(x.s);
        self.grads.push(None);
        let slot = self.grads.len() - 1;
        let leaf = self.node(ACCUMULATE, Vec::new(), None, Some(slot), 1);
        self.nodes[leaf.node].holds = self.running_holds;
        let detached = T {
            fun: Some(leaf),
            ..x
        };
        let grad = self.set_grad(true);
        let holds = self.running_holds;
        let out = region(self, detached);
        // The recomputation's autocast region exits before the backward.
        self.clear_amp_cache();
        // `torch.autograd.backward(outputs, args)`: `args` holds `g`.
        if let Some(root) = out.fun {
            self.hold(g);
            self.walk(root, g);
        }
        self.running_holds = holds;
        self.set_grad(grad);
        // The function returns: its `outputs`, then the detached input.
        self.drop(out);
        let gx = self.grads[slot].take();
        self.release(x.s);
        gx
    }
}
