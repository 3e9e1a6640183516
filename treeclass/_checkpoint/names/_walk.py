"""A tree as checkpoint entries, walked through its rows of the node-kind table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.core import Tracer
from jax.tree_util import GetAttrKey

from ..._structure import LEAF as LEAF_KIND_CODE
from ..._structure import node_kind, open_node, row_of
from ..._structure import rebuild as rebuild_node
from ..._values import entry_name, path_str
from ..files._json import check_text

LEAF, FROZEN, STATIC = "leaf", "frozen", "static"
# what a value is to a checkpoint
TENSOR, NUMBER, PLAIN, OBJECT = "tensor", "number", "plain", "object"
NUMBERS = (bool, int, float, complex)


def walk(
    node: Any,
    visit: Callable[[tuple, str, Any], Any],
    rebuild: bool,
    path: tuple = (),
    frozen: bool = False,
) -> Any:
    """Call `visit(path, kind, value)` on every leaf (`FROZEN` inside a wrapper kind's
    value) and static part (`STATIC`) of each node's row; the children are the node's JAX
    flatten. With `rebuild`, the tree of what `visit` returned, wrappers wrapped again."""
    row = row_of(node)
    wrapper = row.wrapper
    if wrapper is not None:
        value = wrapper.unwrap(node)
        inner = walk(value, visit, rebuild, path, frozen=True)
        # an unchanged wrapped value keeps its node: wrapping again would hash it again
        if not rebuild or inner is value:
            return node if rebuild else None
        if wrapper.rewrap is None:
            raise TypeError(
                f"cannot restore {wrapper.what} (a `{type(node).__name__}`): its row in the table "
                "of node kinds gives no way to wrap a value again (`Wrapper.rewrap` is None)"
            )
        return wrapper.rewrap(node, inner)
    for name, value in row.static_values(node).items():
        visit((*path, GetAttrKey(name)), STATIC, value)
    kind = node_kind(node)
    opened = None if kind == LEAF_KIND_CODE else open_node(node, kind)
    if opened is None:
        return visit(path, FROZEN if frozen else LEAF, node)
    children = [
        walk(child, visit, rebuild, (*path, entry), frozen)
        for entry, child in zip(opened.entries, opened.children)
    ]
    return rebuild_node(node, kind, opened.aux, children) if rebuild else None


def category(value: object) -> str:
    if isinstance(value, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return TENSOR
    if type(value) in NUMBERS:
        return NUMBER
    if is_plain(value):
        return PLAIN
    return OBJECT


# how deeply tuples and lists of plain values may nest to be recorded: a file's metadata
# is read with a bounded nesting depth, and what we write must be readable
PLAIN_DEPTH = 16


def is_plain(value: Any, depth: int = 0) -> bool:
    kind = type(value)
    if kind in (str, bool, int, float, complex) or value is None:
        return True
    if kind not in (tuple, list):
        return False
    if depth >= PLAIN_DEPTH:
        raise ValueError(f"it nests tuples or lists more than {PLAIN_DEPTH} levels deep")
    return all(is_plain(x, depth + 1) for x in value)


def _check_plain_text(value: Any) -> None:
    if type(value) is str:
        check_text(value, "the string")
    elif type(value) in (tuple, list):
        for item in value:
            _check_plain_text(item)


NO_DATA = (
    "an abstract value at {where} ({value}): there is no data to save. Save the model "
    "itself (load or build it), not its `jax.eval_shape` template."
)


def is_abstract(value: object) -> bool:
    return isinstance(value, (jax.ShapeDtypeStruct, Tracer))


def key_name(key: object) -> str:
    return str(entry_name(key))


def state_key(key: object) -> Any:
    name = entry_name(key)
    return name if name is not key else str(key)


class Entry(NamedTuple):
    path: tuple
    kind: str  # leaf, frozen or static
    value: Any
    name: str  # the checkpoint name: key path joined with dots
    category: str  # tensor, number, plain or object
    # the key path of the node the entry belongs to: its own for a leaf or frozen value; for
    # a static value (or a part of one) that of the TreeClass holding the field
    node: tuple

    @property
    def is_data(self) -> bool:
        """An array or a number outside static fields: what every checkpoint holds."""
        return self.kind != STATIC and self.category in (TENSOR, NUMBER)


_NO_KEYS = (
    "{action} needs a tree with keys, but got a single {type}: the checkpoint names its "
    "values by their key paths. Put it in a container:\n"
    "    before: {call}\n"
    "    after:  {fixed}"
)
_SAME_NAME = (
    "Two key paths of the tree have the same checkpoint name {name!r}: {first} and "
    "{second}. Names join the keys with dots, so a dict key containing a dot, or the keys "
    "0 and '0' side by side, collide. Rename one of the keys."
)
_UNNAMEABLE = (
    "{where} cannot be recorded in a checkpoint: {reason}. Checkpoint names and values must "
    "be readable by every safetensors reader; change the key or the value."
)


def static_parts(value: object) -> list[tuple[Any, Any]]:
    """The parts of a static container with their keys, each an entry (`act.0`) of its own."""
    try:
        opened = open_node(value, node_kind(value))
    except Exception:  # a broken flatten: an object like any other
        return []
    return [] if opened is None else list(zip(opened.entries, opened.children))


def entries(tree: object, action: str, call: str, to_file: bool = False) -> list[Entry]:
    """Every leaf, frozen leaf and static field (or part) of `tree`, named."""
    found: list[Entry] = []
    seen: dict[str, Entry] = {}

    def add(path: tuple, kind: str, value: object, node: tuple, depth: int = 0) -> None:
        name = ".".join(key_name(key) for key in path)
        try:
            entry = Entry(path, kind, value, name, category(value), node)
            if to_file:
                check_text(name, "the checkpoint name")
                if entry.category == PLAIN:
                    _check_plain_text(value)
            parts = static_parts(value) if kind == STATIC and entry.category == OBJECT else ()
            if parts and depth >= PLAIN_DEPTH:
                raise ValueError(f"it nests containers more than {PLAIN_DEPTH} levels deep")
        except ValueError as error:
            raise ValueError(_UNNAMEABLE.format(where=path_str(tree, path), reason=error)) from None
        other = seen.setdefault(name, entry)
        if other is not entry:
            first, second = path_str(tree, other.path), path_str(tree, path)
            raise ValueError(_SAME_NAME.format(name=name, first=first, second=second))
        found.append(entry)
        for key, part in parts:
            add((*path, key), STATIC, part, node, depth + 1)

    def visit(path: tuple, kind: str, value: object) -> None:
        if not path:
            fixed = call.replace("value", "{'value': value}")
            raise ValueError(
                _NO_KEYS.format(action=action, type=type(value).__name__, call=call, fixed=fixed)
            )
        add(path, kind, value, path[:-1] if kind == STATIC else path)

    walk(tree, visit, rebuild=False)
    return found
