//! References, cycles, holders and "kept alive by".

use super::*;

/// "Kept alive by" of every live object, by id.
fn why(rt: &Runtime) -> BTreeMap<ObjId, String> {
    rt.objects().keys().copied().zip(rt.retention()).collect()
}

fn tensor(rt: &mut Runtime, block: BlockId, label: &str) -> ObjId {
    rt.new_local(
        ObjectKind::Tensor(Tensor {
            block: Some(block),
            bytes: 1,
            shape: vec![1],
            dtype: Dtype::Uint8,
            category: Category::Other,
        }),
        label,
    )
}

/// Binds a new local object to a name and drops the local.
fn bound(rt: &mut Runtime, id: ObjId, name: &str) {
    rt.bind(name, id);
    rt.drop_local(id);
}

fn blocks(r: &[Released]) -> Vec<BlockId> {
    r.iter().filter_map(|r| r.tensor()?.block).collect()
}

#[test]
fn del_frees_only_the_last_reference() {
    let mut rt = Runtime::new();
    let x = tensor(&mut rt, 1, "x");
    bound(&mut rt, x, "x");
    rt.bind("y", x);
    assert!(rt.unbind("x").unwrap().is_empty());
    assert_eq!(blocks(&rt.unbind("y").unwrap()), vec![1]);
    assert!(rt.unbind("y").is_none());
    rt.check_invariants().unwrap();
}

#[test]
fn rebinding_frees_the_old_object_after_the_new_exists() {
    let mut rt = Runtime::new();
    let a = tensor(&mut rt, 1, "x");
    bound(&mut rt, a, "x");
    let b = tensor(&mut rt, 2, "x");
    assert_eq!(blocks(&rt.bind("x", b)), vec![1]);
    rt.drop_local(b);
    rt.check_invariants().unwrap();
}

#[test]
fn a_list_drops_its_items_last_first() {
    let mut rt = Runtime::new();
    let x = tensor(&mut rt, 1, "x");
    let y = tensor(&mut rt, 2, "y");
    let h = rt.new_list(&[x, y], false, "h");
    rt.drop_local(x);
    rt.drop_local(y);
    bound(&mut rt, h, "h");
    assert_eq!(blocks(&rt.unbind("h").unwrap()), vec![2, 1]);
    assert!(rt.objects().is_empty());
}

#[test]
fn a_cycle_waits_for_gc() {
    let mut rt = Runtime::new();
    let x = tensor(&mut rt, 1, "x");
    bound(&mut rt, x, "x");
    let h = rt.new_list(&[x], true, "h");
    bound(&mut rt, h, "h");
    assert!(rt.unbind("h").unwrap().is_empty());
    assert!(rt.unbind("x").unwrap().is_empty());
    let why = why(&rt);
    assert!(why[&x].contains("list `h`"), "{}", why[&x]);
    assert!(why[&h].contains("only a reference cycle"), "{}", why[&h]);
    rt.check_invariants().unwrap();
    let (found, released) = rt.collect();
    assert_eq!(found, 2);
    assert_eq!(blocks(&released), vec![1]);
    assert!(rt.objects().is_empty());
}

#[test]
fn gc_leaves_reachable_cycles_alone() {
    let mut rt = Runtime::new();
    let h = rt.new_list(&[], true, "h");
    bound(&mut rt, h, "h");
    assert_eq!(rt.collect().0, 0);
    assert_eq!(rt.objects().len(), 1);
}

#[test]
fn framework_state_keeps_objects_until_cleared() {
    let mut rt = Runtime::new();
    let w = tensor(&mut rt, 7, "w");
    bound(&mut rt, w, "w");
    rt.hold(Holder::FrameworkState, w);
    assert!(rt.unbind("w").unwrap().is_empty());
    assert_eq!(why(&rt)[&w], "the framework's global state");
    assert_eq!(blocks(&rt.release_holder(Holder::FrameworkState)), vec![7]);
}

#[test]
fn an_attribute_chain_names_every_hop() {
    let mut rt = Runtime::new();
    let p = tensor(&mut rt, 1, "model.0.weight");
    let g = tensor(&mut rt, 2, "model.0.weight.grad");
    rt.add_ref(p, g);
    rt.drop_local(g);
    let m = rt.new_local(ObjectKind::Instance(Class::Model), "model");
    rt.add_ref(m, p);
    rt.drop_local(p);
    bound(&mut rt, m, "model");
    assert_eq!(
        why(&rt)[&g],
        "name `model` -> MLP `model` -> Tensor `model.0.weight`"
    );
    assert_eq!(blocks(&rt.remove_ref(p, g)), vec![2]);
    rt.check_invariants().unwrap();
}

/// "Kept alive by" stays short however deep the chain: 1,500 nested
/// lists used to give quadratic text (85 MB messages).
#[test]
fn a_deep_chain_is_told_by_its_first_hops_and_its_last_holder() {
    let mut rt = Runtime::new();
    let x = tensor(&mut rt, 1, "x");
    let mut prev = rt.new_list(&[x], false, "l0");
    rt.drop_local(x);
    for i in 1..1500 {
        let l = rt.new_list(&[prev], false, &format!("l{i}"));
        rt.drop_local(prev);
        prev = l;
    }
    bound(&mut rt, prev, "h");
    let why = why(&rt);
    assert_eq!(
        why[&x],
        "name `h` -> list `l1499` -> list `l1498` -> list `l1497` -> list `l1496` -> … (1495 more) -> list `l0`"
    );
    assert!(why.values().all(|w| w.len() < 200));
}
