"""The layers that make or mark a sequence of tokens, as a vision transformer (ViT) and
BERT have them: `PatchEmbed`, `ClassToken` and `PositionEmbedding`."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, dtype_field, fan_in_params, normal_weight
from ._checks import check_input, check_int, check_integers
from ._conv import check_spatial, convolve

_PATCH_MSG = (
    "`PatchEmbed(patch_size=...)` takes one positive size per spatial axis, 1 to 3 of them "
    "((16, 16) for images); got {value!r}."
)
_IMAGE_MSG = (
    "`PatchEmbed` with patch_size {patch} cuts inputs of shape {shape} into whole patches "
    "only, and {size} (axis {axis}) is not a multiple of {step}: crop or pad the input."
)
_TOO_LONG_MSG = (
    "`PositionEmbedding(num_positions={n})` holds {n} positions; got a sequence of {seq} "
    "(shape {shape}): build it with more positions, or pass `positions=`."
)
_INIT_STDDEV = 0.02  # BERT's, GPT-2's and ViT's initialiser of positions and tokens


class PatchEmbed(Layer):
    """An image cut into non-overlapping patches, each projected to a vector (ViT's patch
    embedding): a convolution whose stride is its kernel, its spatial axes flattened
    row-major into one sequence axis: the output is `(*batch, num_patches, features)`.

    **Arguments**

    - `in_channels`: the channels of the image (`3` for RGB); `features`: the size of
      each patch's vector.
    - `patch_size`: one size per spatial axis (1 to 3), e.g. `(16, 16)`; a spatial size
      that is not a multiple of it is an error. `weight` is `[features, in_channels,
      *patch_size]`.
    - `channels_first`: inputs are `(*batch, channels, *spatial)` (default `True`, as
      Hugging Face's `pixel_values`); `False` takes `(*batch, *spatial, channels)`.
    - `use_bias`, `dtype`, `param_dtype`, `key`: as for `Conv`
      (`fan_in = in_channels * prod(patch_size)`).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    patches = tc.nn.PatchEmbed(3, 32, (4, 4), key=jax.random.key(0))
    assert patches(jnp.ones((2, 3, 16, 16))).shape == (2, 16, 32)  # 4 x 4 patches
    ```
    """

    weight: jax.Array
    bias: jax.Array | None
    channels_first: bool = field(default=True, static=True, on_setattr=[bool])
    dtype: str | None = dtype_field()

    def __init__(
        self,
        in_channels: int,
        features: int,
        patch_size: Sequence[int],
        *,
        channels_first: bool = True,
        use_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        in_channels = check_int("PatchEmbed", "in_channels", in_channels)
        features = check_int("PatchEmbed", "features", features)
        patch = check_spatial(patch_size, "PatchEmbed", "patch_size", _PATCH_MSG)
        shape = (features, in_channels, *patch)
        assign(
            self,
            **fan_in_params("PatchEmbed", key, shape, use_bias, param_dtype),
            channels_first=channels_first,
            dtype=dtype,
        )

    @property
    def patch_size(self) -> tuple[int, ...]:
        """The patch's size along each spatial axis."""
        return tuple(int(s) for s in self.weight.shape[2:])

    def __call__(self, x: jax.Array) -> jax.Array:
        """The patches of `x`, each a vector: shape `(*batch, num_patches, features)`."""
        x = jnp.asarray(x)
        n, patch, first = self.weight.ndim - 2, self.patch_size, self.channels_first
        channels = self.weight.shape[1]
        spatial = [f"s{i}" for i in range(n)]  # the axes cut into patches
        after = spatial if first else []  # the axes after the channels
        lead = "*batch" if first else ", ".join(["*batch", *spatial])
        what = "inputs (channels first)" if first else "inputs"
        check_input(
            "PatchEmbed",
            x,
            "in_channels",
            channels,
            leading=lead,
            trailing=after,
            what=what,
            ndim=n + 1,
        )
        start = x.ndim - n - (0 if first else 1)  # the first spatial axis
        for axis, step in zip(range(start, start + n), patch, strict=True):
            if (size := x.shape[axis]) % step:
                text = _IMAGE_MSG.format(
                    patch=patch, shape=x.shape, size=size, axis=axis, step=step
                )
                raise ValueError(text)
        letters = "DHW"[3 - n :]
        spec = f"C{letters}" if first else f"{letters}C"
        y = convolve(self, x, spec, window_strides=patch, padding="VALID")
        return y.reshape((*y.shape[: y.ndim - n - 1], -1, y.shape[-1]))


class ClassToken(Layer):
    """Learned tokens put in front of a sequence: ViT's and BERT-style `[CLS]` token (and,
    with `num_tokens > 1`, register tokens). `tokens(x)`, `x` of shape `(*batch, seq,
    features)`, gives `(*batch, num_tokens + seq, features)` in the dtype they promote to.

    **Arguments**

    - `features`: the size of each token (the sequence's last axis).
    - `num_tokens`: how many tokens to put in front (default `1`); `weight` is
      `[num_tokens, features]` (ViT's checkpoint holds `[1, 1, features]`).
    - `param_dtype`: the dtype of the tokens (default float32).
    - `key`: a PRNG key; the tokens are drawn from `normal(0, 0.02)`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    cls = tc.nn.ClassToken(8, key=jax.random.key(0))
    y = cls(jnp.zeros((2, 5, 8)))
    assert y.shape == (2, 6, 8) and (y[:, 0] == cls.weight[0]).all()
    ```
    """

    weight: jax.Array

    def __init__(
        self,
        features: int,
        *,
        num_tokens: int = 1,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        features = check_int("ClassToken", "features", features)
        num_tokens = check_int("ClassToken", "num_tokens", num_tokens)
        weight = normal_weight("ClassToken", key, (num_tokens, features), param_dtype, _INIT_STDDEV)
        assign(self, weight=weight)

    def __call__(self, x: jax.Array) -> jax.Array:
        """`x` with the tokens in front of its sequence axis (the second to last)."""
        x = jnp.asarray(x)
        check_input(
            "ClassToken", x, "features", self.weight.shape[-1], leading="*batch, seq", ndim=2
        )
        dtype = jnp.result_type(x, self.weight)
        tokens = jnp.broadcast_to(self.weight.astype(dtype), (*x.shape[:-2], *self.weight.shape))
        return jnp.concatenate([tokens, x.astype(dtype)], axis=-2)


class PositionEmbedding(Layer):
    """A learned vector per position, added to a sequence: the absolute position
    embeddings of BERT, GPT-2 and ViT. `positions(x, positions=None)`: `x` (`(*batch, seq,
    features)`) plus the vectors of `positions` (integers broadcastable to `(*batch, seq)`;
    default `arange(seq)`); a sequence longer than the table is an error.

    **Arguments**

    - `num_positions`: the longest sequence it embeds; `features`: the size of each vector
      (`weight` is `[num_positions, features]`; ViT's checkpoint adds a leading 1).
    - `dtype`: the compute dtype of the sum (`None`: what `x` and the table promote to).
    - `param_dtype`: the dtype of the table (default float32).
    - `key`: a PRNG key; the table is drawn from `normal(0, 0.02)`.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    positions = tc.nn.PositionEmbedding(16, 8, key=jax.random.key(0))
    assert (positions(jnp.zeros((2, 5, 8))) == positions.weight[:5]).all()
    ```
    """

    weight: jax.Array
    dtype: str | None = dtype_field()

    def __init__(
        self,
        num_positions: int,
        features: int,
        *,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        num_positions = check_int("PositionEmbedding", "num_positions", num_positions)
        features = check_int("PositionEmbedding", "features", features)
        shape = (num_positions, features)
        weight = normal_weight("PositionEmbedding", key, shape, param_dtype, _INIT_STDDEV)
        assign(self, weight=weight, dtype=dtype)

    def __call__(self, x: jax.Array, *, positions: jax.Array | None = None) -> jax.Array:
        """`x` plus the vectors of its positions."""
        x = jnp.asarray(x)
        n, features = self.weight.shape
        check_input("PositionEmbedding", x, "features", features, leading="*batch, seq", ndim=2)
        if positions is None:
            seq = x.shape[-2]
            if seq > n:
                raise ValueError(_TOO_LONG_MSG.format(n=n, seq=seq, shape=x.shape))
            table = self.weight[:seq]
        else:
            positions = check_integers("PositionEmbedding", "positions", positions)
            table = jnp.take(self.weight, positions, axis=0)
        x, table = cast(self.dtype, x, table)
        return x + table
