"""optax integration: per-leaf optimizers from `.at` selections.

`trainable(transform, model)` is the one call a training loop needs: an optax
transformation that updates exactly the trainable leaves (`tc.roles`: inexact arrays that
are neither frozen nor state), or exactly a selection, and leaves every other leaf
bit-identical, with no optimizer state for it.

Three ways to give leaves different treatment, from lightest to most explicit:

- `mask(selection)`: a boolean tree, `True` exactly at the selected leaves, for
  `optax.masked`, `optax.adamw(mask=...)`, `optax.freeze`, `optax.selective_transform`;
- `labels(tree, {label: selection}, default=...)`: labels for `optax.multi_transform` /
  `optax.partition`; `partition(transforms, tree, {label: selection})` builds the
  optimizer in one call;
- `tc.freeze` (or `tc.tree_mask`) on the tree itself: frozen leaves are pytree nodes
  without children, so `opt.init` and `opt.update` never see them. This needs nothing
  from this module.

`trainable` composes with all three: the transformation it wraps sees only the leaves it
updates. `scale_blocks(factors)` scales updates by a factor per leaf, or per block along
the block axis of a stacked leaf (`tc.Stacked`): freeze the first blocks, a learning rate
per block.

`check_mask` and `check_labels` say where a mask or label tree and the parameters part
ways, naming the key path, before optax fails with a structure mismatch.

optax is an optional dependency: nothing here imports it, except `partition`, `trainable`
and `scale_blocks`, which do so when called.
"""

from __future__ import annotations

import functools
import numbers
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeGuard, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from jax.tree_util import KeyPath, PyTreeDef
from jax.typing import ArrayLike

from ._at import AtIndexer, at
from ._numbers import is_number, plain_number
from ._roles import TRAINABLE, leaf_roles
from ._structure import (
    describe,
    first_mismatch,
    is_leaf_node,
    is_wrapper,
    path_str,
    root_name,
)
from ._values import is_inexact_array, is_prng_key, local_copy, readable_here

__all__ = [
    "mask",
    "labels",
    "Labels",
    "check_mask",
    "check_labels",
    "partition",
    "trainable",
    "scale_blocks",
    "apply_updates",
]

_T = TypeVar("_T")

_NO_OPTAX_MSG = (
    "`treeclass.optim.{name}` needs optax, which is not installed. Install it with\n"
    "    pip install optax\n"
    "or with the optional extra of treeclass:\n"
    "    pip install 'treeclass[optax]'"
)


def _import_optax(name: str) -> Any:
    try:
        import optax
    except ImportError as error:
        raise ImportError(_NO_OPTAX_MSG.format(name=name)) from error
    return optax


# --------------------------------------------------------------------------------------
# checking that a mask or label tree fits the parameters

_NOT_A_PREFIX_MSG = (
    "The {what} does not fit the parameters at `{path}`: {reason}.\n"
    "A {what} must have the structure of the parameters, or of a prefix of them (a single "
    "value may stand for a whole subtree). Build it from the same tree you hand to optax:\n"
    "    before: m = tc.optim.mask(model.at[...]); model = model.at[...].apply(tc.freeze)\n"
    "    after:  model = model.at[...].apply(tc.freeze); m = tc.optim.mask(model.at[...])"
)
_MASK_LEAF_MSG = (
    "The mask leaf at `{path}` is {found}; mask leaves must be Python or scalar array "
    "booleans (`True`: the leaf is selected). Use `tc.optim.mask(...)` to build a mask."
)
_UNHASHABLE_LABEL_MSG = (
    "The label at `{path}` is {found}, which is not hashable; labels are keys of the "
    "`transforms` mapping of `optax.multi_transform` (strings, usually)."
)
_UNKNOWN_LABEL_MSG = (
    "The label {label!r} at `{path}` has no transform: the transforms are for {known}. "
    "Add a transform for it, or choose another label for these leaves."
)


def _misfit(tree: object, params: object, what: str, params_are: str) -> tuple[str, str] | None:
    """Where `tree` stops being a prefix of `params`: `(key path, reason)`, or `None`.

    A leaf of `tree` stands for the whole subtree of `params` at its place.
    """
    found = first_mismatch(params, tree, other_covers=is_leaf_node)
    if found is None:
        return None
    return path_str(params, found.path), found.explain(what, tree=params_are)


def _check_prefix(
    tree: object, params: object, what: str, check_leaf: Callable[[object, str], None]
) -> None:
    """Raise where `tree` (a mask or label tree) stops being a prefix of `params`."""
    if jax.tree_util.tree_structure(tree) != jax.tree_util.tree_structure(params):
        misfit = _misfit(tree, params, what, "parameters")
        if misfit is not None:
            where, reason = misfit
            raise ValueError(_NOT_A_PREFIX_MSG.format(what=what, path=where, reason=reason))
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        check_leaf(leaf, path_str(params, path))


def _check_mask_leaf(leaf: object, where: str) -> None:
    if isinstance(leaf, (bool, np.bool_)):
        return
    if getattr(leaf, "dtype", None) == np.bool_ and getattr(leaf, "shape", None) == ():
        return
    raise TypeError(_MASK_LEAF_MSG.format(path=where, found=describe(leaf)))


def check_mask(mask: _T, params: object) -> _T:
    """Check that `mask` fits `params` the way optax needs, and return it unchanged.

    optax accepts a mask with the structure of the parameters or of a prefix of them (a
    single boolean standing for a whole subtree), with boolean leaves. When a mask does
    not fit, optax fails deep inside `jax.tree.map`; this names the key path instead.

    **Arguments**

    - `mask`: a tree of booleans, usually from `tc.optim.mask`.
    - `params`: the parameters handed to `opt.init` / `opt.update`.

    **Returns**

    `mask` itself, so that the check can sit inline.

    **Raises**

    `ValueError` when the structures part ways (naming the key path, the node types or
    keys on each side), `TypeError` when a leaf is not a scalar boolean.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    tc.optim.check_mask({"w": True, "b": False}, params)
    try:
        tc.optim.check_mask({"w": True}, params)
    except ValueError as error:
        assert "missing in the mask: ['b']" in str(error)
    ```
    """
    _check_prefix(mask, params, "mask", _check_mask_leaf)
    return mask


