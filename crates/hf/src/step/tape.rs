//! A training step's memory as PyTorch's autograd holds it: each op's
//! output a storage that lives while Python, a node's saved tensors or a
//! gradient buffer refers to it; nodes with their saved tensors, edges and
//! backward; `loss.backward()` as the engine runs it (`engine.cpp`):
//!
//! - ready nodes by the highest sequence number first, `AccumulateGrad`
//!   before any other (its sequence number is the largest);
//! - a node runs: its backward allocates the input gradients (the sum to a
//!   broadcast input's shape inside it, as `validate_outputs` does), then
//!   the gradients it was given go, then its saved tensors
//!   (`release_variables`), then each output joins the buffer of the node
//!   it feeds: a second gradient for the same input is added out of place
//!   (`InputBuffer::accumulate`: the first one's storage is shared with the
//!   view that carried it);
//! - `AccumulateGrad` makes the first gradient `.grad` as it is, and adds a
//!   later one in place.
//!
//! Non-reentrant `torch.utils.checkpoint` regions: their nodes save
//! nothing (a holder each); the region's inputs live until its last node
//! has run; the first of its nodes to run recomputes the region's forward,
//! which keeps each tensor saved again for the node that saved it and
//! stops as soon as the last one is saved (early stop); a node frees what
//! it unpacked as its backward returns.

use vramlab_train::program::{Alloc, Holds, Op, Role, Sink};

mod checkpoint;
mod engine;
mod record;
mod reentrant;

pub(super) use reentrant::Region;

/// A storage of the step.
pub(super) type Sid = usize;

/// The input `slot` of `node`, where a gradient goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Edge {
    pub node: usize,
    pub slot: usize,
}

/// A tensor as Python holds it: its storage, its bytes (a view's own) and
/// the node its gradient goes to (none: it needs no gradient).
#[derive(Clone, Copy, Debug)]
pub(super) struct T {
    pub s: Sid,
    pub bytes: u64,
    pub fun: Option<Edge>,
}

