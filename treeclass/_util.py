"""Small tree utilities: `is_tree_equal`, `Partial`, and the leaf-error note shared by maps."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer as _Tracer

from ._numbers import PYTHON_NUMBERS
from ._structure import describe
from ._values import (
    exact_key,
    local_copy,
    path_str,
    readable_here,
    register_childless,
    root_name,
    sharding_spec,
)

_R = TypeVar("_R")

# `isinstance(x, jax.Array)` costs about 1 us (an ABC check): a type's kind is cached

_OTHER, _NUMBER, _NUMPY, _JAX = 0, 1, 2, 3


@functools.lru_cache(maxsize=512)
def _kind_of_type(cls: type) -> int:
    if issubclass(cls, jax.Array):  # also tracers
        return _JAX
    if issubclass(cls, (np.ndarray, np.generic)):  # before numbers: np.float64 is a float
        return _NUMPY
    if issubclass(cls, PYTHON_NUMBERS):
        return _NUMBER
    return _OTHER


def _truth(result: object) -> Any:
    """`result` of an `==` as a bool, a traced bool, or False when it has no truth value."""
    if isinstance(result, _Tracer):
        return jnp.all(result)
    try:
        return bool(result)
    except Exception:  # an object whose == returns something without a truth value
        return False


UNREADABLE_LEAF_MSG = (
    "Cannot compare the leaf at {where}: it is a jax.Array placed on devices of several "
    "processes ({sharding}), and JAX reads an array on one process alone only when that "
    "process holds it whole on its own devices or it is replicated everywhere. `==` and "
    "`tc.is_tree_equal` answer with a plain bool on each process, so compare under "
    "`jax.jit` instead, on every process, which gives a bool every process can read:\n"
    "    before: tc.is_tree_equal(a, b)   # or a == b\n"
    "    after:  bool(jax.jit(tc.is_tree_equal)(a, b))"
)


class _UnreadableLeaf(Exception):
    """A jax.Array (`args[0]`) JAX does not read on this process alone; `is_tree_equal`
    names its path."""


def _local(x: object) -> Any:
    """`local_copy(x)`, or `_UnreadableLeaf` (JAX's own error would not name the leaf)."""
    if not readable_here(x):
        raise _UnreadableLeaf(x)
    return local_copy(x)


def _arrays_equal(a: Any, b: Any) -> Any:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
        # typed PRNG keys have no NumPy form: keys of one dtype are equal by their key data
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    if isinstance(a, _Tracer) or isinstance(b, _Tracer):
        return jnp.array_equal(a, b)
    return bool(np.array_equal(np.asarray(_local(a)), np.asarray(_local(b))))


def _array_equals_number(array: Any, number: object, kind: int) -> Any:
    # a number stands for an array filled with it (as `.at[...].set(number)` fills one)
    if array.size == 0:
        return False
    if not isinstance(array, _Tracer):
        array = _local(array)
    try:
        if kind == _JAX:
            # rounds `number` to the array's dtype, as `jax.jit` does to a Python number leaf
            return _truth(jnp.all(array == number) if array.shape else array == number)
        # NumPy values are compared exactly: `np.float32(0.1)` is not `0.1`, which keeps
        # equality consistent with NumPy scalars' hash (that of the exact Python value)
        if not array.shape:
            return _truth(array.item() == number)
        return all(value == number for value in array.ravel().tolist())
    except (OverflowError, TypeError, ValueError):  # e.g. 2**40 against an int32 array
        return False


def _leaves_equal(a: object, b: object) -> Any:
    """`True`/`False`, or a traced boolean scalar when a tracer is involved."""
    if a is b:
        # as containers compare members ([nan] == [nan] when shared); also a tree with itself
        return True
    # mypy: a class is not Hashable
    a_kind, b_kind = _kind_of_type(type(a)), _kind_of_type(type(b))  # type: ignore[arg-type]
    if a_kind < _NUMPY and b_kind < _NUMPY:  # neither is an array: Python's ==
        return _python_equal(a, b)
    if a_kind >= _NUMPY and b_kind >= _NUMPY:
        return _arrays_equal(a, b)
    if a_kind == _NUMBER:
        return _array_equals_number(b, a, b_kind)
    if b_kind == _NUMBER:
        return _array_equals_number(a, b, a_kind)
    if isinstance(a, np.generic) or isinstance(b, np.generic):  # np.str_("a") == "a"
        return _python_equal(a, b)
    return False  # an array and a non-numeric value


def _python_equal(a: object, b: object) -> Any:
    try:
        return _truth(a == b)
    except Exception:  # an `==` that raises
        return False


def equal_or_false(a: object, b: object) -> bool:
    """`a == b` as a bool; False when `==` raises, has no truth value or is traced."""
    return a is b or _python_equal(a, b) is True


def is_tree_equal(*trees: object) -> Any:
    """Whether all `trees` have the same structure and equal leaves.

    Leaves compare by value, as in PyTreeClass, so a tree equals itself after `jax.jit`:
    arrays by shape, dtype and values; a number and an array when every element (one at
    least) equals it (rounded to a JAX array's dtype first; exactly for NumPy); other
    leaves by `==` (one that raises or has no truth value differs). Static values (static
    fields, frozen values, `Partial`) are part of the structure, compared strictly (`1`,
    `1.0` and `True` differ). A leaf always equals itself, even a NaN.

    **Arguments**

    - `*trees`: any pytrees; fewer than two trees are trivially equal.

    **Returns**

    A Python `bool`; or, when some leaves are tracers (inside `jax.jit`) and the answer
    depends on their values, a traced boolean scalar.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    assert not tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
    assert tc.is_tree_equal((0, 1.5), jax.jit(lambda t: t)((0, 1.5)))   # Array(0) is 0
    ```
    """
    if len(trees) < 2:
        return True
    first = trees[0]
    first_leaves, first_def = jax.tree_util.tree_flatten(first)
    traced: list[Any] = []
    for other in trees[1:]:
        if other is first:
            continue
        leaves, treedef = jax.tree_util.tree_flatten(other)
        if treedef != first_def:
            return False
        for index, (a, b) in enumerate(zip(first_leaves, leaves, strict=True)):
            try:
                equal = _leaves_equal(a, b)
            except _UnreadableLeaf as error:
                where, spec = leaf_path_str(first, index), sharding_spec(error.args[0])
                message = UNREADABLE_LEAF_MSG.format(where=where, sharding=f"sharding {spec}")
                raise ValueError(message) from None
            if equal is True:
                continue
            if isinstance(equal, _Tracer):
                traced.append(equal)
            elif not equal:
                return False
    if not traced:
        return True
    if len(traced) == 1:
        return traced[0]
    return jnp.all(jnp.stack(traced))


def leaf_path_str(tree: object, index: int, is_leaf: Callable[[Any], bool] | None = None) -> str:
    """`MLP.b[0]`-style name of the `index`-th leaf of `tree` (in `tree_flatten` order)."""
    paths = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
    if not 0 <= index < len(paths):
        return root_name(tree)
    return path_str(tree, paths[index][0])


_NOT_CALLABLE_MSG = "`{where}` expects a callable `{arg}`{what}, got {value}."


def check_callable(
    value: object, where: str, arg: str, what: str = "", optional: bool = False
) -> None:
    """Raise a `TypeError` naming the function and argument when `value` is not callable."""
    if not (optional and value is None) and not callable(value):
        what += " (or None)" if optional else ""
        message = _NOT_CALLABLE_MSG.format(where=where, arg=arg, what=what, value=describe(value))
        raise TypeError(message)


def add_leaf_note(error: BaseException, note: str) -> None:
    """Attach `note` to `error` (PEP 678) so that its traceback says where it happened."""
    if sys.version_info >= (3, 11):
        error.add_note(note)


_PARTIAL_MISSING_MSG = (
    "{name} has {holes} placeholder(s) `...` to fill, but was called with only {given} "
    "positional argument(s). Pass one positional argument per `...`:\n"
    "    f = tc.Partial(func, ..., 2)\n"
    "    f(1)  # calls func(1, 2)"
)
_PARTIAL_IMMUTABLE_MSG = "Partial is immutable: make a new one instead of setting `{name}`."


class Partial(Generic[_R]):
    """A partial function application that is hashable, comparable and has no pytree leaves.

    Like `functools.partial`, but `...` in the positional arguments is a placeholder,
    filled from the call's positional arguments in order (extra ones are appended); and
    it is a pytree *without leaves*: its function and arguments are static, so `jax.jit`
    compiles once per distinct `Partial` (pass what changes per call as call arguments).
    Two are equal when their functions are equal and their arguments are the same static
    values (`1`, `1.0` and `True` differ; arrays by value; tracers by identity).

    **Arguments**

    - `func`: the callable to call.
    - `*args`: positional arguments; `...` marks a position filled at call time.
    - `**kwargs`: keyword arguments; keywords given at call time override them.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    sub_from_ten = tc.Partial(jnp.subtract, 10.0, ...)
    assert sub_from_ten(3.0) == 7.0 and jax.tree_util.tree_leaves(sub_from_ten) == []
    ```
    """

    __slots__ = ("func", "args", "_keywords", "_holes", "_hash", "_key", "__weakref__")

    func: Callable[..., _R]
    args: tuple[Any, ...]
    _keywords: dict[str, Any]
    _holes: tuple[int, ...]  # the positions of `...` in `args`
    _hash: int | None  # computed on first use: `jax.jit` hashes it on every call
    _key: Any  # the exact key of (func, args, keywords), computed on first use

    def __init__(self, func: Callable[..., _R], /, *args: Any, **kwargs: Any) -> None:
        check_callable(func, "Partial", "func")
        _set_slot(self, "func", func)
        _set_slot(self, "args", args)
        _set_slot(self, "_keywords", kwargs)
        _set_slot(self, "_holes", tuple(i for i, a in enumerate(args) if a is Ellipsis))
        _set_slot(self, "_hash", None)
        _set_slot(self, "_key", None)

    @property
    def keywords(self) -> dict[str, Any]:
        """The keyword arguments (a copy: a Partial never changes)."""
        return dict(self._keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> _R:
        holes = self._holes
        if holes:
            if len(args) < len(holes):
                raise TypeError(
                    _PARTIAL_MISSING_MSG.format(name=repr(self), holes=len(holes), given=len(args))
                )
            filled = list(self.args)
            for position, value in zip(holes, args, strict=False):
                filled[position] = value
            args = (*filled, *args[len(holes) :])
        else:
            args = (*self.args, *args)
        keywords = {**self._keywords, **kwargs} if kwargs else self._keywords
        return self.func(*args, **keywords)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Partial:
            return NotImplemented
        if hash(self) != hash(other):
            return False
        return bool(self._exact_key() == other._exact_key())

    def __hash__(self) -> int:
        cached = self._hash
        if cached is None:
            cached = hash(self._exact_key())
            _set_slot(self, "_hash", cached)
        return cached

    def _exact_key(self) -> Any:
        # the exact key of static fields and frozen values (a fresh `Partial(f, nan)` is the
        # same static), computed on first use, not at construction, which tracing does often
        key = self._key
        if key is None:
            key = exact_key((self.func, self.args, self._keywords))
            _set_slot(self, "_key", key)
        return key

    def __repr__(self) -> str:
        name = getattr(self.func, "__name__", None) or repr(self.func)
        parts = [name]
        parts += ["..." if a is Ellipsis else repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self._keywords.items()]
        return f"Partial({', '.join(parts)})"

    def __setattr__(self, name: str, value: object = None) -> None:
        raise AttributeError(_PARTIAL_IMMUTABLE_MSG.format(name=name))

    __delattr__ = __setattr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_partial, (self.func, self.args, self._keywords))

    def __copy__(self) -> Partial[_R]:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Partial[_R]:
        args, keywords = copy.deepcopy((self.args, self._keywords), memo)
        return Partial(self.func, *args, **keywords)


_set_slot = object.__setattr__


def _rebuild_partial(func: Callable[..., Any], args: tuple, keywords: dict[str, Any]) -> Partial:
    return Partial(func, *args, **keywords)


register_childless(Partial)
