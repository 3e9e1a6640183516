"""A transformer layer: `FeedForward` (plain or gated), and `DecoderBlock` and
`EncoderBlock`, one computation with Llama's field names and Llama's or BERT's defaults."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._attention import MultiHeadAttention
from ._base import Layer, assign, check_key, named
from ._checks import check_input, check_int, check_number
from ._linear import Linear
from ._normalization import LayerNorm, RMSNorm


def gelu_exact(x: jax.Array) -> jax.Array:
    """The GELU of `x` by the error function (BERT's, ViT's `"gelu"`; `jax.nn.gelu` is the
    tanh approximation), a named function: a static `activation` field prints as itself.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    x = jnp.linspace(-3.0, 3.0, 7)
    assert jnp.allclose(tc.nn.gelu_exact(x), jax.nn.gelu(x, approximate=False))
    ```
    """
    return jax.nn.gelu(x, approximate=False)


class FeedForward(Layer):
    """`down_proj(activation(up_proj(x)))`, or gated: `down_proj(activation(gate_proj(x))
    * up_proj(x))` (SwiGLU with `jax.nn.silu`, GeGLU with `jax.nn.gelu`). The projections'
    outputs are named `"up"` and `"gate"` for a rematerialisation policy that keeps them.

    **Arguments**

    - `features`: the size of the input's and the output's last axis.
    - `hidden_features`: the size of the hidden layer.
    - `gated`: the gated form (default `False`; `gate_proj` is `None` without it).
    - `activation`: default `jax.nn.silu` when gated, `tc.nn.gelu_exact` when not; a
      static field, so a named function (a `lambda` compares by identity).
    - `use_bias`: biases in the projections (default `True`; Llama's have none).
    - `dtype`, `param_dtype`: as for `Linear`.
    - `key`: a PRNG key, split three ways (gate, up, down).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    swiglu = tc.nn.FeedForward(8, 16, gated=True, use_bias=False, key=jax.random.key(0))
    x = jnp.ones((2, 8))
    expected = swiglu.down_proj(jax.nn.silu(swiglu.gate_proj(x)) * swiglu.up_proj(x))
    assert jnp.allclose(swiglu(x), expected)
    ```
    """

    gate_proj: Linear | None
    up_proj: Linear
    down_proj: Linear
    activation: Callable[[Any], Any] = field(default=gelu_exact, static=True)

    def __init__(
        self,
        features: int,
        hidden_features: int,
        *,
        gated: bool = False,
        activation: Callable[[Any], Any] | None = None,
        use_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        features = check_int("FeedForward", "features", features)
        hidden_features = check_int("FeedForward", "hidden_features", hidden_features)
        if activation is None:
            activation = jax.nn.silu if gated else gelu_exact
        elif not callable(activation):
            raise TypeError(
                f"`FeedForward(activation=...)` must be a function; got {activation!r}."
            )
        gkey, ukey, dkey = jax.random.split(check_key(key, "FeedForward"), 3)
        options: dict[str, Any] = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype)
        assign(
            self,
            gate_proj=Linear(features, hidden_features, key=gkey, **options) if gated else None,
            up_proj=Linear(features, hidden_features, key=ukey, **options),
            down_proj=Linear(hidden_features, features, key=dkey, **options),
            activation=activation,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """The hidden layer (gated or not), projected back to `features`."""
        check_input("FeedForward", x, "features", getattr(self.up_proj, "in_features", None))
        up = named(self.up_proj(x), "up")  # a name a remat policy may keep
        if self.gate_proj is None:
            hidden = self.activation(up)
        else:
            hidden = self.activation(named(self.gate_proj(x), "gate")) * up
        return self.down_proj(hidden)


_NORMS = {"rms": RMSNorm, "layer": LayerNorm}
_NORM_MSG = "`{block}(norm=...)` must be 'rms' (RMSNorm) or 'layer' (LayerNorm); got {value!r}."
_POSITION_MSG = (
    "`{block}(norm_position=...)` must be 'pre' (a norm before attention and before the "
    "MLP) or 'post' (a norm after each residual sum); got {value!r}."
)
_PARALLEL_MSG = (
    "`{block}(parallel_residual=True)` adds attention and MLP to one residual, each "
    "through its own norm before it: it needs norm_position='pre', got 'post'."
)
_OFFSET_MSG = (
    "`{block}(norm_weight_offset=...)` is an option of RMSNorm (Gemma's `1 + w`); "
    "norm='layer' has none."
)

Norm = LayerNorm | RMSNorm
# the block's arguments passed to `MultiHeadAttention` as they are
_ATTENTION_OPTIONS = (
    "num_kv_heads head_dim causal sliding_window rope_theta rope_dim rope_interleaved "
    "use_qkv_bias use_out_bias"
).split()


class _TransformerBlock(Layer):
    """The computation and fields both blocks share; see `DecoderBlock`."""

    input_layernorm: Norm | None
    self_attn: MultiHeadAttention
    post_attention_layernorm: Norm | None
    mlp: FeedForward
    output_layernorm: Norm | None
    norm_position: str = field(default="pre", static=True)
    parallel_residual: bool = field(default=False, static=True, on_setattr=[bool])

    # Llama's defaults (DecoderBlock's); EncoderBlock passes BERT's
    def __init__(
        self,
        features: int,
        num_heads: int,
        hidden_features: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        causal: bool = True,
        sliding_window: int | None = None,
        rope_theta: float | None = None,
        rope_dim: int | None = None,
        rope_interleaved: bool = False,
        use_qkv_bias: bool = False,
        use_out_bias: bool = False,
        norm: str = "rms",
        norm_eps: float = 1e-5,
        norm_weight_offset: float = 0.0,
        norm_position: str = "pre",
        parallel_residual: bool = False,
        gated: bool = True,
        activation: Callable[[Any], Any] | None = None,
        use_mlp_bias: bool = False,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        block = type(self).__name__
        features = check_int(block, "features", features)
        num_heads = check_int(block, "num_heads", num_heads)
        hidden_features = check_int(block, "hidden_features", hidden_features)
        if norm not in _NORMS:
            raise ValueError(_NORM_MSG.format(block=block, value=norm))
        if norm_position not in ("pre", "post"):
            raise ValueError(_POSITION_MSG.format(block=block, value=norm_position))
        if parallel_residual and norm_position == "post":
            raise ValueError(_PARALLEL_MSG.format(block=block))
        norm_weight_offset = check_number(block, "norm_weight_offset", norm_weight_offset)
        if norm_weight_offset and norm == "layer":
            raise ValueError(_OFFSET_MSG.format(block=block))
        akey, mkey = jax.random.split(check_key(key, block))
        dtypes: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype)
        arguments = locals()
        attention = {name: arguments[name] for name in _ATTENTION_OPTIONS} | dtypes
        offset: dict[str, Any] = {"weight_offset": norm_weight_offset} if norm == "rms" else {}
        make_norm = functools.partial(_NORMS[norm], features, eps=norm_eps, **offset, **dtypes)
        pre = norm_position == "pre"
        mlp: dict[str, Any] = dict(
            gated=gated, activation=activation, use_bias=use_mlp_bias, **dtypes
        )
        assign(
            self,
            input_layernorm=make_norm() if pre else None,
            self_attn=MultiHeadAttention(features, num_heads, key=akey, **attention),
            post_attention_layernorm=make_norm(),
            mlp=FeedForward(features, hidden_features, key=mkey, **mlp),
            output_layernorm=None if pre else make_norm(),
            norm_position=norm_position,
            parallel_residual=parallel_residual,
        )

    def __call__(
        self, x: jax.Array, *, mask: jax.Array | None = None, positions: jax.Array | None = None
    ) -> jax.Array:
        """The block applied to `x` (`(*batch, seq, features)`); see `DecoderBlock`."""
        x = jnp.asarray(x)
        features = getattr(self.self_attn.q_proj, "in_features", None)
        check_input(type(self).__name__, x, "features", features, leading="*batch, seq", ndim=2)
        attend = functools.partial(self.self_attn, mask=mask, positions=positions)
        # which norms a block holds follows from norm_position (set by __init__)
        norms = (self.input_layernorm, self.post_attention_layernorm, self.output_layernorm)
        first, second, last = (cast(Norm, n) for n in norms)
        if self.norm_position == "post":  # BERT: a norm after each residual sum
            x = second(x + attend(x))
            return last(x + self.mlp(x))
        if self.parallel_residual:  # GPT-NeoX: both branches read the same input
            return x + attend(first(x)) + self.mlp(second(x))
        x = x + attend(first(x))
        return x + self.mlp(second(x))


class DecoderBlock(_TransformerBlock):
    """A transformer decoder layer: causal self-attention and a feed-forward, each with
    its norm and residual. The defaults are Llama's layer; the other families' keywords are
    in the layers guide, "Families as configuration".

    It computes `x + self_attn(input_layernorm(x))`, then `x + mlp(post_attention_layernorm(x))`
    (pre-norm, the default); with `parallel_residual=True` both branches read the same `x`
    (GPT-NeoX); with `norm_position="post"`, `x = post_attention_layernorm(x + self_attn(x))`,
    then `output_layernorm(x + mlp(x))` (BERT). A norm its position leaves unused is `None`.

    **Arguments**

    - `features`, `num_heads`, `hidden_features`: the width, the query heads, the
      feed-forward's hidden size.
    - Attention (`MultiHeadAttention` documents each): `num_kv_heads`, `head_dim`,
      `causal` (default `True`), `sliding_window`, `rope_theta`, `rope_dim`,
      `rope_interleaved`, `use_qkv_bias`, `use_out_bias` (default `False`).
    - `norm`: `"rms"` (`RMSNorm`, default) or `"layer"` (`LayerNorm`); `norm_eps`
      (default `1e-5`); `norm_weight_offset` (RMSNorm's `weight_offset`: `1.0` for Gemma).
    - `norm_position`: `"pre"` (default) or `"post"`; `parallel_residual` (needs `"pre"`).
    - Feed-forward (`FeedForward`): `gated` (default `True`: SwiGLU), `activation`
      (default `jax.nn.silu` gated, `tc.nn.gelu_exact` plain), `use_mlp_bias` (`False`).
    - `dtype`, `param_dtype`: passed to every layer.
    - `key`: a PRNG key, split between the attention and the feed-forward.

    A call `block(x, *, mask=None, positions=None)` takes `x` of shape `(*batch, seq,
    features)`; `mask` and `positions` go to the attention.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    llama = tc.nn.DecoderBlock(64, 4, 172, num_kv_heads=2, rope_theta=1e4, key=jax.random.key(0))
    assert llama(jnp.ones((2, 5, 64))).shape == (2, 5, 64)
    ```
    """


class EncoderBlock(_TransformerBlock):
    """A transformer encoder layer: `DecoderBlock`'s computation, options and fields with
    BERT's defaults: `causal=False`, `norm="layer"`, `norm_eps=1e-12`,
    `norm_position="post"`, `gated=False`, `activation=tc.nn.gelu_exact`, and
    `use_qkv_bias`, `use_out_bias`, `use_mlp_bias` all `True`. A ViT encoder layer is
    `norm_position="pre"`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    bert = tc.nn.EncoderBlock(32, 4, 64, key=jax.random.key(0))
    valid = jnp.arange(5) < jnp.array([[5], [3]])  # padding, as BERT's attention_mask
    assert bert(jnp.ones((2, 5, 32)), mask=valid[:, None, None, :]).shape == (2, 5, 32)
    ```
    """

    def __init__(
        self,
        features: int,
        num_heads: int,
        hidden_features: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        causal: bool = False,
        sliding_window: int | None = None,
        rope_theta: float | None = None,
        rope_dim: int | None = None,
        rope_interleaved: bool = False,
        use_qkv_bias: bool = True,
        use_out_bias: bool = True,
        norm: str = "layer",
        norm_eps: float = 1e-12,
        norm_weight_offset: float = 0.0,
        norm_position: str = "post",
        parallel_residual: bool = False,
        gated: bool = False,
        activation: Callable[[Any], Any] | None = gelu_exact,
        use_mlp_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        _TransformerBlock.__init__(**locals())  # every argument (`self` too) by name
