"""optax integration: per-leaf optimizers from `.at` selections (guide: docs/guides/training.md).

A declared role outranks a selection everywhere here: frozen and state leaves (and
`tc.freeze` values) are never trained, decayed or given state. Every helper reads a
selection as a value (`_at.selection`): one flag per leaf. optax is imported only by
`partition`, `trainable` and `scale_blocks`, when called.
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
from jax.tree_util import KeyPath
from jax.typing import ArrayLike

from ._at import AtIndexer, at
from ._at import selection as selection_of
from ._numbers import is_number, plain_number
from ._roles import NEVER_TRAINED, TRAINABLE, leaf_roles
from ._structure import (
    describe,
    first_mismatch,
    is_leaf_node,
    is_wrapper,
    path_str,
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
    "split",
    "merge",
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


# -- checking that a mask or label tree fits the parameters --------------------------------

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


def _apart(tree: object, other: object, what: str, tree_is: str, **how: Any) -> tuple[str, str]:
    """`(key path, reason)` of the first place where `other` (the `what`) does not fit
    `tree`, by `first_mismatch(tree, other, **how)`."""
    found = first_mismatch(tree, other, **how)
    if found is None:
        return path_str(tree, ()), "the structures differ"
    return path_str(tree, found.path), found.explain(what, tree=tree_is)


def _check_prefix(
    tree: object, params: object, what: str, check_leaf: Callable[[object, str], None]
) -> None:
    """Raise where `tree` (a mask or label tree) stops being a prefix of `params`."""
    if jax.tree_util.tree_structure(tree) != jax.tree_util.tree_structure(params):
        # a prefix fits: a leaf of `tree` stands for the whole subtree of `params` there
        if first_mismatch(params, tree, other_covers=is_leaf_node) is not None:
            where, reason = _apart(params, tree, what, "parameters", other_covers=is_leaf_node)
            raise ValueError(_NOT_A_PREFIX_MSG.format(what=what, path=where, reason=reason))
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        check_leaf(leaf, path_str(params, path))


def _check_mask_leaf(leaf: object, where: str) -> None:
    scalar_bool = getattr(leaf, "dtype", None) == np.bool_ and getattr(leaf, "shape", None) == ()
    if not (isinstance(leaf, (bool, np.bool_)) or scalar_bool):
        raise TypeError(_MASK_LEAF_MSG.format(path=where, found=describe(leaf)))


def check_mask(mask: _T, params: object) -> _T:
    """Check that `mask` fits `params` the way optax needs, and return it unchanged.

    optax takes the structure of the parameters or of a prefix of them (one boolean for
    a whole subtree), with boolean leaves; this names the key path where a mask does not.

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

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    mask = tc.optim.check_mask({"w": True, "b": False}, params)
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
            found = describe(leaf)
            raise TypeError(_UNHASHABLE_LABEL_MSG.format(path=where, found=found)) from None
        if known is not None and leaf not in known and not isinstance(leaf, _NeverTrained):
            raise ValueError(_UNKNOWN_LABEL_MSG.format(label=leaf, path=where, known=known))

    _check_prefix(tree, params, "label tree", check_leaf)
    return labels


# -- masks from selections -----------------------------------------------------------------


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
    "'weight')`; got {found} and no selectors, which selects every leaf. "
    "Pass `...` to mean that: `tc.optim.mask(tree, ...)`."
)


def _whole_flag(
    flag: ArrayLike, where: Callable[[], str], message: str = _PARTIAL_LEAF_MSG
) -> bool:
    """A flag (or boolean array) as one flag for its whole leaf, or `message` naming `where()`."""
    if flag is True or flag is False:
        return flag
    if isinstance(flag, Tracer) or not bool(np.all(flag)) and bool(np.any(flag)):
        raise ValueError(message.format(where=where()))
    return bool(np.all(flag))


def _whole_leaf_selector(selector: object) -> object:
    """`selector`, the boolean array leaves of a mask selector made whole-leaf bools and its
    frozen values (as `mask` returns them) `False`."""
    leaves = jax.tree_util.tree_leaves(selector, is_leaf=is_wrapper)
    if not any(is_wrapper(x) or _is_bool_array(x) for x in leaves):
        return selector

    def whole(path: KeyPath, x: object) -> object:
        if is_wrapper(x) or not _is_bool_array(x):
            return False if is_wrapper(x) else x
        where = "mask" + jax.tree_util.keystr(path) + (" (traced)" if isinstance(x, Tracer) else "")
        return _whole_flag(x, lambda: where, _PARTIAL_SELECTION_MSG)

    return jax.tree_util.tree_map_with_path(whole, selector, is_leaf=is_wrapper)


def _is_bool_array(x: object) -> TypeGuard[jax.Array | np.ndarray]:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == np.bool_