def check_labels(labels: _T, params: object, transforms: Iterable[Hashable] | None = None) -> _T:
    """Check that a label tree fits `params` (and `transforms`), and return it unchanged.

    **Arguments**

    - `labels`: a label tree (a `Labels` from `tc.optim.labels`, or a plain tree of
      labels with the structure of the parameters or of a prefix of them).
    - `params`: the parameters handed to `opt.init` / `opt.update`.
    - `transforms`: optionally, the transforms mapping of `optax.multi_transform` (or its
      keys); every label must be one of them.

    **Returns**

    `labels` itself.

    **Raises**

    `ValueError` naming the key path where the structures part ways, or where a label has
    no transform; `TypeError` for an unhashable label.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    tc.optim.check_labels({"w": "adam", "b": "sgd"}, params, {"adam": None, "sgd": None})
    ```
    """
    tree = labels.tree if isinstance(labels, Labels) else labels
    known = None if transforms is None else list(transforms)

    def check_leaf(leaf: object, where: str) -> None:
        try:
            hash(leaf)
        except TypeError:
            raise TypeError(
                _UNHASHABLE_LABEL_MSG.format(path=where, found=describe(leaf))
            ) from None
        if known is not None and leaf not in known:
            raise ValueError(_UNKNOWN_LABEL_MSG.format(label=leaf, path=where, known=known))

    _check_prefix(tree, params, "label tree", check_leaf)
    return labels


# --------------------------------------------------------------------------------------
# masks from selections


_PARTIAL_LEAF_MSG = (
    "The selection picks part of the leaf at {where} (some blocks of a stacked leaf, or "
    "some elements by an element mask), but an optax mask or label says yes or no per "
    "whole leaf. Select all of it or none of it. For settings per block (freeze blocks "
    "0-5, a learning rate per block), build factors on a tree of numbers instead:\n"
    "    factors = model.at[...].set(1.0).at['blocks'][0:6].set(0.0)\n"
    "    opt = optax.chain(optax.adam(1e-3), tc.optim.scale_blocks(factors))"
)
_PARTIAL_SELECTION_MSG = (
    "The boolean array at `{where}` in the selection picks some elements of its leaf, but "
    "an optax mask says yes or no per whole leaf. Select whole leaves, e.g. with a mask "
    "tree whose leaves are booleans:\n"
    "    before: model.at[jax.tree.map(lambda x: x > 0, model)]\n"
    "    after:  model.at[jax.tree.map(lambda x: bool((x > 0).all()), model)]"
)
_NOT_AN_INDEXER_MSG = (
    "`tc.optim.mask` takes an `.at` selection, e.g. `tc.optim.mask(model.at[Linear]"
    "['weight'])`, or a tree followed by selectors, e.g. `tc.optim.mask(model, Linear, "
    "'weight')`; got a tree of type {type} and no selectors, which selects every leaf. "
    "Pass `...` to mean that: `tc.optim.mask(tree, ...)`."
)


def _whole_leaf_flag(path: KeyPath, x: object) -> object:
    if not _is_bool_array(x):
        return x
    traced = isinstance(x, Tracer)
    if traced or (not x.all() and x.any()):
        where = "mask" + jax.tree_util.keystr(path) + (" (traced)" if traced else "")
        raise ValueError(_PARTIAL_SELECTION_MSG.format(where=where))
    return bool(x.all())


def _whole_flag(tree: object, path: KeyPath, flag: ArrayLike) -> bool:
    """A flag of a selection's `mask()` as one flag for its whole leaf (or an error)."""
    if flag is True or flag is False:
        return flag
    if isinstance(flag, Tracer) or not bool(np.all(flag)) and bool(np.any(flag)):
        raise ValueError(_PARTIAL_LEAF_MSG.format(where=path_str(tree, path)))
    return bool(np.all(flag))


def _whole_leaf_selector(selector: object) -> object:
    """`selector`, with the leaves of a mask selector made whole-leaf Python bools.

    An array leaf in a mask selects elements (`jnp.where` semantics); for an optax mask it
    must select all of its leaf or none of it.
    """
    leaves = jax.tree_util.tree_leaves(selector, is_leaf=is_wrapper)
    if not any(is_wrapper(x) or _is_bool_array(x) for x in leaves):
        return selector
    # a frozen value in a mask (as `mask` returns them) is never selected; as `False` it
    # fits the tree when frozen values are taken as leaves, as `mask` takes them
    return jax.tree_util.tree_map_with_path(
        lambda path, x: False if is_wrapper(x) else _whole_leaf_flag(path, x),
        selector,
        is_leaf=is_wrapper,
    )


def _is_bool_array(x: object) -> TypeGuard[jax.Array | np.ndarray]:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == np.bool_


def _indexer(selection: object, where: tuple[object, ...]) -> AtIndexer:
    if isinstance(selection, AtIndexer):
        tree, chain = selection.tree, (*selection.where, *where)
    elif where:
        tree, chain = selection, where
    else:
        raise TypeError(_NOT_AN_INDEXER_MSG.format(type=type(selection).__name__))
    indexer = at(tree)
    for selector in chain:
        indexer = indexer[_whole_leaf_selector(selector)]
    return indexer


_EMPTY_SELECTION_MSG = (
    "{what} selects no leaf{why}: an optimizer setting built from it would change nothing "
    "(a typo in a selector, say, turns weight decay off without a word). Check the "
    "selection; if an empty selection is what you mean, pass `strict=False`."
)


def _check_strict(strict: object, where: str) -> None:
    if not isinstance(strict, bool):
        raise TypeError(
            f"`tc.optim.{where}` takes `strict` as a bool, got {strict!r} of type "
            f"{type(strict).__name__}."
        )


