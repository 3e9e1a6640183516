"""`Linear` and `Embed`: the affine map on the last axis, and the lookup table of tokens.

Weights are stored as PyTorch, Hugging Face checkpoints and equinox store them:
`Linear.weight` is `[out_features, in_features]` and `Embed.weight` is
`[num_embeddings, features]`, so a published checkpoint loads under a key rule that only
renames (no transposes), and an output projection tied to the embedding is `Embed.attend`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, check_key, dtype_field, dtype_name, fan_in_params
from ._checks import check_input, check_int, check_number

__all__ = ["Linear", "Embed"]

_INDEX_MSG = "`Embed` looks up integer token ids, got an array of dtype {dtype}."


class Linear(Layer):
    """`y = x @ weight.T + bias` on the last axis of `x`; any leading axes are batch axes.

    **Arguments**

    - `in_features`, `out_features`: the sizes of the last axis of `x` and of `y`.
    - `use_bias`: add a bias (`bias` is `None` without one).
    - `dtype`: the compute dtype (`jnp.bfloat16` computes in bf16 from float32
      parameters); `None` computes in the type `x` and the parameters promote to.
    - `param_dtype`: the dtype the parameters are created in (default float32).
    - `key`: a PRNG key; weight and bias are drawn from
      `uniform(-1/sqrt(in_features), 1/sqrt(in_features))`, as `equinox.nn.Linear` and
      PyTorch draw them.

    **Fields**

    `weight`: `[out_features, in_features]` (PyTorch's and Hugging Face's layout);
    `bias`: `[out_features]` or `None`; `dtype` (static).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    layer = tc.nn.Linear(3, 4, key=jax.random.key(0))
    assert layer.weight.shape == (4, 3) and layer(jnp.ones((2, 5, 3))).shape == (2, 5, 4)
    bf16 = layer.replace(dtype=jnp.bfloat16)
    assert bf16(jnp.ones(3)).dtype == jnp.bfloat16 and bf16.weight.dtype == jnp.float32
    ```
    """

    # the axes' names: a layer holding this one can say which carries its heads, so
    # `tc.ShardingRules` refuses to cut a head across devices
    weight: jax.Array = field(metadata={"axes": ("out", "in")})
    bias: jax.Array | None = field(metadata={"axes": ("out",)})
    dtype: str | None = dtype_field()

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        use_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        in_features = check_int("Linear", "in_features", in_features)
        out_features = check_int("Linear", "out_features", out_features)
        key = check_key(key, "Linear")
        shape = (out_features, in_features)
        assign(self, **fan_in_params(key, shape, in_features, use_bias, param_dtype), dtype=dtype)

    @property
    def in_features(self) -> int:
        """The size of the last axis of the input."""
        return int(self.weight.shape[-1])

    @property
    def out_features(self) -> int:
        """The size of the last axis of the output."""
        return int(self.weight.shape[-2])

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x @ weight.T + bias`, for `x` of shape `(..., in_features)`."""
        check_input("Linear", x, "in_features", self.weight.shape[-1])
        x, weight, bias = cast(self.dtype, x, self.weight, self.bias)
        # contract x's last axis with weight's last: no transposed copy of the weight
        y = jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))
        return y if bias is None else y + bias


class Embed(Layer):
    """A table of `num_embeddings` vectors of size `features`, looked up by integer ids.

    **Arguments**

    - `num_embeddings`, `features`: the rows and columns of the table.
    - `scale`: multiply the vectors looked up by this number (default `None`: not
      scaled). Gemma scales its embeddings by the square root of their width,
      `scale=features ** 0.5`; the factor is rounded to the vectors' dtype first, as
      Gemma rounds it. `attend` does not scale.
    - `dtype`: the compute dtype of the vectors returned (`None`: the table's).
    - `param_dtype`: the dtype the table is created in (default float32).
    - `key`: a PRNG key; the table is drawn from a standard normal, as
      `equinox.nn.Embedding` and PyTorch draw it.

    **Fields**

    `weight`: `[num_embeddings, features]`; `scale`, `dtype` (static).

    `embed(ids)` gives the vectors of `ids` (any integer shape; an id past the table
    gives NaNs, so a bad id shows instead of silently reading another row, and negative
    ids count from the end); `embed.attend(x)` is `x @ weight.T`, the logits of an output
    layer tied to the embedding.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    embed = tc.nn.Embed(10, 4, key=jax.random.key(0))
    vectors = embed(jnp.array([[1, 2, 3]]))
    assert vectors.shape == (1, 3, 4) and embed.attend(vectors).shape == (1, 3, 10)
    gemma = tc.nn.Embed(10, 4, scale=4**0.5, key=jax.random.key(0))
    assert jnp.allclose(gemma(jnp.array([1])), 2.0 * embed(jnp.array([1])))
    ```
    """

    weight: jax.Array
    scale: float | None = field(default=None, static=True)
    dtype: str | None = dtype_field()

    def __init__(
        self,
        num_embeddings: int,
        features: int,
        *,
        scale: float | None = None,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        num_embeddings = check_int("Embed", "num_embeddings", num_embeddings)
        features = check_int("Embed", "features", features)
        key = check_key(key, "Embed")
        param_dtype = dtype_name(param_dtype, "param_dtype")
        assign(
            self,
            weight=jax.random.normal(key, (num_embeddings, features), param_dtype),
            scale=None if scale is None else check_number("Embed", "scale", scale),
            dtype=dtype,
        )

    @property
    def num_embeddings(self) -> int:
        """The number of rows of the table."""
        return int(self.weight.shape[0])

    @property
    def features(self) -> int:
        """The size of each vector."""
        return int(self.weight.shape[1])

    def __call__(self, ids: jax.Array) -> jax.Array:
        """The rows of the table at `ids`: shape `ids.shape + (features,)`."""
        ids = jnp.asarray(ids)
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise TypeError(_INDEX_MSG.format(dtype=ids.dtype))
        (weight,) = cast(self.dtype, self.weight)
        vectors = jnp.take(weight, ids, axis=0)
        if self.scale is None:
            return vectors
        return vectors * jnp.asarray(self.scale, vectors.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """`x @ weight.T`: scores of `x` (shape `(..., features)`) against every row."""
        check_input("Embed.attend", x, "features", self.weight.shape[-1])
        x, weight = cast(self.dtype, x, self.weight)
        return jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))
