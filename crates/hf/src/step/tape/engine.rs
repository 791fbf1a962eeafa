//! `loss.backward()` on the tape: the engine's walk (`engine.cpp`): ready
//! nodes by the highest sequence number, each run, its gradients passed on
//! into the buffers of the nodes they feed.

use super::{Edge, Sid, Tape, T};
use std::collections::BinaryHeap;
use vramlab_train::program::{Holds, Role};

impl Tape<'_> {
    /// The gradient of input `i` of the node running, of `bytes`.
    pub fn grad(&mut self, i: usize, op: &'static str, bytes: u64) -> Sid {
        let holds = match self.running.get(i).copied().flatten() {
            // `AccumulateGrad`'s: what its leaf's `.grad` holds.
            Some(e) if self.nodes[e.node].param.is_some() => self.nodes[e.node].holds,
            _ => self.running_holds,
        };
        match self.running.get(i).copied().flatten() {
            Some(e) => self.alloc_for(e.node, op, bytes, holds),
            None => self.alloc(op, bytes, holds),
        }
    }

    /// A tensor made for node `n`'s input buffer: a piece of parameter
    /// `p`'s gradient when `n` is its `AccumulateGrad` (it becomes `.grad`,
    /// or is added into it and dies), else of the phase's role.
    fn alloc_for(&mut self, n: usize, op: &'static str, bytes: u64, holds: Holds) -> Sid {
        let role = match (self.nodes[n].param, self.nodes[n].holds) {
            (Some(p), Holds::Gradient) => Role::Grad(p),
            _ => self.role,
        };
        let outside = std::mem::replace(&mut self.role, role);
        let made = self.alloc(op, bytes, holds);
        self.role = outside;
        made
    }

    /// The node's backward has returned (before `validate_outputs` sums a
    /// broadcast input's gradient): what it unpacked goes.
    pub fn backward_returned(&mut self) {
        // `apply`'s locals, destroyed in reverse.
        let unpacked = std::mem::take(&mut self.unpacked);
        unpacked.into_iter().rev().for_each(|s| self.release(s));
    }

    /// A temporary of a backward.
    pub fn temp(&mut self, op: &'static str, bytes: u64) -> Sid {
        self.alloc(op, bytes, self.running_holds)
    }

    /// `loss.backward()`: `ones_like(loss)`, then every node the loss
    /// leads to, in the engine's order.
    pub fn backward(&mut self, loss: T) {
        let Some(root) = loss.fun else {
            return;
        };
        // `_make_grads`' ones live until `backward` returns.
        let one = self.temp("ones_like", loss.bytes);
        self.hold(one);
        self.walk(root, one);
        self.release(one);
    }

    /// The engine's walk from `root`, given the gradient `g` (one
    /// reference to it is the root's buffer's).
    pub(super) fn walk(&mut self, root: Edge, g: Sid) {
        let mut deps = self.dependencies(root.node);
        self.nodes[root.node].buffer[root.slot] = Some(g);
        let mut ready = BinaryHeap::from([(self.nodes[root.node].seq, root.node)]);
        while let Some((_, n)) = ready.pop() {
            if self.sink.stopped() {
                return;
            }
            for (i, g) in self.run(n).into_iter().enumerate() {
                let Some(g) = g else { continue };
                let Some(e) = self.nodes[n].next.get(i).copied().flatten() else {
                    self.release(g);
                    continue;
                };
                self.accumulate(e, g);
                deps[e.node] -= 1;
                if deps[e.node] == 0 {
                    ready.push((self.nodes[e.node].seq, e.node));
                }
            }
        }
    }

    /// How many edges lead to each node from `root`.
    fn dependencies(&self, root: usize) -> Vec<u32> {
        let mut deps = vec![0; self.nodes.len()];
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![root];
        seen[root] = true;
        while let Some(n) = stack.pop() {
            for e in self.nodes[n].next.iter().flatten() {
                deps[e.node] += 1;
                if !seen[e.node] {
                    seen[e.node] = true;
                    stack.push(e.node);
                }
            }
        }
        deps
    }

    fn accumulate(&mut self, e: Edge, g: Sid) {
        let Some(old) = self.nodes[e.node].buffer[e.slot] else {
            self.nodes[e.node].buffer[e.slot] = Some(g);
            return;
        };
        let holds = self.nodes[e.node].holds;
        let bytes = self.bytes(g);
        let sum = self.alloc_for(e.node, "add", bytes, holds);
        self.release(old);
        self.release(g);
        self.nodes[e.node].buffer[e.slot] = Some(sum);
    }

    pub fn bytes(&self, s: Sid) -> u64 {
        self.storages.get(s).map_or(0, |st| st.bytes)
    }

    /// Runs node `n`: the gradients it passes on.
    fn run(&mut self, n: usize) -> Vec<Option<Sid>> {
        let inputs = std::mem::take(&mut self.nodes[n].buffer);
        if let Some(p) = self.nodes[n].param {
            match (self.grads[p], inputs[0]) {
                (None, g) => {
                    // A parameter's first gradient becomes its `.grad` as
                    // it is, whatever op made it.
                    let handle = g
                        .and_then(|g| self.storages.get(g))
                        .and_then(|st| st.handle);
                    if let (Some(h), Holds::Gradient) = (handle, self.nodes[n].holds) {
                        self.sink.retag(h, Role::Grad(p), Holds::Gradient);
                    }
                    self.grads[p] = g;
                }
                (Some(_), Some(g)) => self.release(g),
                (Some(_), None) => {}
            }
            return Vec::new();
        }
        let frame = self.nodes[n].frame;
        if let Some(f) = frame {
            self.recompute(f);
        }
        let Some(backward) = self.nodes[n].backward.take() else {
            return Vec::new();
        };
        self.running = self.nodes[n].next.clone();
        self.running_holds = self.nodes[n].holds;
        let layer = self.set_layer(self.nodes[n].layer);
        let saved = std::mem::take(&mut self.nodes[n].saved);
        if frame.is_some() {
            self.unpacked = saved.clone();
        }
        let mut out = backward(self, &inputs);
        // A gradient no input needs goes inside `apply`.
        for (i, g) in out.iter_mut().enumerate() {
            if self.nodes[n].next.get(i).copied().flatten().is_none() {
                if let Some(g) = g.take() {
                    self.release(g);
                }
            }
        }
        // What a checkpointed node unpacked goes as its backward returns,
        // before its gradients; what a node saved goes after them.
        self.backward_returned();
        inputs.into_iter().flatten().for_each(|g| self.release(g));
        if frame.is_none() {
            saved.iter().for_each(|&s| self.release(s));
        }
        if let Some(f) = frame {
            self.frames[f].waiting -= 1;
            if self.frames[f].waiting == 0 {
                self.free_frame(f);
            }
        }
        self.set_layer(layer);
        out
    }
}

impl Tape<'_> {
    /// Every parameter made so far has its `.grad` already (kept by
    /// `zero_grad(set_to_none=False)`, or a step accumulating): its
    /// `AccumulateGrad` adds each gradient it is given into that buffer in
    /// place and lets the gradient go (`accumulateGrad`'s `variable_grad
    /// += new_grad`), so the step leaves no new `.grad`.
    pub fn grads_exist(&mut self) {
        for slot in 0..self.grads.len() {
            if self.grads[slot].is_none() {
                self.grads[slot] = Some(self.storage(None, 0));
            }
        }
    }
}
