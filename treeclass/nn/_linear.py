"""`Linear`, `Embed` and `LoRA`: the affine map on the last axis, the lookup table of
tokens, and a low-rank adapter around a frozen `Linear` (README.md beside this)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, check_key, dtype_field, fan_in_params, normal_weight
from ._checks import check_input, check_int, check_integers, check_number


class Linear(Layer):
    """`y = x @ weight.T + bias` on the last axis of `x`; any leading axes are batch axes.

    **Arguments**

    - `in_features`, `out_features`: the sizes of the last axis of `x` and of `y`
      (`weight` is `[out_features, in_features]`).
    - `use_bias`: add a bias (`bias` is `None` without one).
    - `dtype`: the compute dtype (`jnp.bfloat16` computes in bf16 from float32
      parameters); `None` computes in the type `x` and the parameters promote to.
    - `param_dtype`: the dtype the parameters are created in (default float32).
    - `key`: a PRNG key; weight and bias are drawn from `uniform(±1/sqrt(in_features))`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    layer = tc.nn.Linear(3, 4, key=jax.random.key(0))
    assert layer.weight.shape == (4, 3) and layer(jnp.ones((2, 5, 3))).shape == (2, 5, 4)
    ```
    """

    # the axes' names: a holder says which carries its heads (`tc.ShardingRules` checks)
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
        params = fan_in_params("Linear", key, (out_features, in_features), use_bias, param_dtype)
        assign(self, **params, dtype=dtype)

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
    """A table `weight` of `num_embeddings` vectors of size `features`, looked up by integer
    ids: `embed(ids)` gives the vectors of `ids` (any integer shape; an id past the table
    gives NaNs, negative ids count from the end); `embed.attend(x)` is `x @ weight.T`, the
    logits of an output layer tied to the embedding.

    **Arguments**

    - `num_embeddings`, `features`: the rows and columns of the table.
    - `scale`: multiply the vectors looked up by this number, rounded to their dtype
      first (default `None`; Gemma's is `features ** 0.5`); `attend` does not scale.
    - `dtype`: the compute dtype of the vectors returned (`None`: the table's).
    - `param_dtype`: the dtype the table is created in (default float32).
    - `key`: a PRNG key; the table is drawn from a standard normal.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    embed = tc.nn.Embed(10, 4, key=jax.random.key(0))
    vectors = embed(jnp.array([[1, 2, 3]]))
    assert vectors.shape == (1, 3, 4) and embed.attend(vectors).shape == (1, 3, 10)
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
        scale = None if scale is None else check_number("Embed", "scale", scale)
        weight = normal_weight("Embed", key, (num_embeddings, features), param_dtype)
        assign(self, weight=weight, scale=scale, dtype=dtype)

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
        (weight,) = cast(self.dtype, self.weight)
        vectors = jnp.take(weight, check_integers("Embed", "token ids", ids), axis=0)
        if self.scale is None:
            return vectors
        return vectors * jnp.asarray(self.scale, vectors.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """`x @ weight.T`: scores of `x` (shape `(..., features)`) against every row."""
        check_input("Embed.attend", x, "features", self.weight.shape[-1])
        x, weight = cast(self.dtype, x, self.weight)
        return jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))


_BASE_MSG = "`LoRA` wraps a `tc.nn.Linear`, got a {type}."


class LoRA(Layer):
    """`base(x) + (alpha / rank) * lora_B(lora_A(x))`: a `Linear` plus a trainable
    low-rank update; `lora_B` starts at zero, so a fresh adapter computes what `base` does.
    `adapter.merge()` is the one `Linear` computing the same function.

    **Arguments**

    - `base`: the `tc.nn.Linear` to adapt, kept as `base_layer`, a field declared
      `role="frozen"` (the layers guide, "LoRA").
    - `rank`: the rank of the update: `lora_A` is a `Linear` `[rank, in]`, `lora_B` one
      `[out, rank]`, both without bias.
    - `alpha`: the update's scale numerator (default `rank`: a scale of one).
    - `key`: a PRNG key for `lora_A` (drawn as a `Linear` is).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    base = tc.nn.Linear(8, 4, key=jax.random.key(0))
    adapter = tc.nn.LoRA(base, rank=2, key=jax.random.key(1))
    assert jnp.allclose(adapter(jnp.ones((3, 8))), base(jnp.ones((3, 8))))
    ```
    """

    base_layer: Linear = field(role="frozen")
    # PEFT's checkpoint names; the rank axis is not the base's: sharding checks see that
    lora_A: Linear = field(metadata={"rename_axes": {"out": "rank"}})  # noqa: N815
    lora_B: Linear = field(metadata={"rename_axes": {"in": "rank"}})  # noqa: N815
    alpha: float = field(default=1.0, static=True, on_setattr=[float])

    def __init__(
        self, base: Linear, rank: int, *, alpha: float | None = None, key: jax.Array
    ) -> None:
        if not isinstance(base, Linear):
            raise TypeError(_BASE_MSG.format(type=type(base).__name__))
        rank = check_int("LoRA", "rank", rank)
        key = check_key(key, "LoRA")
        param_dtype = base.weight.dtype
        options: dict[str, Any] = {"use_bias": False, "dtype": base.dtype, "key": key}
        zero = Linear(rank, base.out_features, **options)
        assign(
            self,
            base_layer=base,
            lora_A=Linear(base.in_features, rank, param_dtype=param_dtype, **options),
            lora_B=zero.replace(weight=jnp.zeros((base.out_features, rank), param_dtype)),
            alpha=rank if alpha is None else check_number("LoRA", "alpha", alpha),
        )

    @property
    def rank(self) -> int:
        """The rank of the update."""
        return int(self.lora_A.weight.shape[-2])

    @property
    def in_features(self) -> int:
        """The size of the last axis of the input (the base layer's)."""
        return int(self.lora_A.weight.shape[-1])

    @property
    def out_features(self) -> int:
        """The size of the last axis of the output (the base layer's)."""
        return int(self.lora_B.weight.shape[-2])

    @property
    def scaling(self) -> float:
        """`alpha / rank`, the factor of the update."""
        return self.alpha / self.rank

    def __call__(self, x: jax.Array) -> jax.Array:
        """The base layer's output plus the scaled low-rank update."""
        check_input("LoRA", x, "in_features", self.lora_A.weight.shape[-1])
        update = self.lora_B(self.lora_A(x))  # the frozen base is read gradient-stopped
        return self.base_layer(x) + update * jnp.asarray(self.scaling, update.dtype)

    def merge(self) -> Linear:
        """The one `Linear` computing what this adapter computes (in its parameters' dtype)."""
        base = self.base_layer
        delta = self.scaling * (self.lora_B.weight @ self.lora_A.weight)
        return base.replace(weight=(base.weight + delta).astype(base.weight.dtype))
