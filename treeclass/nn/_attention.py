"""`MultiHeadAttention`: scaled dot-product attention with grouped-query heads, causal
and padding masks and optional rotary position embeddings.

The projections are `Linear` layers named as Llama's checkpoints name them (`q_proj`,
`k_proj`, `v_proj`, `o_proj`), so Hugging Face weights load by renaming. The attention
itself is `jax.nn.dot_product_attention`, which takes fewer key/value heads than query
heads (grouped-query attention) without repeating them in memory.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, check_key, dtype_field
from ._checks import check_input, check_int, check_number
from ._linear import Linear

__all__ = ["MultiHeadAttention", "rotary_embedding"]

_HEADS_MSG = (
    "`MultiHeadAttention(num_heads={heads}, num_kv_heads={kv})`: the query heads must be a "
    "multiple of the key/value heads (each group of query heads shares one)."
)
_FEATURES_MSG = (
    "`MultiHeadAttention(features={features}, num_heads={heads})`: give `head_dim` when "
    "the features do not divide evenly into heads."
)
_ROTARY_MSG = (
    "`MultiHeadAttention(head_dim={head_dim})`: rotary embeddings turn pairs of "
    "dimensions, so head_dim must be even."
)


def rotary_embedding(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """`x` (`(..., seq, heads, head_dim)`) rotated by its `positions` (`(..., seq)`).

    The rotary position embedding of RoFormer in the half-split form of GPT-NeoX, Llama's
    Hugging Face checkpoints and equinox: dimension `i` of the first half pairs with
    dimension `i` of the second, turning at frequency `theta ** (-2i / head_dim)`.
    Computed in float32 or wider; returned in `x`'s dtype.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    q = jnp.ones((5, 2, 8))
    rotated = tc.nn.rotary_embedding(q, jnp.arange(5), theta=10_000.0)
    assert rotated.shape == q.shape and jnp.allclose(rotated[0], q[0])  # position 0: same
    ```
    """
    x = jnp.asarray(x)
    half = x.shape[-1] // 2
    wide = jnp.promote_types(x.dtype, jnp.float32)
    freqs = 1.0 / (theta ** (jnp.arange(half, dtype=wide) * 2 / x.shape[-1]))
    angles = jnp.asarray(positions, wide)[..., None] * freqs  # (..., seq, half)
    angles = jnp.concatenate([angles, angles], -1)[..., None, :]  # over the heads axis
    xs = x.astype(wide)
    rotated = jnp.concatenate([-xs[..., half:], xs[..., :half]], -1)
    return (xs * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def _check_inputs(layer: Any, x: jax.Array, source: jax.Array, cross: bool) -> None:
    # the projections may be any layer of the right shapes (a LoRA around a Linear): each
    # says its sizes through `in_features` where it has one
    name, leading = "MultiHeadAttention", "*batch, seq"
    features = getattr(layer.q_proj, "in_features", None)
    if features is not None:
        check_input(name, x, "features", features, leading=leading, ndim=2)
    kv_features = getattr(layer.k_proj, "in_features", None)
    if cross and kv_features is not None:
        leading = "*batch, kv_seq"
        check_input(
            name, source, "kv_features", kv_features, leading=leading, ndim=2, what="a context"
        )


class MultiHeadAttention(Layer):
    """Multi-head attention of a sequence over itself or over a context.

    **Arguments**

    - `features`: the size of the input's last axis (and of the output's).
    - `num_heads`: query heads.
    - `num_kv_heads`: key/value heads (default `num_heads`); fewer is grouped-query
      attention (`1` is multi-query attention). It must divide `num_heads`.
    - `head_dim`: the size of each head (default `features // num_heads`).
    - `kv_features`: the size of the context's last axis (default `features`).
    - `use_bias`: biases in the four projections (default `False`, as equinox and Llama).
    - `causal`: each position attends to itself and the positions before it only.
    - `rope_theta`: apply rotary position embeddings to queries and keys with this base
      (Llama uses `10_000.0`, or `500_000.0` for Llama 3); `None` (default): none.
    - `dtype`, `param_dtype`: the compute dtype and the dtype of the parameters.
    - `key`: a PRNG key, split into four for the projections as `equinox.nn`'s attention
      splits it (the projections are `Linear`s, initialised as `Linear` is).

    **Fields**

    `q_proj`, `k_proj`, `v_proj`, `o_proj` (`Linear`, or any layer of the same
    shapes, such as a `LoRA` around one); `num_heads`, `num_kv_heads`, `head_dim`,
    `causal`, `rope_theta`, `dtype` (static).

    **Calling.** `attention(x, context=None, *, mask=None, positions=None)` with `x` of
    shape `(*batch, seq, features)` returns the same shape. `context`
    (`(*batch, kv_seq, kv_features)`) gives the keys and values for cross-attention.
    `mask` is a boolean array broadcastable to `(*batch, num_heads, seq, kv_seq)`, `True`
    where a query may attend: a padding mask of valid key positions `valid`
    (`(batch, kv_seq)`) is `mask=valid[:, None, None, :]`. It combines with `causal`.
    `positions` (`(*batch, seq)`, default `arange(seq)`) are the rotary positions of the
    queries, and of the keys in self-attention.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    attention = tc.nn.MultiHeadAttention(
        64, num_heads=8, num_kv_heads=2, causal=True, rope_theta=10_000.0,
        key=jax.random.key(0),
    )
    x = jnp.ones((2, 10, 64))
    valid = jnp.arange(10) < jnp.array([[10], [7]])  # the second sequence is padded
    assert attention(x, mask=valid[:, None, None, :]).shape == (2, 10, 64)
    assert attention.k_proj.weight.shape == (16, 64)  # 2 heads of 8
    ```
    """

    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    num_heads: int = field(default=1, static=True)
    num_kv_heads: int = field(default=1, static=True)
    head_dim: int = field(default=0, static=True)
    causal: bool = field(default=False, static=True, on_setattr=[bool])
    rope_theta: float | None = field(default=None, static=True)
    dtype: str | None = dtype_field()

    def __init__(
        self,
        features: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_features: int | None = None,
        use_bias: bool = False,
        causal: bool = False,
        rope_theta: float | None = None,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        name = "MultiHeadAttention"
        features = check_int(name, "features", features)
        num_heads = check_int(name, "num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_kv_heads = check_int(name, "num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(_HEADS_MSG.format(heads=num_heads, kv=num_kv_heads))
        if head_dim is None:
            if features % num_heads:
                raise ValueError(_FEATURES_MSG.format(features=features, heads=num_heads))
            head_dim = features // num_heads
        head_dim = check_int(name, "head_dim", head_dim)
        kv_features = check_int(
            name, "kv_features", features if kv_features is None else kv_features
        )
        if rope_theta is not None:
            rope_theta = check_number(name, "rope_theta", rope_theta, low=0.0, open_low=True)
            if head_dim % 2:
                raise ValueError(_ROTARY_MSG.format(head_dim=head_dim))
        key = check_key(key, name)
        qkey, kkey, vkey, okey = jax.random.split(key, 4)
        options: dict[str, Any] = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype)
        assign(
            self,
            q_proj=Linear(features, num_heads * head_dim, key=qkey, **options),
            k_proj=Linear(kv_features, num_kv_heads * head_dim, key=kkey, **options),
            v_proj=Linear(kv_features, num_kv_heads * head_dim, key=vkey, **options),
            o_proj=Linear(num_heads * head_dim, features, key=okey, **options),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            causal=causal,
            rope_theta=rope_theta,
            dtype=dtype,
        )

    def __call__(
        self,
        x: jax.Array,
        context: jax.Array | None = None,
        *,
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        """Attention of `x` over itself (or over `context`); see the class docstring."""
        x = jnp.asarray(x)
        source = x if context is None else jnp.asarray(context)
        _check_inputs(self, x, source, context is not None)
        batch, seq, kv_seq = x.shape[:-2], x.shape[-2], source.shape[-2]
        h = self.head_dim
        q = self.q_proj(x).reshape((*batch, seq, self.num_heads, h))
        k = self.k_proj(source).reshape((*batch, kv_seq, self.num_kv_heads, h))
        v = self.v_proj(source).reshape((*batch, kv_seq, self.num_kv_heads, h))
        if self.rope_theta is not None:
            q_pos = jnp.arange(seq) if positions is None else positions
            k_pos = q_pos if context is None else jnp.arange(kv_seq)
            q = rotary_embedding(q, q_pos, self.rope_theta)
            k = rotary_embedding(k, k_pos, self.rope_theta)
        flat = (-1,) if batch else (1,)
        q, k, v = (a.reshape((*flat, *a.shape[-3:])) for a in (q, k, v))
        if mask is not None:
            mask = jnp.broadcast_to(mask, (*batch, self.num_heads, seq, kv_seq))
            mask = mask.reshape((*flat, self.num_heads, seq, kv_seq))
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=self.causal)
        return self.o_proj(out.reshape((*batch, seq, self.num_heads * h)))
