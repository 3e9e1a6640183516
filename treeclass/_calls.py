"""Running code that mutates trees on copies: `tree.at["method"](...)` and `value_and_tree`.

`call_on_copy` makes the one kind of private copy (TreeClass nodes mutable, NumPy leaves
copied, sealed again when the function returns or raises); `.at`'s method call runs
`method_of` the selected node on such a copy, and puts the copy back as `.set` would.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import _node
from ._util import check_callable
from ._values import closest, path_str

_T = TypeVar("_T")
_R = TypeVar("_R")

NOT_CALLABLE_MSG = (
    "{where} is not callable (it is a `{type}`), so `.at[{name!r}](...)` cannot call it. Use "
    "`.at[{name!r}].get()`, `.set(value)` or `.apply(fn)` to read or change it."
)
NO_METHOD_MSG = "{where} has no method {name!r}{hint}"
ARGNUMS_TYPE_MSG = (
    "`value_and_tree` expects `argnums` to be an int or a sequence of ints (the positions of "
    "the arguments whose changed copies it returns), got {value!r}."
)
ARGNUMS_RANGE_MSG = (
    "`value_and_tree({func}, argnums={argnums!r})` returns the changed copy of positional "
    "argument {argnum}, but the call passed {count} positional argument{s}."
)


def call_on_copy(tree: _T, fn: Callable[[_T], _R]) -> tuple[_R, _T]:
    """`(fn(copy), copy)` for a copy of `tree` whose TreeClass nodes may be mutated (sealed
    again when `fn` returns or raises: `fn`'s error is the one reported)."""
    copy = _node.unsealed_copy(tree)
    try:
        value = fn(copy)
    except BaseException:
        with contextlib.suppress(Exception):  # the function's own error is the one to report
            _node.reseal(copy)
        raise
    _node.reseal(copy)
    return value, copy


def method_of(root: object, node: object, path: tuple[Any, ...], name: str) -> Callable[..., Any]:
    """The method `name` of `node` (at `path` in `root`), or an error naming both."""
    where = path_str(root, path)
    try:
        method = getattr(node, name)
    except AttributeError:
        names = [
            n for n in dir(node) if not n.startswith("_") and callable(getattr(type(node), n, None))
        ]
        close = closest(name, names)
        hint = f"; did you mean {close!r}?" if close is not None else "."
        raise AttributeError(NO_METHOD_MSG.format(where=where, name=name, hint=hint)) from None
    if not callable(method):
        raise TypeError(
            NOT_CALLABLE_MSG.format(where=f"{where}.{name}", type=type(method).__name__, name=name)
        )
    return method


def value_and_tree(
    func: Callable[..., Any], argnums: int | Sequence[int] = 0
) -> Callable[..., tuple[Any, Any]]:
    """Run `func` on copies of its arguments that it may mutate: `(value, changed copies)`.

    For code that changes its arguments in place (setting attributes of a `TreeClass`,
    appending to lists, writing into NumPy arrays): the copies' TreeClass nodes may be
    mutated until `func` returns or raises; the inputs never change.

    **Arguments**

    - `func`: the function to run.
    - `argnums`: the position of the argument whose changed copy is returned, or a
      sequence of positions (the copies are then returned as a tuple, in that order);
      negative positions count from the end.

    **Returns**

    A function taking `func`'s arguments and returning `(func's value, copy)`; it raises
    `TypeError` when `argnums` names a position the call did not pass (as `value_and_tree`
    does for a non-callable `func` or an `argnums` that is not int(s)).

    ```python
    import treeclass as tc

    items = [1, 2]
    _, new = tc.value_and_tree(lambda xs: xs.append(3))(items)
    assert new == [1, 2, 3] and items == [1, 2]
    ```
    """
    check_callable(func, "value_and_tree", "func")
    single = isinstance(argnums, int)
    sequence = isinstance(argnums, Sequence) and not isinstance(argnums, str)
    positions: tuple[Any, ...] = tuple(argnums) if sequence else (argnums,)  # type: ignore[arg-type]
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in positions):
        raise TypeError(ARGNUMS_TYPE_MSG.format(value=argnums))

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        count = len(args)
        for argnum in positions:
            if not -count <= argnum < count:
                name, s = getattr(func, "__name__", "func"), "" if count == 1 else "s"
                message = ARGNUMS_RANGE_MSG.format(
                    func=name, argnums=argnums, argnum=argnum, count=count, s=s
                )
                raise TypeError(message)

        def call(copied: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
            # the copy's dict is in flatten (sorted) order; the call keeps the caller's
            return func(*copied[0], **{key: copied[1][key] for key in kwargs})

        value, (args_copy, _) = call_on_copy((args, kwargs), call)
        if single:
            return value, args_copy[positions[0]]
        return value, tuple(args_copy[a] for a in positions)

    return run
