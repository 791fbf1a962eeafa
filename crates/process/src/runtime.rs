//! The Python-like object world: names bound in a namespace, objects with
//! reference counts and references to other objects (a list's items, a
//! model's parameters, a parameter's `.grad`, a loss's autograd graph and
//! the tensors it saved), cycles, `del`, the cyclic garbage collector, and
//! the framework's global state.
//!
//! Like CPython, an object is destroyed the moment its reference count
//! reaches zero, and a destroyed object drops its references from the last
//! to the first (`list_dealloc`). Objects kept alive only by a cycle wait for
//! [`Runtime::collect`], which clears unreachable objects in creation order
//! (`tp_clear`). The runtime never touches the allocator: it reports the
//! objects that died, in order, and the engine frees their blocks.

use std::collections::{BTreeMap, VecDeque};
#[cfg(debug_assertions)]
use vramlab_core::error::Broken;
use vramlab_core::types::{Category, Dtype};
use vramlab_device::alloc::BlockId;

pub type ObjId = u64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// `None` for a zero-byte tensor.
    pub block: Option<BlockId>,
    /// The bytes asked for.
    pub bytes: u64,
    pub shape: Vec<u64>,
    pub dtype: Dtype,
    pub category: Category,
}

/// Python objects other than tensors and lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// `nn.Module` (an MLP).
    Model,
    /// `torch.optim.Optimizer`.
    Optimizer,
    /// A dataset (its tensors, when on the device).
    Dataset,
    /// An autograd graph node: what backward needs (saved tensors).
    Graph,
    /// `tf.compat.v1.Session`: owns the variables built while it is open.
    Session,
    /// An exception and its traceback frames (their locals).
    Exception,
    Llm, // vLLM's `LLM`: its engine core is a process of its own.
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Model => "MLP",
            Class::Optimizer => "optimizer",
            Class::Dataset => "dataset",
            Class::Graph => "autograd graph",
            Class::Session => "tf.Session",
            Class::Exception => "OutOfMemoryError",
            Class::Llm => "vllm.LLM",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Tensor(Tensor),
    List,
    Instance(Class),
}

impl ObjectKind {
    pub fn type_name(&self) -> &'static str {
        match self {
            ObjectKind::Tensor(_) => "Tensor",
            ObjectKind::List => "list",
            ObjectKind::Instance(c) => c.name(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub kind: ObjectKind,
    /// References this object holds, in order.
    pub refs: Vec<ObjId>,
    pub refcount: u32,
    /// The name it was created under.
    pub label: String,
}

/// An object whose last reference went away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub id: ObjId,
    pub label: String,
    pub kind: ObjectKind,
}

impl Released {
    pub fn tensor(&self) -> Option<&Tensor> {
        match &self.kind {
            ObjectKind::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

/// What holds objects outside Python's names: roots of the reference graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The framework's global state (Keras's; what `clear_session` drops).
    FrameworkState,
    /// PyTorch's map of cuBLAS workspaces, one per (handle, stream), a
    /// handle per thread (`setWorkspaceForHandle` in `CublasHandlePool.cpp`):
    /// freed only by `torch._C._cuda_clearCublasWorkspaces()` or the end of
    /// the process.
    CublasWorkspaces,
    /// TensorFlow's GPU device (`BaseGPUDevice`): its Eigen scratch buffer,
    /// kept for the process's life.
    GpuDevice,
}

impl Holder {
    /// The holder in words ("kept alive by").
    pub fn describe(self) -> &'static str {
        match self {
            Holder::FrameworkState => "the framework's global state",
            Holder::CublasWorkspaces => {
                "cuBLAS's workspace map (torch._C._cuda_clearCublasWorkspaces() frees it)"
            }
            Holder::GpuDevice => {
                "TensorFlow's GPU device (its scratch buffer lives as long as the process)"
            }
        }
    }
}

/// Hops of a "kept alive by" chain written out in full at its start.
const CHAIN_HEAD_HOPS: usize = 4;

/// A chain of references from a root: its first hops in words (shared
/// between the objects below), how many hops it has, and the last holder.
#[derive(Clone, Debug)]
struct Chain {
    head: std::rc::Rc<str>,
    hops: usize,
    last: Option<ObjId>,
}

impl Chain {
    fn root(why: String) -> Self {
        Chain {
            head: why.into(),
            hops: 0,
            last: None,
        }
    }

