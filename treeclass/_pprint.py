"""Text printers on any pytree (`tree_repr`, `tree_str`, `tree_diagram`, `tree_summary`,
`tree_graph`, `tree_mermaid`, `tree_repr_with_trace`). They share a value's text
(`leaf_text`), a node's opening (`view_of`), the folding of long runs of siblings
(`fold_runs`) and, for the pictures, a tree of labelled entries (`Entry`). `tree_repr` lays
out bottom-up: each node knows its one-line width first, so line breaking is one pass.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, SupportsFloat, TypeAlias, TypeGuard, final

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.typing import DTypeLike

from . import _roles, _trace
from ._pprint_registry import children_of, printer_alias, rule_for, view_of
from ._structure import describe, key_text, row_of, wrapper_of
from ._values import array_type, local_copy, offer_display, readable_here, short_repr, size_text

_DEPTH_TYPE_MSG = "`depth` must be a number (an int, or `float('inf')` for no limit), got {value}."
_INT_TYPE_MSG = "`{name}` must be an int, got {value}."
_LOW_MSG = "`{name}` must be >= {low}, got {value!r}."
_IS_LEAF_MSG = "`is_leaf` must be a callable or None, got {value}."
_REPEATS_MSG = (
    "`repeats` must be None (show every child) or an int >= 0 (how many children to keep at "
    "each end of a run of siblings of one type and structure), got {value}."
)

DEFAULT_REPEATS = 3  # children of a long run of siblings kept at each end
_RUN_SIGNATURE_MAX = 72  # a folded run names its children's structure up to this, else `T(...)`
_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic)
_DEVICE_STATS_MIN_SIZE = 1 << 20  # accelerator arrays this big are reduced where they live
_SMALL_ARRAY_SIZE = 1 << 16  # up to this size, a shortcut cheaper than `np.std`
STATS_EXACT_MAX = 1 << 20  # host arrays above this show statistics of a sample (milliseconds)
STATS_SAMPLE_SIZE = 1 << 16


def _check_options(depth: object = 0, is_leaf: object = None, repeats: object = None) -> None:
    _check_number(depth, "depth", 0, _DEPTH_TYPE_MSG, numbers.Real)
    if is_leaf is not None and not callable(is_leaf):
        raise TypeError(_IS_LEAF_MSG.format(value=describe(is_leaf)))
    if repeats is not None:
        _check_number(repeats, "repeats", 0, _REPEATS_MSG, low_msg=_REPEATS_MSG)


def _check_number(
    value: Any,
    name: str,
    low: int,
    msg: str = _INT_TYPE_MSG,
    kind: type[Any] = numbers.Integral,
    low_msg: str = _LOW_MSG,
) -> None:
    """`value` is a `kind` (not a bool) and `>= low` (not nan), else `msg` or `low_msg`."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(msg.format(name=name, value=describe(value)))
    if not value >= low:
        raise ValueError(low_msg.format(name=name, low=low, value=value))


# -- one value ---------------------------------------------------------------------------


_KINDS = (("bool", jnp.bool_), ("complex", jnp.complexfloating), ("float", jnp.floating))


@functools.cache
def _dtype_kind(dtype: DTypeLike) -> str:
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return "extended"  # e.g. PRNG keys: no numbers to summarize, no numpy view
    for kind, family in (*_KINDS, ("int", jnp.integer)):
        if jnp.issubdtype(dtype, family):
            return kind
    return "other"


# `to_host` and `reduce_on_device`: the seams tests replace (CI has no accelerator)


def to_host(x: object) -> np.ndarray:
    """The only place an array's data leaves its device for printing."""
    return np.asarray(x)


def reduce_on_device(x: object) -> bool:
    """Whether `x`'s statistics are reduced where it lives (a large accelerator array)."""
    return isinstance(x, jax.Array) and x.size >= _DEVICE_STATS_MIN_SIZE and not _on_cpu(x)


def _spread_text(x: Any) -> str:
    """`sharded P('data', None) across 2 processes`: an array JAX reads on no process alone."""
    devices = x.sharding.device_set
    processes = sorted({device.process_index for device in devices})
    if len(processes) == 1:  # on devices of one other process
        return f"on process {processes[0]}"
    spec = getattr(x.sharding, "spec", None)
    layout = repr(spec) if spec is not None else f"over {len(devices)} devices"
    return f"sharded {layout} across {len(processes)} processes"


@functools.partial(jax.jit, static_argnames="kind")
def _device_stats(x: jax.Array, kind: str) -> tuple[jax.Array, ...]:
    wide = x.astype(jnp.complex64 if kind == "complex" else jnp.float32)
    if kind == "complex":
        return jnp.mean(wide), jnp.std(wide)
    return jnp.mean(wide), jnp.std(wide), jnp.min(x), jnp.max(x)


