"""optax integration: per-leaf optimizers from `.at` selections.

Three ways to give leaves different treatment, from lightest to most explicit:

- `mask(selection)`: a boolean tree, `True` exactly at the selected leaves, for
  `optax.masked`, `optax.adamw(mask=...)`, `optax.freeze`, `optax.selective_transform`;
- `labels(tree, {label: selection}, default=...)`: labels for `optax.multi_transform` /
  `optax.partition`; `partition(transforms, tree, {label: selection})` builds the
  optimizer in one call;
- `tc.freeze` (or `tc.tree_mask`) on the tree itself: frozen leaves are pytree nodes
  without children, so `opt.init` and `opt.update` never see them. This needs nothing
  from this module.

`check_mask` and `check_labels` say where a mask or label tree and the parameters part
ways, naming the key path, before optax fails with a structure mismatch.

optax is an optional dependency: nothing here imports it, except `partition`, which does
so when called.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from ._at import AtIndexer, at
from ._mask import is_frozen

__all__ = ["mask", "labels", "Labels", "check_mask", "check_labels", "partition"]

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
# key paths and one-level views of a tree


def _path_str(path: tuple[Any, ...], root: str = "tree") -> str:
    return root + jax.tree_util.keystr(path)


def _is_leaf(node: Any) -> bool:
    # a childless node (None, (), a frozen value) has one node and no leaves
    treedef = jax.tree_util.tree_structure(node)
    return treedef.num_nodes == 1 and treedef.num_leaves == 1


def _one_level(node: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """The `(key, child)` pairs of `node` and the treedef of this level alone."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    return [(path[0], child) for path, child in flat], treedef


def _describe(node: Any) -> str:
    if is_frozen(node):
        return "a frozen value (a node without leaves)"
    if _is_leaf(node):
        shape, dtype = getattr(node, "shape", None), getattr(node, "dtype", None)
        if shape is not None and dtype is not None:
            return f"a leaf {dtype}{list(shape)}"
        return f"a leaf {type(node).__name__} {node!r:.40}"
    if jax.tree_util.tree_structure(node).num_leaves == 0:
        return f"a node without leaves ({type(node).__name__})"
    return f"a `{type(node).__name__}` node"


# --------------------------------------------------------------------------------------
# checking that a mask or label tree fits the parameters

