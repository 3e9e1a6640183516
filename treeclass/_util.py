"""Small tree utilities: `is_tree_equal` (and, later in this module, `Partial`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_tree_equal"]


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _leaves_equal(a: Any, b: Any) -> Any:
    a_array, b_array = _is_array(a), _is_array(b)
    if a_array or b_array:
        if not (a_array and b_array):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if isinstance(a, jax.core.Tracer) or isinstance(b, jax.core.Tracer):
            return jnp.array_equal(a, b)
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    try:
        result = a == b
    except Exception:
        return False
    if isinstance(result, jax.core.Tracer):
        return jnp.all(result)
    try:
        return bool(result)
    except Exception:  # an object whose == returns something without a truth value
        return False


def is_tree_equal(*trees: Any) -> Any:
    """Whether all `trees` have the same structure and equal leaves.

    Arrays are equal when their shapes, dtypes and values are; an array never equals a
    Python scalar. Returns a Python `bool` eagerly and a traced boolean when a leaf is a
    tracer (inside `jax.jit`).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    assert tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(2)})
    assert not tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
    ```
    """
    if len(trees) < 2:
        return True
    first_leaves, first_def = jax.tree_util.tree_flatten(trees[0])
    traced: list[Any] = []
    for other in trees[1:]:
        leaves, treedef = jax.tree_util.tree_flatten(other)
        if treedef != first_def:
            return False
        for a, b in zip(first_leaves, leaves):
            equal = _leaves_equal(a, b)
            if isinstance(equal, jax.core.Tracer):
                traced.append(equal)
            elif not equal:
                return False
    if traced:
        return jnp.all(jnp.stack([jnp.asarray(t) for t in traced]))
    return True


class Partial:
    """Placeholder until the leafwise/util issue lands."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError
