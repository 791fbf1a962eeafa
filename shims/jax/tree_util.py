"""jax.tree_util: the older names of jax.tree's functions."""

from jax.tree import leaves as tree_leaves, map as tree_map, structure as tree_structure  # noqa: F401