def _empty_selection_error(what: str, reached_frozen: bool) -> ValueError:
    why = " (frozen values are not leaves: optax never sees them)" if reached_frozen else ""
    return ValueError(_EMPTY_SELECTION_MSG.format(what=what, why=why))


# Typed as the selected tree: a mask has its structure (the class of every node), with
# `bool` leaves.
@overload
def mask(selection: AtIndexer[_T], *where: object, strict: bool = True) -> _T: ...
@overload
def mask(selection: _T, where: object, /, *more: object, strict: bool = True) -> _T: ...
def mask(selection: object, *where: object, strict: bool = True) -> object:
    """A boolean tree, `True` exactly at the leaves a selection picks.

    The result has the structure of the selected tree (same node types), with `False`
    in place of each frozen value (a mask leaf stands for the subtree at its place), so
    optax accepts it wherever it takes a mask, with or without `tc.optim.trainable`
    around the transform that takes it: `optax.masked`,
    `optax.adamw(mask=...)` (and every optimizer with a `mask`/`weight_decay_mask`),
    `optax.freeze`, `optax.selective_transform(freeze_mask=...)`. Its leaves are plain
    `bool`s, so it is safe when the model class defines `__call__`: `optax.masked` tells a
    mask function from a mask tree by its leaves (since the fix of optax issue #913),
    which are never callable here. (For `optax.multi_transform`, which calls any callable
    it gets, use `labels`.)

    Frozen values (`tc.freeze`) are not leaves, so a mask never selects them (`False`). A selection
    that selects no leaf at all (a mask or predicate selecting nothing, or only frozen
    values) is an error unless `strict=False`: an optimizer setting built from it would
    silently change nothing.

    **Arguments**

    - `selection`: an `.at` selection such as `model.at[Linear]["weight"]` or
      `tc.at(tree)["layers"][0]`; or a tree, followed by selectors.
    - `*where`: selectors applied one level after another, as `.at[a][b]` would:
      `mask(model, Linear, "weight")` is `mask(model.at[Linear]["weight"])`.
    - `strict`: whether selecting no leaf is an error (the default).

    **Returns**

    A tree of `bool` with the structure of the tree the selection was made on.

    **Raises**

    What `.at` raises for a selector that does not fit the tree (a missing key, a glob
    matching nothing); `ValueError` for a boolean array selector that picks only some
    elements of a leaf, and for an empty selection when `strict`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    assert tc.optim.mask(tc.at(params)["w"]) == {"w": True, "b": False}
    assert tc.optim.mask(params, "b") == {"w": False, "b": True}
    ```
    """
    _check_strict(strict, "mask")
    indexer = _indexer(selection, where)
    # the selection's own mask, with frozen values as leaves (so that a selection reaching
    # only frozen values is told apart from one reaching nothing); a frozen value's place
    # then holds `False`: a mask leaf stands for the whole subtree at its place, so the
    # mask fits the model (where a frozen value is a node without children) and the tree
    # `tc.optim.trainable` hands its transform (where it is `MaskedNode()`)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(indexer.tree, is_leaf=is_wrapper)
    flags = treedef.flatten_up_to(indexer.mask(is_leaf=is_wrapper))
    result = treedef.unflatten(
        [
            False if is_wrapper(leaf) else _whole_flag(indexer.tree, path, flag)
            for (path, leaf), flag in zip(pairs, flags, strict=True)
        ]
    )
    if strict and not any(x is True for x in jax.tree_util.tree_leaves(result)):
        reached_frozen = any(
            is_wrapper(leaf) and flag is True for (_, leaf), flag in zip(pairs, flags, strict=True)
        )
        raise _empty_selection_error(f"The selection {indexer!r}", reached_frozen)
    return result


# --------------------------------------------------------------------------------------
# labels for optax.multi_transform

_OVERLAP_MSG = (
    "Selections overlap: {count} leaf(s) are claimed by more than one label, but each leaf "
    "gets one transform:\n{claims}\nNarrow the selections so that each leaf is claimed "
    "once (a leaf no selection claims gets the default label)."
)
_UNCLAIMED_MSG = (
    "With `default=None` every leaf must be claimed by a selection, but {count} leaf(s) "
    "are not:\n{paths}\nAdd a selection for them, or pass a `default` label."
)
_SELECTION_TREE_MSG = (
    "The selection for label {label!r} was made on another tree than the one labelled "
    "(their structures differ). Select on the same tree:\n"
    "    tc.optim.labels(model, {{{label!r}: model.at[...]}})\n{detail}"
)
_PLACEHOLDER_TYPE = "_ParamsPlaceholder"


class Labels(Generic[_T]):
    """A label tree for `optax.multi_transform` / `optax.partition`, as a label function.

    optax calls any callable it is given as labels, and a label tree whose root is a
    model class with `__call__` is callable; so labels reach optax wrapped in this
    function, which returns the tree (after checking that it fits the parameters, so a
    mismatch names its key path). The tree itself is `.tree`. A label function may
    return a `Labels` too (`lambda p: tc.optim.labels(p, ...)`): it is a pytree whose
    leaves are its labels, and mapping over it gives the mapped tree (`jax.tree.map(f,
    labels)` is `jax.tree.map(f, labels.tree)`). Frozen values hold the first label
    there (`fitted()`): a leaf that stands for a node without children.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    labels = tc.optim.Labels({"w": "adam", "b": "sgd"})
    assert labels({"w": jnp.ones(2), "b": jnp.ones(2)}) == {"w": "adam", "b": "sgd"}
    ```
    """

    __slots__ = ("tree",)

    tree: _T

    def __init__(self, tree: _T) -> None:
        self.tree = tree

    def __call__(self, params: object) -> _T:
        tree = self.fitted()
        # `optax.tree_utils.tree_map_params` initialises with a stand-in object instead
        # of the parameters; it only needs the tree back
        if type(params).__name__ != _PLACEHOLDER_TYPE:
            check_labels(tree, params)
        return tree

    def fitted(self) -> _T:
        """The label tree as optax takes it: a label in place of each frozen value.

        A frozen value stands where the parameters hold a node without children (the
        frozen value itself, or `optax.MaskedNode()` inside `tc.optim.trainable`): a label
        leaf fits both, and no array is there for its transform to see.
        """
        tree = self.tree
        leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_wrapper)
        if not any(is_wrapper(x) for x in leaves):
            return tree
        label = next((x for x in leaves if not is_wrapper(x)), None)
        return jax.tree_util.tree_map(
            lambda x: label if is_wrapper(x) else x, tree, is_leaf=is_wrapper
        )

    def __repr__(self) -> str:
        return f"Labels({self.tree!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Labels):
            return NotImplemented
        return jax.tree_util.tree_structure(self.tree) == jax.tree_util.tree_structure(
            other.tree
        ) and jax.tree_util.tree_leaves(self.tree) == jax.tree_util.tree_leaves(other.tree)

    __hash__ = None  # type: ignore[assignment]


