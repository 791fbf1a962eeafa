"""jax.tree: pytrees (nested lists, tuples, dicts, None; other objects are
leaves) mapped leaf by leaf."""


def _is_node(x):
    return isinstance(x, (list, tuple, dict)) or x is None


def leaves(tree):
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [leaf for t in tree for leaf in leaves(t)]
    return [tree]


def map(f, tree, *rest, is_leaf=None):
    if is_leaf is not None and is_leaf(tree):
        return f(tree, *rest)
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: map(f, tree[k], *[r[k] for r in rest], is_leaf=is_leaf) for k in tree}
    if isinstance(tree, (list, tuple)):
        out = [map(f, t, *[r[i] for r in rest], is_leaf=is_leaf) for i, t in enumerate(tree)]
        if hasattr(tree, "_fields"):  # a namedtuple
            return type(tree)(*out)
        return type(tree)(out)
    return f(tree, *rest)


def structure(tree):
    return map(lambda _: None, tree)


tree_map, tree_leaves = map, leaves