    /// The chain to an object `holder` refers to.
    fn child(&self, holder: ObjId, described: &str) -> Self {
        if self.hops < CHAIN_HEAD_HOPS {
            Chain {
                head: format!("{} -> {described}", self.head).into(),
                hops: self.hops + 1,
                last: None,
            }
        } else {
            Chain {
                head: self.head.clone(),
                hops: self.hops + 1,
                last: Some(holder),
            }
        }
    }

    /// In words: the first hops, how many were left out, the last holder.
    fn text(&self, rt: &Runtime) -> String {
        let Some(last) = self.last else {
            return self.head.to_string();
        };
        let skipped = self.hops - CHAIN_HEAD_HOPS - 1;
        let last = rt.describe(last);
        if skipped == 0 {
            format!("{} -> {last}", self.head)
        } else {
            format!("{} -> … ({skipped} more) -> {last}", self.head)
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Runtime {
    objects: BTreeMap<ObjId, Object>,
    next_id: ObjId,
    namespace: BTreeMap<String, ObjId>,
    /// What holders outside Python hold, in the order they took it.
    held: Vec<(Holder, ObjId)>,
}

impl Runtime {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn objects(&self) -> &BTreeMap<ObjId, Object> {
        &self.objects
    }

    pub fn namespace(&self) -> &BTreeMap<String, ObjId> {
        &self.namespace
    }

    pub fn lookup(&self, name: &str) -> Option<ObjId> {
        self.namespace.get(name).copied()
    }

    pub fn get(&self, id: ObjId) -> Option<&Object> {
        self.objects.get(&id)
    }

    pub fn tensor(&self, id: ObjId) -> Option<&Tensor> {
        match &self.objects.get(&id)?.kind {
            ObjectKind::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Ids are never reused: a long run makes billions (about 60 a
    /// training step), past any 32-bit count. Tests start near that edge.
    #[doc(hidden)]
    pub fn skip_ids(&mut self, n: ObjId) {
        self.next_id += n;
    }

    pub fn tensor_mut(&mut self, id: ObjId) -> Option<&mut Tensor> {
        match &mut self.objects.get_mut(&id)?.kind {
            ObjectKind::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Creates an object held by one local reference (a Python local
    /// variable): [`Runtime::drop_local`] releases it.
    pub fn new_local(&mut self, kind: ObjectKind, label: &str) -> ObjId {
        let id = self.next_id;
        self.next_id += 1;
        self.objects.insert(
            id,
            Object {
                kind,
                refs: Vec::new(),
                refcount: 1,
                label: label.to_string(),
            },
        );
        id
    }

    /// `[items...]`, plus itself when `cycle`; held by one local reference.
    pub fn new_list(&mut self, items: &[ObjId], cycle: bool, label: &str) -> ObjId {
        let id = self.new_local(ObjectKind::List, label);
        for &item in items {
            self.add_ref(id, item);
        }
        if cycle {
            self.add_ref(id, id);
        }
        id
    }

    fn incref(&mut self, id: ObjId) {
        if let Some(o) = self.objects.get_mut(&id) {
            o.refcount += 1;
        }
    }

    /// Drops one reference; destroys what reaches zero, depth first, an
    /// object's references last to first.
    fn decref(&mut self, id: ObjId, released: &mut Vec<Released>) {
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let Some(o) = self.objects.get_mut(&id) else {
                continue;
            };
            o.refcount -= 1;
            if o.refcount > 0 {
                continue;
            }
            let o = self.objects.remove(&id).expect("object exists");
            // Popped from the end: the last reference is dropped first.
            stack.extend(o.refs);
            released.push(Released {
                id,
                label: o.label,
                kind: o.kind,
            });
        }
    }

    /// `owner.attr = target` / `owner.append(target)`.
    pub fn add_ref(&mut self, owner: ObjId, target: ObjId) {
        self.incref(target);
        if let Some(o) = self.objects.get_mut(&owner) {
            o.refs.push(target);
        }
    }

    /// Removes one reference from `owner` to `target`.
    pub fn remove_ref(&mut self, owner: ObjId, target: ObjId) -> Vec<Released> {
        let mut released = Vec::new();
        let removed = self.objects.get_mut(&owner).and_then(|o| {
            let pos = o.refs.iter().rposition(|&r| r == target)?;
            Some(o.refs.remove(pos))
        });
        if let Some(target) = removed {
            self.decref(target, &mut released);
        }
        released
    }

    /// Drops every reference `owner` holds, last first.
    pub fn clear_refs(&mut self, owner: ObjId) -> Vec<Released> {
        let refs = self
            .objects
            .get_mut(&owner)
            .map(|o| std::mem::take(&mut o.refs))
            .unwrap_or_default();
        let mut released = Vec::new();
        for &r in refs.iter().rev() {
            self.decref(r, &mut released);
        }
        released
    }

    /// Drops a local reference.
    pub fn drop_local(&mut self, id: ObjId) -> Vec<Released> {
        let mut released = Vec::new();
        self.decref(id, &mut released);
        released
    }

    /// Takes a local reference to an existing object.
    pub fn take_local(&mut self, id: ObjId) {
        self.incref(id);
    }

    /// `name = obj`: binds, then drops the old binding's reference (Python
    /// evaluates the right side before it rebinds).
    pub fn bind(&mut self, name: &str, id: ObjId) -> Vec<Released> {
        self.incref(id);
        let mut released = Vec::new();
        if let Some(old) = self.namespace.insert(name.to_string(), id) {
            self.decref(old, &mut released);
        }
        released
    }

    /// `del name`; `None` when the name is not bound (NameError).
    pub fn unbind(&mut self, name: &str) -> Option<Vec<Released>> {
        let id = self.namespace.remove(name)?;
        let mut released = Vec::new();
        self.decref(id, &mut released);
        Some(released)
    }

    /// A holder outside Python takes a reference.
    pub fn hold(&mut self, holder: Holder, id: ObjId) {
        self.incref(id);
        self.held.push((holder, id));
    }

    /// Drops every reference `holder` holds, last taken first.
    pub fn release_holder(&mut self, holder: Holder) -> Vec<Released> {
        let (dropped, kept) = std::mem::take(&mut self.held)
            .into_iter()
            .partition::<Vec<_>, _>(|&(h, _)| h == holder);
        self.held = kept;
        let mut released = Vec::new();
        for (_, id) in dropped.into_iter().rev() {
            self.decref(id, &mut released);
        }
        released
    }

    fn held_ids(&self) -> impl Iterator<Item = &ObjId> {
        self.held.iter().map(|(_, id)| id)
    }

    /// The live objects' ids in order: per-object tables are `Vec`s in
    /// this order (one kind of ordered map fewer in the page's download).
    fn ids(&self) -> Vec<ObjId> {
        self.objects.keys().copied().collect()
    }

    /// Whether each live object (in [`Self::ids`] order) is reachable from
    /// the namespace or the framework's state.
    fn reachable(&self, ids: &[ObjId]) -> Vec<bool> {
        let mut seen = vec![false; ids.len()];
        let mut queue: VecDeque<ObjId> = self
            .namespace
            .values()
            .chain(self.held_ids())
            .copied()
            .collect();
        while let Some(id) = queue.pop_front() {
            let Ok(at) = ids.binary_search(&id) else {
                continue;
            };
            if !std::mem::replace(&mut seen[at], true) {
                queue.extend(self.objects[&id].refs.iter().copied());
            }
        }
        seen
    }

    /// `gc.collect()`: frees what only reference cycles keep alive. Returns
    /// the number of unreachable objects found and the objects destroyed.
    pub fn collect(&mut self) -> (usize, Vec<Released>) {
        let ids = self.ids();
        let reachable = self.reachable(&ids);
        let unreachable: Vec<ObjId> = (ids.iter().zip(&reachable))
            .filter(|(_, &r)| !r)
            .map(|(&id, _)| id)
            .collect();
        let mut released = Vec::new();
        for &id in &unreachable {
            // `tp_clear` on each object still alive, in creation order: its
            // references are taken away, then dropped last to first.
            released.extend(self.clear_refs(id));
        }
        (unreachable.len(), released)
    }

    /// Restarting the kernel: the process and everything in it are gone.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The names bound to each live object, in [`Self::objects`] order.
    pub fn names_of(&self) -> Vec<Vec<String>> {
        let ids = self.ids();
        let mut out = vec![Vec::new(); ids.len()];
        for (name, id) in &self.namespace {
            if let Ok(at) = ids.binary_search(id) {
                out[at].push(name.clone());
            }
        }
        out
    }

    fn describe(&self, id: ObjId) -> String {
        match self.objects.get(&id) {
            Some(o) => format!("{} `{}`", o.kind.type_name(), o.label),
            None => "?".into(),
        }
    }

    /// For every live object, the shortest chain of references from a root,
    /// e.g. ``name `h` -> list `h` ``; objects with no chain are kept alive
    /// only by a cycle. In [`Self::objects`] order.
    pub fn retention(&self) -> Vec<String> {
        let ids = self.ids();
        let chains = self.chains(&ids);
        let mut cycles = self.cycle_holders(&ids, &chains);
        (chains.iter().zip(&mut cycles))
            .map(|(chain, cycle)| match chain {
                Some(chain) => chain.text(self),
                None => std::mem::take(cycle),
            })
            .collect()
    }

    /// The shortest chain from a root to every reachable object, found
    /// breadth first. Each chain shares its first hops with its holder's, so
    /// a deep chain costs no more than a short one.
    fn chains(&self, ids: &[ObjId]) -> Vec<Option<Chain>> {
        let mut chains: Vec<Option<Chain>> = vec![None; ids.len()];
        // Positions in `ids`.
        let mut queue: VecDeque<usize> = VecDeque::new();
        let roots = self
            .namespace
            .iter()
            .map(|(name, &id)| (id, format!("name `{name}`")))
            .chain(
                self.held
                    .iter()
                    .map(|&(h, id)| (id, h.describe().to_string())),
            );
        for (id, why) in roots {
            if let Ok(at) = ids.binary_search(&id) {
                if chains[at].is_none() {
                    chains[at] = Some(Chain::root(why));
                    queue.push_back(at);
                }
            }
        }
        while let Some(at) = queue.pop_front() {
            let id = ids[at];
            let o = &self.objects[&id];
            let Some(chain) = chains[at].as_ref().filter(|_| !o.refs.is_empty()) else {
                continue;
            };
            let child = chain.child(id, &self.describe(id));
            for item in &o.refs {
                if let Ok(to) = ids.binary_search(item) {
                    if chains[to].is_none() {
                        chains[to] = Some(child.clone());
                        queue.push_back(to);
                    }
                }
            }
        }
        chains
    }

    /// For objects no root reaches: who holds them (a few, then a count).
    /// In `ids` order; empty for an object a root reaches.
    fn cycle_holders(&self, ids: &[ObjId], chains: &[Option<Chain>]) -> Vec<String> {
        let mut holders: Vec<Vec<ObjId>> = vec![Vec::new(); ids.len()];
        for (&h, o) in &self.objects {
            for target in &o.refs {
                match ids.binary_search(target) {
                    Ok(at) if chains[at].is_none() => holders[at].push(h),
                    _ => {}
                }
            }
        }
        let told = |by: &Vec<ObjId>| {
            if by.is_empty() {
                return String::new();
            }
            let mut names: Vec<String> = by.iter().take(3).map(|&h| self.describe(h)).collect();
            if by.len() > 3 {
                names.push(format!("{} more", by.len() - 3));
            }
            format!(
                "only a reference cycle (held by {}); gc.collect() frees it",
                names.join(", ")
            )
        };
        holders.iter().map(told).collect()
    }

    /// Who refers to `id`, in words (names, then holders).
    pub fn holders_of(&self, id: ObjId, except_name: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = self
            .namespace
            .iter()
            .filter(|(n, &o)| o == id && Some(n.as_str()) != except_name)
            .map(|(n, _)| format!("name `{n}`"))
            .collect();
        for (&h, o) in &self.objects {
            if h == id && o.refs.contains(&id) {
                out.push("itself: a reference cycle, which only `gc.collect()` breaks".into());
            } else if o.refs.contains(&id) {
                out.push(self.describe(h));
            }
        }
        for &(h, held) in &self.held {
            if held == id {
                out.push(h.describe().into());
            }
        }
        out
    }

    #[cfg(debug_assertions)]
    /// Checks reference counts against the references that exist (between
    /// commands, when no local references are held).
    pub fn check_invariants(&self) -> Result<(), Broken> {
        let mut counts: BTreeMap<ObjId, u32> = BTreeMap::new();
        for &id in self.namespace.values().chain(self.held_ids()) {
            *counts.entry(id).or_default() += 1;
        }
        for o in self.objects.values() {
            for &item in &o.refs {
                *counts.entry(item).or_default() += 1;
            }
        }
        for (id, o) in &self.objects {
            let actual = counts.get(id).copied().unwrap_or(0);
            if o.refcount != actual {
                return Err(Broken(format!(
                    "object {id} (`{}`) has refcount {} but {actual} references",
                    o.label, o.refcount
                )));
            }
        }
        for id in counts.keys() {
            if !self.objects.contains_key(id) {
                return Err(Broken(format!("a reference points to dead object {id}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
