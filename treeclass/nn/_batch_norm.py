"""`BatchNorm`: normalisation by batch statistics, with running statistics as state.

The running mean and variance are fields declared with the `state` role, so
`tc.optim.trainable` never updates or decays them, `tc.tree_summary` counts them apart
and `tc.save` keeps them. In training mode the forward pass *assigns* the new statistics
to the layer: a TreeClass is immutable, so the call runs on a copy made by
`tc.value_and_tree` (or `model.at["__call__"](x)`), which hands back the output and the
model with its new statistics, wherever the layer sits in it.
"""

from __future__ import annotations

from collections.abc import Hashable

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, dtype_field, scale_and_shift
from ._checks import check_number
from ._normalization import (
    check_norm_input,
    checked_norm_arguments,
    scaled_and_shifted,
    statistics_dtype,
)

__all__ = ["BatchNorm"]

_IMMUTABLE_MSG = (
    "A `BatchNorm` in training mode updates its running statistics, so it must be called "
    "on a copy that may change: run the model through `tc.value_and_tree`, which returns "
    "the output and the updated model,\n"
    "    y, model = tc.value_and_tree(lambda m: m(x))(model)\n"
    "or switch it to inference mode, which reads the running statistics only,\n"
    "    model = tc.nn.set_training(model, False)"
)


def _momentum(value: float) -> float:
    return check_number("BatchNorm", "momentum", value, low=0.0, high=1.0)


class BatchNorm(Layer):
    """Normalises each feature (the last axis) by its statistics over every other axis.

    In training mode (`training=True`) a call normalises by the batch's mean and (biased)
    variance and assigns the running statistics
    `running = momentum * running + (1 - momentum) * batch`; in inference mode it
    normalises by the running statistics and changes nothing. This is flax's and
    equinox's batch norm (their `momentum` too: the weight of the old value).

    Because the call assigns, a training-mode call runs on a mutable copy:
    `y, model = tc.value_and_tree(lambda m: m(x))(model)` gives the output and the whole
    model with its layers' new statistics; a direct call raises an error saying so.
    `tc.nn.set_training(model, False)` (or `model.at[tc.nn.BatchNorm]["training"]
    .set(False)`) switches to inference; `training` is static, so each mode compiles once.

    **Arguments**

    - `features`: the size of the last axis.
    - `momentum`: the weight of the running value in its update (default `0.99`).
    - `eps`: added to the variance (default `1e-5`).
    - `use_weight`, `use_bias`: learn a scale and an offset.
    - `axis_name`: a named axis (of `jax.vmap`, `shard_map`, `pmap`) to average the batch
      statistics over, for a batch split across it.
    - `training`: the mode (default `True`).
    - `dtype`, `param_dtype`: as for `LayerNorm`; statistics are float32 or wider.

    **Fields**

    `weight`, `bias` (trainable, or `None`); `running_mean`, `running_var` (state, as
    PyTorch names them); `momentum`, `eps`, `axis_name`, `training`, `dtype` (static).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    norm = tc.nn.BatchNorm(3)
    x = jnp.arange(12.0).reshape(4, 3)
    y, norm = tc.value_and_tree(lambda m: m(x))(norm)
    assert jnp.allclose(norm.running_mean, 0.01 * x.mean(0))
    print(tc.roles(norm))
    y = tc.nn.set_training(norm, False)(x)  # inference: no copy needed
    ```
    """

    weight: jax.Array | None
    bias: jax.Array | None
    running_mean: jax.Array = field(role="state")
    running_var: jax.Array = field(role="state")
    momentum: float = field(default=0.99, static=True, on_setattr=[_momentum])
    eps: float = field(default=1e-5, static=True, on_setattr=[float])
    axis_name: Hashable = field(default=None, static=True)
    training: bool = field(default=True, static=True, on_setattr=[bool])
    dtype: str | None = dtype_field()

    def __init__(
        self,
        features: int,
        *,
        momentum: float = 0.99,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        axis_name: Hashable = None,
        training: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
    ) -> None:
        features, eps = checked_norm_arguments("BatchNorm", features, eps)
        momentum = _momentum(momentum)
        assign(
            self,
            **scale_and_shift(features, use_weight, use_bias, param_dtype),
            running_mean=jnp.zeros((features,), param_dtype),
            running_var=jnp.ones((features,), param_dtype),
            momentum=momentum,
            eps=eps,
            axis_name=axis_name,
            training=training,
            dtype=dtype,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` normalised per feature; in training mode, the statistics assigned too."""
        x = jnp.asarray(x)
        check_norm_input(self, x)
        stats = x.astype(statistics_dtype(x))
        if self.training:
            axes = tuple(range(x.ndim - 1))
            mean = stats.mean(axes)
            if self.axis_name is not None:
                mean = jax.lax.pmean(mean, self.axis_name)
            var = jnp.square(stats - mean).mean(axes)
            if self.axis_name is not None:
                var = jax.lax.pmean(var, self.axis_name)
            m = self.momentum
            running = jax.lax.stop_gradient(
                (
                    m * self.running_mean + (1 - m) * mean,
                    m * self.running_var + (1 - m) * var,
                )
            )
            try:
                assign(
                    self,
                    running_mean=running[0].astype(self.running_mean.dtype),
                    running_var=running[1].astype(self.running_var.dtype),
                )
            except AttributeError:  # sealed: the first assignment fails, nothing changed
                raise AttributeError(_IMMUTABLE_MSG) from None
        else:
            mean, var = self.running_mean, self.running_var
        return scaled_and_shifted(self, x, (stats - mean) * jax.lax.rsqrt(var + self.eps))
