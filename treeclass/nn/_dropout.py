"""`Dropout`: zeroes elements at random in training mode, nothing in inference mode.

A TreeClass holds no random state: the key is an argument of the call, as in equinox,
and a model splits its key among its dropout layers itself. The mode is a static field,
so `jax.jit` compiles each mode once and inference has no random draw in its program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._fields import field
from ._base import Layer
from ._checks import check_number

__all__ = ["Dropout"]

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
    `1 / (1 - rate)` in training mode; the identity in inference mode.

    **Arguments**

    - `rate`: the probability of zeroing an element, in `[0, 1)` (default `0.5`).
    - `training`: the mode (default `True`).

    **Fields**

    `rate`, `training` (static: switching mode compiles the other program once).

    **Keys.** `dropout(x, key=key)`: a training-mode call with a non-zero rate and no key
    is an error (silently dropping nothing would hide a bug); an inference-mode call
    ignores `key`, so the same model code runs in both modes. Draw a fresh key per step
    and per layer (`jax.random.split`); the same key drops the same elements.

    **Modes.** `tc.nn.set_training(model, False)` switches every layer with a `training`
    field, at any depth; `model.at[tc.nn.Dropout]["training"].set(False)` switches the
    dropouts alone.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    drop = tc.nn.Dropout(0.5)
    y = drop(jnp.ones(1000), key=jax.random.key(0))
    assert set(y.tolist()) == {0.0, 2.0}
    assert (drop.replace(training=False)(jnp.ones(3)) == 1.0).all()
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
