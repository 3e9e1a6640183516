"""`LayerNorm` and `RMSNorm`: normalisation over the last axis, without state.

The statistics are computed in float32 (or wider) whatever the compute dtype, as flax
does, so a bf16 model normalises as accurately as a float32 one; the result is returned
in the compute dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, dtype_field, scale_and_shift
from ._checks import check_input, check_int, check_number

__all__ = [
    "LayerNorm",
    "RMSNorm",
    "statistics_dtype",
    "checked_norm_arguments",
    "check_norm_input",
]


def statistics_dtype(x: jax.Array) -> Any:
    """The dtype statistics of `x` are computed in: float32, or wider when `x` is."""
    return jnp.promote_types(x.dtype, jnp.float32)


def checked_norm_arguments(layer: str, features: object, eps: object) -> tuple[int, float]:
    """A norm's `features` (a positive int) and `eps` (a number >= 0), checked."""
    return check_int(layer, "features", features), check_number(layer, "eps", eps, low=0.0)


def check_norm_input(norm: Any, x: jax.Array) -> None:
    """A `ValueError` unless `x`'s last axis is the norm's features (when it has a
    parameter or statistic that says how many)."""
    for name in ("weight", "bias", "running_mean"):
        array = getattr(norm, name, None)
        if array is not None:
            check_input(type(norm).__name__, x, "features", array.shape[-1])
            return


def scaled_and_shifted(norm: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    """`y` (`x` normalised) in `norm`'s compute dtype (`None`: what `x` and its parameters
    promote to), times its `weight` plus its `bias` (either may be `None`)."""
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
    - `eps`: added to the variance (default `1e-5`, as equinox and PyTorch).
    - `use_weight`, `use_bias`: learn a scale (ones) and an offset (zeros); a field is
      `None` without one.
    - `dtype`: the compute dtype of the result (`None`: what `x` and the parameters
      promote to); the statistics are float32 or wider.
    - `param_dtype`: the dtype the parameters are created in.

    **Fields**

    `weight`, `bias`: `[features]` or `None` (PyTorch's and Hugging Face's names);
    `eps`, `dtype` (static).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    norm = tc.nn.LayerNorm(4)
    y = norm(jnp.arange(8.0).reshape(2, 4))
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
        features, eps = checked_norm_arguments(type(self).__name__, features, eps)
        scale_shift = scale_and_shift(features, use_weight, use_bias, param_dtype)
        assign(self, **scale_shift, eps=eps, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` normalised over its last axis, scaled and shifted."""
        x = jnp.asarray(x)
        check_norm_input(self, x)
        stats = x.astype(statistics_dtype(x))
        mean = stats.mean(-1, keepdims=True)
        var = jnp.square(stats - mean).mean(-1, keepdims=True)
        return scaled_and_shifted(self, x, (stats - mean) * jax.lax.rsqrt(var + self.eps))


class RMSNorm(Layer):
    """`x / sqrt(mean(x**2) + eps) * (weight_offset + weight)`, over the last axis of `x`
    (Llama's norm; Gemma's with `weight_offset=1.0`).

    **Arguments**

    - `features`: the size of the last axis.
    - `eps`: added to the mean square (default `1e-5`, as equinox).
    - `use_weight`: learn a scale; `weight` is `None` without one.
    - `use_bias`: learn an offset too (zeros; off by default: Llama and flax have none).
    - `weight_offset`: a constant added to `weight` before it scales (default `0.0`).
      Gemma stores its scale as `w` and multiplies by `1 + w`: `weight_offset=1.0` reads
      such a checkpoint as it is. The weight starts at `1 - weight_offset`, so a new norm
      always scales by one.
    - `dtype`, `param_dtype`: as for `LayerNorm`. With an offset the scaling is done in
      float32 (or wider) before the cast to the compute dtype, as Gemma does it.

    **Fields**

    `weight`, `bias`: `[features]` or `None`; `eps`, `weight_offset`, `dtype` (static).

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    norm = tc.nn.RMSNorm(4)
    y = norm(jnp.full((2, 4), 3.0))
    assert jnp.allclose(y, 1.0, atol=1e-5)
    gemma = tc.nn.RMSNorm(4, weight_offset=1.0)
    assert (gemma.weight == 0).all() and jnp.allclose(gemma(jnp.full((2, 4), 3.0)), 1.0)
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
        features, eps = checked_norm_arguments(type(self).__name__, features, eps)
        weight_offset = check_number("RMSNorm", "weight_offset", weight_offset)
        scale_shift = scale_and_shift(features, use_weight, use_bias, param_dtype)
        if scale_shift["weight"] is not None and weight_offset:
            scale_shift["weight"] = scale_shift["weight"] - jnp.asarray(
                weight_offset, scale_shift["weight"].dtype
            )
        assign(self, **scale_shift, eps=eps, weight_offset=weight_offset, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` divided by its root mean square over the last axis, scaled."""
        x = jnp.asarray(x)
        check_norm_input(self, x)
        stats = x.astype(statistics_dtype(x))
        y = stats * jax.lax.rsqrt(jnp.square(stats).mean(-1, keepdims=True) + self.eps)
        return scaled_and_shifted(self, x, y)
