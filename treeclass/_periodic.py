"""Periodic stacks: a repeating pattern of different block kinds, scanned one pattern a step.

A `Periodic` holds a `Stacked` of R patterns (tuples of P blocks) and numbers its layers as
the unrolled model does (layer `i` is position `i % P` of repeat `i // P`), in `.at` too.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.tree_util import GetAttrKey, SequenceKey

from ._stacked import STACKED_KIND, StackBase, Stacked, block_index, scan_result
from ._structure import Display, NodeKind, Opened, Stack, describe, register_kind, stack_of
from ._util import check_callable

_PATTERN = GetAttrKey("pattern")

EMPTY_PATTERN_MSG = "A periodic stack needs a pattern of at least one block; got none."
LAYER_COUNT_MSG = (
    "{n} layers do not repeat a pattern of {p}: a periodic stack holds whole repeats, so "
    "its number of layers is a multiple of the pattern's length."
)
INDEX_MSG = (
    "Layer {index} out of range for a periodic stack of {n} layers (valid: {low} to {high})."
)
NOT_PATTERN_MSG = (
    "`Periodic` wraps a `Stacked` whose blocks are patterns (tuples of blocks), got {what}; "
    "build one with `Periodic.from_layers` or `Periodic.from_init`."
)
OUTPUTS_MSG = (
    "The outputs of `Periodic.scan` are stacked per layer, so every position of the pattern "
    "must return outputs of one structure and shape: position 0 gave {first}, position {j} "
    "gave {other}. Return `None`, or outputs of one shape."
)


class Periodic(StackBase):
    """R repeats of a pattern of P blocks (of possibly different kinds), as one tree.

    A `tc.Stacked` of R patterns (`.stack`, the key `pattern` for JAX), applied in R
    `lax.scan` steps. `p[i]`, `.at[i]` and key paths number the layers as the unrolled
    model's. More in the stacked guide, "Periodic stacks".

    **Arguments**

    - `stack`: a `tc.Stacked` whose block tree is a tuple, the pattern; usually built
      with `Periodic.from_layers` or `Periodic.from_init`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    layers = [{"w": jnp.zeros(2)}, {"w": jnp.zeros(2), "b": jnp.zeros(2)}] * 3
    periodic = tc.Periodic.from_layers(layers, period=2).at[3]["b"].set(1.0)  # layer 3 only
    assert len(periodic) == 6 and periodic.repeats == 3 and periodic.period == 2
    assert periodic[3]["b"].tolist() == [1.0, 1.0] and periodic[1]["b"].tolist() == [0.0, 0.0]
    ```
    """

    __slots__ = ("_stack", "_period", "_flat", "__weakref__")
    _HOW_TO_CHANGE = "change layers with `.at`: `model.at['layers'][11]['w'].set(value)`."

    _stack: Stacked
    _period: int
    _flat: tuple[tuple[Any, ...], int]

    def __init__(self, stack: Stacked) -> None:
        # a pattern stack is a `Stacked` (its row's stack part) holding a tuple of layers
        pattern = stack_of(stack) is STACKED_KIND.stack and type(stack.tree) is tuple
        if not pattern or not stack.tree:
            raise TypeError(NOT_PATTERN_MSG.format(what=describe(stack)))
        _unflatten(len(stack.tree), (stack,), self)

    @classmethod
    def from_layers(cls, layers: Sequence[Any], period: int) -> Periodic:
        """A periodic stack of the layers of an unrolled model (the inverse of `layers()`).

        **Arguments**

        - `layers`: the R×P layers in order; layer `i` must have the structure, shapes
          and dtypes of layer `i % period` (its position in the pattern).
        - `period`: P, the length of the pattern.

        **Raises**

        `ValueError` for a number of layers that is not a multiple of `period`, or naming
        the first layer (its position and repeat) that does not fit its position.
        """
        layers = list(layers)
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(f"A pattern has at least one block; got period={period!r}.")
        if not layers:
            raise ValueError(EMPTY_PATTERN_MSG)
        if len(layers) % period:
            raise ValueError(LAYER_COUNT_MSG.format(n=len(layers), p=period))
        patterns = [tuple(layers[r : r + period]) for r in range(0, len(layers), period)]
        try:
            stack = Stacked.from_blocks(patterns)
        except (ValueError, TypeError) as error:
            where = (
                f" In a periodic stack of period {period}, `blocks[r][j]` is layer "
                f"r × {period} + j (position j of repeat r)."
            )
            raise type(error)(f"{error}{where}") from None
        return cls(stack)

    @classmethod
    def from_init(cls, make: Callable[[Any], Sequence[Any]], keys: Any) -> Periodic:
        """R repeats of the pattern that `make(key)` builds, traced once (vmapped).

        **Arguments**

        - `make`: a function of one key returning the pattern, a tuple (or list) of
          blocks: `lambda k: (*[Local(k) for k in split(k, 5)], Global(...))`.
        - `keys`: one key per repeat, stacked: `jax.random.split(key, repeats)`.

        **Returns**

        A `Periodic` of `len(keys)` repeats.
        """
        check_callable(make, "Periodic.from_init", "make", " of one key")

        def pattern(key: Any) -> tuple[Any, ...]:
            blocks = make(key)
            if not isinstance(blocks, list | tuple) or not blocks:
                raise TypeError(
                    "`Periodic.from_init` needs `make` to return the pattern, a non-empty "
                    f"tuple or list of blocks; got {describe(blocks)}."
                )
            return tuple(blocks)

        return cls(Stacked.from_init(pattern, keys))

    @property
    def stack(self) -> Stacked:
        """The `Stacked` of R patterns (tuples of P blocks) that JAX sees."""
        return self._stack

    @property
    def period(self) -> int:
        """P, the number of blocks in the pattern."""
        return self._period

    @property
    def repeats(self) -> int:
        """R, the number of times the pattern repeats."""
        return len(self._stack)

    def __len__(self) -> int:
        return self._period * len(self._stack)

    def __getitem__(self, index: int) -> Any:
        """Layer `index` (negative counts from the end)."""
        if isinstance(index, bool) or not isinstance(index, int | jnp.integer):
            raise TypeError(f"A periodic stack is indexed by an int, got {describe(index)}.")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(INDEX_MSG.format(index=index, n=n, low=-n, high=n - 1))
        r, j = divmod(int(index) % n, self._period)
        return self._stack[r][j]

    def layers(self) -> tuple[Any, ...]:
        """Every layer in order, as a tuple of blocks (the unrolled model's)."""
        return tuple(block for pattern in self._stack.unstack() for block in pattern)

    def scan(
        self,
        fn: Callable[..., tuple[Any, Any]],
        carry: Any,
        xs: Any = None,
        *,
        remat: bool | Callable[..., Any] = False,
        unroll: int | bool = 1,
    ) -> tuple[Any, Any]:
        """Run `fn` over the layers in order: one `lax.scan` step per repeat of the pattern.

        **Arguments**

        - `fn`, `carry`: as for `Stacked.scan`, `fn` taking a layer.
        - `xs`: optional per-layer inputs with a leading axis of `len(self)`.
        - `remat`, `unroll`: as for `Stacked.scan` (per repeat of the pattern).

        **Returns**

        `(final_carry, outputs)`, the outputs stacked along a leading axis of layers.

        ```python
        import jax.numpy as jnp
        import treeclass as tc

        layers = tc.Periodic.from_layers([{"s": jnp.float32(i)} for i in range(4)], 2)
        total, seen = layers.scan(lambda layer, c: (c + layer["s"], c), jnp.float32(0.0))
        assert float(total) == 6.0 and seen.tolist() == [0.0, 0.0, 1.0, 3.0]
        ```
        """
        check_callable(fn, "Periodic.scan", "fn", " of (layer, carry)")
        p, r = self._period, len(self._stack)
        with_xs = xs is not None
        if with_xs:  # [R×P, ...] -> [R, P, ...]: repeat r gets its P slices
            xs = jax.tree_util.tree_map(lambda x: jnp.reshape(x, (r, p, *x.shape[1:])), xs)

        def step(pattern: tuple[Any, ...], carry: Any, *x: Any) -> tuple[Any, Any]:
            outputs = []
            for j, block in enumerate(pattern):
                args = (jax.tree_util.tree_map(operator.itemgetter(j), x[0]),) if x else ()
                out = fn(block, carry, *args)
                carry, output = scan_result(out, "Periodic.scan", f"pattern position {j}")
                outputs.append(output)
            return carry, _stack_outputs(outputs)

        carry, outputs = self._stack.scan(step, carry, xs, remat=remat, unroll=unroll)
        # [R, P, ...] -> [R×P, ...]: in layer order
        outputs = jax.tree_util.tree_map(lambda y: jnp.reshape(y, (r * p, *y.shape[2:])), outputs)
        return carry, outputs

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unflatten, (self._period, (self._stack,)))


def _stack_outputs(outputs: list[Any]) -> Any:
    """One output per pattern position, stacked on a new axis 0 (they must agree)."""
    first = jax.tree_util.tree_structure(outputs[0])
    shapes = [
        jax.tree_util.tree_map(lambda y: (jnp.shape(y), jnp.result_type(y)), out) for out in outputs
    ]
    for j, (out, shape) in enumerate(zip(outputs, shapes)):
        if jax.tree_util.tree_structure(out) != first or shape != shapes[0]:
            raise ValueError(OUTPUTS_MSG.format(first=shapes[0], j=j, other=shape))
    return jax.tree_util.tree_map(lambda *ys: jnp.stack(ys), *outputs)


def _unflatten(period: int, children: Any, periodic: Periodic | None = None) -> Periodic:
    # no checks: JAX rebuilds trees with any leaves (tracers, None, sentinel objects)
    periodic = object.__new__(Periodic) if periodic is None else periodic
    store = object.__setattr__
    store(periodic, "_stack", children[0])
    store(periodic, "_period", period)
    store(periodic, "_flat", (tuple(children), period))
    return periodic


jax.tree_util.register_pytree_with_keys(
    Periodic,
    lambda p: (((_PATTERN, p._stack),), p._period),
    _unflatten,
    operator.attrgetter("_flat"),
)


def _kinds(periodic: Periodic) -> str:
    """`5×Local, Global`: the pattern's block types, runs folded."""
    names = itertools.groupby(type(block).__name__ for block in periodic.stack.tree)
    runs = [(name, len(list(run))) for name, run in names]
    return ", ".join(name if count == 1 else f"{count}×{name}" for name, count in runs)


class _PeriodicKind(NodeKind["Periodic"]):
    """A periodic stack's row: `.at` opens it into the layers `[r×P+j]`, through the row
    of the stack it holds."""

    def open(self, node: Periodic) -> Opened:
        opened = STACKED_KIND.open(node._stack)
        layers = [block for pattern in opened.children for block in pattern]
        entries = tuple(SequenceKey(i) for i in range(len(layers)))
        return Opened(entries, layers, (opened.children, opened.aux))

    def child(self, node: Periodic, key: str | int) -> tuple[Any, Any] | None:
        i = block_index(key, len(node))
        if i is None:
            return None
        r, j = divmod(i, node._period)
        return SequenceKey(i), node._stack[r][j]

    def replace(
        self,
        node: Periodic,
        entry: Any,
        old: object,
        new: object,
        path: tuple[Any, ...] = (),
        where: Callable[[tuple], str] = jax.tree_util.keystr,
    ) -> Periodic:
        r, j = divmod(entry.idx, node._period)
        pattern = node._stack[r]
        changed = (*pattern[:j], new, *pattern[j + 1 :])
        where = _in_layers(node._period, path, where)
        stack = STACKED_KIND.replace(node._stack, SequenceKey(r), pattern, changed, (), where)
        return _unflatten(node._period, (stack,))

    def rebuild(
        self,
        node: Periodic,
        aux: Any,
        children: Sequence[Any],
        partial: bool = False,
        path: tuple[Any, ...] = (),
        where: Callable[[tuple], str] = jax.tree_util.keystr,
    ) -> Any:
        patterns, stack_aux = aux
        p = node._period
        regrouped = []
        for r, old in enumerate(patterns):
            new = children[r * p : (r + 1) * p]
            same = all(a is b for a, b in zip(new, old))
            regrouped.append(old if same else tuple(new))
        inner = _in_layers(p, path, where)
        out = STACKED_KIND.rebuild(node._stack, stack_aux, regrouped, partial, (), inner)
        if type(out) is tuple:  # a `get` whose fill values changed the structure
            return tuple(children)
        return node if out is node._stack else _unflatten(p, (out,))

    # its leaves' block axis is the held stack's (`block_axes=0`: not counted twice)
    stack: Stack[Periodic] = Stack(
        length=len,
        unstack=lambda node: node.layers(),
        restack=lambda node, layers: Periodic.from_layers(layers, node._period),
        period=lambda node: node._period,
        pattern=_PATTERN.name,
        block_axes=0,
    )
    display: Display[Periodic] = Display(
        children=lambda node: [(_PATTERN, node.stack)],
        type_name=lambda node: f"Periodic[{node.repeats}×({_kinds(node)})]",
    )


def _in_layers(
    p: int, path: tuple[Any, ...], where: Callable[[tuple], str]
) -> Callable[[tuple], str]:
    """The held stack's paths (`[r][j]...`) told in layers (`[r×P+j]...`) below `path`."""

    def text(below: tuple) -> str:
        if len(below) >= 2 and isinstance(below[0], SequenceKey):
            layer = below[0].idx * p + below[1].idx
            return where((*path, SequenceKey(layer), *below[2:]))
        return where((*path, *below))

    return text


register_kind(Periodic, _PeriodicKind())
