"""Roles: what each value of a tree is for, one answer for every tool (`roles` says each).

A field declares a role (`_fields.ROLE_KEY` in its metadata); `tc.freeze` wins over a
declared role, the innermost declaration over outer ones, a declaration over the kind of
the value. The `NEVER_TRAINED` roles outrank any selection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from . import _node
from ._fields import FIELD_ROLES, ROLE_KEY
from ._structure import LEAF, is_wrapper, node_kind, open_node, row_of, wrapper_of
from ._values import entry_name, is_array, is_inexact_array

_T = TypeVar("_T")

TRAINABLE = "trainable"
STATE = "state"
FROZEN = "frozen"
STATIC = "static"
OTHER = "other"
MIXED = "mixed"  # a node where printing stops and whose leaves play several roles
NEVER_TRAINED = frozenset({STATE, FROZEN})

_UNKNOWN_ROLE_MSG = (
    "The field `{cls}.{name}` has metadata role {role!r}; the roles a field can declare "
    "are {known}. Write\n"
    "    {name}: jax.Array = tc.field(role='state')\n"
    "for a value the forward pass updates (running statistics, counters, caches), or\n"
    "    {name}: jax.Array = tc.field(role='frozen')\n"
    "for a pretrained value that is never trained."
)
_NO_ROLES: dict[str, str] = {}


@functools.lru_cache(maxsize=4096)
def _declared_fields(cls: type) -> dict[str, str]:
    """Field name -> the role it declares; a class's fields are fixed: looked up once."""
    found = {}
    for name, field in _node.fields_of(cls).items():
        role = field.metadata.get(ROLE_KEY)
        if role is not None and role not in FIELD_ROLES:
            known = ", ".join(map(repr, FIELD_ROLES))
            raise ValueError(
                _UNKNOWN_ROLE_MSG.format(cls=cls.__name__, name=name, role=role, known=known)
            )
        if role is not None:
            found[name] = role
    return found or _NO_ROLES


def fields_holder(node: object) -> Any:
    """The node whose declared fields name `node`'s children (`NodeKind.roles_of`), or None."""
    holder = row_of(node).roles_of(node)
    while holder is not None and holder is not node:  # a stack's block may be a stack
        node, holder = holder, row_of(holder).roles_of(holder)
    return holder


def declared_children(node: object) -> dict[str, str]:
    """Child name -> declared role, for the children of `node`."""
    holder = fields_holder(node)
    if holder is None:
        return _NO_ROLES
    cls: type = type(holder)  # `type[Any]` is not `Hashable` to mypy; a class is
    return _declared_fields(cls)


def leaf_role(x: object, in_state: bool | str) -> str:
    """The role of one leaf (or frozen value); `in_state`: the role its field declares
    (`True`: state), or a false value."""
    wrapper = wrapper_of(x)
    if wrapper is not None:  # a frozen value: its wrapper kind says its role
        return wrapper.role
    if in_state:
        return STATE if in_state is True else in_state
    trainable = (is_array(x) or isinstance(x, jax.ShapeDtypeStruct)) and is_inexact_array(x)
    return TRAINABLE if trainable else OTHER


def leaf_roles(
    tree: object, in_state: bool | str = False, is_leaf: Callable[[Any], bool] | None = None
) -> list[str]:
    """The roles of `jax.tree_util.tree_leaves(tree, is_leaf=...)`, frozen values counted as
    leaves; a node `is_leaf` holds for gets the role its leaves share, or `"mixed"`."""
    wrapper = wrapper_of(tree)
    if wrapper is not None:
        return [wrapper.role]
    if is_leaf is not None and is_leaf(tree):
        found = set(leaf_roles(tree, in_state))
        return [found.pop() if len(found) == 1 else MIXED]
    kind = node_kind(tree)
    opened = None if kind == LEAF else open_node(tree, kind)
    if opened is None:
        return [leaf_role(tree, in_state)]
    declared = declared_children(tree)
    out: list[str] = []
    for entry, child in zip(opened.entries, opened.children, strict=True):
        # the innermost declaration counts (a state field inside a frozen subtree is state)
        held = (declared.get(entry_name(entry)) if declared else None) or in_state
        out += leaf_roles(child, held, is_leaf)
    return out


# Typed as the tree (as `tc.optim.mask` is): the same node types, with role names as leaves.
def roles(tree: _T) -> _T:
    """The role of every value of `tree`: a tree of role names, one in place of each leaf.

    `"trainable"`: an inexact JAX or NumPy array (or `jax.ShapeDtypeStruct`), neither
    frozen nor state; `"state"`: a leaf held, at any depth, by a field declared
    `tc.field(role="state")`; `"frozen"`: a `tc.freeze`d value, or a leaf held by a field
    declared `tc.field(role="frozen")`; `"other"`: every other leaf (Python numbers,
    integer arrays, keys, strings). Every tool answers from these roles (the training
    guide's table says how); roles are judged on the values as they are.

    **Arguments**

    - `tree`: any pytree.

    **Returns**

    A tree of the structure of `tree` with a role name (`str`) in place of each leaf and
    of each frozen value.

    **Raises**

    `ValueError` for a field whose metadata declares an unknown role.

    ```python
    import jax, jax.numpy as jnp
    import treeclass as tc

    @tc.autoinit
    class Norm(tc.TreeClass):
        scale: jax.Array
        mean: jax.Array = tc.field(role="state")
        eps: float = 1e-5                       # a Python number: a leaf, not trained
        name: str = tc.freeze("norm")

    roles = tc.roles(Norm(jnp.ones(3), jnp.zeros(3)))
    assert jax.tree.leaves(roles) == ["trainable", "state", "other", "frozen"]
    ```
    """
    treedef = jax.tree_util.tree_structure(tree, is_leaf=is_wrapper)
    return treedef.unflatten(leaf_roles(tree))


def static_values(tree: object) -> Iterator[tuple[Any, str, Any]]:
    """`(node, name, value)` for every static field of every TreeClass node of `tree`."""
    for node in _node.treeclass_nodes(tree):
        for name, value in _node.static_values(node).items():
            yield node, name, value
