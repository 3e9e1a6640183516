"""Roles: what each value of a tree is for (trainable, state, frozen, other, static), with
one answer for every tool (`tc.optim.trainable`, `tc.tree_summary`, `tc.roles`); `roles`
says what each role is. A role is declared by a field of the class (`_fields.ROLE_KEY` in
its metadata); `tc.freeze` wins over a declared role, the innermost declaration over
outer ones, a declaration over the kind of the value. The `NEVER_TRAINED` roles (state,
frozen) outrank any selection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from . import _node
from ._fields import FIELD_ROLES, ROLE_KEY
from ._structure import LEAF, is_wrapper, node_kind, open_node, row_of, wrapper_of
from ._values import is_array, is_inexact_array

_T = TypeVar("_T")

__all__ = [
    "TRAINABLE",
    "STATE",
    "FROZEN",
    "STATIC",
    "OTHER",
    "NEVER_TRAINED",
    "ROLE_KEY",
    "roles",
    "is_trainable_value",
    "static_values",
    "field_role",
    "declared_children",
    "leaf_role",
    "leaf_roles",
    "declares_state",
]

TRAINABLE = "trainable"
STATE = "state"
FROZEN = "frozen"
STATIC = "static"
OTHER = "other"
MIXED = "mixed"  # a node where printing stops and whose leaves play several roles
# the roles that outrank any selection: no optimizer helper trains, decays or keeps
# optimizer state for such a leaf, however it was selected
NEVER_TRAINED = frozenset({STATE, FROZEN})

_UNKNOWN_ROLE_MSG = (
    "The field `{cls}.{name}` has metadata role {role!r}; the roles a field can declare "
    "are {known}. Write\n"
    "    {name}: jax.Array = tc.field(role='state')\n"
    "for a value the forward pass updates (running statistics, counters, caches), or\n"
    "    {name}: jax.Array = tc.field(role='frozen')\n"
    "for a pretrained value that is never trained."
)


def is_trainable_value(x: object) -> bool:
    """Whether a leaf's value makes it trainable: an inexact JAX, NumPy or abstract array
    (a template gets its model's roles); Python numbers and NumPy scalars are not arrays."""
    return (is_array(x) or isinstance(x, jax.ShapeDtypeStruct)) and is_inexact_array(x)


def field_role(cls: type, name: str) -> str | None:
    """The role a TreeClass field declares (`"state"`, `"frozen"`), or `None`."""
    field = _node.fields_of(cls).get(name)
    if field is None:
        return None
    role = field.metadata.get(ROLE_KEY)
    if role is None:
        return None
    if role not in FIELD_ROLES:
        raise ValueError(
            _UNKNOWN_ROLE_MSG.format(
                cls=cls.__name__, name=name, role=role, known=", ".join(map(repr, FIELD_ROLES))
            )
        )
    return role


_NO_ROLES: dict[str, str] = {}


@functools.lru_cache(maxsize=4096)
def _declared_fields(cls: type) -> dict[str, str]:
    # a class's fields are fixed when it is created: looked up once per class (speed only)
    found = {name: field_role(cls, name) for name in _node.fields_of(cls)}
    return {name: role for name, role in found.items() if role is not None} or _NO_ROLES


def declared_children(node: object) -> dict[str, str]:
    """Child name -> declared role, for the children of `node` (read-only): the fields of
    the TreeClass its row names (`NodeKind.roles_of`: itself, or a stack's block)."""
    holder = row_of(node).roles_of(node)
    if holder is None:
        return _NO_ROLES
    if holder is not node:
        return declared_children(holder)
    cls: type = type(node)  # `type[Any]` is not `Hashable` to mypy; a class is
    return _declared_fields(cls)


def declares_state(tree: object) -> bool:
    """Whether a TreeClass node of `tree` has a field that declares a role."""
    return any(declared_children(node) for node in _node.treeclass_nodes(tree))


def leaf_role(x: object, in_state: bool | str) -> str:
    """The role of one leaf (or frozen value); `in_state`: the role its field declares
    (`True`: state), or a false value."""
    wrapper = wrapper_of(x)
    if wrapper is not None:  # a frozen value: its wrapper kind says its role
        return wrapper.role
    if in_state:
        return STATE if in_state is True else in_state
    return TRAINABLE if is_trainable_value(x) else OTHER


def leaf_roles(
    tree: object, in_state: bool | str = False, is_leaf: Callable[[Any], bool] | None = None
) -> list[str]:
    """The roles of `jax.tree_util.tree_leaves(tree, is_leaf=...)`, frozen values counted as
    leaves; a node `is_leaf` holds for gets the role its leaves share, or `"mixed"`."""
    out: list[str] = []
    _collect(tree, in_state, is_leaf, out)
    return out


def _collect(
    node: object, in_state: bool | str, is_leaf: Callable[[Any], bool] | None, out: list[str]
) -> None:
    wrapper = wrapper_of(node)
    if wrapper is not None:
        out.append(wrapper.role)
        return
    if is_leaf is not None and is_leaf(node):
        found = set(leaf_roles(node, in_state))
        out.append(found.pop() if len(found) == 1 else MIXED)
        return
    kind = node_kind(node)
    opened = None if kind == LEAF else open_node(node, kind)
    if opened is None:
        out.append(leaf_role(node, in_state))
        return
    declared = declared_children(node)
    for entry, child in zip(opened.entries, opened.children, strict=True):
        # the innermost declaration counts (a state field inside a frozen subtree is state)
        _collect(child, (declared.get(entry.name) if declared else None) or in_state, is_leaf, out)


# Typed as the tree (as `tc.optim.mask` is): the same node types, with role names as leaves.
def roles(tree: _T) -> _T:
    """The role of every value of `tree`: a tree of role names, one in place of each leaf.

    Every tool answers "what is trained, what is state, what is configuration" from these
    roles: `tc.optim.trainable` updates the trainable leaves, or the leaves of a selection
    that are neither state nor frozen (a declared role outranks a selection);
    `tc.tree_summary` counts each role apart.

    - `"trainable"`: an inexact (floating or complex) JAX or NumPy array (or an abstract
      `jax.ShapeDtypeStruct`) that is neither frozen nor state;
    - `"state"`: a leaf held, at any depth, by a field declared `tc.field(role="state")`
      (or `metadata={"role": "state"}`): running statistics, counters, caches the forward
      pass updates and no optimizer touches;
    - `"frozen"`: a value wrapped by `tc.freeze` (it stands where the frozen value stood:
      frozen values are not leaves), or a leaf held by a field declared
      `tc.field(role="frozen")` (traced by `jax.jit`, its reads stop gradients, never
      trained);
    - `"other"`: every other leaf (Python numbers, NumPy scalars, integer and boolean
      arrays, PRNG keys, strings): `jax.grad` sees them, the optimizer helpers do not
      train them.

    Static fields are not leaves: they do not appear here (`tc.tree_summary` counts them
    as `static`). Roles are judged on the values as they are: inside `jax.jit` Python
    numbers are arrays, so judge a model (build its optimizer) as it was constructed.

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

    class Norm(tc.TreeClass):
        scale: jax.Array
        mean: jax.Array = tc.field(role="state")

        def __init__(self, n):
            self.scale = jnp.ones(n)
            self.mean = jnp.zeros(n)
            self.eps = 1e-5                       # a Python number: a leaf, not trained
            self.name = tc.freeze("norm")

    assert jax.tree.leaves(tc.roles(Norm(3))) == ["trainable", "state", "other", "frozen"]
    ```
    """
    treedef = jax.tree_util.tree_structure(tree, is_leaf=is_wrapper)
    return treedef.unflatten(leaf_roles(tree))


def static_values(tree: object) -> Iterator[tuple[Any, str, Any]]:
    """`(node, name, value)` for every static field of every TreeClass node of `tree`
    (not inside frozen values)."""
    for node in _node.treeclass_nodes(tree):
        for name, value in _node.static_values(node).items():
            yield node, name, value