# A `Labels` is a pytree node whose one child is its (fitted) tree, and mapping over it
# gives the mapped tree itself: so a label function may return one (`lambda p:
# tc.optim.labels(p, ...)`); optax reads its leaves as the labels, and the per-label masks
# it maps from it are plain boolean trees.
def _labels_children(children: Iterable[object]) -> Any:  # the tree, not a `Labels`
    (tree,) = children
    return tree


jax.tree_util.register_pytree_with_keys(
    Labels,
    lambda labels: (((jax.tree_util.GetAttrKey("tree"), labels.fitted()),), None),
    lambda _, children: _labels_children(children),
    flatten_func=lambda labels: ((labels.fitted(),), None),
)


def _structure_with_frozen_as(tree: object, frozen_as: object) -> PyTreeDef:
    """The structure of `tree` with `frozen_as` in place of every frozen value.

    `False` gives the structure of a mask of `tree`; `None` (no leaf) its frozen-free
    structure: two trees with equal frozen-free structures differ at most in their frozen
    values, so an abstract template of a model fits it, even when its frozen values were
    built apart.
    """
    return jax.tree_util.tree_structure(
        jax.tree_util.tree_map(
            lambda x: frozen_as if is_wrapper(x) else 0, tree, is_leaf=is_wrapper
        )
    )


def _selection_mask(tree: object, label: Hashable, selection: object) -> object:
    if isinstance(selection, AtIndexer):
        selected = mask(selection, strict=False)
    else:
        selected = mask(tree, selection, strict=False)
    if jax.tree_util.tree_structure(selected) != _structure_with_frozen_as(tree, False):
        try:
            check_mask(selected, tree)
            detail = ""
        except ValueError as error:
            detail = str(error).split("\n")[0]
        raise ValueError(_SELECTION_TREE_MSG.format(label=label, detail=detail))
    return selected


_SELECTIONS_TYPE_MSG = (
    "`tc.optim.labels` takes a mapping of label -> selection, e.g. "
    "`{{'decay': model.at[Linear]['weight']}}`; got {type}."
)


def labels(
    tree: _T,
    selections: Mapping[Hashable, object],
    *,
    default: Hashable | None = "rest",
    strict: bool = True,
) -> Labels[_T]:
    """Labels for `optax.multi_transform` from a mapping of label -> selection.

    **Arguments**

    - `tree`: the parameters (a `TreeClass` model or any pytree).
    - `selections`: label -> selection, where a selection is an `.at` selection made on
      `tree` (`model.at[Linear]["weight"]`), or a selector for `tree.at[...]` (a name,
      a type, `tc.glob("layers.*.bias")`, a boolean mask tree, ...).
    - `default`: the label of the leaves no selection claims; `None` makes every
      unclaimed leaf an error.
    - `strict`: whether a label whose selection selects no leaf is an error (the
      default: a typo would otherwise leave that label's transform unused).

    **Returns**

    A `Labels`: hand it to `optax.multi_transform(transforms, labels)`; its `.tree` is the
    label tree, with the structure of `tree`.

    **Raises**

    `ValueError` when selections overlap (naming every leaf claimed twice and by which
    labels), when `default=None` leaves leaves unclaimed, when a selection was made on
    another tree, or (with `strict`) when a label selects nothing; `TypeError` when
    `selections` is not a mapping.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w1": jnp.ones((2, 2)), "b1": jnp.zeros(2), "w2": jnp.ones((2, 1))}
    labels = tc.optim.labels(params, {"decay": tc.glob("w*")}, default="plain")
    assert labels.tree == {"w1": "decay", "b1": "plain", "w2": "decay"}
    ```
    """
    if not isinstance(selections, Mapping):
        raise TypeError(_SELECTIONS_TYPE_MSG.format(type=type(selections).__name__))
    _check_strict(strict, "labels")
    # frozen values count as places here (their mask leaf is `False`); they are kept
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_wrapper)
    claims: list[list[Hashable]] = [[] for _ in flat]
    for label, selection in selections.items():
        selected = jax.tree_util.tree_leaves(_selection_mask(tree, label, selection))
        if strict and not any(selected):
            raise _empty_selection_error(f"The selection for label {label!r}", False)
        for index, is_selected in enumerate(selected):
            if is_selected:
                claims[index].append(label)
    overlaps = [
        f"    `{path_str(tree, path)}`: " + ", ".join(map(repr, claimed))
        for (path, _), claimed in zip(flat, claims)
        if len(claimed) > 1
    ]
    if overlaps:
        raise ValueError(_OVERLAP_MSG.format(count=len(overlaps), claims="\n".join(overlaps)))
    if default is None:
        unclaimed = [
            f"    `{path_str(tree, path)}`"
            for (path, leaf), c in zip(flat, claims)
            if not c and not is_wrapper(leaf)
        ]
        if unclaimed:
            raise ValueError(
                _UNCLAIMED_MSG.format(count=len(unclaimed), paths="\n".join(unclaimed))
            )
    leaves = [
        leaf if is_wrapper(leaf) else (claimed[0] if claimed else default)
        for (_, leaf), claimed in zip(flat, claims)
    ]
    return Labels(jax.tree_util.tree_unflatten(treedef, leaves))