/// A node's backward: given the gradients of its outputs, the gradient of
/// each input it has an edge for, in input order.
pub(super) type Backward = Box<dyn FnOnce(&mut Tape<'_>, &[Option<Sid>]) -> Vec<Option<Sid>>>;

/// A node's backward as an op is given it: boxed only where autograd
/// records the op (never under `no_grad`, as `generate` runs).
pub(super) trait BackwardFn:
    FnOnce(&mut Tape<'_>, &[Option<Sid>]) -> Vec<Option<Sid>> + 'static
{
}

impl<F: FnOnce(&mut Tape<'_>, &[Option<Sid>]) -> Vec<Option<Sid>> + 'static> BackwardFn for F {}

/// A checkpoint region's forward, run again.
pub(super) type Recomputation = Box<dyn FnOnce(&mut Tape<'_>)>;

struct Storage {
    /// The sink's handle (none: a parameter or the batch, made before).
    handle: Option<usize>,
    bytes: u64,
    refs: u32,
}

struct Node {
    seq: u64,
    next: Vec<Option<Edge>>,
    saved: Vec<Sid>,
    backward: Option<Backward>,
    /// `AccumulateGrad` of parameter `p`.
    param: Option<usize>,
    /// What its backward's tensors hold.
    holds: Holds,
    /// The decoder layer that made it.
    layer: Option<u32>,
    buffer: Vec<Option<Sid>>,
    /// The checkpoint region whose holders it saved into.
    frame: Option<usize>,
}

/// A non-reentrant checkpoint region.
struct Frame {
    inputs: Vec<Sid>,
    /// The node of each holder, in the order they were packed.
    holders: Vec<usize>,
    /// Its nodes with holders that have not run.
    waiting: usize,
    recompute: Option<Recomputation>,
}

/// A region's forward being recomputed.
struct Recompute {
    frame: usize,
    packed: usize,
    /// What the recomputing Python holds, freed when it stops early.
    live: Vec<Sid>,
    stopped: bool,
}

pub(super) struct Tape<'a> {
    sink: &'a mut dyn Sink,
    storages: Vec<Storage>,
    nodes: Vec<Node>,
    frames: Vec<Frame>,
    /// Each parameter's `.grad`.
    pub grads: Vec<Option<Sid>>,
    grad_mode: bool,
    region: Option<usize>,
    recompute: Option<Recompute>,
    /// The edges of the node running, to tell a parameter's gradient.
    running: Vec<Option<Edge>>,
    /// What a checkpointed node running unpacked, until its backward
    /// returns.
    unpacked: Vec<Sid>,
    /// Tensors made leaves that need a gradient (`requires_grad_()`), with
    /// their gradient's slot: the graph holds them.
    leaves: Vec<(Sid, usize)>,
    /// Autocast's cache: each trainable weight's cast, by its storage.
    pub(super) amp_cache: Vec<(Sid, T)>,
    /// The temporaries of the op being made (an autocast kernel's casts),
    /// which go in the order they were made.
    pub(super) op_temps: Vec<Sid>,
    /// What the graph's nodes keep besides saved tensors (a reentrant
    /// checkpoint's `partial` arguments) until the graph goes.
    graph_kept: Vec<Sid>,
    /// What the ops made now hold (the logits and the loss's tensors, or
    /// activations), and their nodes' backward tensors.
    holds: Holds,
    /// The node running's.
    running_holds: Holds,
    /// The decoder layer whose ops are being made (or whose node runs).
    layer: Option<u32>,
    /// The role of what the phase running makes (forward, backward, the
    /// optimizer's step).
    role: Role,
}

const ACCUMULATE: u64 = u64::MAX;

impl<'a> Tape<'a> {
    pub fn new(sink: &'a mut dyn Sink) -> Self {
        Tape {
            sink,
            storages: Vec::with_capacity(1024),
            nodes: Vec::new(),
            frames: Vec::new(),
            grads: Vec::new(),
            grad_mode: true,
            region: None,
            recompute: None,
            running: Vec::new(),
            unpacked: Vec::new(),
            leaves: Vec::new(),
            graph_kept: Vec::new(),
            amp_cache: Vec::new(),
            op_temps: Vec::new(),
            holds: Holds::Activation,
            running_holds: Holds::Activation,
            layer: None,
            role: Role::Forward,
        }
    }

    pub fn stopped(&self) -> bool {
        self.sink.stopped()
    }

    /// Where the step is, for the sink.
    pub fn mark(&mut self, op: Op) {
        self.role = match op {
            Op::Phase("backward") => Role::Backward,
            _ => Role::Forward,
        };
        self.sink.mark(op);
    }

    /// The role of what is made from now on (an optimizer's temporaries).
    pub fn set_role(&mut self, role: Role) {
        self.role = role;
    }

    // Storages.

    fn storage(&mut self, handle: Option<usize>, bytes: u64) -> Sid {
        self.storages.push(Storage {
            handle,
            bytes,
            refs: 1,
        });
        self.storages.len() - 1
    }

    /// A new storage of `bytes` made by `op`, held once.
    pub fn alloc(&mut self, op: &'static str, bytes: u64, holds: Holds) -> Sid {
        let alloc = Alloc {
            role: self.role,
            ..Alloc::memory(op, bytes, holds, self.layer)
        };
        let handle = self.sink.alloc(&alloc);
        let s = self.storage(Some(handle), bytes);
        // A recomputation's Python holds what it makes until it stops.
        if let Some(r) = &mut self.recompute {
            r.live.push(s);
        }
        s
    }

    pub fn hold(&mut self, s: Sid) {
        if let Some(st) = self.storages.get_mut(s) {
            st.refs += 1;
        }
    }

    pub fn release(&mut self, s: Sid) {
        let Some(st) = self.storages.get_mut(s) else {
            return;
        };
        if st.refs == 0 {
            return;
        }
        st.refs -= 1;
        if st.refs == 0 {
            if let Some(h) = st.handle {
                self.sink.free(h);
            }
        }
    }

    /// A tensor made before the step (a parameter, the batch): never freed.
    pub fn external(&mut self, bytes: u64) -> T {
        let s = self.storage(None, bytes);
        T {
            s,
            bytes,
            fun: None,
        }
    }

    /// A tensor an earlier tape made and its caller kept ([`Tape::keep`]):
    /// the sink's `handle`, held once.
    pub fn adopt(&mut self, handle: usize, bytes: u64) -> T {
        let s = self.storage(Some(handle), bytes);
        T {
            s,
            bytes,
            fun: None,
        }
    }

    /// The caller keeps `t` past this tape (a cache's keys between
    /// tokens): its sink handle, which this tape no longer frees.
    pub fn keep(&mut self, t: T) -> Option<usize> {
        let st = self.storages.get_mut(t.s)?;
        st.refs = 0;
        st.handle.take()
    }

    /// [`Sink::on_stack`]: `t` waits on a Python frame's stack.
    pub fn on_stack(&mut self, t: T) {
        if let Some(h) = self.storages.get(t.s).and_then(|st| st.handle) {
            self.sink.on_stack(h);
        }
    }

    /// A storage made by `alloc` as a tensor that needs no gradient.
    pub fn plain(&self, s: Sid, bytes: u64) -> T {
        T {
            s,
            bytes,
            fun: None,
        }
    }

    /// `opt.zero_grad(set_to_none=True)`: every `.grad` goes, in the
    /// parameters' order.
    pub fn zero_grad(&mut self) {
        for slot in 0..self.grads.len() {
            if self.leaves.iter().any(|&(_, l)| l == slot) {
                continue;
            }
            if let Some(g) = self.grads[slot].take() {
                self.release(g);
            }
        }
    }

    /// `t.requires_grad_()` on a tensor no op made with a gradient (peft's
    /// `enable_input_require_grads` on the embeddings): a leaf whose
    /// gradient `AccumulateGrad` keeps in `.grad`.
    pub fn leaf(&mut self, t: T) -> T {
        self.hold(t.s);
        self.grads.push(None);
        let slot = self.grads.len() - 1;
        self.leaves.push((t.s, slot));
        let fun = Some(self.node(ACCUMULATE, Vec::new(), None, Some(slot), 1));
        T { fun, ..t }
    }

    /// The graph goes (the loss that held it is dropped): what its nodes
    /// kept, then the leaves it held, each with its
    /// `.grad`.
    pub fn free_graph(&mut self) {
        for s in std::mem::take(&mut self.graph_kept) {
            self.release(s);
        }
        for (s, slot) in std::mem::take(&mut self.leaves) {
            self.release(s);
            if let Some(g) = self.grads[slot].take() {
                self.release(g);
            }
        }
    }

    /// Parameter `index`: trainable, its gradient goes to its own
    /// `AccumulateGrad`.
    pub fn parameter(&mut self, bytes: u64, trainable: bool) -> T {
        let mut t = self.external(bytes);
        if trainable {
            self.grads.push(None);
            let param = Some(self.grads.len() - 1);
            let fun = self.node(ACCUMULATE, Vec::new(), None, param, 1);
            // A parameter's `.grad` is a gradient; a leaf made of an
            // activation (`leaf`, a reentrant checkpoint's input) keeps an
            // activation's.
            self.nodes[fun.node].holds = Holds::Gradient;
            t.fun = Some(fun);
        }
        t
    }

    // Python's references.

    /// Python lets go of `t`.
    pub fn drop(&mut self, t: T) {
        if let Some(r) = &mut self.recompute {
            if r.stopped {
                return;
            }
            if let Some(i) = r.live.iter().position(|&s| s == t.s) {
                r.live.remove(i);
            }
        }
        self.release(t.s);
    }

    pub fn drop_all(&mut self, ts: &[T]) {
        for &t in ts {
            self.drop(t);
        }
    }

    /// A second Python reference to `t`'s storage (a view, a name).
    pub fn share(&mut self, t: T) -> T {
        if self.halted() {
            return t;
        }
        self.hold(t.s);
        if let Some(r) = &mut self.recompute {
            r.live.push(t.s);
        }
        t
    }

    /// The decoder layer whose ops are made from now on (none: outside).
    pub fn set_layer(&mut self, layer: Option<u32>) -> Option<u32> {
        std::mem::replace(&mut self.layer, layer)
    }

    /// What the ops made from now on hold (and their backward's tensors).
    pub fn set_holds(&mut self, holds: Holds) -> Holds {
        std::mem::replace(&mut self.holds, holds)
    }

    /// Ops made under `torch.no_grad()` need no gradient.
    pub fn set_grad(&mut self, on: bool) -> bool {
        std::mem::replace(&mut self.grad_mode, on)
    }

    /// Storage `s` is not Python's to free as a recomputation unwinds.
    pub fn unlist(&mut self, s: Sid) {
        if let Some(r) = &mut self.recompute {
            if let Some(i) = r.live.iter().position(|&x| x == s) {
                r.live.remove(i);
            }
        }
    }

    /// A recomputation that stopped early runs nothing more; nor does a
    /// step whose sink stopped it (out of memory).
    pub fn halted(&self) -> bool {
        self.recompute.as_ref().is_some_and(|r| r.stopped) || self.sink.stopped()
    }

    /// Node `n` saves storage `s`: held, or in a checkpoint region a
    /// holder, or while recomputing one, kept for the node that saved it.
    fn save(&mut self, n: usize, s: Sid) {
        if let Some(f) = self.region {
            let frame = &mut self.frames[f];
            if self.nodes[n].frame.is_none() {
                frame.waiting += 1;
            }
            frame.holders.push(n);
            self.nodes[n].frame = Some(f);
            return;
        }
        let Some(r) = &mut self.recompute else {
            self.hold(s);
            self.nodes[n].saved.push(s);
            return;
        };
        // Recomputing makes nodes of its own, which are let go; the tensor
        // is kept for the holder's node.
        let frame = &self.frames[r.frame];
        let owner = frame.holders[r.packed];
        r.packed += 1;
        let last = r.packed == frame.holders.len();
        self.hold(s);
        self.nodes[owner].saved.push(s);
        if last {
            // The stop unwinds through the recomputation's autocast region
            // (its cache goes) before its frames go.
            self.clear_amp_cache();
            self.stop_recompute();
        }
    }

    /// Early stop: the recomputation's Python frames unwind.
    fn stop_recompute(&mut self) {
        let Some(r) = &mut self.recompute else {
            return;
        };
        r.stopped = true;
        let mut live = std::mem::take(&mut r.live);
        // The op being made lets go of its temporaries first, then the
        // innermost frames unwind first.
        for s in std::mem::take(&mut self.op_temps) {
            if let Some(i) = live.iter().position(|&x| x == s) {
                live.remove(i);
                self.release(s);
            }
        }
        for s in live.into_iter().rev() {
            self.release(s);
        }
    }
}

/// What an op of a recomputation that stopped returns: nothing.
fn dead(bytes: u64) -> T {
    T {
        s: usize::MAX,
        bytes,
        fun: None,
    }
}