def _pieces(x: object) -> list[tuple[tuple[slice, ...] | None, Any]]:
    """`x` as `(index, values)` pieces: itself, or its distinct shards (never gathered)."""
    x = local_copy(x)
    if not isinstance(x, jax.Array) or len(x.sharding.device_set) <= 1:
        return [(None, x)]
    pieces: list[tuple[tuple[slice, ...] | None, Any]] = []
    seen: set[Any] = set()
    for shard in x.addressable_shards:
        key = tuple((part.start, part.stop, part.step) for part in shard.index)
        if key not in seen:
            seen.add(key)
            pieces.append((shard.index, shard.data))
    return pieces


def _on_cpu(x: object) -> bool:
    return not isinstance(x, jax.Array) or all(
        device.platform == "cpu" for device in x.sharding.device_set
    )


def _corners(x: Any) -> np.ndarray:
    """The elements of `x` NumPy's summary shows (per long axis the first and last
    `edgeitems` and one between), as a small host array read shard by shard."""
    edge = np.get_printoptions()["edgeitems"]
    axes = [np.r_[0:edge, edge, n - edge : n] if n > 2 * edge else np.arange(n) for n in x.shape]
    out = np.empty(tuple(len(a) for a in axes), dtype=x.dtype)
    for index, data in _pieces(x):
        spans = index or tuple(slice(0, n) for n in x.shape)
        positions: list[np.ndarray] = []
        local: list[Any] = []
        for axis, span in zip(axes, spans, strict=True):
            start = span.start or 0
            stop = x.shape[len(positions)] if span.stop is None else span.stop
            inside = np.nonzero((axis >= start) & (axis < stop))[0]
            positions.append(inside)
            local.append(axis[inside] - start)
        if any(len(p) == 0 for p in positions):
            continue
        picked = np.ix_(*local)  # a CPU shard is read in place, another indexed where it lives
        out[np.ix_(*positions)] = to_host(data)[picked] if _on_cpu(data) else to_host(data[picked])
    return out


_GOLDEN = (math.sqrt(5) - 1) / 2


def _sample(host: np.ndarray, count: int) -> np.ndarray:
    """`count` elements of `host` at the fractions `k * φ mod 1`: the same every time, never
    in step with a row length (and no random generator to start)."""
    picks = ((np.arange(count) * _GOLDEN) % 1.0 * host.size).astype(np.int64)
    picks.sort()  # in memory order: fewer cache misses on a big buffer
    return host.reshape(-1)[picks] if host.flags.c_contiguous else host.flat[picks]


