"""Small tree utilities: `is_tree_equal`, `Partial`, and the leaf-error note shared by maps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["is_tree_equal", "Partial"]

_Tracer = jax.core.Tracer


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _leaves_equal(a: Any, b: Any) -> Any:
    """`True`/`False`, or a traced boolean scalar when a tracer is involved."""
    if a is b:
        # containers compare members by identity first too ([nan] == [nan] when shared);
        # this is also the fast path for comparing a tree with itself
        return True
    a_array, b_array = _is_array(a), _is_array(b)
    if a_array or b_array:
        if not (a_array and b_array):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if isinstance(a, _Tracer) or isinstance(b, _Tracer):
            return jnp.array_equal(a, b)
        return bool((np.asarray(a) == np.asarray(b)).all())
    if type(a) is not type(b):
        # 1, 1.0 and True are == in Python but behave differently once traced (weak int vs
        # weak float vs bool), like arrays of different dtypes; treating them as equal
        # would also let a tree holding 1 reuse the jit cache entry of one holding 1.0.
        return False
    try:
        result = a == b
    except Exception:
        return False
    if isinstance(result, _Tracer):
        return jnp.all(result)
    try:
        return bool(result)
    except Exception:  # an object whose == returns something without a truth value
        return False


def is_tree_equal(*trees: Any) -> Any:
    """Whether all `trees` have the same structure and equal leaves.

    Two leaves are equal when:

    - both are arrays (NumPy or JAX) of the same shape and dtype with equal values; an
      array never equals a Python scalar;
    - otherwise, both have the same type and compare equal with `==`; so `1`, `1.0` and
      `True` are *different* leaves, just as arrays of different dtypes are.

    A leaf is always equal to itself (the same object), which makes comparing a tree
    with itself cheap and `True` even when it holds NaNs.

    **Arguments**

    - `*trees`: any pytrees; fewer than two trees are trivially equal.

    **Returns**

    A Python `bool`; or, when some leaves are tracers (inside `jax.jit`) and the answer
    depends on their values, a traced boolean scalar.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    assert tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(2)})
    assert not tc.is_tree_equal({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
    assert not tc.is_tree_equal((1,), (1.0,))
    assert jax.jit(tc.is_tree_equal)(jnp.ones(2), jnp.ones(2))
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
        for a, b in zip(first_leaves, leaves, strict=True):
            equal = _leaves_equal(a, b)
            if isinstance(equal, _Tracer):
                traced.append(equal)
            elif not equal:
                return False
    if not traced:
        return True
    if len(traced) == 1:
        return traced[0]
    return jnp.all(jnp.stack(traced))


# -- the note maps attach to an error raised at one leaf --------------------------------


def leaf_path_str(tree: Any, index: int, is_leaf: Callable[[Any], bool] | None = None) -> str:
    """`tree.b[0]`-style name of the `index`-th leaf of `tree` (in `tree_flatten` order)."""
    paths = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
    if not 0 <= index < len(paths):
        return "tree"
    return "tree" + jax.tree_util.keystr(paths[index][0])


def add_leaf_note(error: BaseException, note: str) -> None:
    """Attach `note` to `error` (PEP 678) so that its traceback says where it happened."""
    if hasattr(error, "add_note"):
        error.add_note(note)


# -- Partial ----------------------------------------------------------------------------

_PARTIAL_NOT_CALLABLE_MSG = "Partial(func, ...) needs a callable `func`, got a {type}."
_PARTIAL_MISSING_MSG = (
    "{name} has {holes} placeholder(s) `...` to fill, but was called with only {given} "
    "positional argument(s). Pass one positional argument per `...`:\n"
    "    f = tc.Partial(func, ..., 2)\n"
    "    f(1)  # calls func(1, 2)"
)
_PARTIAL_UNHASHABLE_MSG = (
    "Cannot hash {name}: its argument `{where}` is an unhashable {type}. A Partial is "
    "hashable (and so usable as a `jax.jit` static argument) only when all its arguments "
    "are. Pass arrays as ordinary (traced) arguments instead:\n"
    "    before: jax.jit(f, static_argnums=0)(tc.Partial(g, array), x)\n"
    "    after:  jax.jit(f)(tc.Partial(g, array), x)   # a Partial is a pytree"
)
_PARTIAL_IMMUTABLE_MSG = "Partial is immutable: make a new one instead of setting `{name}`."


class Partial:
    """A partial function application that is hashable, comparable and a pytree.

    Like `functools.partial`, but:

    - it is a pytree: its positional and keyword arguments are its children (so array
      arguments are leaves that `jax.jit`, `jax.grad` and `tree_map` see), while the
      function is static (part of the tree definition);
    - `...` in the positional arguments is a placeholder, filled from the call's
      positional arguments in order; extra call arguments are appended;
    - it compares with `tc.is_tree_equal` semantics and is hashable when its arguments
      are, so it can be a `jax.jit` static argument.

    **Arguments**

    - `func`: the callable to call.
    - `*args`: positional arguments; `...` marks a position filled at call time.
    - `**kwargs`: keyword arguments; keywords given at call time override them.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    sub_from_ten = tc.Partial(jnp.subtract, 10.0, ...)
    assert sub_from_ten(3.0) == 7.0
    scale = tc.Partial(jnp.multiply, jnp.array([1.0, 2.0]))   # the array is a leaf
    assert len(jax.tree_util.tree_leaves(scale)) == 1
    apply = jax.jit(lambda f, x: f(x), static_argnums=0)
    assert apply(tc.Partial(jnp.add, 1.0), 2.0) == 3.0
    ```
    """

    __slots__ = ("func", "args", "_keywords", "_holes", "_hash")

    func: Callable[..., Any]
    args: tuple[Any, ...]

    def __init__(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        if not callable(func):
            raise TypeError(_PARTIAL_NOT_CALLABLE_MSG.format(type=type(func).__name__))
        _set_partial(self, func, args, kwargs)

    @property
    def keywords(self) -> dict[str, Any]:
        """The keyword arguments (a copy: a Partial never changes)."""
        return dict(self._keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        holes = self._holes
        if holes:
            if len(args) < len(holes):
                raise TypeError(
                    _PARTIAL_MISSING_MSG.format(name=repr(self), holes=len(holes), given=len(args))
                )
            filled = list(self.args)
            for position, value in zip(holes, args, strict=False):
                filled[position] = value
            args = (*filled, *args[len(holes):])
        else:
            args = (*self.args, *args)
        keywords = {**self._keywords, **kwargs} if kwargs else self._keywords
        return self.func(*args, **keywords)

    def __eq__(self, other: object) -> Any:
        if self is other:
            return True
        if type(other) is not Partial:
            return NotImplemented
        if self._holes != other._holes or not equal_or_false(self.func, other.func):
            return False
        return is_tree_equal((self.args, self._keywords), (other.args, other._keywords))

    def __hash__(self) -> int:
        cached = self._hash
        if cached is None:
            try:
                cached = hash((self.func, self.args, tuple(sorted(self._keywords.items()))))
            except TypeError:
                self._raise_unhashable()
                raise
            object.__setattr__(self, "_hash", cached)
        return cached

    def _raise_unhashable(self) -> None:
        named = [(f"args[{i}]", a) for i, a in enumerate(self.args)]
        named += [(f"{k}=", v) for k, v in self._keywords.items()]
        for where, value in named:
            try:
                hash(value)
            except TypeError:
                raise TypeError(
                    _PARTIAL_UNHASHABLE_MSG.format(
                        name=repr(self), where=where, type=type(value).__name__
                    )
                ) from None

    def __repr__(self) -> str:
        name = getattr(self.func, "__name__", None) or repr(self.func)
        parts = [name]
        parts += ["..." if a is Ellipsis else repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self._keywords.items()]
        return f"Partial({', '.join(parts)})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(_PARTIAL_IMMUTABLE_MSG.format(name=name))

    def __delattr__(self, name: str) -> None:
        raise AttributeError(_PARTIAL_IMMUTABLE_MSG.format(name=name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_partial, (self.func, self.args, self._keywords))

    def __copy__(self) -> Partial:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Partial:
        import copy

        return _rebuild_partial(
            self.func, copy.deepcopy(self.args, memo), copy.deepcopy(self._keywords, memo)
        )


_set_slot = object.__setattr__


def equal_or_false(a: Any, b: Any) -> bool:
    """`a == b` as a bool; False when `==` has no truth value (arrays, leafwise trees)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def _set_partial(
    partial: Partial, func: Any, args: tuple[Any, ...], keywords: dict[str, Any]
) -> None:
    _set_slot(partial, "func", func)
    _set_slot(partial, "args", tuple(args))
    _set_slot(partial, "_keywords", dict(keywords))
    _set_slot(partial, "_holes", tuple(i for i, a in enumerate(args) if a is Ellipsis))
    _set_slot(partial, "_hash", None)


def _rebuild_partial(func: Any, args: tuple[Any, ...], keywords: dict[str, Any]) -> Partial:
    partial = object.__new__(Partial)
    _set_partial(partial, func, args, keywords)
    return partial


_ARGS_KEY = jax.tree_util.GetAttrKey("args")
_KEYWORDS_KEY = jax.tree_util.GetAttrKey("keywords")


def _partial_children(partial: Partial) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = partial.args
    if partial._holes:
        # `...` would be a leaf (and not a valid jit argument); it lives in the treedef
        args = tuple(None if a is Ellipsis else a for a in args)
    return args, partial._keywords


def _flatten_partial(partial: Partial) -> tuple[Any, Any]:
    return _partial_children(partial), (partial.func, partial._holes)


def _flatten_partial_with_keys(partial: Partial) -> tuple[Any, Any]:
    args, keywords = _partial_children(partial)
    return ((_ARGS_KEY, args), (_KEYWORDS_KEY, keywords)), (partial.func, partial._holes)


def _unflatten_partial(aux: tuple[Any, tuple[int, ...]], children: Any) -> Partial:
    func, holes = aux
    args, keywords = children
    if holes:
        args = list(args)
        for position in holes:
            args[position] = Ellipsis
    return _rebuild_partial(func, tuple(args), keywords)


jax.tree_util.register_pytree_with_keys(
    Partial, _flatten_partial_with_keys, _unflatten_partial, _flatten_partial
)
