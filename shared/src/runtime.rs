//! The Python-like object world: names bound in a namespace, objects with
//! reference counts, lists that can hold themselves (cycles), `del`, the
//! cyclic garbage collector, and the framework's global state.
//!
//! Like CPython, an object is destroyed the moment its reference count
//! reaches zero, and a destroyed list drops its items from the last to the
//! first (`list_dealloc`). Objects kept alive only by a cycle wait for
//! [`Runtime::collect`], which clears unreachable lists in creation order
//! (`tp_clear`). The runtime never touches the allocator: it reports the
//! tensors that died, in order, and the engine frees their blocks.

use crate::alloc::BlockId;
use crate::protocol::{Category, Dtype};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub type ObjId = u32;

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Tensor(Tensor),
    List(Vec<ObjId>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub kind: ObjectKind,
    pub refcount: u32,
    /// The name it was created under.
    pub label: String,
}

/// A tensor whose last reference went away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub id: ObjId,
    pub label: String,
    pub tensor: Tensor,
}

/// Where a reference chain starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    Name(String),
    FrameworkState,
}

#[derive(Clone, Debug, Default)]
pub struct Runtime {
    objects: BTreeMap<ObjId, Object>,
    next_id: ObjId,
    namespace: BTreeMap<String, ObjId>,
    /// What the framework's global state holds (what `clear_session` drops).
    framework_state: Vec<ObjId>,
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

    /// Creates an object with no references yet.
    fn create(&mut self, kind: ObjectKind, label: &str) -> ObjId {
        let id = self.next_id;
        self.next_id += 1;
        self.objects.insert(
            id,
            Object {
                kind,
                refcount: 0,
                label: label.to_string(),
            },
        );
        id
    }

    pub fn new_tensor(&mut self, tensor: Tensor, label: &str) -> ObjId {
        self.create(ObjectKind::Tensor(tensor), label)
    }

    /// `[items...]`, plus itself when `cycle`.
    pub fn new_list(&mut self, items: &[ObjId], cycle: bool, label: &str) -> ObjId {
        let id = self.create(ObjectKind::List(Vec::new()), label);
        let mut all = items.to_vec();
        if cycle {
            all.push(id);
        }
        for &item in &all {
            self.incref(item);
        }
        if let Some(Object {
            kind: ObjectKind::List(v),
            ..
        }) = self.objects.get_mut(&id)
        {
            *v = all;
        }
        id
    }

    fn incref(&mut self, id: ObjId) {
        if let Some(o) = self.objects.get_mut(&id) {
            o.refcount += 1;
        }
    }

