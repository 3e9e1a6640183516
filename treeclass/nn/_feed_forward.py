"""`FeedForward`: the two- or three-projection MLP of a transformer block, plain or gated.

Named as Llama's checkpoints name it (`gate_proj`, `up_proj`, `down_proj`), so the
feed-forward weights of Llama, Qwen2, Mistral and Gemma load by their own names, and the
plain two-layer form (BERT, GPT-NeoX, ViT) by renaming two layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, check_key
from ._checks import check_input, check_int
from ._linear import Linear

__all__ = ["FeedForward", "gelu_exact"]


def gelu_exact(x: jax.Array) -> jax.Array:
    """The GELU of `x` by the error function (`approximate=False`): BERT's, ViT's and
    GPT-NeoX's `"gelu"`. `jax.nn.gelu` is the tanh approximation (Gemma's
    `"gelu_pytorch_tanh"`). A named function, so a layer's static `activation` field
    prints and compares as itself.

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
    * up_proj(x))`.

    The gated form is SwiGLU with `activation=jax.nn.silu` (Llama, Qwen2, Mistral) and
    GeGLU with `activation=jax.nn.gelu` (Gemma's tanh GELU); the plain form with
    `gelu_exact` is BERT's, ViT's and GPT-NeoX's MLP.

    **Arguments**

    - `features`: the size of the input's and the output's last axis.
    - `hidden_features`: the size of the hidden layer.
    - `gated`: the gated form (a `gate_proj` beside `up_proj`; default `False`).
    - `activation`: default `jax.nn.silu` when gated, `tc.nn.gelu_exact` when not. A
      static field: pass a named function (a `lambda` prints and compares by identity).
    - `use_bias`: biases in the projections (default `True`; Llama's have none).
    - `dtype`, `param_dtype`: as for `Linear`.
    - `key`: a PRNG key, split three ways (gate, up, down); each projection is a `Linear`
      initialised as `Linear` is.

    **Fields**

    `gate_proj` (a `Linear`, or `None` when not gated), `up_proj`, `down_proj`
    (`Linear`); `activation` (static).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    swiglu = tc.nn.FeedForward(8, 16, gated=True, use_bias=False, key=jax.random.key(0))
    x = jnp.ones((2, 8))
    expected = swiglu.down_proj(jax.nn.silu(swiglu.gate_proj(x)) * swiglu.up_proj(x))
    assert jnp.allclose(swiglu(x), expected)
    bert = tc.nn.FeedForward(8, 32, key=jax.random.key(1))
    assert bert.gate_proj is None and bert(x).shape == (2, 8)
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
        key = check_key(key, "FeedForward")
        gkey, ukey, dkey = jax.random.split(key, 3)
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
        features = getattr(self.up_proj, "in_features", None)
        if features is not None:
            check_input("FeedForward", x, "features", features)
        if self.gate_proj is None:
            hidden = self.activation(self.up_proj(x))
        else:
            hidden = self.activation(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(hidden)
