"""State dicts: a tree's data as a nested dict, and a nested dict as a catalog."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
from jax.core import Tracer

from ..files._source import dtype_name
from ._catalog import Stored
from ._walk import PLAIN, TENSOR, category, entries, state_key


class StateCatalog:
    """A nested state dict (as `state_dict` makes it, or orbax restores it) by name."""

    label = "the state dict"
    title = "The state dict"
    records_values = False  # a state dict has no strings or static values to check
    call = "tc.from_state_dict(like, state)"

    def __init__(self, state: dict) -> None:
        self.problems: list[str] = []
        self.values: dict[str, Any] = {}
        self._flatten(state, ())

    def _flatten(self, node: Any, prefix: tuple[str, ...]) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = (*prefix, str(key))
            if isinstance(value, (dict, list, tuple)):
                self._flatten(value, where)
                continue
            name = ".".join(where)
            if name in self.values:
                raise ValueError(
                    f"the state dict has two values named {name!r} (an int key and a "
                    "string key alike?); rename one"
                )
            self.values[name] = value

    def names(self) -> Iterator[str]:
        return iter(self.values)

    def stored(self, name: str) -> Stored | None:
        if name not in self.values:
            return None
        value = self.values[name]
        if category(value) == TENSOR:
            return Stored(TENSOR, dtype_name(value), tuple(value.shape))
        return Stored(PLAIN, value=value)

    def fetch(self, name: str) -> Any:
        return self.values[name]


def state_dict_of(tree: object) -> dict:
    """The data of `tree` as a nested dict (see `tc.state_dict`)."""
    out: dict = {}
    for entry in entries(tree, "tc.state_dict", "tc.state_dict(value)"):
        if not entry.is_data:
            continue
        value = entry.value
        if isinstance(value, Tracer):  # a frozen array of an abstract model
            value = jax.ShapeDtypeStruct(value.shape, value.dtype)
        node = out
        for key in entry.path[:-1]:
            node = node.setdefault(state_key(key), {})
        node[state_key(entry.path[-1])] = value
    return out