def _indexer(selection: object, where: tuple[object, ...]) -> AtIndexer:
    if isinstance(selection, AtIndexer):
        tree, chain = selection.tree, (*selection.where, *where)
    elif where:
        tree, chain = selection, where
    else:
        raise TypeError(_NOT_AN_INDEXER_MSG.format(found=describe(selection)))
    return at(tree, [_whole_leaf_selector(selector) for selector in chain])


_EMPTY_SELECTION_MSG = (
    "{what} selects no leaf: an optimizer setting built from it would change nothing (a "
    "typo in a selector, say, turns weight decay off without a word). Check the "
    "selection; if an empty selection is what you mean, pass `strict=False`."
)
_ONLY_NEVER_TRAINED_MSG = (
    "{what} selects only leaves that no optimizer trains, whatever the selection:\n"
    "{leaves}\n"
    "A declared role outranks a selection: frozen leaves (`tc.field(role='frozen')`, "
    "`tc.freeze`) and state leaves (`tc.field(role='state')`) are never updated or "
    "decayed, and hold no optimizer state. Select parameters (`tc.roles(model)` shows "
    "each leaf's role); if an empty selection is what you mean, pass `strict=False`."
)
_LISTED = 8  # leaves named in an error before "and N more"


def _check_strict(strict: object, where: str) -> None:
    if not isinstance(strict, bool):
        raise TypeError(f"`tc.optim.{where}` takes `strict` as a bool, got {describe(strict)}.")


class _Places:
    """A tree's leaves (frozen values counted as leaves), structure and key paths."""

    __slots__ = ("tree", "leaves", "treedef", "_paths")

    def __init__(self, tree: object) -> None:
        self.tree = tree
        self.leaves, self.treedef = jax.tree_util.tree_flatten(tree, is_leaf=is_wrapper)
        self._paths: list[KeyPath] | None = None

    def where(self, index: int) -> str:
        if self._paths is None:
            pairs = jax.tree_util.tree_flatten_with_path(self.tree, is_leaf=is_wrapper)[0]
            self._paths = [path for path, _ in pairs]
        return path_str(self.tree, self._paths[index])


def _selected_places(
    indexer: AtIndexer, strict: bool, what: str | None = None
) -> tuple[_Places, list[bool]]:
    """Per place of `indexer.tree`, whether the selection trains it; with `strict`, selecting
    none (naming the places reached that no optimizer trains) is an error about `what`."""
    places = _Places(indexer.tree)
    # frozen values as leaves: a selection reaching only them is not an empty one
    flags = selection_of(indexer, is_wrapper).flags()
    names = leaf_roles(places.tree)
    chosen: list[bool] = []
    refused: list[str] = []
    for index, (leaf, flag, role) in enumerate(zip(places.leaves, flags, names, strict=True)):
        if is_wrapper(leaf) or role in NEVER_TRAINED:
            # a leaf never trained may be reached in part (no whole-leaf rule)
            if flag is True or (flag is not False and (isinstance(flag, Tracer) or np.any(flag))):
                why = "frozen by `tc.freeze`" if is_wrapper(leaf) else f"role {role!r}"
                refused.append(f"`{places.where(index)}` ({why})")
            chosen.append(False)
        else:
            chosen.append(_whole_flag(flag, functools.partial(places.where, index)))
    if strict and True not in chosen:
        what = what or f"The selection {indexer!r}"
        if not refused:
            raise ValueError(_EMPTY_SELECTION_MSG.format(what=what))
        listed = [f"    {line}" for line in refused[:_LISTED]]
        if len(refused) > _LISTED:
            listed.append(f"    ... and {len(refused) - _LISTED} more")
        raise ValueError(_ONLY_NEVER_TRAINED_MSG.format(what=what, leaves="\n".join(listed)))
    return places, chosen


# Typed as the selected tree: a mask has its structure, with `bool` leaves.
@overload
def mask(selection: AtIndexer[_T], *where: object, strict: bool = True) -> _T: ...
@overload
def mask(selection: _T, where: object, /, *more: object, strict: bool = True) -> _T: ...
def mask(selection: object, *where: object, strict: bool = True) -> object:
    """A boolean tree, `True` exactly at the leaves a selection picks for training.

    Frozen and state leaves (and `tc.freeze` values) are `False` whatever the selection.
    For `optax.masked`, `optax.adamw(mask=...)` and the like (more: the optax recipe).

    **Arguments**

    - `selection`: an `.at` selection such as `model.at[Linear]["weight"]` or
      `tc.at(tree)["layers"][0]`; or a tree, followed by selectors.
    - `*where`: selectors applied one level after another, as `.at[a][b]` would:
      `mask(model, Linear, "weight")` is `mask(model.at[Linear]["weight"])`.
    - `strict`: whether selecting no leaf, or only frozen and state leaves (named in
      the error), is an error (the default): a setting built from it would change nothing.

    **Returns**

    A tree of `bool` with the structure of the tree the selection was made on.

    **Raises**

    What `.at` raises for a selector that does not fit the tree (a missing key, a glob
    matching nothing); `ValueError` for a boolean array selector that picks only some
    elements of a trainable leaf, and for an empty selection when `strict`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    assert tc.optim.mask(tc.at(params)["w"]) == {"w": True, "b": False}
    assert tc.optim.mask(params, "b") == {"w": False, "b": True}
    ```
    """
    _check_strict(strict, "mask")
    places, chosen = _selected_places(_indexer(selection, where), strict)
    # a frozen value's place holds `False`, which fits both the model and the tree
    # `tc.optim.trainable` hands its transform (`MaskedNode()` there)
    return places.treedef.unflatten(chosen)