    /// Drops one reference; destroys what reaches zero, depth first, a
    /// list's items last to first.
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
            match o.kind {
                ObjectKind::Tensor(tensor) => released.push(Released {
                    id,
                    label: o.label,
                    tensor,
                }),
                // Popped from the end: the last item is dropped first.
                ObjectKind::List(items) => stack.extend(items),
            }
        }
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

    /// The framework's global state takes a reference.
    pub fn hold_in_framework_state(&mut self, id: ObjId) {
        self.incref(id);
        self.framework_state.push(id);
    }

    /// Drops every reference the framework's global state holds.
    pub fn clear_framework_state(&mut self) -> Vec<Released> {
        let mut released = Vec::new();
        for id in std::mem::take(&mut self.framework_state).into_iter().rev() {
            self.decref(id, &mut released);
        }
        released
    }

    /// Objects reachable from the namespace or the framework's state.
    fn reachable(&self) -> BTreeSet<ObjId> {
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<ObjId> = self
            .namespace
            .values()
            .chain(self.framework_state.iter())
            .copied()
            .collect();
        while let Some(id) = queue.pop_front() {
            if !seen.insert(id) {
                continue;
            }
            if let Some(Object {
                kind: ObjectKind::List(items),
                ..
            }) = self.objects.get(&id)
            {
                queue.extend(items.iter().copied());
            }
        }
        seen
    }

    /// `gc.collect()`: frees what only reference cycles keep alive. Returns
    /// the number of unreachable objects found and the tensors freed.
    pub fn collect(&mut self) -> (usize, Vec<Released>) {
        let reachable = self.reachable();
        let unreachable: Vec<ObjId> = self
            .objects
            .keys()
            .copied()
            .filter(|id| !reachable.contains(id))
            .collect();
        let mut released = Vec::new();
        for &id in &unreachable {
            // `tp_clear` on each container still alive, in creation order.
            let items = match self.objects.get_mut(&id) {
                Some(Object {
                    kind: ObjectKind::List(items),
                    ..
                }) => std::mem::take(items),
                _ => continue,
            };
            // `_list_clear`: the list is emptied first, then its items are
            // dropped last to first (its reference to itself among them).
            for &item in items.iter().rev() {
                self.decref(item, &mut released);
            }
        }
        (unreachable.len(), released)
    }

    /// Restarting the kernel: the process and everything in it are gone.
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Names bound to each object.
    pub fn names_of(&self) -> BTreeMap<ObjId, Vec<String>> {
        let mut out: BTreeMap<ObjId, Vec<String>> = BTreeMap::new();
        for (name, &id) in &self.namespace {
            out.entry(id).or_default().push(name.clone());
        }
        out
    }

    /// For every live object, the shortest chain of references from a root,
    /// e.g. `h -> list -> x`; objects with no chain are kept alive only by a
    /// cycle.
    pub fn retention(&self) -> BTreeMap<ObjId, String> {
        let mut path: BTreeMap<ObjId, String> = BTreeMap::new();
        let mut queue: VecDeque<ObjId> = VecDeque::new();
        let roots = self
            .namespace
            .iter()
            .map(|(name, &id)| (id, format!("name `{name}`")))
            .chain(
                self.framework_state
                    .iter()
                    .map(|&id| (id, "the framework's global state".to_string())),
            );
        for (id, why) in roots {
            if let std::collections::btree_map::Entry::Vacant(e) = path.entry(id) {
                e.insert(why);
                queue.push_back(id);
            }
        }
        while let Some(id) = queue.pop_front() {
            let Some(Object {
                kind: ObjectKind::List(items),
                label,
                ..
            }) = self.objects.get(&id)
            else {
                continue;
            };
            let via = format!("{} -> list `{label}`", path[&id]);
            for &item in items {
                if let std::collections::btree_map::Entry::Vacant(e) = path.entry(item) {
                    e.insert(via.clone());
                    queue.push_back(item);
                }
            }
        }
        self.objects
            .keys()
            .map(|&id| {
                let why = path.get(&id).cloned().unwrap_or_else(|| {
                    let holders: Vec<&str> = self
                        .objects
                        .iter()
                        .filter(|(_, h)| matches!(&h.kind, ObjectKind::List(items) if items.contains(&id)))
                        .map(|(_, h)| h.label.as_str())
                        .collect();
                    format!(
                        "only a reference cycle (held by list `{}`); gc.collect() frees it",
                        holders.join("`, `")
                    )
                });
                (id, why)
            })
            .collect()
    }

    /// Checks reference counts against the references that exist.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut counts: BTreeMap<ObjId, u32> = BTreeMap::new();
        for &id in self.namespace.values().chain(self.framework_state.iter()) {
            *counts.entry(id).or_default() += 1;
        }
        for o in self.objects.values() {
            if let ObjectKind::List(items) = &o.kind {
                for &item in items {
                    *counts.entry(item).or_default() += 1;
                }
            }
        }
        for (id, o) in &self.objects {
            let actual = counts.get(id).copied().unwrap_or(0);
            if o.refcount != actual {
                return Err(format!(
                    "object {id} (`{}`) has refcount {} but {actual} references",
                    o.label, o.refcount
                ));
            }
            if o.refcount == 0 {
                return Err(format!("object {id} is alive with no references"));
            }
        }
        for (id, _) in counts {
            if !self.objects.contains_key(&id) {
                return Err(format!("a reference points to dead object {id}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(block: BlockId) -> Tensor {
        Tensor {
            block: Some(block),
            bytes: 1,
            shape: vec![1],
            dtype: Dtype::Uint8,
            category: Category::Other,
        }
    }

    fn blocks(r: &[Released]) -> Vec<Option<BlockId>> {
        r.iter().map(|r| r.tensor.block).collect()
    }

    #[test]
    fn del_frees_only_the_last_reference() {
        let mut rt = Runtime::new();
        let x = rt.new_tensor(tensor(1), "x");
        rt.bind("x", x);
        rt.bind("y", x);
        assert!(rt.unbind("x").unwrap().is_empty());
        assert_eq!(blocks(&rt.unbind("y").unwrap()), vec![Some(1)]);
        assert!(rt.unbind("y").is_none());
        rt.check_invariants().unwrap();
    }

    #[test]
    fn rebinding_frees_the_old_object_after_the_new_exists() {
        let mut rt = Runtime::new();
        let a = rt.new_tensor(tensor(1), "x");
        rt.bind("x", a);
        let b = rt.new_tensor(tensor(2), "x");
        assert_eq!(blocks(&rt.bind("x", b)), vec![Some(1)]);
        rt.check_invariants().unwrap();
    }

    #[test]
    fn a_list_drops_its_items_last_first() {
        let mut rt = Runtime::new();
        let x = rt.new_tensor(tensor(1), "x");
        let y = rt.new_tensor(tensor(2), "y");
        let h = rt.new_list(&[x, y], false, "h");
        rt.bind("h", h);
        assert_eq!(blocks(&rt.unbind("h").unwrap()), vec![Some(2), Some(1)]);
        assert!(rt.objects().is_empty());
    }

    #[test]
    fn a_cycle_waits_for_gc() {
        let mut rt = Runtime::new();
        let x = rt.new_tensor(tensor(1), "x");
        rt.bind("x", x);
        let h = rt.new_list(&[x], true, "h");
        rt.bind("h", h);
        assert!(rt.unbind("h").unwrap().is_empty());
        assert!(rt.unbind("x").unwrap().is_empty());
        let why = rt.retention();
        assert!(why[&x].contains("list `h`"), "{}", why[&x]);
        assert!(why[&h].contains("only a reference cycle"), "{}", why[&h]);
        rt.check_invariants().unwrap();
        let (found, released) = rt.collect();
        assert_eq!(found, 2);
        assert_eq!(blocks(&released), vec![Some(1)]);
        assert!(rt.objects().is_empty());
    }

    #[test]
    fn gc_leaves_reachable_cycles_alone() {
        let mut rt = Runtime::new();
        let h = rt.new_list(&[], true, "h");
        rt.bind("h", h);
        assert_eq!(rt.collect().0, 0);
        assert_eq!(rt.objects().len(), 1);
    }

    #[test]
    fn framework_state_keeps_objects_until_cleared() {
        let mut rt = Runtime::new();
        let w = rt.new_tensor(tensor(7), "w");
        rt.bind("w", w);
        rt.hold_in_framework_state(w);
        assert!(rt.unbind("w").unwrap().is_empty());
        assert_eq!(rt.retention()[&w], "the framework's global state");
        assert_eq!(blocks(&rt.clear_framework_state()), vec![Some(7)]);
    }
}
