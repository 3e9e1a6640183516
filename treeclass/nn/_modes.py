"""Modes: training and inference, switched on a whole model by one call.

A layer with a mode (`Dropout`, `BatchNorm`, and any class of yours) has a static field
named `training`. Static fields are part of the tree definition, so `jax.jit` compiles
each mode once, and switching back finds the first compilation again (layouts are
interned: equal static values give the identical tree definition).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from .._at import at
from .._fields import fields
from .._node import is_treeclass
from .._selectors import where

__all__ = ["set_training", "has_mode"]

_T = TypeVar("_T")
_FLAG_MSG = "`set_training(model, training)` takes a bool, got {value!r}."


def has_mode(node: object) -> bool:
    """Whether `node` is a TreeClass with a static field named `training` that it set."""
    if not is_treeclass(node) or "training" not in vars(node):
        return False
    return any(f.name == "training" and f.static for f in fields(node))


def _below(path: Sequence[object], node: object) -> bool:
    return len(path) == 1


def _switch(node: object, training: bool) -> Any:
    # the node's children first (a block of yours with a mode may hold dropouts), then it
    inner = at(node)[where(_below)].apply(lambda child: set_training(child, training), whole=True)
    return at(inner)["training"].set(training)


def set_training(tree: _T, training: bool) -> _T:
    """`tree` with every layer's mode set: `training=True` for training, `False` for
    inference.

    Every TreeClass node with a static field named `training`, at any depth (inside
    tuples, dicts, `tc.Stacked` blocks; the layers of `treeclass.nn` and classes of
    yours), gets the value; nothing else changes, and a tree without such a node comes
    back unchanged. It is one `.at` call per layer (`model.at[tc.nn.Dropout]["training"]
    .set(False)` switches the dropouts alone).

    The mode is static: `jax.jit` compiles a function once per mode, and a model
    switched back and forth reuses both compilations.

    **Arguments**

    - `tree`: a model, or any pytree holding layers.
    - `training`: `True` (training mode) or `False` (inference mode).

    **Returns**

    The switched tree (the input is unchanged).

    ```python
    import jax
    import treeclass as tc

    model = tc.nn.Sequential(tc.nn.Linear(3, 3, key=jax.random.key(0)), tc.nn.Dropout(0.5))
    evaluating = tc.nn.set_training(model, False)
    assert evaluating[1].training is False and model[1].training is True
    ```
    """
    if not isinstance(training, bool):
        raise TypeError(_FLAG_MSG.format(value=training))
    if has_mode(tree):
        return _switch(tree, training)
    return at(tree)[where(lambda path, node: has_mode(node))].apply(
        lambda node: _switch(node, training), whole=True
    )