# -- labels for optax.multi_transform ------------------------------------------------------

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
_HANDED_TO_A_TRANSFORM_MSG = (
    "The label tree marks these leaves as never trained (a declared role outranks a "
    "selection), but the optimizer was handed them, so `optax.multi_transform` would "
    "update them and keep optimizer state for them:\n{leaves}\n"
    "Wrap the optimizer with `tc.optim.trainable` (its transform sees only the leaves it "
    "trains), or build it with `tc.optim.partition` (which keeps them as they are):\n"
    "    before: opt = optax.multi_transform(transforms, labels)\n"
    "    after:  opt = tc.optim.trainable(optax.multi_transform(transforms, labels), model)"
)


class _NeverTrained(str):
    """The label `"(frozen)"` or `"(state)"`: a `str` for optax's label checks, told apart
    from the user's labels by its type."""

    __slots__ = ()


class Labels(Generic[_T]):
    """A label tree for `optax.multi_transform` / `optax.partition`, as a label function.

    optax calls it with the parameters: it checks that its tree (`.tree`) fits them,
    naming the key path where not, and returns it. It is a pytree of its labels, so a
    label function may return one. A frozen or state leaf's label, `"(frozen)"` or
    `"(state)"`, is an error in a bare `optax.multi_transform`, and inside
    `tc.optim.trainable` (which hides the leaf) takes the first label.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

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
        stand_in = type(params).__name__ == _PLACEHOLDER_TYPE
        if not stand_in:
            check_labels(tree, params)
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if not any(isinstance(x, _NeverTrained) for x in leaves):
            return tree
        places = [] if stand_in else treedef.flatten_up_to(params)
        handed = [
            f"    `{path_str(params, path)}` ({label[1:-1]})"
            for (path, label), place in zip(jax.tree_util.tree_leaves_with_path(tree), places)
            if isinstance(label, _NeverTrained) and jax.tree_util.tree_leaves(place)
        ]
        if handed:
            raise ValueError(_HANDED_TO_A_TRANSFORM_MSG.format(leaves="\n".join(handed)))
        # inside `trainable` such a place is `optax.MaskedNode()`: any label fits it
        first = _first_label(leaves)
        return treedef.unflatten([first if isinstance(x, _NeverTrained) else x for x in leaves])

    def fitted(self) -> _T:
        """The label tree as optax takes it: the first label in place of each frozen value
        (a leaf fits both the frozen value and `optax.MaskedNode()`)."""
        tree = self.tree
        leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_wrapper)
        if not any(is_wrapper(x) for x in leaves):
            return tree
        label = _first_label(leaves)
        return jax.tree_util.tree_map(
            lambda x: label if is_wrapper(x) else x, tree, is_leaf=is_wrapper
        )

    def __repr__(self) -> str:
        return f"Labels({self.tree!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Labels):
            return NotImplemented
        return jax.tree_util.tree_flatten(self.tree) == jax.tree_util.tree_flatten(other.tree)

    __hash__ = None  # type: ignore[assignment]


# A `Labels` is a pytree node whose one child is its (fitted) tree; mapping over it gives
# the mapped tree itself (not a `Labels`), so optax's per-label masks are boolean trees.
jax.tree_util.register_pytree_with_keys(
    Labels,
    lambda labels: (((jax.tree_util.GetAttrKey("tree"), labels.fitted()),), None),
    lambda _, children: tuple(children)[0],
    flatten_func=lambda labels: ((labels.fitted(),), None),
)


def _first_label(leaves: list[object]) -> object:
    """The first label of a label tree's leaves that names a transform of the user's."""
    return next((x for x in leaves if not is_wrapper(x) and not isinstance(x, _NeverTrained)), None)


_SELECTIONS_TYPE_MSG = (
    "`tc.optim.labels` takes a mapping of label -> selection, e.g. "
    "`{{'decay': model.at[Linear]['weight']}}`; got {found}."
)


def labels(
    tree: _T,
    selections: Mapping[Hashable, object],
    *,
    default: Hashable | None = "rest",
    strict: bool = True,
) -> Labels[_T]:
    """Labels for `optax.multi_transform` from a mapping of label -> selection.

    A leaf of a frozen or state field is claimed by no selection and labelled
    `"(frozen)"` or `"(state)"` (see `Labels`).

    **Arguments**

    - `tree`: the parameters (a `TreeClass` model or any pytree).
    - `selections`: label -> selection, where a selection is an `.at` selection made on
      `tree` (`model.at[Linear]["weight"]`), or a selector for `tree.at[...]` (a name,
      a type, `tc.glob("layers.*.bias")`, a boolean mask tree, ...).
    - `default`: the label of the leaves no selection claims (frozen and state leaves
      aside); `None` makes every unclaimed leaf an error.
    - `strict`: whether a label whose selection selects no leaf, or only frozen and
      state leaves, is an error (the default: a typo would otherwise leave that label's
      transform unused).

    **Returns**

    A `Labels`: hand it to `optax.multi_transform(transforms, labels)`; its `.tree` is the
    label tree, with the structure of `tree`.

    **Raises**

    `ValueError` when selections overlap (naming every leaf claimed twice and by which
    labels), when `default=None` leaves leaves unclaimed, when a selection was made on
    another tree, or (with `strict`) when a label selects nothing or only frozen and
    state leaves (naming them); `TypeError` when `selections` is not a mapping.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    params = {"w1": jnp.ones((2, 2)), "b1": jnp.zeros(2), "w2": jnp.ones((2, 1))}
    labels = tc.optim.labels(params, {"decay": tc.glob("w*")}, default="plain")
    assert labels.tree == {"w1": "decay", "b1": "plain", "w2": "decay"}
    ```
    """
    if not isinstance(selections, Mapping):
        raise TypeError(_SELECTIONS_TYPE_MSG.format(found=describe(selections)))
    _check_strict(strict, "labels")
    # frozen values count as places here (their mask leaf is `False`); they are kept
    places = _Places(tree)
    names = leaf_roles(tree)
    claims: list[list[Hashable]] = [[] for _ in places.leaves]
    for label, selection in selections.items():
        on_tree = isinstance(selection, AtIndexer)
        indexer = _indexer(selection, ()) if on_tree else _indexer(tree, (selection,))
        made_on, selected = _selected_places(indexer, strict, f"The selection for label {label!r}")
        if made_on.treedef != places.treedef:  # made on another tree
            try:
                check_mask(made_on.treedef.unflatten(selected), tree)
                detail = ""
            except ValueError as error:
                detail = str(error).split("\n")[0]
            raise ValueError(_SELECTION_TREE_MSG.format(label=label, detail=detail))
        for index, is_selected in enumerate(selected):
            if is_selected:
                claims[index].append(label)
    overlaps = [
        f"    `{places.where(index)}`: " + ", ".join(map(repr, claimed))
        for index, claimed in enumerate(claims)
        if len(claimed) > 1
    ]
    if overlaps:
        raise ValueError(_OVERLAP_MSG.format(count=len(overlaps), claims="\n".join(overlaps)))
    if default is None:
        unclaimed = [
            f"    `{places.where(index)}`"
            for index, (leaf, c, role) in enumerate(zip(places.leaves, claims, names))
            if not c and not is_wrapper(leaf) and role not in NEVER_TRAINED
        ]
        if unclaimed:
            raise ValueError(
                _UNCLAIMED_MSG.format(count=len(unclaimed), paths="\n".join(unclaimed))
            )
    leaves = [
        leaf
        if is_wrapper(leaf)
        else _NeverTrained(f"({role})")
        if role in NEVER_TRAINED
        else (claimed[0] if claimed else default)
        for leaf, claimed, role in zip(places.leaves, claims, names)
    ]
    return Labels(places.treedef.unflatten(leaves))


def partition(
    transforms: Mapping[Hashable, object],
    tree: object,
    selections: Mapping[Hashable, object],
    *,
    default: Hashable | None = "rest",
    strict: bool = True,
) -> Any:
    """One optax transform per selection, in one call (needs optax).

    `optax.multi_transform(transforms, tc.optim.labels(tree, selections, ...))`, after
    checking that every label in use has a transform; the leaves labelled `"(frozen)"` /
    `"(state)"` get a transform with no state that keeps them as they are.

    **Arguments**

    - `transforms`: label -> optax `GradientTransformation`.
    - `tree`, `selections`, `default`, `strict`: as for `tc.optim.labels`.

    **Returns**

    An optax `GradientTransformation`.

    **Raises**

    `ImportError` without optax; `ValueError` as `tc.optim.labels` does, naming the key
    path of a leaf whose label has no transform, and for a transform labelled
    `"(frozen)"` or `"(state)"` when such leaves are present.

    ```python
    import jax.numpy as jnp
    import optax
    import treeclass as tc

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
    fitted = label_tree.fitted()
    never = sorted({x for x in jax.tree_util.tree_leaves(fitted) if isinstance(x, _NeverTrained)})
    taken = [label for label in never if label in transforms]
    if taken:
        raise ValueError(_RESERVED_LABEL_MSG.format(labels=taken))
    # a leaf no optimizer trains gets a transform that keeps it bit for bit, with no state
    keep = _keep_transform(optax)
    every: dict[Hashable, object] = {**transforms, **{str(label): keep for label in never}}

    def label_fn(params: object) -> object:
        if type(params).__name__ != _PLACEHOLDER_TYPE:
            check_labels(fitted, params)
        return fitted

    return combine(every, label_fn)


