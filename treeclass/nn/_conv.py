"""`Conv`: convolution over 1, 2 or 3 spatial axes, channels last, with PyTorch's weight
layout `[out_channels, in_channels // groups, *kernel_size]` (README.md beside this)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from .._fields import field
from ._base import Layer, assign, cast, dtype_field, fan_in_params
from ._checks import check_input, check_int, check_ints

_KERNEL_MSG = (
    "`Conv(kernel_size=...)` takes one positive size per spatial axis, 1 to 3 of them: (5,) "
    "for 1D, (3, 3) for 2D, (3, 3, 3) for 3D; got {value!r}."
)
_PADDING_MSG = (
    "`Conv(padding=...)` must be 'SAME', 'VALID', an int >= 0, one per spatial axis, or one "
    "(low, high) pair of them per spatial axis ({n} of them); got {value!r}."
)
_GROUPS_MSG = (
    "`Conv(groups={groups})` must divide both in_channels ({cin}) and out_channels ({cout})."
)
_SPATIAL = {1: "w", 2: "h, w", 3: "d, h, w"}


def check_spatial(value: object, layer: str, name: str, message: str) -> tuple[int, ...]:
    """`value` as one positive size per spatial axis (1 to 3), else `message`'s error."""
    if isinstance(value, Sequence) and not isinstance(value, str) and 1 <= len(value) <= 3:
        try:
            return check_ints(layer, name, value, len(value))
        except (TypeError, ValueError):
            pass
    raise ValueError(message.format(value=value))


def convolve(layer: Any, x: jax.Array, spec: str, **options: Any) -> jax.Array:
    """`x` (batch axes, then the `spec` axes: `"HWC"`, `"CHW"`) convolved with `layer`."""
    n = len(spec) - 1
    batch = x.shape[: x.ndim - n - 1]
    x, weight, bias = cast(layer.dtype, x, layer.weight, layer.bias)
    if layer.dtype is None:  # the operands of a convolution must agree
        common = jnp.result_type(x, weight)
        x, weight = x.astype(common), weight.astype(common)
    flat = x.reshape((-1, *x.shape[x.ndim - n - 1 :]))
    spatial = spec.replace("C", "")
    numbers = (f"N{spec}", f"OI{spatial}", f"N{spatial}C")
    y = jax.lax.conv_general_dilated(flat, weight, dimension_numbers=numbers, **options)
    if bias is not None:
        y = y + bias
    return y.reshape((*batch, *y.shape[1:]))


def _padding(value: object, n: int) -> str | tuple[tuple[int, ...], ...]:
    if isinstance(value, str) and value.upper() in ("SAME", "VALID"):
        return value.upper()
    pairs = value if isinstance(value, Sequence) and len(value) == n else ()
    try:  # one (low, high) pair per axis, else one int for all axes or one per axis
        if pairs and all(isinstance(v, Sequence) and len(v) == 2 for v in pairs):
            return tuple(check_ints("Conv", "padding", v, 2, minimum=0) for v in pairs)
        return tuple((p, p) for p in check_ints("Conv", "padding", value, n, minimum=0))
    except (TypeError, ValueError):
        raise ValueError(_PADDING_MSG.format(n=n, value=value)) from None


class Conv(Layer):
    """A convolution over the 1 to 3 spatial axes before the channel axis: inputs
    `(*batch, *spatial, in_channels)`, outputs `(*batch, *spatial_out, out_channels)`.

    **Arguments**

    - `in_channels`, `out_channels`: the channels of the input and of the output.
    - `kernel_size`: a tuple, one size per spatial axis (its length says how many);
      `weight` is `[out_channels, in_channels // groups, *kernel_size]`.
    - `stride`, `dilation`: an int or one per spatial axis (`dilation` spaces the kernel).
    - `padding`: `0` (default), an int or one per axis (both sides), one `(low, high)`
      pair per axis, `"SAME"` (output size `ceil(size / stride)`) or `"VALID"`.
    - `groups`: split the channels into groups convolved apart (`groups=in_channels` is
      depthwise); it must divide both channel counts.
    - `use_bias`: add a bias per output channel.
    - `dtype`, `param_dtype`: the compute dtype and the dtype of the parameters.
    - `key`: a PRNG key (`fan_in = in_channels // groups * prod(kernel_size)`).

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    conv = tc.nn.Conv(3, 8, (3, 3), stride=2, padding=1, key=jax.random.key(0))
    assert conv(jnp.ones((2, 32, 32, 3))).shape == (2, 16, 16, 8)
    ```
    """

    weight: jax.Array
    bias: jax.Array | None
    # per-axis tuples; the scalar defaults let the printers hide an all-ones value
    stride: Any = field(default=1, static=True)
    padding: Any = field(default=0, static=True)
    dilation: Any = field(default=1, static=True)
    groups: int = field(default=1, static=True)
    dtype: str | None = dtype_field()

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Sequence[int],
        *,
        stride: int | Sequence[int] = 1,
        padding: object = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
        use_bias: bool = True,
        dtype: DTypeLike | None = None,
        param_dtype: DTypeLike = jnp.float32,
        key: jax.Array,
    ) -> None:
        in_channels = check_int("Conv", "in_channels", in_channels)
        out_channels = check_int("Conv", "out_channels", out_channels)
        kernel = check_spatial(kernel_size, "Conv", "kernel_size", _KERNEL_MSG)
        n = len(kernel)
        stride = check_ints("Conv", "stride", stride, n)
        dilation = check_ints("Conv", "dilation", dilation, n)
        padding = _padding(padding, n)
        groups = check_int("Conv", "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(_GROUPS_MSG.format(groups=groups, cin=in_channels, cout=out_channels))
        shape = (out_channels, in_channels // groups, *kernel)
        assign(
            self,
            **fan_in_params("Conv", key, shape, use_bias, param_dtype),
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            dtype=dtype,
        )

    @property
    def kernel_size(self) -> tuple[int, ...]:
        """The kernel's size along each spatial axis."""
        return tuple(int(s) for s in self.weight.shape[2:])

    def __call__(self, x: jax.Array) -> jax.Array:
        """The convolution of `x`, of shape `(*batch, *spatial, in_channels)`."""
        x = jnp.asarray(x)
        n = self.weight.ndim - 2
        cin = self.weight.shape[1] * self.groups
        leading = "*batch, " + _SPATIAL[n]
        check_input("Conv", x, "in_channels", cin, leading=leading, ndim=n + 1)
        return convolve(
            self,
            x,
            "DHW"[3 - n :] + "C",
            window_strides=self.stride,
            padding=self.padding,
            rhs_dilation=self.dilation,
            feature_group_count=self.groups,
        )
