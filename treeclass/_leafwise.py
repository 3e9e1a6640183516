"""Leafwise operators (`leafwise`) and broadcasting maps over trees (`bcmap`), each at the
cost of a `tree_map`. When a leaf raises, how far the leaves iterator got says which leaf
it was; its key path is computed only then.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable
from itertools import repeat, starmap
from typing import Any, NamedTuple, Protocol, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np

from ._util import add_leaf_note, check_callable, leaf_path_str

_T = TypeVar("_T", bound=type)
_Tree = TypeVar("_Tree")
_flatten = jax.tree_util.tree_flatten

_NOT_A_CLASS_MSG = (
    "`leafwise` decorates a class (a TreeClass subclass or another registered pytree "
    "class), got a {type}. Use it as:\n"
    "    @tc.leafwise\n"
    "    class Tree: ..."
)
_OPERAND_STRUCTURE_MSG = (
    "Leafwise `{symbol}` combines two `{cls}` trees leaf by leaf, so they need the same "
    "structure, but got:\n"
    "    left:  {left}\n"
    "    right: {right}\n"
    "To combine every leaf with one value, pass that value instead of a tree."
)
_LEAF_NOTE = "raised by the leafwise `{symbol}` at the leaf `{path}` ({type})"
_UNARY_OPERAND: Any = object()  # `_leaf_map`'s `other` for a unary operator


def _rounding(name: str) -> Callable[[Any], Any]:
    # `math.floor` works on scalars only (an int back): arrays take NumPy's or JAX's
    jax_fn, numpy_fn, math_fn = getattr(jnp, name), getattr(np, name), getattr(math, name)

    def rounded(x: jax.Array | np.ndarray | float) -> Any:
        if isinstance(x, jax.Array):
            return jax_fn(x)
        return numpy_fn(x) if isinstance(x, np.ndarray) else math_fn(x)

    return rounded


def _leaf_map(
    op: Callable[..., Any],
    tree: object,
    symbol: str,
    other: object = _UNARY_OPERAND,
    cls: type = object,
    reflected: bool = False,
) -> Any:
    """`op` of each leaf of `tree` (and of `other`'s leaf at the same place when it is a
    `cls` tree, else of `other` itself; none for a unary operator)."""
    leaves, treedef = _flatten(tree)
    remaining = iter(leaves)
    if other is _UNARY_OPERAND:
        mapped = map(op, remaining)
    else:
        others: Iterable[Any]
        if isinstance(other, cls):
            others, other_def = _flatten(other)
            if other_def != treedef:
                left, right = (other_def, treedef) if reflected else (treedef, other_def)
                message = _OPERAND_STRUCTURE_MSG.format(
                    symbol=symbol, cls=cls.__name__, left=left, right=right
                )
                raise ValueError(message)
        else:
            others = repeat(other)
        mapped = map(op, others, remaining) if reflected else map(op, remaining, others)
    try:
        out = list(mapped)
    except Exception as error:
        index = len(leaves) - operator.length_hint(remaining) - 1  # the iterator is past it
        leaf_type = type(leaves[index]).__name__ if 0 <= index < len(leaves) else "?"
        path = leaf_path_str(tree, index)
        add_leaf_note(error, _LEAF_NOTE.format(symbol=symbol, path=path, type=leaf_type))
        raise
    return treedef.unflatten(out)


_BINARY = (
    ("add", operator.add, "+"),
    ("sub", operator.sub, "-"),
    ("mul", operator.mul, "*"),
    ("truediv", operator.truediv, "/"),
    ("floordiv", operator.floordiv, "//"),
    ("mod", operator.mod, "%"),
    ("matmul", operator.matmul, "@"),
    ("pow", operator.pow, "**"),  # `__pow__` itself takes a modulo too: made below
    ("lshift", operator.lshift, "<<"),
    ("rshift", operator.rshift, ">>"),
    ("and", operator.and_, "&"),
    ("or", operator.or_, "|"),
    ("xor", operator.xor, "^"),
    ("divmod", divmod, "divmod"),  # one tree of (quotient, remainder) pairs, as PyTreeClass
)
# no reflected forms: Python swaps `1 < tree` into `tree > 1` by itself
_COMPARISONS = (
    ("eq", operator.eq, "=="),
    ("ne", operator.ne, "!="),
    ("lt", operator.lt, "<"),
    ("le", operator.le, "<="),
    ("gt", operator.gt, ">"),
    ("ge", operator.ge, ">="),
)
_UNARY = (
    ("neg", operator.neg, "-"),
    ("pos", operator.pos, "+"),
    ("abs", operator.abs, "abs"),
    ("invert", operator.invert, "~"),
    ("floor", _rounding("floor"), "math.floor"),
    ("ceil", _rounding("ceil"), "math.ceil"),
    ("trunc", _rounding("trunc"), "math.trunc"),
)


def _special_methods(cls: type) -> dict[str, Callable[..., Any]]:
    def binary(op: Callable[[Any, Any], Any], symbol: str, reflected: bool) -> Callable:
        return lambda self, other: _leaf_map(op, self, symbol, other, cls, reflected)

    def unary(fn: Callable[[Any], Any], symbol: str) -> Callable:
        return lambda self: _leaf_map(fn, self, symbol)

    methods: dict[str, Callable[..., Any]] = {}
    for name, op, symbol in _BINARY:
        methods[f"__{name}__"] = binary(op, symbol, reflected=False)
        methods[f"__r{name}__"] = binary(op, symbol, reflected=True)
    for name, op, symbol in _COMPARISONS:
        methods[f"__{name}__"] = binary(op, symbol, reflected=False)
    for name, fn, symbol in _UNARY:
        methods[f"__{name}__"] = unary(fn, symbol)

    def __pow__(self: Any, other: object, modulo: object = None) -> Any:
        op = operator.pow if modulo is None else (lambda x, y: pow(x, y, modulo))
        return _leaf_map(op, self, "**", other, cls)

    def __round__(self: Any, ndigits: int | None = None) -> Any:
        fn = round if ndigits is None else (lambda x: round(x, ndigits))
        return _leaf_map(fn, self, "round")

    methods.update(__pow__=__pow__, __round__=__round__)
    return methods


def leafwise(cls: _T) -> _T:
    """Give a pytree class arithmetic, comparison and unary operators that act leaf by leaf.

    Adds `+ - * / // % ** @`, `divmod`, `& | ^ << >>` (with their reflected forms),
    `== != < <= > >=`, `-x`, `+x`, `abs`, `~`, `round`, `math.floor`, `math.ceil` and
    `math.trunc`. With another instance of `cls` (or of a subclass) a binary operator
    combines the two trees leaf by leaf (same structure, else `ValueError`), with any other
    value every leaf with it; `divmod` gives a tree of pairs, comparisons a tree of bools
    (a mask; tree equality is `tc.is_tree_equal`). Static fields and frozen values stay as
    they are; methods of the class body win (`@dataclass` writes `__eq__`: `eq=False`). An
    error at a leaf gets a note naming it. Same as `class Tree(tc.TreeClass, leafwise=True)`.

    **Arguments**

    - `cls`: a `TreeClass` subclass, or any class registered as a pytree.

    **Returns**

    `cls` itself, with the operators added.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    @tc.leafwise
    class Pair(tc.TreeClass):
        a: float
        b: jnp.ndarray

    pair = Pair(1.0, jnp.array([2.0, 3.0]))
    assert (pair + pair * 2).b.tolist() == [6.0, 9.0]
    ```
    """
    if not isinstance(cls, type):
        raise TypeError(_NOT_A_CLASS_MSG.format(type=type(cls).__name__))
    for name, method in _special_methods(cls).items():
        if name in cls.__dict__:
            continue  # the class body wins
        method.__name__ = name
        method.__qualname__ = f"{cls.__qualname__}.{name}"
        method.__module__ = cls.__module__
        setattr(cls, name, method)
    return cls


_BCMAP_LEAF_NOTE = "raised by `{func}` (in bcmap) at the leaf `{path}`"
_BCMAP_WHOLE_NOTE = (
    "bcmap passed {arg} whole to every call: its structure differs from that of {ref}, "
    "which fixes the structure of the map:\n"
    "    {ref}: {ref_def}\n"
    "    {arg}: {arg_def}\n"
    "To map it leaf by leaf, give it the structure of {ref}."
)

_BCMAP_POSITION_MSG = (
    "bcmap(func, broadcast_to={given!r}) maps over positional argument {position}, but the "
    "call passed {count} positional argument{s}."
)
_BCMAP_KEYWORD_MSG = (
    "bcmap(func, broadcast_to={key!r}) maps over keyword argument `{key}`, but the call "
    "passed no such keyword (keywords passed: {keywords})."
)

# values that are leaves whatever `is_leaf` says, so need no flattening to tell
_LEAF_TYPES = (int, float, complex, bool, str, bytes, np.ndarray, np.generic, jax.Array)


class BroadcastMap(Protocol):
    """What `bcmap(func)` returns, as type checkers see it: a tree of the first argument's type."""

    @overload
    def __call__(self, tree: _Tree, /, *args: Any, **kwargs: Any) -> _Tree: ...
    @overload
    def __call__(self, **kwargs: Any) -> Any: ...


@overload
def bcmap(
    func: Callable[..., Any],
    broadcast_to: None = None,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> BroadcastMap: ...
@overload
def bcmap(
    func: Callable[..., Any],
    broadcast_to: int | str,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Callable[..., Any]: ...
@overload
def bcmap(
    func: Callable[..., Any], broadcast_to: _Tree, *, is_leaf: Callable[[Any], bool] | None = None
) -> Callable[..., _Tree]: ...
def bcmap(
    func: Callable[..., Any],
    broadcast_to: object = None,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
    """Map `func` over the leaves of its first argument, broadcasting other arguments.

    The first argument (positional, else the first keyword one) fixes the structure, as in
    PyTreeClass: every other argument of that structure is mapped leaf by leaf with it, any
    other (a scalar, `None`, `axis=(0, 1)`) is passed whole to every call; a leaf first
    argument makes one plain call. `func`'s errors name the leaf, and the trees passed whole.

    **Arguments**

    - `func`: the function to map.
    - `broadcast_to`: what fixes the structure instead: an int, the position of a
      positional argument (`True` and `False` are 1 and 0, as in sepes); a str, the name
      of a keyword argument; or a tree, whose structure is mapped over.
    - `is_leaf`: as in `jax.tree_util`, for every argument.

    **Returns**

    A function with the signature of `func` that maps it over its first argument.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    tree = {"a": jnp.array([1.0, 3.0]), "b": 5.0}
    out = tc.bcmap(jnp.where)(tc.bcmap(jnp.greater)(tree, 2), tree, 0.0)
    assert out["a"].tolist() == [0.0, 3.0] and out["b"] == 5.0
    ```
    """
    check_callable(func, "bcmap", "func")
    check_callable(is_leaf, "bcmap", "is_leaf", optional=True)

    @functools.wraps(func)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        return _broadcast_call(func, broadcast_to, is_leaf, args, kwargs)

    return mapped


class _Reference(NamedTuple):
    """The argument whose structure `bcmap` maps over, flattened."""

    value: Any
    name: str  # how messages name it: "positional argument 0", "keyword argument `x`"
    position: int | None  # its position, when it is a positional argument
    key: str | None  # its keyword, when it is a keyword argument
    leaves: list[Any]
    treedef: Any


def _reference(
    broadcast_to: object, args: tuple, kwargs: dict, is_leaf: Callable[[Any], bool] | None
) -> _Reference | None:
    """The argument fixing the structure, or `None` when there is none to map over."""
    key = position = None
    if isinstance(broadcast_to, str):
        if broadcast_to not in kwargs:
            shown = ", ".join(f"`{k}`" for k in kwargs) or "none"
            raise TypeError(_BCMAP_KEYWORD_MSG.format(key=broadcast_to, keywords=shown))
        key = broadcast_to
    elif isinstance(broadcast_to, (int, np.integer)):  # a bool too, as in sepes
        count = len(args)
        if not -count <= broadcast_to < count:
            s = "" if count == 1 else "s"
            message = _BCMAP_POSITION_MSG.format(
                given=broadcast_to, position=int(broadcast_to), count=count, s=s
            )
            raise TypeError(message)
        position = int(broadcast_to) % count
    elif broadcast_to is not None:  # a given tree, mapped over even when it is a leaf
        leaves, treedef = _flatten(broadcast_to, is_leaf)
        return _Reference(broadcast_to, "broadcast_to", None, None, leaves, treedef)
    elif args:
        position = 0
    elif kwargs:
        key = next(iter(kwargs))
    else:
        return None
    if position is not None:
        value, name = args[position], f"positional argument {position}"
    else:
        value, name = kwargs[key], f"keyword argument `{key}`"
    if isinstance(value, _LEAF_TYPES):
        return None  # the argument fixing the structure is a leaf: one plain call
    leaves, treedef = _flatten(value, is_leaf)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return None  # a leaf of a custom type, or one `is_leaf` picked
    return _Reference(value, name, position, key, leaves, treedef)


def _broadcast_call(
    func: Callable[..., Any],
    broadcast_to: object,
    is_leaf: Callable[[Any], bool] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    ref = _reference(broadcast_to, args, kwargs, is_leaf)
    if ref is None:
        return func(*args, **kwargs)
    whole: list[tuple[str, Any]] = []  # the other trees, passed whole: (name, treedef)

    def leaves_if_mapped(arg: object, name: str) -> list | None:
        if arg is None or isinstance(arg, _LEAF_TYPES):
            return None
        leaves, treedef = _flatten(arg, is_leaf)
        if treedef == ref.treedef:
            return leaves
        if not (treedef.num_nodes == 1 and treedef.num_leaves == 1):
            whole.append((name, treedef))
        return None

    def mapped(named: Iterable[tuple[Any, Any]], own: object, name: str) -> list[Any]:
        pairs = (
            (k, ref.leaves if k == own else leaves_if_mapped(a, name.format(k))) for k, a in named
        )
        return [(k, leaves) for k, leaves in pairs if leaves is not None]

    mapped_args = mapped(enumerate(args), ref.position, "positional argument {}")
    mapped_kwargs = mapped(kwargs.items(), ref.key, "keyword argument `{}`")
    # one call per leaf of the reference, run in C (`map`/`starmap`) when no keyword is
    # mapped; when one raises, how far the counted iterator got says which leaf it was for
    count = ref.treedef.num_leaves
    if mapped_args:
        columns: list[Any] = [repeat(arg) for arg in args]
        for position, leaves in mapped_args:
            columns[position] = leaves
        counted = columns[mapped_args[0][0]] = iter(mapped_args[0][1])
    else:
        counted = columns = repeat(args, count)  # type: ignore[assignment]
    out: list[Any] = []
    try:
        if mapped_kwargs:
            call_kwargs = dict(kwargs)
            rows = zip(*columns, strict=False) if mapped_args else columns  # repeats
            for index, row in enumerate(rows):
                for key, leaves in mapped_kwargs:
                    call_kwargs[key] = leaves[index]
                out.append(func(*row, **call_kwargs))
        else:
            call = functools.partial(func, **kwargs) if kwargs else func
            out = list(map(call, *columns) if mapped_args else starmap(call, columns))
    except Exception as error:
        index = len(out) if mapped_kwargs else count - operator.length_hint(counted) - 1
        path = leaf_path_str(ref.value, index, is_leaf)
        name = getattr(func, "__name__", None) or type(func).__name__
        add_leaf_note(error, _BCMAP_LEAF_NOTE.format(func=name, path=path))
        for arg, arg_def in whole:
            fields = {"arg": arg, "ref": ref.name, "ref_def": ref.treedef, "arg_def": arg_def}
            add_leaf_note(error, _BCMAP_WHOLE_NOTE.format(**fields))
        raise
    return ref.treedef.unflatten(out)