_RESERVED_LABEL_MSG = (
    "`tc.optim.partition` labels the leaves no optimizer trains {labels} and keeps them as "
    "they are; the transforms may not use these labels. Rename those transforms."
)


def _keep_transform(optax: Any) -> Any:
    """A transform with no state whose every update leaves its parameter as it is."""

    def update(updates: object, state: object, params: object = None) -> tuple[object, object]:
        def one(path: KeyPath, update: ArrayLike, param: ArrayLike | None = None) -> jax.Array:
            return _unchanged(update, param, functools.partial(path_str, updates, path))

        trees = (updates,) if params is None else (updates, params)
        return jax.tree_util.tree_map_with_path(one, *trees), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


# -- trainable: one transformation that updates exactly a selection ------------------------

_KEEP, _UPDATE, _FROZEN = range(3)
_KIND_NAMES = ("kept", "updated", "frozen")

_NOT_A_TRANSFORM_MSG = (
    "`tc.optim.trainable` takes an optax transformation first, then the model: "
    "`tc.optim.trainable(optax.adam(1e-3), model)`; got {found} first."
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


_MISSING_MSG = (
    "The {what} handed to `{method}` hold `None` at `{path}`, a leaf this optimizer "
    "trains. A gradient taken on `tc.optim.split`'s trained part holds `None` only where "
    "the optimizer trains nothing: split the model with the selection the optimizer was "
    "built with, e.g.\n"
    "    opt = tc.optim.trainable(tx, model.at[...]); params, rest = tc.optim.split(model.at[...])"
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
    """Which place of the model is updated, kept or frozen."""

    __slots__ = ("kinds", "places")

    def __init__(self, places: _Places, kinds: list[int]) -> None:
        self.kinds, self.places = kinds, places

    def split(self, tree: object, what: str, method: str) -> list[Any]:
        """What `tree` holds at each place of the model: a leaf, a frozen value (where the
        model has one; its value is not looked at), or `None` (where a gradient of
        `tc.optim.split`'s first part holds none)."""
        try:
            held: list[Any] | None = self.places.treedef.flatten_up_to(tree)
        except (ValueError, TypeError):
            held = None
        for index, (place, kind) in enumerate(zip(held or (), self.kinds)):
            if place is None:
                if kind == _UPDATE:
                    path = self.places.where(index)
                    raise ValueError(_MISSING_MSG.format(what=what, method=method, path=path))
            elif not is_wrapper(place) and not is_leaf_node(place):
                held = None
                break
            elif is_wrapper(place) != (kind == _FROZEN):
                self._refuse_refrozen(index, what, method, kind)
        if held is None:
            where, reason = _apart(self.places.tree, tree, what, "model", is_leaf=is_wrapper)
            raise ValueError(
                _TREE_MISFIT_MSG.format(what=what, method=method, path=where, reason=reason)
            )
        return held

    def _refuse_refrozen(self, index: int, what: str, method: str, kind: int) -> None:
        then = "a frozen value" if kind == _FROZEN else f"a leaf ({_KIND_NAMES[kind]})"
        now = "not frozen" if kind == _FROZEN else "frozen"
        s = "" if what.endswith("s") else "s"
        path = self.places.where(index)
        raise ValueError(
            _REFROZEN_MSG.format(what=what, s=s, method=method, path=path, then=then, now=now)
        )

    def selected(self, leaves: list[object], masked: object) -> object:
        """`leaves` as a tree in which only the updated ones are left (others `masked`)."""
        return self.places.treedef.unflatten(
            [x if kind == _UPDATE else masked for x, kind in zip(leaves, self.kinds)]
        )


def _unchanged(update: ArrayLike, param: ArrayLike | None, where: Callable[[], str]) -> jax.Array:
    """An update that `optax.apply_updates` adds to `param` without changing a bit: `-0.0`
    for inexact dtypes (`x + 0.0` turns -0.0 into 0.0), else zero."""
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


def _plan_of(selection: object, where: tuple[object, ...], strict: bool, name: str) -> _Plan:
    _check_strict(strict, name)
    selects = isinstance(selection, AtIndexer) or bool(where)
    if selects:
        places, chosen = _selected_places(_indexer(selection, where), strict)
    else:
        places = _Places(selection)
        names = leaf_roles(selection)
        # every other role is kept (a leaf of a field declared frozen gets an update too)
        chosen = [name == TRAINABLE for name in names]
    kinds = [
        _FROZEN if is_wrapper(leaf) else (_UPDATE if update else _KEEP)
        for leaf, update in zip(places.leaves, chosen, strict=True)
    ]
    if selects:
        for index, (leaf, kind) in enumerate(zip(places.leaves, kinds)):
            if kind == _UPDATE and not _is_inexact_leaf(leaf):
                path = places.where(index)
                raise ValueError(_NOT_INEXACT_MSG.format(path=path, found=describe(leaf)))
    elif strict and _UPDATE not in kinds:
        shown = ", ".join(f"{n} {name}" for name, n in Counter(names).items()) or "none"
        raise ValueError(
            _NOTHING_TRAINABLE_MSG.format(what=f"The {type(selection).__name__}", roles=shown)
        )
    return _Plan(places, kinds)


def _is_inexact_leaf(x: object) -> bool:
    # a selection is an explicit choice: a selected Python float trains too
    return isinstance(x, (float, complex)) or is_inexact_array(x)


def trainable(transform: object, selection: object, *where: object, strict: bool = True) -> Any:
    """An optax transformation that updates exactly a selection and nothing else (needs optax).

    `transform` sees the trained leaves only; every other leaf gets an update that
    `tc.optim.apply_updates` adds without changing a bit, and no optimizer state. The
    selection is computed once, here; `init` and `update` then take any tree of its
    structure (an abstract template, `tc.optim.split`'s gradient). More: the training guide.

    **Arguments**

    - `transform`: the optax transformation for the trained leaves. A mask or labels it
      takes (`optax.adamw(mask=...)`, `optax.multi_transform`) are taken on the tree it
      sees: pass them as functions of the parameters, e.g.
      `mask=lambda p: tc.optim.mask(p.at[Linear]["weight"])`.
    - `selection`: a model (or any pytree): its trainable leaves (`tc.roles`: inexact
      JAX or NumPy arrays, not frozen, not state) are updated. Or an `.at` selection
      (`model.at[Linear]["weight"]`), or a tree followed by selectors as for `mask`: the
      selected leaves are updated, except state and frozen ones (a selected Python float
      trains; a selected integer is an error).
    - `strict`: whether nothing to update is an error (the default).

    **Returns**

    An optax `GradientTransformationExtraArgs`. Pass the parameters to `update`
    (`opt.update(grads, state, model)`): the unchanged updates take their dtype from them.

    **Raises**

    `ImportError` without optax; `ValueError` for an empty selection (with `strict`), a
    selection reaching only state or frozen leaves (naming them), a selected leaf that
    is not inexact, or, from `init` and `update`, a tree that does not fit the model
    (naming the key path); `TypeError` from `update` for a PRNG key leaf
    (`optax.apply_updates` cannot add to a key: freeze it); what `.at` raises for a
    selector that does not fit.

    ```python
    import jax, jax.numpy as jnp, optax
    import treeclass as tc

    model = {"w": jnp.ones(2), "eps": 1e-5}  # a Python number: a leaf, not a parameter
    opt = tc.optim.trainable(optax.adamw(0.1, weight_decay=0.1), model)
    grads = jax.grad(lambda m: (m["w"] * m["eps"]).sum())(model)
    updates, state = opt.update(grads, opt.init(model), model)
    model = tc.optim.apply_updates(model, updates)
    assert model["eps"] == 1e-5 and (model["w"] != 1.0).all()
    ```
    """
    optax = _import_optax("trainable")
    if not all(callable(getattr(transform, name, None)) for name in ("init", "update")):
        raise TypeError(_NOT_A_TRANSFORM_MSG.format(found=describe(transform)))
    plan = _plan_of(selection, where, strict, "trainable")
    inner = optax.with_extra_args_support(transform)
    masked = optax.MaskedNode()

    def init(params: object) -> Any:
        return inner.init(plan.selected(plan.split(params, "parameters", "init"), masked))

    def update(updates: object, state: object, params: object = None, **extra_args: Any) -> Any:
        leaves = plan.split(updates, "updates", "update")
        sub_params = None
        param_leaves: list[Any] = [None] * len(leaves)
        if params is not None:
            param_leaves = plan.split(params, "parameters", "update")
            sub_params = plan.selected(param_leaves, masked)
        new, state = inner.update(plan.selected(leaves, masked), state, sub_params, **extra_args)
        updated = iter(jax.tree_util.tree_leaves(new))
        out = []
        for index, (leaf, param, kind) in enumerate(zip(leaves, param_leaves, plan.kinds)):
            if kind == _UPDATE:
                out.append(next(updated))
            elif kind == _FROZEN or leaf is None:  # `None`: nothing to update, nothing made
                out.append(leaf)
            else:
                out.append(_unchanged(leaf, param, functools.partial(plan.places.where, index)))
        return plan.places.treedef.unflatten(out), state

    return optax.GradientTransformationExtraArgs(init, update)


# -- split and merge: gradients of the trained leaves only ---------------------------------

_MERGE_MISFIT_MSG = (
    "`tc.optim.merge` takes the two parts `tc.optim.split` returned (or trees of the same "
    "structure, such as a gradient of the first); they part ways at `{path}`: {reason}."
)
_MERGE_BOTH_MSG = (
    "`tc.optim.merge` found a value in both parts at `{path}`: each place of the model is "
    "in one part (the other holds `None` there). Merge the parts of one `tc.optim.split`."
)


def split(selection: _T, *where: object, strict: bool = True) -> tuple[_T, _T]:
    """The model in two parts: the leaves an optimizer trains, and the rest.

    Both parts have the model's structure, with `None` where the other part holds a value;
    `merge` puts them back. The first part's gradient has no array for an untrained base,
    and a `tc.optim.trainable` of the same selection takes it (the training guide,
    "Gradients without the base").

    **Arguments**

    - `selection`, `*where`, `strict`: as for `tc.optim.trainable` (and raising as it
      does): a model (its trainable leaves), an `.at` selection (its selected leaves, less
      the frozen and state ones), or a tree and selectors.

    **Returns**

    `(params, rest)`: two trees of the model's structure.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    model = tc.nn.LoRA(tc.nn.Linear(8, 4, key=jax.random.key(0)), rank=2, key=jax.random.key(1))
    params, rest = tc.optim.split(model)
    grads = jax.grad(lambda p: tc.optim.merge(p, rest)(jnp.ones((3, 8))).sum())(params)
    assert grads.base_layer.weight is None  # no array as large as the base
    ```
    """
    plan = _plan_of(selection, where, strict, "split")
    leaves, treedef = plan.places.leaves, plan.places.treedef
    kept = [None if kind == _UPDATE else leaf for leaf, kind in zip(leaves, plan.kinds)]
    trained = [leaf if kind == _UPDATE else None for leaf, kind in zip(leaves, plan.kinds)]
    return treedef.unflatten(trained), treedef.unflatten(kept)


def merge(params: _T, rest: object) -> _T:
    """The model `tc.optim.split` parted: each place from the part that holds it.

    **Arguments**

    - `params`: the first part (or a tree of its structure: updated parameters, a
      gradient).
    - `rest`: the second part.

    **Returns**

    One tree of the model's structure.

    **Raises**

    `ValueError` naming the key path where the parts do not have one structure, or where
    both hold a value.

    ```python
    import jax.numpy as jnp
    import treeclass as tc

    model = {"w": jnp.ones(2), "n": jnp.arange(2)}
    params, rest = tc.optim.split(model)
    assert params == {"w": model["w"], "n": None} and rest["w"] is None
    assert tc.is_tree_equal(tc.optim.merge(params, rest), model)
    ```
    """
    trained, treedef = jax.tree_util.tree_flatten(params, is_leaf=_is_none_or_wrapper)
    others, other_def = jax.tree_util.tree_flatten(rest, is_leaf=_is_none_or_wrapper)
    if treedef != other_def:
        where, reason = _apart(
            params, rest, "second part", "first part", is_leaf=_is_none_or_wrapper
        )
        raise ValueError(_MERGE_MISFIT_MSG.format(path=where, reason=reason))
    merged = []
    for index, (a, b) in enumerate(zip(trained, others)):
        if a is not None and b is not None:
            path = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_none_or_wrapper)[0]
            raise ValueError(_MERGE_BOTH_MSG.format(path=path_str(params, path[index][0])))
        merged.append(b if a is None else a)
    return treedef.unflatten(merged)


def _is_unchanged_update(update: object) -> bool:
    """Whether a concrete `update` adds nothing to any value: all `-0.0`, or all zero."""
    if isinstance(update, Tracer) or not isinstance(update, (jax.Array, np.ndarray, np.generic)):
        return False
    if update.dtype == jax.dtypes.float0:  # the gradient of an integer leaf: nothing to add
        return True
    data = np.asarray(update)
    if np.issubdtype(data.dtype, np.inexact):
        # -0.0 is the one value `x + u == x` holds for, bit for bit, for every float x
        parts = (np.real(data), np.imag(data)) if np.iscomplexobj(data) else (data,)
        return all(bool(np.all((part == 0) & np.signbit(part))) for part in parts)
    return not data.any()


def _apply_one(param: Any, update: object) -> Any:
    if param is None or update is None or is_wrapper(param):  # a gap, a frozen value
        return param
    if not _is_inexact_leaf(param) or is_prng_key(param) or _is_unchanged_update(update):
        # integers, booleans, keys: no optimizer trains them; an update of -0.0: the
        # param as it is (its type, dtype, weak type and bits; a NaN's payload too)
        return param
    new = jnp.asarray(param + update)
    dtype = jnp.result_type(param)
    return new if new.dtype == dtype else new.astype(dtype)


def apply_updates(params: _T, updates: object) -> _T:
    """`optax.apply_updates` that leaves every value no optimizer changed exactly as it is.

    Integer, boolean and PRNG key leaves, frozen values, and leaves whose update is `None`
    or concretely all `-0.0` (what `tc.optim.trainable` gives the leaves it does not
    train) come back as the same object; any other leaf is `param + update` in the
    parameter's dtype and weak type (`optax.apply_updates` casts every sum, see the
    training guide).

    **Arguments**

    - `params`: the parameters (a model or any pytree).
    - `updates`: the updates, as `opt.update` returns them.

    **Returns**

    The updated parameters, with the structure of `params`.

    ```python
    import jax.numpy as jnp, numpy as np
    import treeclass as tc

    params = {"w": jnp.ones(2), "count": np.int64(2**40)}
    new = tc.optim.apply_updates(params, {"w": jnp.full(2, -0.1), "count": np.zeros(())})
    assert new["count"] is params["count"] and np.allclose(new["w"], 0.9)
    ```
    """
    return jax.tree_util.tree_map(_apply_one, params, updates, is_leaf=_is_none_or_wrapper)


def _is_none_or_wrapper(x: object) -> bool:
    return x is None or is_wrapper(x)


# -- scale_blocks: a factor per leaf, or per block of a stacked leaf -----------------------

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
    full = jnp.shape(update)
    got = tuple(getattr(factor, "shape", ())) if shape is None else shape
    if len(got) > len(full) or tuple(got) != tuple(full[: len(got)]):
        raise ValueError(_SCALE_RANK_MSG.format(where=where(), got=got, want=full))
    if isinstance(factor, bool | np.bool_):
        return update if factor else jnp.zeros_like(update)
    if isinstance(factor, numbers.Number) or is_number(factor):
        factor = plain_number(factor)  # weak: a NumPy or ml_dtypes scalar keeps the dtype
        return update if factor == 1 else update * factor
    factor = jnp.asarray(factor)
    factor = factor.reshape(factor.shape + (1,) * (len(full) - factor.ndim))
    if factor.dtype == jnp.bool_:
        return jnp.where(factor, update, jnp.zeros_like(update))
    return (update * factor).astype(jnp.result_type(update))


def _compact_factor(factor: object) -> tuple[object, tuple[int, ...] | None]:
    """`factor` with the trailing axes along which it is constant dropped (a number when
    constant: factors built with `model.at[...].set(1.0)` would double the model's memory),
    and its shape as given (None for a number)."""
    if not isinstance(factor, np.ndarray | jax.Array):
        return factor, None
    shape = tuple(factor.shape)
    if isinstance(factor, Tracer) or not readable_here(factor) or factor.size == 0:
        return factor, shape
    values = np.asarray(local_copy(factor))
    for kept in range(values.ndim):
        lead = values.reshape(values.shape[:kept] + (-1,))
        if bool((lead == lead[..., :1]).all()):
            return (lead[..., 0].item() if kept == 0 else lead[..., 0]), shape
    return factor, shape


def scale_blocks(factors: object) -> Any:
    """An optax transform multiplying each update by a factor: one per leaf, or per block.

    Put it last in a chain; build the factors from the model with `.at` (the stacked
    guide, "Optimizer settings", shows per-block freezing and layer-wise decay).

    **Arguments**

    - `factors`: a tree of the parameters' structure (or a prefix of it) whose leaves are
      numbers (`0` freezes a leaf, `0.5` halves its learning rate; booleans act as masks)
      or arrays along the leading axes of their leaf (one factor per block of a stack).

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
    # flattened once; a frozen value in them stands where the updates hold no leaf
    flat, factors_def = jax.tree_util.tree_flatten_with_path(factors, is_leaf=is_wrapper)
    compacted = [(path, *_compact_factor(factor)) for path, factor in flat]

    def update(updates: object, state: object, params: object = None) -> tuple[object, object]:
        try:
            subtrees = factors_def.flatten_up_to(updates)
        except (ValueError, TypeError):
            where, reason = _apart(
                updates, factors, "factors", "updates", other_covers=is_leaf_node
            )
            raise ValueError(_SCALE_MISMATCH_MSG.format(where=where, reason=reason)) from None
        scaled = [
            jax.tree_util.tree_map(
                functools.partial(
                    _scale_one, factor, shape, functools.partial(path_str, updates, path)
                ),
                subtree,
            )
            for (path, factor, shape), subtree in zip(compacted, subtrees)
        ]
        return factors_def.unflatten(scaled), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
