"""`LoRA`: a low-rank adapter around a `Linear`, trained while the `Linear` stays fixed,
and merged back into one `Linear` when training is done.

The names and shapes are those of Hugging Face PEFT's adapter files (`base_layer`,
`lora_A.weight` `[rank, in]`, `lora_B.weight` `[out, rank]`, PyTorch's `Linear` layout),
so adapters trained here load there and back by renaming only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._fields import field
from ._base import Layer, assign, check_key
from ._checks import check_input, check_int, check_number
from ._linear import Linear

__all__ = ["LoRA"]

_BASE_MSG = "`LoRA` wraps a `tc.nn.Linear`, got a {type}."


class LoRA(Layer):
    """`base(x) + (alpha / rank) * lora_B(lora_A(x))`: a `Linear` plus a trainable
    low-rank update, with the `Linear` itself kept out of training.

    `lora_A` starts as a `Linear` does (uniform in `±1/sqrt(in_features)`, as PEFT's
    default) and `lora_B` at zero, so a fresh adapter computes exactly what `base` does.
    `base_layer` is a field declared `role="frozen"`: its weights stay ordinary leaves
    (traced by `jax.jit`, saved in checkpoints), `jax.grad` computes no gradient for them
    and `tc.optim.trainable` leaves them as they are.

    **Arguments**

    - `base`: the `tc.nn.Linear` to adapt.
    - `rank`: the rank of the update.
    - `alpha`: the update's scale numerator (default `rank`: a scale of one).
    - `key`: a PRNG key for `lora_A`.

    **Fields**

    `base_layer` (the `Linear`), `lora_A` (`Linear` `[rank, in]`, no bias), `lora_B`
    (`Linear` `[out, rank]`, no bias); `alpha` (static).

    `adapter.merge()` is the one `Linear` computing the same function:
    `weight + (alpha / rank) * lora_B.weight @ lora_A.weight`, the base's bias.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    base = tc.nn.Linear(8, 4, key=jax.random.key(0))
    adapter = tc.nn.LoRA(base, rank=2, key=jax.random.key(1))
    x = jnp.ones((3, 8))
    assert jnp.allclose(adapter(x), base(x))  # lora_B starts at zero
    adapter = adapter.at["lora_B"]["weight"].apply(lambda w: w + 0.1)
    # equal up to the products' rounding (a TPU rounds their inputs to bfloat16)
    assert jnp.allclose(adapter.merge()(x), adapter(x), atol=1e-2)
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
        """The `Linear` that computes what this adapter computes (in its parameters'
        dtype): the update added into the base's weight."""
        base = self.base_layer
        delta = self.scaling * (self.lora_B.weight @ self.lora_A.weight)
        return base.replace(weight=(base.weight + delta).astype(base.weight.dtype))
