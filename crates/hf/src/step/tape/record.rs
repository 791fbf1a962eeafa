//! An op recorded as autograd records it: its node (made only where an
//! input needs a gradient and grad mode is on), what it saves of its
//! inputs and outputs, its outputs' storages; a view's node over the
//! storage it shares.

use super::{dead, Backward, BackwardFn, Edge, Node, Sid, Tape, T};

impl Tape<'_> {
    pub(super) fn node(
        &mut self,
        seq: u64,
        next: Vec<Option<Edge>>,
        backward: Option<Backward>,
        param: Option<usize>,
        outputs: usize,
    ) -> Edge {
        self.nodes.push(Node {
            seq,
            next,
            saved: Vec::new(),
            backward,
            param,
            holds: self.holds,
            layer: self.layer,
            buffer: vec![None; outputs],
            frame: None,
        });
        Edge {
            node: self.nodes.len() - 1,
            slot: 0,
        }
    }

    /// An op of `inputs` making `outputs` (their op and bytes), which saves
    /// the storages `saved` of its inputs (before it runs) and the outputs
    /// `save_out` (after). `backward` is its node's, made when an input
    /// needs a gradient.
    pub fn op(
        &mut self,
        outputs: &[(&'static str, u64)],
        inputs: &[T],
        saved: &[Sid],
        save_out: &[usize],
        backward: impl BackwardFn,
    ) -> Vec<T> {
        let Some(node) = self.op_node(inputs, saved, outputs.len(), backward) else {
            return outputs.iter().map(|&(_, b)| dead(b)).collect();
        };
        let made: Vec<T> = (outputs.iter().enumerate())
            .map(|(slot, &(op, bytes))| self.output(node, slot, op, bytes))
            .collect();
        if let Some(n) = node {
            for &i in save_out {
                self.save(n, made[i].s);
            }
        }
        made
    }

    /// An op of one output.
    pub fn op1(
        &mut self,
        op: &'static str,
        bytes: u64,
        inputs: &[T],
        saved: &[Sid],
        save_output: bool,
        backward: impl BackwardFn,
    ) -> T {
        let Some(node) = self.op_node(inputs, saved, 1, backward) else {
            return dead(bytes);
        };
        let made = self.output(node, 0, op, bytes);
        if let (Some(n), true) = (node, save_output) {
            self.save(n, made.s);
        }
        made
    }

    /// An op's node, with what it saves of its inputs (none: no input
    /// needs a gradient, or grad mode is off); none at all where the step
    /// has halted and the op makes nothing.
    fn op_node(
        &mut self,
        inputs: &[T],
        saved: &[Sid],
        outputs: usize,
        backward: impl BackwardFn,
    ) -> Option<Option<usize>> {
        if self.halted() {
            return None;
        }
        let grad = self.grad_mode && inputs.iter().any(|t| t.fun.is_some());
        if !grad {
            return Some(None);
        }
        let next = inputs.iter().map(|t| t.fun).collect();
        let seq = self.nodes.len() as u64;
        let n = (self.node(seq, next, Some(Box::new(backward)), None, outputs)).node;
        for &s in saved {
            self.save(n, s);
        }
        (!self.halted()).then_some(Some(n))
    }

    /// Output `slot` of an op (of `node`, where autograd records it).
    fn output(&mut self, node: Option<usize>, slot: usize, op: &'static str, bytes: u64) -> T {
        let s = self.alloc(op, bytes, self.holds);
        T {
            s,
            bytes,
            fun: node.map(|node| Edge { node, slot }),
        }
    }

    /// A view of `t` (no new storage) of `bytes`, its backward `backward`:
    /// Python holds `t` and the view apart.
    pub fn view(&mut self, t: T, bytes: u64, backward: impl BackwardFn) -> T {
        if self.halted() {
            return dead(bytes);
        }
        let v = self.share(t);
        let fun = (self.grad_mode && t.fun.is_some()).then(|| {
            let seq = self.nodes.len() as u64;
            self.node(seq, vec![t.fun], Some(Box::new(backward)), None, 1)
        });
        T { s: v.s, bytes, fun }
    }

    /// `n` views of `x` from one op (`split`), of `bytes` each; `backward`
    /// is given each view's gradient.
    pub fn views(&mut self, x: T, n: usize, bytes: u64, backward: impl BackwardFn) -> Vec<T> {
        if self.halted() {
            return vec![dead(bytes); n];
        }
        let fun = (self.grad_mode && x.fun.is_some()).then(|| {
            let seq = self.nodes.len() as u64;
            self.node(seq, vec![x.fun], Some(Box::new(backward)), None, n)
                .node
        });
        (0..n)
            .map(|slot| {
                let v = self.share(x);
                T {
                    s: v.s,
                    bytes,
                    fun: fun.map(|node| Edge { node, slot }),
                }
            })
            .collect()
    }
}