def partition(
    transforms: Mapping[Hashable, object],
    tree: object,
    selections: Mapping[Hashable, object],
    *,
    default: Hashable | None = "rest",
    strict: bool = True,
) -> Any:
    """One optax transform per selection, in one call (needs optax).

    Same as `optax.multi_transform(transforms, tc.optim.labels(tree, selections,
    default=default))`, after checking that every label in use has a transform.

    **Arguments**

    - `transforms`: label -> optax `GradientTransformation`.
    - `tree`, `selections`, `default`, `strict`: as for `tc.optim.labels`.

    **Returns**

    An optax `GradientTransformation`.

    **Raises**

    `ImportError` without optax; `ValueError` as `tc.optim.labels` does, and naming the
    key path of a leaf whose label has no transform.

    ```python
    import jax.numpy as jnp
    import optax
    import treeclass as tc
    import treeclass.optim

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    opt = tc.optim.partition(
        {"w": optax.adam(1e-3), "rest": optax.sgd(1e-2)}, params, {"w": tc.at(params)["w"]}
    )
    state = opt.init(params)
    ```
    """
    optax = _import_optax("partition")
    label_tree = labels(tree, selections, default=default, strict=strict)
    check_labels(label_tree, tree, transforms)
    combine = getattr(optax, "partition", None) or optax.multi_transform
    return combine(transforms, label_tree)


# --------------------------------------------------------------------------------------
# trainable: one transformation that updates exactly a selection

_KEEP, _UPDATE, _FROZEN = range(3)

_NOT_A_TRANSFORM_MSG = (
    "`tc.optim.trainable` takes an optax transformation first, then the model: "
    "`tc.optim.trainable(optax.adam(1e-3), model)`; got {type} first."
)
_NOTHING_TRAINABLE_MSG = (
    "{what} has no trainable leaf (an inexact, unfrozen array outside state fields): "
    "an optimizer built on it would change nothing. Its leaves' roles: {roles}. Select the "
    "leaves to train, `tc.optim.trainable(opt, model.at[...])`, or pass `strict=False` if "
    "nothing to train is what you mean."
)
_NOT_INEXACT_MSG = (
    "The selection picks the leaf at `{path}`, {found}, which cannot be trained: only "
    "inexact (floating or complex) values have gradients. Narrow the selection, or make the "
    "leaf a float array."
)
_TREE_MISFIT_MSG = (
    "The {what} handed to `{method}` does not fit the model this optimizer was built from "
    "at `{path}`: {reason}. Build it from the same model (frozen values may differ: they "
    "are not looked at), e.g.\n"
    "    opt = tc.optim.trainable(optax.adam(1e-3), model); state = opt.init(model)"
)
_FLOAT0_MSG = (
    "The update at `{path}` has dtype float0 (the gradient of an integer or boolean leaf, "
    "from `jax.grad(..., allow_int=True)`), and no parameters were given to derive an "
    "unchanged update from. Pass the parameters: `opt.update(grads, state, model)`."
)
_PRNG_KEY_MSG = (
    "The leaf at `{path}` is a PRNG key array, which no optimizer changes; but "
    "`optax.apply_updates` adds an update to every leaf, and nothing can be added to a key. "
    "Keep keys out of the leaves the optimizer sees: freeze the key (frozen values are not "
    "leaves), or pass it to the step as an argument:\n"
    "    before: self.key = jax.random.key(0)\n"
    "    after:  self.key = tc.freeze(jax.random.key(0))"
)


_REFROZEN_MSG = (
    "The {what} handed to `{method}` hold{s} at `{path}` a value that is {now}, but it was "
    "{then} in the model this optimizer was built from: the optimizer keeps the roles it "
    "was built with, so it would build or update a state that does not fit the model. "
    "Build the optimizer from the model as you train it, after freezing (or unfreezing):\n"
    "    before: opt = tc.optim.trainable(tx, model); model = model.at[...].apply(tc.freeze)\n"
    "    after:  model = model.at[...].apply(tc.freeze); opt = tc.optim.trainable(tx, model)"
)


class _Plan:
    """Which leaf of the model (frozen values counted as leaves) is updated, kept or frozen."""

    __slots__ = ("kinds", "treedef", "skeleton", "root")

    def __init__(self, tree: object, kinds: list[int]) -> None:
        self.kinds = kinds
        self.treedef = jax.tree_util.tree_structure(tree, is_leaf=is_wrapper)
        self.skeleton = _structure_with_frozen_as(tree, None)
        self.root = tree

    def split(self, tree: object, what: str, method: str) -> tuple[list[Any], PyTreeDef]:
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_wrapper)
        if treedef == self.treedef:  # the same places, frozen values counted as leaves
            for index, (leaf, kind) in enumerate(zip(leaves, self.kinds)):
                if is_wrapper(leaf) != (kind == _FROZEN):
                    self._refuse_refrozen(tree, index, what, method, kind)
        elif (
            len(leaves) != len(self.kinds) or _structure_with_frozen_as(tree, None) != self.skeleton
        ):
            found = first_mismatch(self.root, tree, is_leaf=is_wrapper)
            path, reason = (), "the structures differ"
            if found is not None:
                path, reason = found.path, found.explain(what, tree="model")
            where = path_str(self.root, path)
            raise ValueError(
                _TREE_MISFIT_MSG.format(what=what, method=method, path=where, reason=reason)
            )
        return leaves, treedef

    def _refuse_refrozen(self, tree: object, index: int, what: str, method: str, kind: int) -> None:
        if kind == _FROZEN:
            then, now = "a frozen value", "not frozen"
        else:
            then, now = "a leaf (" + ("updated" if kind == _UPDATE else "kept") + ")", "frozen"
        raise ValueError(
            _REFROZEN_MSG.format(
                what=what,
                s="" if what.endswith("s") else "s",
                method=method,
                path=_leaf_path(tree, index),
                then=then,
                now=now,
            )
        )

    def selected(self, treedef: PyTreeDef, leaves: list[object], masked: object) -> object:
        """`leaves` as a tree in which only the updated ones are left (others `masked`)."""
        return treedef.unflatten(
            [x if kind == _UPDATE else masked for x, kind in zip(leaves, self.kinds)]
        )