_NOT_A_PREFIX_MSG = (
    "The {what} does not fit the parameters at `{path}`: {found} in the {what}, {expected} "
    "in the parameters.\n{hint}"
    "A {what} must have the structure of the parameters, or of a prefix of them (a single "
    "value may stand for a whole subtree). Build it from the same tree you hand to optax:\n"
    "    before: m = tc.optim.mask(model.at[...]); model = model.at[...].apply(tc.freeze)\n"
    "    after:  model = model.at[...].apply(tc.freeze); m = tc.optim.mask(model.at[...])"
)
_KEYS_HINT = "Keys only in the {what}: {extra}; keys only in the parameters: {missing}.\n"
_TYPE_HINT = "Node types differ: `{found}` in the {what}, `{expected}` in the parameters.\n"
_AUX_HINT = (
    "Both are `{type}` nodes with the same keys, but their static data differ (a static "
    "field, or the value of a frozen leaf).\n"
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


def _mismatch_hint(found: Any, expected: Any, what: str) -> str:
    if type(found) is not type(expected):
        return _TYPE_HINT.format(
            found=type(found).__name__, expected=type(expected).__name__, what=what
        )
    found_keys = [jax.tree_util.keystr((k,)) for k, _ in _one_level(found)[0]]
    expected_keys = [jax.tree_util.keystr((k,)) for k, _ in _one_level(expected)[0]]
    shown = lambda keys: ", ".join(keys) or "none"
    if found_keys != expected_keys:
        extra = [k for k in found_keys if k not in expected_keys]
        missing = [k for k in expected_keys if k not in found_keys]
        if not extra and not missing:
            return (
                f"The keys are in another order: {shown(found_keys)} in the {what}, "
                f"{shown(expected_keys)} in the parameters.\n"
            )
        return _KEYS_HINT.format(what=what, extra=shown(extra), missing=shown(missing))
    return _AUX_HINT.format(type=type(found).__name__)


def _walk_prefix(
    tree: Any,
    params: Any,
    path: tuple[Any, ...],
    what: str,
    check_leaf: Callable[[Any, tuple[Any, ...]], None],
) -> None:
    if _is_leaf(tree):
        check_leaf(tree, path)
        return
    children, treedef = _one_level(tree)
    param_is_leaf = _is_leaf(params)
    param_children, param_treedef = ([], None) if param_is_leaf else _one_level(params)
    if param_is_leaf or treedef != param_treedef:
        hint = "" if param_is_leaf else _mismatch_hint(tree, params, what)
        raise ValueError(
            _NOT_A_PREFIX_MSG.format(
                what=what,
                path=_path_str(path),
                found=_describe(tree),
                expected=_describe(params),
                hint=hint,
            )
        )
    for (key, child), (_, param_child) in zip(children, param_children):
        _walk_prefix(child, param_child, (*path, key), what, check_leaf)


def _check_prefix(
    tree: Any, params: Any, what: str, check_leaf: Callable[[Any, tuple[Any, ...]], None]
) -> None:
    if jax.tree_util.tree_structure(tree) == jax.tree_util.tree_structure(params):
        # the common case, one comparison; leaves still get their check
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            check_leaf(leaf, path)
        return
    _walk_prefix(tree, params, (), what, check_leaf)


def _check_mask_leaf(leaf: Any, path: tuple[Any, ...]) -> None:
    if isinstance(leaf, (bool, np.bool_)):
        return
    if getattr(leaf, "dtype", None) == np.bool_ and getattr(leaf, "shape", None) == ():
        return
    raise TypeError(_MASK_LEAF_MSG.format(path=_path_str(path), found=_describe(leaf)))


def check_mask(mask: Any, params: Any) -> Any:
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
        assert "keys only in the parameters: ['b']" in str(error)
    ```
    """
    _check_prefix(mask, params, "mask", _check_mask_leaf)
    return mask


def check_labels(labels: Any, params: Any, transforms: Iterable[Hashable] | None = None) -> Any:
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

    def check_leaf(leaf: Any, path: tuple[Any, ...]) -> None:
        try:
            hash(leaf)
        except TypeError:
            raise TypeError(
                _UNHASHABLE_LABEL_MSG.format(path=_path_str(path), found=_describe(leaf))
            ) from None
        if known is not None and leaf not in known:
            raise ValueError(
                _UNKNOWN_LABEL_MSG.format(label=leaf, path=_path_str(path), known=known)
            )

    _check_prefix(tree, params, "label tree", check_leaf)
    return labels


# --------------------------------------------------------------------------------------
# masks from selections


class _Selected:
    """Stands in for a selected leaf while a mask is built."""

    __slots__ = ()


_SELECTED = _Selected()

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


def _whole_leaf_flag(path: tuple[Any, ...], x: Any) -> Any:
    if not _is_bool_array(x):
        return x
    where = _path_str(path, root="mask")
    if isinstance(x, jax.core.Tracer):
        raise ValueError(_PARTIAL_SELECTION_MSG.format(where=f"{where} (traced)"))
    if x.all():
        return True
    if not x.any():
        return False
    raise ValueError(_PARTIAL_SELECTION_MSG.format(where=where))


def _whole_leaf_selector(selector: Any) -> Any:
    """`selector`, with the leaves of a mask selector made whole-leaf Python bools.

    An array leaf in a mask selects elements (`jnp.where` semantics); for an optax mask it
    must select all of its leaf or none of it.
    """
    leaves = jax.tree_util.tree_leaves(selector, is_leaf=is_frozen)
    if not any(is_frozen(x) or _is_bool_array(x) for x in leaves):
        return selector
    # a frozen value in a mask (as `mask` returns them) is never selected; as `False` it
    # fits the tree when frozen values are taken as leaves, as `mask` takes them
    return jax.tree_util.tree_map_with_path(
        lambda path, x: False if is_frozen(x) else _whole_leaf_flag(path, x),
        selector,
        is_leaf=is_frozen,
    )


def _is_bool_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == np.bool_


def _indexer(selection: Any, where: tuple[Any, ...]) -> AtIndexer:
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


def mask(selection: Any, *where: Any) -> Any:
    """A boolean tree, `True` exactly at the leaves a selection picks.

    The result has the structure of the selected tree (same node types, frozen values
    kept as they are), so optax accepts it wherever it takes a mask: `optax.masked`,
    `optax.adamw(mask=...)` (and every optimizer with a `mask`/`weight_decay_mask`),
    `optax.freeze`, `optax.selective_transform(freeze_mask=...)`. Its leaves are plain
    `bool`s, so it is safe when the model class defines `__call__`: `optax.masked` tells a
    mask function from a mask tree by its leaves (since the fix of optax issue #913),
    which are never callable here. (For `optax.multi_transform`, which calls any callable
    it gets, use `labels`.)

    Frozen values (`tc.freeze`) are not leaves, so a mask never selects them; a selection
    that reaches only frozen values gives an all-`False` mask rather than an error.

    **Arguments**

    - `selection`: an `.at` selection such as `model.at[Linear]["weight"]` or
      `tc.at(tree)["layers"][0]`; or a tree, followed by selectors.
    - `*where`: selectors applied one level after another, as `.at[a][b]` would:
      `mask(model, Linear, "weight")` is `mask(model.at[Linear]["weight"])`.

    **Returns**

    A tree of `bool` with the structure of the tree the selection was made on.

    **Raises**

    What `.at` raises for a selector that does not fit the tree (a missing key, say), and
    `ValueError` for a boolean array selector that picks only some elements of a leaf.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
    assert tc.optim.mask(tc.at(params)["w"]) == {"w": True, "b": False}
    assert tc.optim.mask(params, "b") == {"w": False, "b": True}
    ```
    """
    indexer = _indexer(selection, where)
    # frozen values count as leaves here, so that a selection reaching only frozen values
    # is not an error; they are put back unchanged below
    marked = indexer.apply(lambda _: _SELECTED, is_leaf=is_frozen)
    return jax.tree_util.tree_map(
        lambda old, new: old if is_frozen(old) else new is _SELECTED,
        indexer.tree,
        marked,
        is_leaf=is_frozen,
    )


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


class Labels:
    """A label tree for `optax.multi_transform` / `optax.partition`, as a label function.

    optax calls any callable it is given as labels, and a label tree whose root is a
    model class with `__call__` is callable; so labels reach optax wrapped in this
    function, which returns the tree (after checking that it fits the parameters, so a
    mismatch names its key path). The tree itself is `.tree`.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    labels = tc.optim.Labels({"w": "adam", "b": "sgd"})
    assert labels({"w": jnp.ones(2), "b": jnp.ones(2)}) == {"w": "adam", "b": "sgd"}
    ```
    """

    __slots__ = ("tree",)

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def __call__(self, params: Any) -> Any:
        # `optax.tree_utils.tree_map_params` initialises with a stand-in object instead
        # of the parameters; it only needs the tree back
        if type(params).__name__ != _PLACEHOLDER_TYPE:
            check_labels(self.tree, params)
        return self.tree

    def __repr__(self) -> str:
        return f"Labels({self.tree!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Labels):
            return NotImplemented
        return jax.tree_util.tree_structure(self.tree) == jax.tree_util.tree_structure(
            other.tree
        ) and jax.tree_util.tree_leaves(self.tree) == jax.tree_util.tree_leaves(other.tree)

    __hash__ = None  # type: ignore[assignment]


def _selection_mask(tree: Any, label: Hashable, selection: Any) -> Any:
    selected = mask(selection) if isinstance(selection, AtIndexer) else mask(tree, selection)
    if jax.tree_util.tree_structure(selected) != jax.tree_util.tree_structure(tree):
        try:
            check_mask(selected, tree)
            detail = ""
        except ValueError as error:
            detail = str(error).split("\n")[0]
        raise ValueError(_SELECTION_TREE_MSG.format(label=label, detail=detail))
    return selected


def labels(
    tree: Any, selections: Mapping[Hashable, Any], *, default: Hashable | None = "rest"
) -> Labels:
    """Labels for `optax.multi_transform` from a mapping of label -> selection.

    **Arguments**

    - `tree`: the parameters (a `TreeClass` model or any pytree).
    - `selections`: label -> selection, where a selection is an `.at` selection made on
      `tree` (`model.at[Linear]["weight"]`), or a selector for `tree.at[...]` (a name,
      a type, `tc.glob("layers.*.bias")`, a boolean mask tree, ...).
    - `default`: the label of the leaves no selection claims; `None` makes every
      unclaimed leaf an error.

    **Returns**

    A `Labels`: hand it to `optax.multi_transform(transforms, labels)`; its `.tree` is the
    label tree, with the structure of `tree`.

    **Raises**

    `ValueError` when selections overlap (naming every leaf claimed twice and by which
    labels), when `default=None` leaves leaves unclaimed, or when a selection was made on
    another tree.

    ```python
    import jax.numpy as jnp
    import treeclass as tc
    import treeclass.optim

    params = {"w1": jnp.ones((2, 2)), "b1": jnp.zeros(2), "w2": jnp.ones((2, 1))}
    labels = tc.optim.labels(params, {"decay": tc.glob("w*")}, default="plain")
    assert labels.tree == {"w1": "decay", "b1": "plain", "w2": "decay"}
    ```
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    claims: list[list[Hashable]] = [[] for _ in flat]
    for label, selection in selections.items():
        selected = jax.tree_util.tree_leaves(_selection_mask(tree, label, selection))
        for index, is_selected in enumerate(selected):
            if is_selected:
                claims[index].append(label)
    overlaps = [
        f"    `{_path_str(path)}`: " + ", ".join(map(repr, claimed))
        for (path, _), claimed in zip(flat, claims)
        if len(claimed) > 1
    ]
    if overlaps:
        raise ValueError(_OVERLAP_MSG.format(count=len(overlaps), claims="\n".join(overlaps)))
    if default is None:
        unclaimed = [f"    `{_path_str(path)}`" for (path, _), c in zip(flat, claims) if not c]
        if unclaimed:
            raise ValueError(
                _UNCLAIMED_MSG.format(count=len(unclaimed), paths="\n".join(unclaimed))
            )
    leaves = [claimed[0] if claimed else default for claimed in claims]
    return Labels(jax.tree_util.tree_unflatten(treedef, leaves))


def partition(
    transforms: Mapping[Hashable, Any],
    tree: Any,
    selections: Mapping[Hashable, Any],
    *,
    default: Hashable | None = "rest",
) -> Any:
    """One optax transform per selection, in one call (needs optax).

    Same as `optax.multi_transform(transforms, tc.optim.labels(tree, selections,
    default=default))`, after checking that every label in use has a transform.

    **Arguments**

    - `transforms`: label -> optax `GradientTransformation`.
    - `tree`, `selections`, `default`: as for `tc.optim.labels`.

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
    label_tree = labels(tree, selections, default=default)
    check_labels(label_tree, tree, transforms)
    combine = getattr(optax, "partition", None) or optax.multi_transform
    return combine(transforms, label_tree)
