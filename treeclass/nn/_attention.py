"""`MultiHeadAttention` (grouped-query heads, masks, rotary embeddings) over
`jax.nn.dot_product_attention`, with Llama's projection names (`q_proj`, ..., `o_proj`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, check_key, dtype_field, named
from ._checks import check_input, check_int, check_number
from ._linear import Linear

_HEADS_MSG = (
    "`MultiHeadAttention(num_heads={heads}, num_kv_heads={kv})`: the query heads must be a "
    "multiple of the key/value heads (each group of query heads shares one)."
)
_FEATURES_MSG = (
    "`MultiHeadAttention(features={features}, num_heads={heads})`: give `head_dim` when "
    "the features do not divide evenly into heads."
)
_ROPE_DIM_MSG = (
    "`{where}(rope_dim={value})`: rotary embeddings turn pairs of dimensions of each head, "
    "so rope_dim (default: head_dim) must be even and at most head_dim ({head_dim})."
)
_ROPE_OPTION_MSG = (
    "`MultiHeadAttention({name}=...)` configures rotary embeddings, which are off: give "
    "`rope_theta` too (Llama uses 10_000.0)."
)


def _window(value: object) -> int | None:
    return None if value is None else check_int("MultiHeadAttention", "sliding_window", value)


def _rope_dim(where: str, rope_dim: object, head_dim: int) -> int:
    dim = head_dim if rope_dim is None else check_int(where, "rope_dim", rope_dim)
    if dim % 2 or dim > head_dim:
        raise ValueError(_ROPE_DIM_MSG.format(where=where, value=dim, head_dim=head_dim))
    return dim


def rotary_embedding(
    x: jax.Array,
    positions: jax.Array,
    theta: float,
    *,
    rope_dim: int | None = None,
    interleaved: bool = False,
) -> jax.Array:
    """`x` (`(..., seq, heads, head_dim)`) rotated by its `positions` (`(..., seq)`).

    RoFormer's rotary position embedding: the first `rope_dim` dimensions of each head
    (default: all) turn in pairs, pair `i` at frequency `theta ** (-2i / rope_dim)`; the
    others pass through (partial rotary: GPT-NeoX's `rotary_pct`, GPT-J's `rotary_dim`).
    Pairs are dimensions `i` and `i + rope_dim // 2` (Llama's "rotate_half"), or with
    `interleaved=True` `2i` and `2i + 1` (GPT-J's "rotate_every_two"). Computed in float32
    or wider; returned in `x`'s dtype.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    q = jnp.ones((5, 2, 8))
    rotated = tc.nn.rotary_embedding(q, jnp.arange(5), theta=10_000.0)
    assert rotated.shape == q.shape and jnp.allclose(rotated[0], q[0])  # position 0: same
    ```
    """
    x = jnp.asarray(x)
    dim = _rope_dim("rotary_embedding", rope_dim, x.shape[-1])
    wide = jnp.promote_types(x.dtype, jnp.float32)
    freqs = 1.0 / (theta ** (jnp.arange(dim // 2, dtype=wide) * 2 / dim))
    angles = jnp.asarray(positions, wide)[..., None, None] * freqs  # (..., seq, 1, pairs)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xs = x[..., :dim].astype(wide)
    if interleaved:
        first, second = xs[..., 0::2], xs[..., 1::2]
    else:
        first, second = xs[..., : dim // 2], xs[..., dim // 2 :]
    # each pair (a, b) turned by its angle: (a cos - b sin, b cos + a sin)
    turned = (first * cos - second * sin, second * cos + first * sin)
    out = jnp.stack(turned, -1).reshape(xs.shape) if interleaved else jnp.concatenate(turned, -1)
    return jnp.concatenate([out.astype(x.dtype), x[..., dim:]], -1)


class MultiHeadAttention(Layer):
    """Multi-head attention of a sequence over itself or over a context. The projections'
    outputs are named `"query"`, `"key"`, `"value"` and the attention's `"attended"`, for a
    rematerialisation policy that keeps them (the stacked-layers guide).

    **Arguments**

    - `features`: the size of the input's last axis (and of the output's).
    - `num_heads`: query heads; `num_kv_heads`: key/value heads (default `num_heads`; fewer
      is grouped-query attention, `1` multi-query), a divisor of `num_heads`.
    - `head_dim`: the size of each head (default `features // num_heads`).
    - `kv_features`: the size of the context's last axis (default `features`).
    - `use_bias`: biases in the four projections (default `False`); `use_qkv_bias`,
      `use_out_bias`: in `q_proj`/`k_proj`/`v_proj` and in `o_proj` apart (default `use_bias`).
    - `causal`: each position attends to itself and the positions before it only.
    - `sliding_window`: a query attends only to keys less than this many positions away
      (`i - window < j`, with `causal` also `j <= i`; without it `|i - j| < window`).
      `None` (default): no window.
    - `rope_theta`: rotary position embeddings on queries and keys with this base (Llama:
      `10_000.0`); `None` (default): none. `rope_dim`, `rope_interleaved`: as for
      `rotary_embedding`.
    - `dtype`, `param_dtype`: the compute dtype and the dtype of the parameters.
    - `key`: a PRNG key, split among the four projections, `Linear`s (any layer of their
      shapes, such as a `LoRA`, may replace one).

    A call `attention(x, context=None, *, mask=None, positions=None)` maps `x` of shape
    `(*batch, seq, features)` to that shape; `context` (`(*batch, kv_seq,
    kv_features)`) gives keys and values for cross-attention; `mask`, broadcastable to
    `(*batch, num_heads, seq, kv_seq)`, is `True` where a query may attend, combined with
    `causal` and `sliding_window`; `positions` (`(*batch, seq)`, default `arange(seq)`) are
    the rotary positions of the queries, and of the keys in self-attention.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    attention = tc.nn.MultiHeadAttention(64, 8, num_kv_heads=2, causal=True, key=jax.random.key(0))
    x = jnp.ones((2, 10, 64))
    valid = jnp.arange(10) < jnp.array([[10], [7]])  # the second sequence is padded
    assert attention(x, mask=valid[:, None, None, :]).shape == (2, 10, 64)
    ```
    """

    q_proj: Linear = field(metadata={"heads": ("num_heads", "out")})
    k_proj: Linear = field(metadata={"heads": ("num_kv_heads", "out")})
    v_proj: Linear = field(metadata={"heads": ("num_kv_heads", "out")})
    o_proj: Linear = field(metadata={"heads": ("num_heads", "in")})
    num_heads: int = field(default=1, static=True)
    num_kv_heads: int = field(default=1, static=True)
    head_dim: int = field(default=0, static=True)
    causal: bool = field(default=False, static=True, on_setattr=[bool])
    sliding_window: int | None = field(default=None, static=True, on_setattr=[_window])
    rope_theta: float | None = field(default=None, static=True)
    rope_dim: int | None = field(default=None, static=True)
    rope_interleaved: bool = field(default=False, static=True, on_setattr=[bool])
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
        use_qkv_bias: bool | None = None,
        use_out_bias: bool | None = None,
        causal: bool = False,
        sliding_window: int | None = None,
        rope_theta: float | None = None,
        rope_dim: int | None = None,
        rope_interleaved: bool = False,
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
        kv_features = features if kv_features is None else kv_features
        kv_features = check_int(name, "kv_features", kv_features)
        sliding_window = _window(sliding_window)
        if rope_theta is None:
            for option, value in (("rope_dim", rope_dim), ("rope_interleaved", rope_interleaved)):
                if value not in (None, False):
                    raise ValueError(_ROPE_OPTION_MSG.format(name=option))
        else:
            rope_theta = check_number(name, "rope_theta", rope_theta, low=0.0, open_low=True)
            dim = _rope_dim(name, rope_dim, head_dim)
            rope_dim = None if dim == head_dim else dim
        qkey, kkey, vkey, okey = jax.random.split(check_key(key, name), 4)
        options: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype)
        qkv = dict(options, use_bias=use_bias if use_qkv_bias is None else use_qkv_bias)
        out = dict(options, use_bias=use_bias if use_out_bias is None else use_out_bias)
        assign(
            self,
            q_proj=Linear(features, num_heads * head_dim, key=qkey, **qkv),
            k_proj=Linear(kv_features, num_kv_heads * head_dim, key=kkey, **qkv),
            v_proj=Linear(kv_features, num_kv_heads * head_dim, key=vkey, **qkv),
            o_proj=Linear(num_heads * head_dim, features, key=okey, **out),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            causal=causal,
            sliding_window=sliding_window,
            rope_theta=rope_theta,
            rope_dim=rope_dim,
            rope_interleaved=rope_interleaved,
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
        # the projections may be any layer of the right shapes (a LoRA around a Linear):
        # each says its sizes through `in_features` where it has one
        name, features = "MultiHeadAttention", getattr(self.q_proj, "in_features", None)
        check_input(name, x, "features", features, leading="*batch, seq", ndim=2)
        if context is not None:
            kv = getattr(self.k_proj, "in_features", None)
            check_input(
                name, source, "kv_features", kv, leading="*batch, kv_seq", ndim=2, what="a context"
            )
        batch, seq, kv_seq = x.shape[:-2], x.shape[-2], source.shape[-2]
        h, kv_shape = self.head_dim, (*batch, kv_seq, self.num_kv_heads, self.head_dim)
        # the products a rematerialisation policy may keep by name (`save_only_these_names`)
        q = named(self.q_proj(x), "query").reshape((*batch, seq, self.num_heads, h))
        k = named(self.k_proj(source), "key").reshape(kv_shape)
        v = named(self.v_proj(source), "value").reshape(kv_shape)
        if self.rope_theta is not None:
            q_pos = jnp.arange(seq) if positions is None else positions
            k_pos = q_pos if context is None else jnp.arange(kv_seq)
            dim, interleaved = self.rope_dim, self.rope_interleaved
            q = rotary_embedding(q, q_pos, self.rope_theta, rope_dim=dim, interleaved=interleaved)
            k = rotary_embedding(k, k_pos, self.rope_theta, rope_dim=dim, interleaved=interleaved)
        flat = (-1,) if batch else (1,)
        q, k, v = (a.reshape((*flat, *a.shape[-3:])) for a in (q, k, v))
        if mask is not None:
            mask = jnp.broadcast_to(mask, (*batch, self.num_heads, seq, kv_seq))
            mask = mask.reshape((*flat, self.num_heads, seq, kv_seq))
        window = None
        if self.sliding_window is not None:  # (left, right): how far a key may lie each way
            reach = self.sliding_window - 1
            window = (reach, 0 if self.causal else reach)
        out = jax.nn.dot_product_attention(
            q, k, v, mask=mask, is_causal=self.causal, local_window_size=window
        )
        return self.o_proj(named(out.reshape((*batch, seq, self.num_heads * h)), "attended"))
