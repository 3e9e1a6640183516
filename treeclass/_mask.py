"""Masking whole trees: `tree_mask` / `tree_unmask` freeze and thaw the leaves a mask picks
(a predicate or a bool mask tree; `is_nondiff` by default). The wrapper is `_frozen`'s."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from . import _structure
from ._frozen import freeze
from ._util import add_leaf_note, check_callable, leaf_path_str
from ._values import is_bool_mask_leaf, is_inexact_array, path_str, short_repr

PyTree = Any
_T = TypeVar("_T")


# -- differentiability ---------------------------------------------------------------------


def is_nondiff(x: object) -> bool:
    """Whether `jax.grad` cannot differentiate `x`: all but inexact scalars and arrays.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    assert not tc.is_nondiff(1.0) and not tc.is_nondiff(jnp.ones(2))
    assert tc.is_nondiff(1) and tc.is_nondiff(jnp.arange(2)) and tc.is_nondiff("relu")
    ```
    """
    if isinstance(x, (float, complex)):
        return False
    if isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return not is_inexact_array(x)
    return True


# -- masking whole trees ---------------------------------------------------------------------

_MASK_DOES_NOT_FIT = (
    "the mask does not fit the tree at `{path}`: {reason}.\n"
    "A mask tree needs the tree's structure with a bool at every leaf; build it from the "
    "tree itself, e.g.\n"
    "    mask = jax.tree_util.tree_map(lambda x: ..., tree)"
)
_MASK_LEAF_NOT_BOOL = (
    "the mask has {value} at `{path}`, expected True or False (a bool scalar): a leaf is "
    "frozen whole or not at all."
)
_MASK_NOT_A_MASK = (
    "the mask (or `cond`) must be a predicate, a function of a leaf returning a bool, or a "
    "mask tree: the tree's structure with True or False at every leaf; got {value}."
)
_MASK_AND_COND_MSG = (
    "`{name}` takes the mask (or predicate) as `mask=` (PyTreeClass) or `cond=` (sepes), not both."
)
_RULE_UNMASKED_MSG = (
    "The mask rule for `{kind}` (`{rule}`, registered with `tc.tree_mask.def_type`) returned "
    "{result} for the leaf at {where}, which is not masked: `jax.grad`, "
    "optax and `tc.tree_unmask` would see it as an ordinary value. A mask rule returns a "
    "frozen value (`tc.freeze(value)`) or an instance of a wrapper type registered with "
    "`tc.tree_unmask.def_type(Wrapper)(unwrap)`."
)


class MaskLeafError(TypeError, ValueError):
    """A mask (or `cond`) that is not one: a `TypeError` as in sepes, a `ValueError` as in
    PyTreeClass."""


def _is_predicate(cond: object) -> bool:
    # A TreeClass layer may define __call__, yet as `cond` it is a mask tree
    return callable(cond) and _structure.row_of(cond).kind != _structure.TREECLASS


def _mask_leaves(
    tree: object, mask: object, is_leaf: Callable[[Any], bool] | None, frozen_may_be_leaves: bool
) -> tuple[list, list, Any, Callable[[Any], bool] | None]:
    """Leaves of `tree` (split with `is_leaf`), the mask's bools (a frozen value in the
    mask: `False`), the structure and the `is_leaf` the mask fitted with; or a ValueError."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    flags, mask_def = jax.tree_util.tree_flatten(mask, is_leaf=_structure.is_wrapper)
    # the mask's leaves first: a non-bool is the wrong kind of argument, whatever its shape
    for i, flag in enumerate(flags):
        if _structure.is_wrapper(flag):
            flags[i] = False
        elif not is_bool_mask_leaf(flag):
            if mask_def.num_nodes == 1:  # not a tree at all: `cond=1.0`
                raise MaskLeafError(_MASK_NOT_A_MASK.format(value=short_repr(flag)))
            pairs = jax.tree_util.tree_flatten_with_path(mask, is_leaf=_structure.is_wrapper)[0]
            where = path_str(tree, pairs[i][0])
            raise MaskLeafError(_MASK_LEAF_NOT_BOOL.format(value=short_repr(flag), path=where))
    split = is_leaf
    if mask_def != treedef and frozen_may_be_leaves:
        # a mask made from the tree with its frozen values as leaves fits too
        split = _frozen_or(is_leaf)
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=split)
    if mask_def != treedef:
        found = _structure.first_mismatch(tree, mask, is_leaf=split)
        path: tuple[object, ...] = ()
        reason = "the structures differ"
        if found is not None:
            path, reason = found.path, found.explain("mask")
        raise ValueError(_MASK_DOES_NOT_FIT.format(path=path_str(tree, path), reason=reason))
    return leaves, flags, treedef, split


_UNSET: Any = object()


def _one_condition(name: str, mask: object, cond: object, default: object) -> Any:
    if mask is not _UNSET and cond is not _UNSET:
        raise TypeError(_MASK_AND_COND_MSG.format(name=name))
    if mask is not _UNSET:
        return mask
    return default if cond is _UNSET else cond


def _ask(
    cond: Callable[[Any], Any], tree: object, is_leaf: Callable[[Any], bool] | None, what: str
) -> tuple[list, list, Any, Callable[[Any], bool] | None]:
    """`_mask_leaves` for a predicate: an error it raises gets a note naming the leaf's path."""
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_leaf)
    flags: list[bool] = []
    try:
        for leaf in leaves:
            flags.append(bool(cond(leaf)))
    except Exception as error:
        add_leaf_note(error, f"raised by the {what} at {leaf_path_str(tree, len(flags), is_leaf)}")
        raise
    return leaves, flags, treedef, is_leaf


def tree_mask(
    tree: _T,
    mask: Callable[[Any], bool] | PyTree = _UNSET,
    *,
    cond: Callable[[Any], bool] | PyTree = _UNSET,
    is_leaf: Callable[[Any], bool] | None = None,
) -> _T:
    """Freeze the leaves of `tree` where the mask holds; the input is not changed.

    **Arguments**

    - `tree`: any pytree; leaves already frozen stay frozen.
    - `mask` (PyTreeClass's name) or `cond` (sepes's name), one of the two: a predicate
      called on every leaf, or a mask tree: `tree`'s structure with a bool at every leaf
      (the leaves to freeze are True). Default `is_nondiff`: freeze all that `jax.grad`
      cannot differentiate.
    - `is_leaf`: as in `jax.tree_util.tree_map`, to freeze whole subtrees.

    `tc.tree_mask.def_type(T)(fn)` masks values of type `T` as `fn(value)` instead (the
    masking guide, "Your own wrapper").

    **Returns**

    A new tree, `tree` with the chosen leaves frozen.

    **Raises**

    `ValueError` naming the key path where a mask tree does not fit `tree`; a
    `MaskLeafError` (both a `TypeError` and a `ValueError`) when the mask is neither a
    predicate nor holds bools (`cond=1.0`); a `TypeError` naming the rule and the leaf
    when a `def_type` rule returns an unmasked value; an error raised by the predicate
    gets a note naming the leaf.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(3), "act": "relu", "n": 2}
    masked = tc.tree_mask(model)                      # freezes "act" and "n"
    grads = jax.grad(lambda m: (tc.tree_unmask(m)["w"] ** 2).sum())(masked)
    assert tc.is_frozen(grads["act"]) and grads["w"].shape == (3,)
    ```
    """
    cond = _one_condition("tree_mask", mask, cond, is_nondiff)
    check_callable(is_leaf, "tree_mask", "is_leaf", optional=True)
    if _is_predicate(cond):
        leaves, flags, treedef, split = _ask(cond, tree, is_leaf, "mask predicate")
    else:
        leaves, flags, treedef, split = _mask_leaves(tree, cond, is_leaf, frozen_may_be_leaves=True)
    out = [
        _mask_value(x, functools.partial(leaf_path_str, tree, index, split)) if flag else x
        for index, (x, flag) in enumerate(zip(leaves, flags))
    ]
    return treedef.unflatten(out)


def tree_unmask(
    tree: _T,
    mask: Callable[[Any], bool] | PyTree = _UNSET,
    *,
    cond: Callable[[Any], bool] | PyTree = _UNSET,
) -> _T:
    """Unfreeze the frozen leaves of `tree` where the mask holds (all by default: also
    values a class froze on purpose; pass `tree_mask`'s mask tree to undo only that).

    **Arguments**

    - `tree`: any pytree.
    - `mask` or `cond`, one of the two: a predicate called with the *unfrozen* value of
      every frozen leaf, or a mask tree with a bool at every leaf of `tree`, counting
      frozen values as leaves (so the mask given to `tree_mask` fits). Wrappers of
      types registered with `tc.tree_unmask.def_type(W)(unwrap)` count as frozen values
      (see `is_masked`) and are unwrapped with `unwrap`.

    **Returns**

    A new tree; the input is not changed.

    **Raises**

    `ValueError` naming the key path where a mask tree does not fit `tree`.

    ```python
    import treeclass as tc

    masked = tc.tree_mask({"a": 1, "b": "x", "c": 2.0})
    assert tc.tree_unmask(masked) == {"a": 1, "b": "x", "c": 2.0}
    only_ints = tc.tree_unmask(masked, cond=lambda v: isinstance(v, int))
    assert only_ints["a"] == 1 and tc.is_frozen(only_ints["b"])
    ```
    """
    cond = _one_condition("tree_unmask", mask, cond, lambda _: True)
    if _is_predicate(cond):

        def asked(x: object) -> bool:  # the value inside each masked leaf only
            return is_masked(x) and bool(cond(_structure.unwrap(x)))

        leaves, flags, treedef, _ = _ask(asked, tree, is_masked, "unmask predicate")
    else:
        leaves, flags, treedef, _ = _mask_leaves(tree, cond, is_masked, frozen_may_be_leaves=False)
    return treedef.unflatten([_structure.unwrap(x) if f else x for x, f in zip(leaves, flags)])


def _mask_value(x: object, where: Callable[[], str]) -> Any:
    """`x` masked: by the mask part of its row, found along the MRO (`tree_mask.def_type`
    writes it), else frozen; a rule's result that is not masked is an error naming `where()`."""
    rule = _structure.inherited(type(x), "mask")
    if rule is None:
        return freeze(x)
    result = rule(x)
    if not is_masked(result):  # it would reach `jax.grad` and optax as if never masked
        rows = ((k, _structure.registered_kind(k)) for k in type(x).__mro__)
        kind = next(k for k, row in rows if row is not None and row.mask is rule)
        raise TypeError(
            _RULE_UNMASKED_MSG.format(
                kind=kind.__name__,
                rule=getattr(rule, "__qualname__", None) or repr(rule),
                where=where(),
                result=_structure.describe(result),
            )
        )
    return result


def _def_type(
    name: str,
    write: Callable[[type, Callable[[Any], Any]], None],
    kind: type,
    fn: Callable[[Any], Any] | None = None,
) -> Any:
    if not isinstance(kind, type):
        raise TypeError(f"`{name}.def_type` expects a type, got {_structure.describe(kind)}.")

    def register(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        check_callable(fn, f"{name}.def_type({kind.__name__})", "fn")
        write(kind, fn)
        return fn

    return register if fn is None else register(fn)


def _write_wrapper(kind: type, unwrap: Callable[[Any], Any]) -> None:
    """`tree_unmask.def_type(W)(unwrap)`: `W`'s wrapper part, shown and counted as masked."""
    part = _structure.Wrapper("#", unwrap, f"a masked `{kind.__name__}`", "frozen", kind.__name__)
    _structure.write_part(kind, "wrapper", part)


def is_masked(x: object) -> bool:
    """Whether `tree_unmask` would unwrap `x`: a frozen value, a `tree_unmask.def_type`
    wrapper, any kind whose row has a wrapper part (`is_frozen`: `freeze`'s own only).

    ```python
    import treeclass as tc

    assert tc.is_masked(tc.freeze(1)) and not tc.is_masked(1)
    assert tc.is_masked(tc.tree_mask({"n": 1})["n"])
    ```
    """
    return _structure.is_wrapper(x)


# sepes's extension points, kept on the functions as there: `tc.tree_mask.def_type(T)(fn)`
tree_mask.def_type = functools.partial(  # type: ignore[attr-defined]
    _def_type, "tree_mask", lambda kind, fn: _structure.write_part(kind, "mask", fn)
)
tree_unmask.def_type = functools.partial(_def_type, "tree_unmask", _write_wrapper)  # type: ignore[attr-defined]


def _frozen_or(is_leaf: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    if is_leaf is None:
        return _structure.is_wrapper
    return lambda x: _structure.is_wrapper(x) or is_leaf(x)