def _unchanged(update: ArrayLike, param: ArrayLike | None, where: Callable[[], str]) -> jax.Array:
    """An update that `optax.apply_updates` adds to `param` without changing a bit.

    `x + (-0.0)` is `x` for every float `x`, -0.0, infinities and NaNs included (adding
    +0.0 would turn -0.0 into 0.0); integers and booleans add a zero.
    """
    reference = update if param is None else param
    if is_prng_key(reference):
        raise TypeError(_PRNG_KEY_MSG.format(path=where()))
    dtype = jnp.result_type(reference)
    if dtype == jax.dtypes.float0:
        raise ValueError(_FLOAT0_MSG.format(path=where()))
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.full_like(reference, complex(-0.0, -0.0))
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.full_like(reference, -0.0)
    return jnp.zeros_like(reference)


def _plan_of(selection: object, where: tuple[object, ...], strict: bool) -> _Plan:
    selects = isinstance(selection, AtIndexer) or bool(where)
    if selects:
        indexer = _indexer(selection, where)
        tree = indexer.tree
        # a mask holds `False` where the tree holds a frozen value: one flag per place
        chosen = [flag is True for flag in jax.tree_util.tree_leaves(mask(indexer, strict=strict))]
    else:
        tree = selection
        names = leaf_roles(tree)  # in the order of the leaves, frozen values counted as leaves
        # every role but trainable is kept, a leaf of a field declared `role="frozen"` too
        # (it is a leaf, with an update)
        chosen = [name == TRAINABLE for name in names]
    places = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_wrapper)[0]
    # a frozen value is `_FROZEN` (not a leaf)
    kinds = [
        _FROZEN if is_wrapper(leaf) else (_UPDATE if update else _KEEP)
        for (_, leaf), update in zip(places, chosen, strict=True)
    ]
    if selects:
        for (path, leaf), kind in zip(places, kinds):
            if kind == _UPDATE and not _is_inexact_leaf(leaf):
                shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
                found = (
                    f"an array {dtype}{list(shape)}"
                    if dtype is not None and shape is not None
                    else f"a `{type(leaf).__name__}`"
                )
                raise ValueError(_NOT_INEXACT_MSG.format(path=path_str(tree, path), found=found))
    elif strict and _UPDATE not in kinds:
        shown = ", ".join(f"{n} {name}" for name, n in Counter(names).items()) or "none"
        raise ValueError(
            _NOTHING_TRAINABLE_MSG.format(what=f"The {type(tree).__name__}", roles=shown)
        )
    return _Plan(tree, kinds)


def _is_inexact_leaf(x: object) -> bool:
    # a selection is an explicit choice: a selected Python float trains too
    return isinstance(x, (float, complex)) or is_inexact_array(x)


def trainable(transform: object, selection: object, *where: object, strict: bool = True) -> Any:
    """An optax transformation that updates exactly a selection and nothing else (needs optax).

    `transform` (any optax `GradientTransformation`: `optax.adamw(1e-3)`, a chain, a
    `multi_transform`) sees the selected leaves only; every other leaf gets an update that
    `optax.apply_updates` adds without changing a bit: no step, no momentum, no weight
    decay, and no optimizer state. So:

    - Python numbers of a hand-written `__init__` (`self.eps = 1e-5`), integer and
      boolean leaves, state fields (`tc.field(role="state")`: running statistics,
      counters) and frozen fields (`tc.field(role="frozen")`: a pretrained base) are
      never trained and hold no optimizer state, although `jax.grad` gives the first
      ones gradients (every leaf is a leaf);
    - frozen values are not in the state at all (neither are their copies: the state is
      built on a tree in which they are `optax.MaskedNode()`), so saving the optimizer
      state stores no frozen array;
    - the selection is computed once, here, from `selection`. `init` and `update` accept
      any tree of the same structure: the model itself, an abstract template of it
      (`jax.eval_shape`, an orbax or `tc.load` restore target), even one whose frozen
      values differ. Build it from the model itself, not from such a template: there,
      Python numbers are abstract arrays, and would be trained.

    Unlike `optax.masked`, which passes the other leaves' raw gradients through (the loop
    would then apply them), and `optax.set_to_zero`, which writes `0.0` (so `-0.0`
    becomes `0.0`), the other leaves come out of `optax.apply_updates` bit-identical.

    **Arguments**

    - `transform`: the optax transformation for the selected leaves. A mask or labels it
      takes (`optax.adamw(mask=...)`, `optax.multi_transform`) are taken on the tree it
      sees: pass them as functions of the parameters, e.g.
      `mask=lambda p: tc.optim.mask(p.at[Linear]["weight"])`.
    - `selection`: a model (or any pytree): its trainable leaves (`tc.roles`: inexact
      JAX or NumPy arrays, not frozen, not state) are updated. Or an `.at` selection
      (`model.at[Linear]["weight"]`), or a tree followed by selectors as for `mask`:
      exactly the selected leaves are updated, whatever their role (an explicit choice:
      a selected Python float trains; a selected integer is an error).
    - `strict`: whether nothing to update is an error (the default).

    **Returns**

    An optax `GradientTransformationExtraArgs`. Pass the parameters to `update`
    (`opt.update(grads, state, model)`): the unchanged updates take their dtype from
    them, which integer leaves (gradients of dtype `float0` under
    `jax.grad(allow_int=True)`) need.

    **Raises**

    `ImportError` without optax; `ValueError` for an empty selection (with `strict`), a
    selected leaf that is not inexact, or, from `init` and `update`, a tree that does not
    fit the model (naming the key path); `TypeError` from `update` for a PRNG key leaf
    (`optax.apply_updates` cannot add to a key: freeze it); what `.at` raises for a
    selector that does not fit.

    ```python
    import jax, jax.numpy as jnp, optax
    import treeclass as tc

    class Scale(tc.TreeClass):
        def __init__(self):
            self.w = jnp.ones(2)
            self.eps = 1e-5            # a Python number: a leaf, not a parameter

        def __call__(self, x):
            return x * self.w + self.eps

    model = Scale()
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.1), model)
    state = opt.init(model)
    grads = jax.grad(lambda m: m(jnp.ones(2)).sum())(model)
    updates, state = opt.update(grads, state, model)
    model = optax.apply_updates(model, updates)
    assert model.eps == 1e-5 and (model.w != 1.0).all()
    ```
    """
    optax = _import_optax("trainable")
    if not (
        callable(getattr(transform, "init", None)) and callable(getattr(transform, "update", None))
    ):
        raise TypeError(_NOT_A_TRANSFORM_MSG.format(type=type(transform).__name__))
    _check_strict(strict, "trainable")
    plan = _plan_of(selection, where, strict)
    inner = optax.with_extra_args_support(transform)
    masked = optax.MaskedNode()

    def init(params: object) -> Any:
        leaves, treedef = plan.split(params, "parameters", "init")
        return inner.init(plan.selected(treedef, leaves, masked))

    def update(updates: object, state: object, params: object = None, **extra_args: Any) -> Any:
        leaves, treedef = plan.split(updates, "updates", "update")
        sub_params = None
        param_leaves: list[Any] = [None] * len(leaves)
        if params is not None:
            param_leaves, param_def = plan.split(params, "parameters", "update")
            sub_params = plan.selected(param_def, param_leaves, masked)
        new, state = inner.update(
            plan.selected(treedef, leaves, masked), state, sub_params, **extra_args
        )
        updated = iter(jax.tree_util.tree_leaves(new))
        out = []
        for index, (leaf, param, kind) in enumerate(zip(leaves, param_leaves, plan.kinds)):
            if kind == _UPDATE:
                out.append(next(updated))
            elif kind == _FROZEN:
                out.append(leaf)
            else:
                out.append(_unchanged(leaf, param, functools.partial(_leaf_path, updates, index)))
        return treedef.unflatten(out), state

    return optax.GradientTransformationExtraArgs(init, update)


