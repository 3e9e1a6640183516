"""Modes: a static `training` field (each mode compiles once) switched on a whole model by
`set_training`; and `Dropout`, whose training mode zeroes elements at random."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp

from .._at import at
from .._fields import field, fields
from .._selectors import where
from .._structure import TREECLASS, row_of
from ._base import Layer
from ._checks import check_number

_T = TypeVar("_T")
_FLAG_MSG = "`set_training(model, training)` takes a bool, got {value!r}."


def has_mode(node: object) -> bool:
    """Whether `node` is a TreeClass with a static field named `training` that it set."""
    if row_of(node).kind != TREECLASS or "training" not in vars(node):
        return False
    return any(f.name == "training" and f.static for f in fields(node))


def _below(path: Sequence[object], node: object) -> bool:
    return len(path) == 1


def _switch(node: object, training: bool) -> Any:
    # the node's children first (a block of yours with a mode may hold dropouts), then it
    inner = at(node)[where(_below)].apply(lambda child: set_training(child, training), whole=True)
    return at(inner)["training"].set(training)


def set_training(tree: _T, training: bool) -> _T:
    """`tree` with every layer's mode set: `True` for training, `False` for inference.

    Every TreeClass node with a static field named `training`, at any depth (in tuples,
    dicts, `tc.Stacked` blocks; layers of `treeclass.nn` and of yours), gets the value;
    nothing else changes. A function `jax.jit` compiles once per mode.

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


_NO_KEY_MSG = (
    "`Dropout` in training mode (rate {rate}) needs a PRNG key: call it as "
    "`dropout(x, key=key)`, splitting one key per dropout layer per step, or switch the "
    "model to inference mode, which needs none:\n"
    "    model = tc.nn.set_training(model, False)"
)


def _rate(value: float) -> float:
    return check_number("Dropout", "rate", value, low=0.0, high=1.0, open_high=True)


class Dropout(Layer):
    """Zeroes each element with probability `rate` and scales the others by
    `1 / (1 - rate)` in training mode; the identity in inference mode. A training-mode call
    needs a key, `dropout(x, key=key)` (the layers guide, "Dropout and keys").

    **Arguments**

    - `rate`: the probability of zeroing an element, in `[0, 1)` (default `0.5`).
    - `training`: the mode (default `True`; `tc.nn.set_training` switches a model).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    y = tc.nn.Dropout(0.5)(jnp.ones(1000), key=jax.random.key(0))
    assert set(y.tolist()) == {0.0, 2.0}
    ```
    """

    rate: float = field(default=0.5, static=True, on_setattr=[_rate])
    training: bool = field(default=True, static=True, on_setattr=[bool])

    def __call__(self, x: jax.Array, *, key: jax.Array | None = None) -> jax.Array:
        """`x` with elements dropped (training mode) or unchanged (inference mode)."""
        x = jnp.asarray(x)
        if not self.training or self.rate == 0.0:
            return x
        if key is None:
            raise ValueError(_NO_KEY_MSG.format(rate=self.rate))
        keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros((), x.dtype))
