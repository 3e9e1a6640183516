"""`LayerNorm`, `RMSNorm` (over the last axis) and `BatchNorm` (with running statistics
as state): statistics in float32 or wider whatever the compute dtype."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, dtype_field, dtype_name
from ._checks import check_input, check_int, check_number


def statistics_dtype(x: jax.Array) -> Any:
    """The dtype statistics of `x` are computed in: float32, or wider when `x` is."""
    return jnp.promote_types(x.dtype, jnp.float32)


def norm_fields(
    layer: str, features: object, eps: object, use_weight: bool, use_bias: bool, dtype: DTypeLike
) -> dict[str, Any]:
    """A norm's `eps` (a number >= 0) and its `weight` (ones) and `bias` (zeros) of
    `features` (a positive int) in the parameters' `dtype`, or None where off, checked."""
    size = check_int(layer, "features", features)
    eps = check_number(layer, "eps", eps, low=0.0)
    dtype = dtype_name(dtype, "param_dtype")
    weight = jnp.ones((size,), dtype) if use_weight else None
    return {"weight": weight, "bias": jnp.zeros((size,), dtype) if use_bias else None, "eps": eps}


def checked_input(norm: Any, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`x` (its last axis checked against the norm's features, when it knows them) and `x`
    in the statistics' dtype."""
    x = jnp.asarray(x)
    arrays = [getattr(norm, name, None) for name in ("weight", "bias", "running_mean")]
    features = next((a.shape[-1] for a in arrays if a is not None), None)
    check_input(type(norm).__name__, x, "features", features)
    return x, x.astype(statistics_dtype(x))


def scaled_and_shifted(norm: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """`y` (`x` normalised) in `norm`'s compute dtype, times its `weight` plus its `bias`."""
    present = [a for a in (norm.weight, norm.bias) if a is not None]
    dtype = norm.dtype or jnp.result_type(x, *present)
    weight = norm.weight
    offset = getattr(norm, "weight_offset", 0.0)
    if offset and weight is not None:  # Gemma scales in float32 (or wider), then casts
        y, weight = y * (weight.astype(statistics_dtype(weight)) + offset), None
    y, weight, bias = cast(dtype, y, weight, norm.bias)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


class LayerNorm(Layer):
    """`(x - mean) / sqrt(var + eps) * weight + bias`, over the last axis of `x`.

    **Arguments**

    - `features`: the size of the last axis.
    - `eps`: added to the variance (default `1e-5`).
    - `use_weight`, `use_bias`: learn `weight` (ones) and `bias` (zeros), each
      `[features]` (else `None`).
    - `dtype`: the compute dtype of the result (`None`: what `x` and the parameters
      promote to); the statistics are float32 or wider.
    - `param_dtype`: the dtype the parameters are created in.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    y = tc.nn.LayerNorm(4)(jnp.arange(8.0).reshape(2, 4))
    assert jnp.allclose(y.mean(-1), 0.0, atol=1e-6)
    ```
    """

    weight: jax.Array | None
    bias: jax.Array | None
    eps: float = field(default=1e-5, static=True, on_setattr=[float])
    dtype: str | None = dtype_field()

    def __init__(
        self,
        features: int,
        *,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
    ) -> None:
        params = norm_fields(type(self).__name__, features, eps, use_weight, use_bias, param_dtype)
        assign(self, **params, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` normalised over its last axis, scaled and shifted."""
        x, stats = checked_input(self, x)
        mean = stats.mean(-1, keepdims=True)
        var = jnp.square(stats - mean).mean(-1, keepdims=True)
        return scaled_and_shifted(self, x, (stats - mean) * jax.lax.rsqrt(var + self.eps))


class RMSNorm(Layer):
    """`x / sqrt(mean(x**2) + eps) * (weight_offset + weight)`, over the last axis of `x`
    (Llama's norm; Gemma's with `weight_offset=1.0`).

    **Arguments**

    - `features`: the size of the last axis.
    - `eps`: added to the mean square (default `1e-5`).
    - `use_weight`, `use_bias`: learn a scale, and an offset (off by default), as
      `LayerNorm`.
    - `weight_offset`: a constant added to `weight` before it scales (default `0.0`):
      Gemma stores `w` and scales by `1 + w` (in float32 or wider). The weight starts at
      `1 - weight_offset`, so a new norm scales by one.
    - `dtype`, `param_dtype`: as for `LayerNorm`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    y = tc.nn.RMSNorm(4)(jnp.full((2, 4), 3.0))
    assert jnp.allclose(y, 1.0, atol=1e-5)
    ```
    """

    weight: jax.Array | None
    bias: jax.Array | None
    eps: float = field(default=1e-5, static=True, on_setattr=[float])
    weight_offset: float = field(default=0.0, static=True, on_setattr=[float])
    dtype: str | None = dtype_field()

    def __init__(
        self,
        features: int,
        *,
        eps: float = 1e-5,
        use_weight: bool = True,
        use_bias: bool = False,
        weight_offset: float = 0.0,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
    ) -> None:
        params = norm_fields(type(self).__name__, features, eps, use_weight, use_bias, param_dtype)
        weight_offset = check_number("RMSNorm", "weight_offset", weight_offset)
        if (weight := params["weight"]) is not None and weight_offset:
            params["weight"] = weight - jnp.asarray(weight_offset, weight.dtype)
        assign(self, **params, weight_offset=weight_offset, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` divided by its root mean square over the last axis, scaled."""
        x, stats = checked_input(self, x)
        y = stats * jax.lax.rsqrt(jnp.square(stats).mean(-1, keepdims=True) + self.eps)
        return scaled_and_shifted(self, x, y)


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
    """Normalises each feature (the last axis) by its statistics over every other axis. In
    training mode a call normalises by the batch's mean and (biased) variance and assigns
    `running = momentum * running + (1 - momentum) * batch` to `running_mean` and
    `running_var` (fields of role state), so it runs on a mutable copy
    (`tc.value_and_tree`; the layers guide, "A ResNet block"); inference mode reads them.

    **Arguments**

    - `features`: the size of the last axis.
    - `momentum`: the weight of the running value in its update (default `0.99`).
    - `eps`: added to the variance (default `1e-5`).
    - `use_weight`, `use_bias`: learn a scale and an offset, as `LayerNorm`.
    - `axis_name`: a named axis (of `jax.vmap`, `shard_map`, `pmap`) to average the batch
      statistics over, for a batch split across it.
    - `training`: the mode (default `True`).
    - `dtype`, `param_dtype`: as for `LayerNorm`; statistics are float32 or wider.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    norm = tc.nn.BatchNorm(3)
    x = jnp.arange(12.0).reshape(4, 3)
    y, norm = tc.value_and_tree(lambda m: m(x))(norm)
    assert jnp.allclose(norm.running_mean, 0.01 * x.mean(0))
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
        assign(
            self,
            **norm_fields("BatchNorm", features, eps, use_weight, use_bias, param_dtype),
            running_mean=jnp.zeros((features,), param_dtype),
            running_var=jnp.ones((features,), param_dtype),
            momentum=_momentum(momentum),
            axis_name=axis_name,
            training=training,
            dtype=dtype,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` normalised per feature; in training mode, the statistics assigned too."""
        x, stats = checked_input(self, x)
        if self.training:
            axes = tuple(range(x.ndim - 1))

            def average(y: jax.Array) -> jax.Array:
                y = y.mean(axes)
                return y if self.axis_name is None else jax.lax.pmean(y, self.axis_name)

            mean = average(stats)
            var = average(jnp.square(stats - mean))
            m = self.momentum
            running = jax.lax.stop_gradient(
                (m * self.running_mean + (1 - m) * mean, m * self.running_var + (1 - m) * var)
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