def _is_unchanged_update(update: object) -> bool:
    """Whether a concrete `update` adds nothing to any value: all `-0.0`, or all zero."""
    if isinstance(update, Tracer) or not isinstance(update, (jax.Array, np.ndarray, np.generic)):
        return False
    dtype = np.dtype(update.dtype) if update.dtype != jax.dtypes.float0 else None
    if dtype is None:  # the gradient of an integer leaf: nothing to add
        return True
    data = np.asarray(update)
    if np.issubdtype(dtype, np.inexact):
        # -0.0 is the one value `x + u == x` holds for, bit for bit, for every float x
        parts = (np.real(data), np.imag(data)) if np.iscomplexobj(data) else (data,)
        return all(bool(np.all((part == 0) & np.signbit(part))) for part in parts)
    return not data.any()


def _apply_one(param: Any, update: object) -> Any:
    if param is None:
        return None
    if not _is_inexact_leaf(param) or is_prng_key(param) or _is_unchanged_update(update):
        # integers, booleans, keys: no optimizer trains them; an update of -0.0: the
        # param as it is (its type, dtype, weak type and bits; a NaN's payload too)
        return param
    new = jnp.asarray(param + update)
    dtype = jnp.result_type(param)
    return new if new.dtype == dtype else new.astype(dtype)


def apply_updates(params: _T, updates: object) -> _T:
    """`optax.apply_updates` that leaves every value no optimizer changed exactly as it is.

    `optax.apply_updates` adds every update and casts the sum to the parameter's dtype,
    which makes a weakly typed value strongly typed (the next jitted step compiles anew),
    turns a NumPy 64-bit scalar into a 32-bit JAX array (with 64-bit types off, an int64
    2**40 becomes 0), and, in eager mode, quiets a signalling NaN. Here:

    - an integer, boolean or PRNG key leaf is returned as it is (no optimizer trains it);
    - a leaf whose update is, concretely, all `-0.0` (what `tc.optim.trainable` gives
      every leaf it does not train) is returned as it is: the same object;
    - any other leaf is `param + update`, of the parameter's dtype and weak type (under
      `jax.jit` an update of `-0.0` is compiled away, so the sum is the parameter).

    **Arguments**

    - `params`: the parameters (a model or any pytree).
    - `updates`: the updates, as `opt.update` returns them.

    **Returns**

    The updated parameters, with the structure of `params`.

    ```python
    import jax.numpy as jnp, numpy as np, optax
    import treeclass as tc

    params = {"w": jnp.ones(2), "count": np.int64(2**40), "eps": jnp.asarray(1e-5)}
    opt = tc.optim.trainable(optax.sgd(0.1), params)
    grads = {"w": jnp.ones(2), "count": np.zeros(()), "eps": jnp.zeros(())}
    updates, _ = opt.update(grads, opt.init(params), params)
    new = tc.optim.apply_updates(params, updates)
    assert new["count"] is params["count"] and new["eps"] is params["eps"]
    assert np.allclose(new["w"], 0.9)
    ```
    """
    return jax.tree_util.tree_map(_apply_one, params, updates, is_leaf=lambda x: x is None)


def _leaf_path(tree: object, index: int) -> str:
    path = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_wrapper)[0][index][0]
    return path_str(tree, path)


# --------------------------------------------------------------------------------------
# scale_blocks: a factor per leaf, or per block of a stacked leaf