def _stats(x: Any, kind: str) -> tuple[tuple[Any, ...], bool]:
    """`((mean, std, min, max), sampled)` (`(mean, std)` for complex), as host scalars."""
    if reduce_on_device(local_copy(x)):
        return jax.device_get(_device_stats(local_copy(x), kind)), False
    size = math.prod(x.shape)
    sampled = size > STATS_EXACT_MAX
    parts = []
    for _, data in _pieces(x):
        host = to_host(data)
        if sampled:
            host = _sample(host, max(1, STATS_SAMPLE_SIZE * host.size // size))
        parts.append(host.reshape(-1) if host.flags.c_contiguous else host.ravel())
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
    # accumulate in double precision: the two printed decimals should not depend on dtype
    wide = np.complex128 if kind == "complex" else np.float64
    with np.errstate(all="ignore"):  # inf and nan values are printed, not warned about
        if flat.size <= _SMALL_ARRAY_SIZE:
            # numpy's `std` costs ~20 us of Python per call: a model has many small arrays
            values = flat.astype(wide)
            mean = values.sum() / values.size
            deviation = values - mean
            std = math.sqrt(np.vdot(deviation, deviation).real / values.size)
        else:
            mean, std = flat.mean(dtype=wide), np.real(flat.std(dtype=wide))
        if kind == "complex":
            return (mean, std), sampled
        return (mean, std, flat.min(), flat.max()), sampled


def _number_text(value: SupportsFloat) -> str:
    value = float(value)
    if math.isfinite(value) and abs(value) >= 1e5:
        return f"{value:.2e}"
    return f"{value:.2f}"


def array_repr(x: Any, head: str | None = None, as_str: bool = False) -> str:
    """`tree_repr`'s text of an array: its type (`f32[3]`, or `head` in its place, as a
    stack writes `48×f32[3]`) and its statistics (`(μ=…, σ=…, ∈[…])`) where it has them;
    with `as_str`, `tree_str`'s: its values as NumPy prints them.

    ```python
    import jax.numpy as jnp
    from treeclass._pprint import array_repr

    assert array_repr(jnp.ones(3)) == "f32[3](μ=1.00, σ=0.00, ∈[1.00,1.00])"
    assert array_repr(jnp.ones(3), head="3×f32[]").startswith("3×f32[](μ=1.00")
    ```
    """
    shape = tuple(x.shape)
    head = array_type(x.dtype, shape) if head is None else head
    kind = _dtype_kind(x.dtype)
    if isinstance(x, Tracer) or (as_str and kind == "extended"):
        return head
    if not readable_here(x):  # shape, dtype and sharding only: no value of it is here
        return f"{head}({_spread_text(x)})"
    try:
        if as_str and isinstance(x, jax.Array) and x.size > np.get_printoptions()["threshold"]:
            with np.printoptions(threshold=0):  # numpy summarizes: a few elements suffice
                return str(_corners(x))
        if as_str:
            return str(to_host(local_copy(x)))
        if kind in ("other", "extended") or math.prod(shape) == 0 or (kind == "bool" and shape):
            return head
        if not shape:
            return f"{head}({str(to_host(_pieces(x)[0][1])[()])})"
        stats, sampled = _stats(x, kind)
    except Exception:  # a deleted (donated) buffer, an exotic dtype: the type still helps
        return head
    mark = "sampled " if sampled else ""
    if kind == "complex":
        mean = complex(stats[0])
        sign = "-" if math.copysign(1, mean.imag) < 0 else "+"
        mean_text = f"{_number_text(mean.real)}{sign}{_number_text(abs(mean.imag))}j"
        return f"{head}({mark}μ={mean_text}, σ={_number_text(stats[1])})"
    mean, std, low, high = stats
    bound = int if kind == "int" else _number_text
    bounds = f"{bound(low)},{bound(high)}"
    return f"{head}({mark}μ={_number_text(mean)}, σ={_number_text(std)}, ∈[{bounds}])"


def is_function(x: object) -> TypeGuard[Callable[..., object]]:
    if isinstance(x, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return True
    # jitted and custom-derivative functions are objects that wrap a function
    return callable(x) and not isinstance(x, type) and hasattr(x, "__wrapped__")


def function_text(fn: Callable[..., object]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if name == "<lambda>":
        name = "lambda"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return f"{name}(...)"
    # annotations are noise here (and strings under `from __future__ import annotations`)
    params = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    bare = signature.replace(parameters=params, return_annotation=signature.empty)
    return f"{name}{bare}"


def leaf_text(x: object, as_str: bool = False) -> str:
    """The text of a value shown as a leaf (not opened into children)."""
    rule = rule_for(x)
    if rule is not None:
        show = (rule.str or rule.repr) if as_str else rule.repr
        if show is not None:
            return show(x)
    if isinstance(x, _ARRAY_TYPES):
        if isinstance(x, np.generic) and as_str:
            return str(x)
        return array_repr(x, as_str=as_str)
    if isinstance(x, jax.ShapeDtypeStruct):
        return array_type(x.dtype, tuple(x.shape))
    if is_function(x):
        return function_text(x)
    # `str` of a tree shows strings unquoted, as `str` does, but numbers by their repr
    return short_repr(x, None, str if as_str and type(x) not in _NUMBERS else repr)


# -- nodes -------------------------------------------------------------------------------


class _Parts(NamedTuple):
    """A node opened for printing."""

    name: str  # type name, for diagrams and summaries
    open: str
    close: str
    cut: str  # the text when `depth` stops here
    items: list[tuple[str, str, Any]]  # (repr label, diagram key, child)
    single_comma: bool = False  # a one-element tuple keeps its comma


_NUMBERS = frozenset({int, float, bool, complex})
_ATOMS = frozenset({*_NUMBERS, str, type(None), bytes})


def _node_parts(
    x: object, is_leaf: Callable[[Any], bool] | None = None, hidden: bool = False
) -> _Parts | None:
    """`x` opened into labelled children (`hidden`: also `repr=False` fields), or None."""
    view = view_of(x, is_leaf)
    items = None if view is None else view.items(x, hidden)
    if view is None or items is None:  # a leaf, or an object JAX does not open
        return None
    name = view.type_name(x)
    opening, close = view.brackets
    opening = name + opening if view.named else opening
    comma = view.single_comma and len(items) == 1
    return _Parts(name, opening, close, f"{opening}...{close}", items, comma)


# -- runs of repeated siblings -------------------------------------------------------------


def _signature(x: object, is_leaf: Callable[[Any], bool] | None, hidden: bool) -> str:
    """`x`'s type and structure without its values: `Linear(weight=f32[8,8], bias=f32[8])`."""
    wrapper = wrapper_of(x)
    if wrapper is not None:
        return wrapper.mark + _signature(wrapper.unwrap(x), is_leaf, hidden)
    parts = _node_parts(x, is_leaf, hidden)
    if parts is None:
        return _leaf_type(x)
    body = ", ".join(label + _signature(child, is_leaf, hidden) for label, _, child in parts.items)
    return f"{parts.open}{body}{',' if parts.single_comma else ''}{parts.close}"


class Run(NamedTuple):
    """The middle of a long run of siblings of one type and structure, shown as one entry."""

    items: list[tuple[str, str, Any]]  # the folded (repr label, diagram key, child) items
    signature: str  # their common structure, or `Name(...)` when that is long

    @property
    def keys(self) -> str:
        return f"{self.items[0][1]}…{self.items[-1][1]}"

    @property
    def text(self) -> str:
        return f"… {len(self.items)} more {self.signature} …"


def fold_runs(
    items: list[tuple[str, str, Any]],
    repeats: int | None,
    is_leaf: Callable[[Any], bool] | None = None,
    hidden: bool = False,
) -> list[Any]:
    """`items` with the middle of every run (same-structure siblings) longer than
    `2 * repeats + 1` made a `Run` (folding one child would not save a line)."""
    if repeats is None or len(items) <= 2 * repeats + 1:
        return items
    # plain Python values never fold: their values are the information (layer sizes)
    keys = [
        None if type(x) in _ATOMS else (type(x), _signature(x, is_leaf, hidden))
        for _, _, x in items
    ]
    out: list[Any] = []
    start, count = 0, len(items)
    while start < count:
        key, stop = keys[start], start + 1
        if key is not None:
            while stop < count and keys[stop] == key:
                stop += 1
        if stop - start > 2 * repeats + 1:
            out.extend(items[start : start + repeats])
            folded = items[start + repeats : stop - repeats]
            assert key is not None  # a run of more than one: its children have a key
            signature = key[1]
            if len(signature) > _RUN_SIGNATURE_MAX:
                parts = _node_parts(folded[0][2], is_leaf, hidden)
                signature = parts.cut if parts is not None else signature
            out.append(Run(folded, signature))
            out.extend(items[stop - repeats : stop])
        else:
            out.extend(items[start:stop])
        start = stop
    return out


# -- tree_repr / tree_str: layout ---------------------------------------------------------


@final  # `type(doc) is not _Group` then tells the checkers that `doc` is a `str`
class _Group(NamedTuple):
    """A node's text before layout: one line if it fits, else one child per line."""

    open: str
    close: str
    items: list[tuple[str, _Doc]]
    comma: bool
    size: float  # the width of the one-line form (infinite if a value spans lines)


def _group(open: str, close: str, items: list[tuple[str, _Doc]], comma: bool) -> _Group:
    size: float = len(open) + len(close) + 2 * max(len(items) - 1, 0) + comma
    for label, doc in items:
        if type(doc) is _Group:
            size += len(label) + doc.size
        else:
            size += len(label) + (math.inf if "\n" in doc else len(doc))
    return _Group(open, close, items, comma, size)


_Doc: TypeAlias = "str | _Group"  # a leaf's text, or a node's before layout


def _flat(doc: _Doc) -> str:
    if type(doc) is not _Group:
        return doc
    body = ", ".join(label + _flat(child) for label, child in doc.items)
    return f"{doc.open}{body}{',' if doc.comma else ''}{doc.close}"


def _render(
    doc: _Doc, out: list[str], indent: int, col: int, width: float, tab: int, trail: int
) -> None:
    if type(doc) is not _Group:
        # continuation lines of a multi-line value line up under its first character
        out.append(doc.replace("\n", "\n" + " " * col) if "\n" in doc else doc)
        return
    if col + doc.size + trail <= width or not doc.items:
        out.append(_flat(doc))
        return
    out.append(doc.open)
    inner = indent + tab
    pad = "\n" + " " * inner
    last = len(doc.items) - 1
    for i, (label, child) in enumerate(doc.items):
        out.append(pad)
        out.append(label)
        comma = i < last or doc.comma
        _render(child, out, inner, inner + len(label), width, tab, comma)
        if comma:
            out.append(",")
    out.append("\n" + " " * indent + doc.close)


def _doc(x: object, depth: float, as_str: bool, repeats: int | None) -> _Doc:
    wrapper = wrapper_of(x)
    if wrapper is not None:
        inner = _doc(wrapper.unwrap(x), depth, as_str, repeats)
        if type(inner) is _Group:
            return inner._replace(
                open=wrapper.mark + inner.open, size=inner.size + len(wrapper.mark)
            )
        return wrapper.mark + inner
    parts = _node_parts(x)
    if parts is None:
        return leaf_text(x, as_str)
    if depth <= 0 and parts.items:
        return parts.cut
    items = [
        ("", item.text)
        if type(item) is Run
        else (item[0], _doc(item[2], depth - 1, as_str, repeats))
        for item in fold_runs(parts.items, repeats)
    ]
    return _group(parts.open, parts.close, items, parts.single_comma)


def _layout(
    tree: object, width: float, tabwidth: int, depth: float, as_str: bool, repeats: int | None
) -> str:
    _check_options(depth, None, repeats)
    if not isinstance(width, numbers.Real) or isinstance(width, bool):
        raise TypeError(_INT_TYPE_MSG.format(name="width", value=describe(width)))
    _check_number(tabwidth, "tabwidth", 0)
    doc = _doc(tree, depth, as_str, repeats)
    out: list[str] = []
    _render(doc, out, 0, 0, width, tabwidth, 0)
    return "".join(out)


def tree_repr(
    tree: object,
    *,
    width: int = 80,
    tabwidth: int = 2,
    depth: float = math.inf,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """A compact text of a tree, one line when it fits in `width`; `TreeClass.__repr__`.

    Arrays show dtype, shape and statistics (of a sample above `STATS_EXACT_MAX`
    elements), tracers dtype and shape, frozen values a `#`; `repr=False` fields are
    hidden; a long run of same-structure siblings folds (the printing guide).

    **Arguments**

    - `tree`: any pytree (or any value).
    - `width`: the line width to fit in.
    - `tabwidth`: spaces per indentation level.
    - `depth`: how many levels of nodes to open; deeper nodes print as `Name(...)`,
      `[...]`, `(...)` or `{...}`.
    - `repeats`: how many children of a run to keep at each end (runs of at most
      `2 * repeats + 1` are shown whole); `None` shows every child.

    **Returns**

    The text, a `str`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    tree = {"w": jnp.array([4.0, 5.0, 6.0]), "n": [1, 2]}
    assert tc.tree_repr(tree) == "{'w': f32[3](μ=5.00, σ=0.82, ∈[4.00,6.00]), 'n': [1, 2]}"
    assert tc.tree_repr(tree, depth=0) == "{...}"
    ```
    """
    return _layout(tree, width, tabwidth, depth, False, repeats)


def tree_str(
    tree: object,
    *,
    width: int = 80,
    tabwidth: int = 2,
    depth: float = math.inf,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """Like `tree_repr`, but leaves print with `str` (arrays their values as NumPy prints
    them, strings without quotes); `TreeClass.__str__` uses it.

    **Arguments**

    - `tree`, `width`, `tabwidth`, `depth`, `repeats`: as for `tree_repr`.

    **Returns**

    The text, a `str`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    text = tc.tree_str({"w": jnp.array([4.0, 5.0]), "act": "relu"})
    assert text == "{'w': [4. 5.], 'act': relu}"
    ```
    """
    return _layout(tree, width, tabwidth, depth, True, repeats)


# -- pictures: labelled entries -----------------------------------------------------------


class Entry(NamedTuple):
    label: str  # ".b:tuple" for an opened node, ".a=1.0" for a leaf
    children: tuple[Entry, ...]
    value: Any = None  # the node or leaf shown (a folded run's first child)
    run: bool = False  # a folded run: `children` are its entries when they were asked for


def picture_entries(
    tree: object,
    depth: float,
    is_leaf: Callable[[Any], bool] | None,
    repeats: int | None,
    *,
    hidden: bool = True,
    open_runs: bool = False,
) -> Entry:
    """The tree as labelled entries (`hidden`: `repr=False` fields too; `open_runs`: folded
    runs with their children), which the diagram, graph, mermaid chart and HTML draw."""
    _check_options(depth, is_leaf, repeats)

    def entries(x: object, key: str, depth: float) -> Entry:
        parts = _node_parts(x, is_leaf, hidden)
        if parts is None or not parts.items or depth <= 0:  # a frozen subtree obeys depth too
            text = _flat(_doc(x, depth, False, repeats))
            return Entry(f"{key}={text}" if key else text, (), x)
        children = []
        for item in fold_runs(parts.items, repeats, is_leaf, hidden):
            if type(item) is not Run:
                children.append(entries(item[2], item[1], depth - 1))
                continue
            label = f"{item.keys}: {len(item.items)} more {item.signature}"
            inner = [entries(c, k, depth - 1) for _, k, c in item.items] if open_runs else []
            children.append(Entry(label, tuple(inner), item.items[0][2], True))
        return Entry(f"{key}:{parts.name}" if key else parts.name, tuple(children), x)

    return entries(tree, "", depth)


def tree_diagram(
    tree: object,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    tabwidth: int = 4,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """A box-drawing diagram of a tree, one line per opened node (`key:Type`) or leaf
    (`key=value`); unlike `repr`, it shows `repr=False` fields too.

    **Arguments**

    - `tree`: any pytree.
    - `depth`, `repeats`: as for `tree_repr`.
    - `is_leaf`: a predicate; nodes where it is true are shown as values.
    - `tabwidth`: the width of one indentation level (at least 1).

    **Returns**

    The diagram, a `str`.

    ```python
    import treeclass as tc

    lines = ["dict", "├── ['a']=1", "└── ['b']:tuple", "    └── [0]=2.0"]
    assert tc.tree_diagram({"a": 1, "b": (2.0,)}).splitlines() == lines
    ```
    """
    _check_number(tabwidth, "tabwidth", 1)
    root = picture_entries(tree, depth, is_leaf, repeats)
    bar = "─" * (tabwidth - 2) + " " if tabwidth >= 2 else ""
    marks = ("├" + bar, "└" + bar, "│" + " " * (tabwidth - 1), " " * tabwidth)
    lines = [root.label]
    _diagram_lines(root, "", lines, marks)
    return "\n".join(lines)


def _diagram_lines(entry: Entry, prefix: str, lines: list[str], marks: tuple[str, ...]) -> None:
    branch, corner, pipe, blank = marks
    last = len(entry.children) - 1
    for i, child in enumerate(entry.children):
        below = prefix + (blank if i == last else pipe)
        label = child.label.replace("\n", "\n" + below) if "\n" in child.label else child.label
        lines.append(prefix + (corner if i == last else branch) + label)
        if child.children:
            _diagram_lines(child, below, lines, marks)


def _chart(root: Entry, node: Callable[[int, Entry], str], edge: str) -> list[str]:
    """A line per entry by node number (the root is 0, parents before children), then a
    line per edge (`edge` formatted with the two numbers)."""
    nodes: list[str] = []
    edges: list[str] = []
    stack: list[tuple[Entry, int]] = [(root, -1)]
    while stack:
        entry, parent = stack.pop()
        if parent >= 0:
            edges.append(edge.format(parent, len(nodes)))
        stack.extend((child, len(nodes)) for child in reversed(entry.children))
        nodes.append(node(len(nodes), entry))
    return nodes + edges


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\l")


def _dot_node(n: int, entry: Entry) -> str:
    rule = None if entry.run else rule_for(entry.value)
    style = {} if rule is None or rule.nodestyle is None else rule.nodestyle(entry.value)
    # the rule checked that names are graphviz's: only values need quoting (bools as DOT's)
    attributes = "".join(
        f', {name}="{_dot_escape(str(value).lower() if type(value) is bool else str(value))}"'
        for name, value in style.items()
    )
    return f'    {n} [label="{_dot_escape(entry.label)}"{attributes}];'


def tree_graph(
    tree: object,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """The tree as a graphviz `dot` graph, with the labels of `tree_diagram`; node styles
    come from `register_printer(T, nodestyle=...)`.

    **Arguments**

    - `tree`, `depth`, `is_leaf`, `repeats`: as for `tree_diagram`.

    **Returns**

    The dot source, a `str`.

    ```python
    import treeclass as tc

    dot = tc.tree_graph({"a": 1})
    assert '0 [label="dict"];' in dot and "0 -> 1;" in dot
    ```
    """
    lines = _chart(picture_entries(tree, depth, is_leaf, repeats), _dot_node, "    {} -> {};")
    return "\n".join(["digraph tree {", '    node [shape=box, fontname="monospace"];', *lines, "}"])


def _mermaid_node(n: int, entry: Entry) -> str:
    text = entry.label  # mermaid reads `#name;` as an entity, so `#` itself goes first
    for char, code in (("#", "#35;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
        text = text.replace(char, code)
    return '    n{}["{}"]'.format(n, text.replace("\n", "<br>"))  # (no `\\` in an f-string)


def tree_mermaid(
    tree: object,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """The tree as a mermaid flowchart (GitHub renders it), with the labels of `tree_diagram`.

    **Arguments**

    - `tree`, `depth`, `is_leaf`, `repeats`: as for `tree_diagram`.

    **Returns**

    The mermaid source, a `str`.

    ```python
    import treeclass as tc

    chart = tc.tree_mermaid({"a": 1})
    assert chart.splitlines() == ["flowchart LR", '    n0["dict"]', '    n1["[\\'a\\']=1"]',
                                  "    n0 --> n1"]
    ```
    """
    lines = _chart(picture_entries(tree, depth, is_leaf, repeats), _mermaid_node, "    n{} --> n{}")
    return "\n".join(["flowchart LR", *lines])


# -- tree_summary ---------------------------------------------------------------------------


def _leaf_type(x: object) -> str:
    rule = rule_for(x)
    if rule is not None and rule.type_name is not None:
        return rule.type_name(x)
    wrapper = wrapper_of(x)
    if wrapper is not None:
        return wrapper.mark + _leaf_type(wrapper.unwrap(x))
    if isinstance(x, (*_ARRAY_TYPES, jax.ShapeDtypeStruct)):
        return array_type(x.dtype, tuple(x.shape))
    if is_function(x):  # not `custom_jvp`, `PjitFunction`, `builtin_function_or_method`
        return "function"
    return type(x).__name__


def _leaf_count_size(x: object) -> tuple[int, int]:
    rule = rule_for(x)
    count_of, size_of = (None, None) if rule is None else (rule.count, rule.size)
    wrapper = wrapper_of(x)  # a rule may set one of the two: the other as if it had none
    if wrapper is not None:
        count, size = _leaf_count_size(wrapper.unwrap(x))
    elif isinstance(x, (*_ARRAY_TYPES, jax.ShapeDtypeStruct)):
        count = math.prod(x.shape)
        try:
            size = count * np.dtype(x.dtype).itemsize
        except TypeError:  # extended dtypes (PRNG keys)
            size = count * getattr(x.dtype, "itemsize", 0)
    elif isinstance(x, (bool, numbers.Number)):
        count, size = 1, sys.getsizeof(x)
    else:  # frozen subtrees and other nodes reached through `is_leaf`: their leaves
        leaves = jax.tree_util.tree_leaves(x, is_leaf=_summary_leaf)
        alone = len(leaves) == 1 and leaves[0] is x
        count, size = (0, sys.getsizeof(x)) if alone else _totals(leaves)
    return count if count_of is None else count_of(x), size if size_of is None else size_of(x)


def _totals(leaves: list[Any]) -> tuple[int, int]:
    pairs = [_leaf_count_size(leaf) for leaf in leaves]
    return sum(c for c, _ in pairs), sum(s for _, s in pairs)


def _summary_leaf(x: object) -> bool:
    if wrapper_of(x) is not None:
        return True
    rule = rule_for(x)
    return rule is not None and rule.has_summary


def _sharding_text(x: object) -> str:
    wrapper = wrapper_of(x)
    if wrapper is not None:  # a frozen array replicated over the mesh says so
        return _sharding_text(wrapper.unwrap(x))
    if not isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) or isinstance(x, Tracer):
        flat = children_of(x)  # a node shown as one value (a stacked leaf): its array's
        return _sharding_text(flat[0][1]) if flat is not None and len(flat) == 1 else ""
    try:
        spec = getattr(x.sharding, "spec", None)
        if isinstance(x, jax.ShapeDtypeStruct):  # a template: where its array will go
            return "" if spec is None else repr(spec)
        devices = len(x.sharding.device_set)
        if devices <= 1:
            return ""
        return repr(spec) if spec is not None else f"{devices} devices"
    except Exception:
        return ""


def _box_table(rows: list[list[str]], right: tuple[bool, ...], rules_after: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def rule(left: str, mid: str, end: str) -> str:
        return left + mid.join("─" * (w + 2) for w in widths) + end

    lines = [rule("┌", "┬", "┐")]
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(w) if r else cell.ljust(w)
            for cell, w, r in zip(row, widths, right, strict=True)
        ]
        lines.append("│ " + " │ ".join(cells) + " │")
        if n in rules_after:
            lines.append(rule("├", "┼", "┤"))
    lines.append(rule("└", "┴", "┘"))
    return "\n".join(lines)


_ROLE_ORDER = (_roles.TRAINABLE, _roles.STATE, _roles.FROZEN, _roles.OTHER, _roles.MIXED)


def _row_role(roles: Iterable[str]) -> str:
    found = set(roles)
    return found.pop() if len(found) == 1 else _roles.MIXED


def _sum_row(role: str, kind: str, count: int, size: int) -> list[str]:
    return ["Σ", kind, f"{count:,}", size_text(size), role, ""]


def tree_summary(
    tree: object,
    *,
    depth: float = math.inf,
    is_leaf: Callable[[Any], bool] | None = None,
    repeats: int | None = DEFAULT_REPEATS,
) -> str:
    """A table of a tree's leaves: key path, type, element count and bytes, with totals.

    One row per leaf (`repr=False` fields too), per node where `depth` stops or per
    folded run. Sharded leaves add a Sharding column; when not every leaf is trainable, a
    Role column (`tc.roles`) and `Σ` rows per role and for static fields (the printing
    guide).

    **Arguments**

    - `tree`: any pytree.
    - `depth`: how many levels of nodes to open before summing a node in one row.
    - `is_leaf`: a predicate; nodes where it is true get one row each.
    - `repeats`: as for `tree_repr` (`0`: the whole run in one row).

    **Returns**

    The table, a `str`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    table = tc.tree_summary({"w": jnp.ones((2, 3)), "b": tc.freeze(jnp.ones(3))})
    assert "│ ['w'] │ f32[2,3] │     6 │  24B │ trainable │" in table
    assert "│ Σ     │          │     6 │  24B │ trainable │" in table
    assert "│ Σ     │          │     3 │  12B │ frozen    │" in table
    ```
    """
    _check_options(depth, is_leaf, repeats)
    rows: list[list[str]] = []
    role_totals: dict[str, list[int]] = {}

    def stop(x: object) -> bool:
        return _summary_leaf(x) or (is_leaf is not None and bool(is_leaf(x)))

    def add_row(path: str, kind: str, parts: list[tuple[str, int, int]], sharding: str) -> None:
        for role, c, s in parts:
            totals = role_totals.setdefault(role, [0, 0])
            totals[0] += c
            totals[1] += s
        count, size = sum(c for _, c, _ in parts), sum(s for _, _, s in parts)
        role = _row_role(r for r, _, _ in parts)
        rows.append([path, kind, f"{count:,}", size_text(size), role, sharding])

    def sized(leaves: list[Any], names: list[str]) -> list[tuple[str, int, int]]:
        return [(name, *_leaf_count_size(x)) for x, name in zip(leaves, names, strict=True)]

    def visit(x: object, in_state: bool | str, path: str, remaining: float) -> None:
        # `in_state`: the role a field of a node above declares for `x` (or False)
        flat = None if stop(x) else children_of(x)
        if flat is not None and remaining > 0:
            declared = _roles.declared_children(x)
            states = [(declared.get(key.name) if declared else None) or in_state for key, _ in flat]
            items = [("", key_text(key)[1], child) for key, child in flat]
            position = 0  # in `flat` and `states`
            # hidden=True: runs are judged on every field, as JAX flattens them
            for item in fold_runs(items, repeats, stop, hidden=True):
                if type(item) is Run:
                    span = range(position, position + len(item.items))
                    position += len(item.items)
                    children = [child for _, _, child in item.items]
                    first = children[0]
                    is_node = not stop(first) and children_of(first) is not None
                    what = type(first).__name__ if is_node else _leaf_type(first)
                    leaves = jax.tree_util.tree_leaves(children, is_leaf=stop)
                    names = [
                        n for k in span for n in _roles.leaf_roles(flat[k][1], states[k], stop)
                    ]
                    kind = f"{len(children)} × {what}"
                    add_row(path + item.keys, kind, sized(leaves, names), "")
                else:
                    _, key, child = item
                    visit(child, states[position], path + key, remaining - 1)
                    position += 1
            return
        if flat is not None:  # a node where depth stops: one row with its leaves' totals
            leaves = jax.tree_util.tree_leaves(x, is_leaf=stop)
            if not leaves:
                return
            names = _roles.leaf_roles(x, in_state, stop)
            kind = (view_of(x) or row_of(x)).type_name(x)  # a rule with children may name it
            add_row(path, kind, sized(leaves, names), "")
            return
        # a leaf, a frozen value, a type a rule sums itself, or a node `is_leaf` stops at
        names = _roles.leaf_roles(x, in_state, _summary_leaf)
        rule = rule_for(x)
        if _summary_leaf(x) or children_of(x) is None or (rule and (rule.count or rule.size)):
            parts = [(_row_role(names), *_leaf_count_size(x))]
        else:  # the node's count is its leaves' unless a rule says it
            parts = sized(jax.tree_util.tree_leaves(x, is_leaf=_summary_leaf), names)
        add_row(path, _leaf_type(x), parts, _sharding_text(x))

    visit(tree, False, "", depth)
    show_roles = any(role != _roles.TRAINABLE for role in role_totals)
    sharded = any(row[5] for row in rows)
    table = [["Name", "Type", "Count", "Size", "Role", "Sharding"], *rows]
    footer = []
    if show_roles:  # the `Σ` rows of each role present, then of the static values
        footer = [
            _sum_row(role, "", *role_totals[role]) for role in _ROLE_ORDER if role in role_totals
        ]
        statics = [value for _, _, value in _roles.static_values(tree)]
        if statics:
            footer.append(_sum_row(_roles.STATIC, "", *_totals(statics)))
    table += footer
    count = sum(c for c, _ in role_totals.values())
    size = sum(s for _, s in role_totals.values())
    table.append(_sum_row("", type(tree).__name__, count, size))
    keep = (True, True, True, True, show_roles, sharded)
    table = [[cell for cell, k in zip(row, keep, strict=True) if k] for row in table]
    right = tuple(r for r, k in zip((False, False, True, True, False, False), keep) if k)
    return _box_table(table, right, {0, len(table) - 2 - len(footer)})


# -- tree_repr_with_trace -----------------------------------------------------------------


class _TraceTable(str):
    """A leaf's trace table: a `str` that prints as itself, so tables show unquoted."""

    __slots__ = ()
    __repr__ = str.__str__


def _type_name(kind: object) -> str:
    if isinstance(kind, type) and issubclass(kind, jax.Array):
        return "Array"  # not `ArrayImpl`, JAX's private concrete class
    return getattr(kind, "__name__", str(kind))


def tree_repr_with_trace(
    tree: object, is_leaf: Callable[[Any], bool] | None = None, transpose: bool = False
) -> Any:
    """The tree with each leaf replaced by a table of its value, name path and type path:
    the trace `tc.tree_map_with_trace` passes, joined by `->` as in PyTreeClass v0.4.

    **Arguments**

    - `tree`: any pytree.
    - `is_leaf`: as for `jax.tree_util.tree_map`.
    - `transpose`: one header row (`Value`, `Name path`, `Type path`) above one row of
      values, instead of one row per item.

    **Returns**

    A tree of the same structure whose leaves are the tables.

    ```python
    import treeclass as tc

    table = tc.tree_repr_with_trace({"a": [1.0]})["a"][0]
    assert "│ Name path │ ['a']->[0]  │" in table and "│ Type path │ list->float │" in table
    ```
    """
    _check_options(is_leaf=is_leaf)
    traced, treedef = _trace.tree_flatten_with_trace(tree, is_leaf=is_leaf)

    def table(trace: tuple[Sequence[object], Sequence[object]], leaf: object) -> _TraceTable:
        keys, kinds = trace
        rows = [
            ["Value", _layout(leaf, math.inf, 0, math.inf, False, None)],  # on one line
            ["Name path", "->".join(map(str, keys))],  # PyTreeClass v0.4's `.b->.c->[0]`
            ["Type path", "->".join(_type_name(kind) for kind in kinds)],
        ]
        if transpose:
            rows = [list(column) for column in zip(*rows)]
        return _TraceTable(_box_table(rows, (False,) * len(rows[0]), {0} if transpose else {0, 1}))

    return treedef.unflatten([table(trace, leaf) for trace, leaf in traced])


# PyTreeClass's spelling of `register_printer`: one rule per type, one field per alias.
tree_summary.def_type = printer_alias("type_name")  # type: ignore[attr-defined]
tree_summary.def_count = printer_alias("count")  # type: ignore[attr-defined]
tree_summary.def_size = printer_alias("size")  # type: ignore[attr-defined]
tree_graph.def_nodestyle = printer_alias("nodestyle")  # type: ignore[attr-defined]


# a frozen value (a floor below) shows itself with these printers
offer_display("repr", tree_repr)
offer_display("str", tree_str)