_SCALE_MISMATCH_MSG = (
    "The factors given to `tc.optim.scale_blocks` do not fit the updates at `{where}`: "
    "{reason}. Build the factors from the model: `model.at[...].set(1.0)`, then set "
    "per-block values."
)
_SCALE_RANK_MSG = (
    "The factor at `{where}` has shape {got}, but the update there has shape {want}: a "
    "factor is a number or an array along the leading (block) axes of its leaf."
)


def _scale_one(
    factor: object, shape: tuple[int, ...] | None, where: Callable[[], str], update: Any
) -> Any:
    """`update` times `factor`; `shape` is the factor's shape as given, before
    `_compact_factor` dropped its constant trailing axes (None for a number)."""
    if shape is not None:
        want = jnp.shape(update)
        if len(shape) > len(want) or tuple(shape) != tuple(want[: len(shape)]):
            raise ValueError(_SCALE_RANK_MSG.format(where=where(), got=shape, want=want))
    if isinstance(factor, bool | np.bool_):
        return update if factor else jnp.zeros_like(update)
    if isinstance(factor, numbers.Number) or is_number(factor):
        factor = plain_number(factor)  # weak: a NumPy or ml_dtypes scalar keeps the dtype
        return update if factor == 1 else update * factor
    factor = jnp.asarray(factor)
    full = jnp.shape(update)
    if factor.ndim > len(full) or tuple(factor.shape) != tuple(full[: factor.ndim]):
        raise ValueError(_SCALE_RANK_MSG.format(where=where(), got=factor.shape, want=full))
    factor = factor.reshape(factor.shape + (1,) * (len(full) - factor.ndim))
    if factor.dtype == jnp.bool_:
        return jnp.where(factor, update, jnp.zeros_like(update))
    return (update * factor).astype(jnp.result_type(update))


def _compact_factor(factor: object) -> object:
    """`factor` with the trailing axes along which it is constant dropped.

    Factors built from the model (`model.at[...].set(1.0)`) are arrays of each leaf's
    shape, constant within each leaf or each block; kept whole, they would double the
    model's memory and enter a jitted step as constants the size of the model. A factor
    constant over its whole leaf becomes a Python number (`1.0` skips the multiply).
    """
    if not isinstance(factor, np.ndarray | jax.Array) or isinstance(factor, Tracer):
        return factor
    if not readable_here(factor) or factor.size == 0:
        return factor
    values = np.asarray(local_copy(factor))
    for kept in range(values.ndim):
        lead = values.reshape(values.shape[:kept] + (-1,))
        if bool((lead == lead[..., :1]).all()):
            return lead[..., 0].item() if kept == 0 else lead[..., 0]
    return factor


def scale_blocks(factors: object) -> Any:
    """An optax transform multiplying each update by a factor: one per leaf, or per block.

    `factors` has the parameters' structure (or a prefix of it). A leaf is a number (the
    whole leaf's factor: `0` freezes it, `0.5` halves its learning rate) or an array along
    the leading axes of its leaf: for a stacked leaf (`tc.Stacked`), one factor per block.
    Booleans work as masks (`False` zeroes the update). Build the factors from the model
    with `.at`:

        factors = model.at[...].set(1.0).at["blocks"][0:6].set(0.0)   # freeze blocks 0-5
        decay = model.at[...].set(1.0).at["blocks"].set(0.9 ** jnp.arange(47, -1, -1))

    Put it last in a chain: `optax.chain(optax.adamw(1e-3), tc.optim.scale_blocks(factors))`
    (the optimizer's state is kept for frozen blocks, but their updates are zero).

    **Arguments**

    - `factors`: the tree of factors.

    **Returns**

    An optax `GradientTransformation` (needs optax).

    **Raises**

    `ImportError` without optax; from `update`, `ValueError` naming the key path where the
    factors do not fit the updates, or where a factor's shape is not that of the leading
    axes of its update.

    ```python
    import jax.numpy as jnp
    import optax
    import treeclass as tc

    params = {"blocks": tc.Stacked({"w": jnp.ones((3, 2))}), "b": jnp.ones(2)}
    factors = tc.at(tc.at(params)[...].set(1.0))["blocks"][0].set(0.0)
    opt = optax.chain(optax.sgd(1.0), tc.optim.scale_blocks(factors))
    grads = {"blocks": tc.Stacked({"w": jnp.ones((3, 2))}), "b": jnp.ones(2)}
    updates, _ = opt.update(grads, opt.init(params))
    assert updates["blocks"].tree["w"][:, 0].tolist() == [0.0, -1.0, -1.0]
    ```
    """
    optax = _import_optax("scale_blocks")
    # the factors are fixed: flattened once, not at every step. A frozen value in them
    # (factors built from a model with `.at` keep its frozen values) stands where the
    # updates hold no leaf: a frozen value, or `optax.MaskedNode` inside `trainable`
    paths_and_factors, factors_def = jax.tree_util.tree_flatten_with_path(
        factors, is_leaf=is_wrapper
    )
    shapes = [
        tuple(factor.shape) if isinstance(factor, np.ndarray | jax.Array) else None
        for _, factor in paths_and_factors
    ]
    paths_and_factors = [(path, _compact_factor(factor)) for path, factor in paths_and_factors]

    def init(params: object) -> Any:
        return optax.EmptyState()

    def update(updates: object, state: object, params: object = None) -> tuple[object, object]:
        try:
            subtrees = factors_def.flatten_up_to(updates)
        except (ValueError, TypeError):
            misfit = _misfit(factors, updates, "factors", "updates")
            where, reason = misfit or (root_name(updates), "the structures differ")
            raise ValueError(_SCALE_MISMATCH_MSG.format(where=where, reason=reason)) from None
        scaled = [
            jax.tree_util.tree_map(
                functools.partial(
                    _scale_one, factor, shape, functools.partial(path_str, updates, path)
                ),
                subtree,
            )
            for (path, factor), shape, subtree in zip(paths_and_factors, shapes, subtrees)
        ]
        return factors_def.unflatten(scaled), state

    return optax.GradientTransformation(init, update)
