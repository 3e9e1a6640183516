"""A template's stacks as checkpoint names see them (the unrolled model names layer `i`
`blocks.{i}.attn.q`), from what a stack's row of the node-kind table says of its layers."""

from __future__ import annotations

from typing import NamedTuple

import jax

from ..._structure import is_wrapper, stack_of
from ._walk import key_name


def joined(prefix: str, name: str) -> str:
    """A name under `prefix` (either may be `""`: the root)."""
    return f"{prefix}.{name}" if prefix and name else prefix or name


class StackAt(NamedTuple):
    """A stack's leaves (`blocks.attn.q`) as per-layer names see them (`blocks.{i}.attn.q`)."""

    prefix: str  # the stack's own name ("" for a stack at the root)
    layers: int  # N, or R * P
    period: int  # 1 for a `Stacked`, P for a `Periodic`
    under: str | None = None  # a pattern's leaves are under `<under>.<position>`

    def _below(self, name: str) -> str | None:
        if self.prefix and not name.startswith(self.prefix + "."):
            return None
        return name[len(self.prefix) + 1 :] if self.prefix else name

    def layer_of(self, name: str) -> tuple[int, str] | None:
        """`(layer, rest)` of a per-layer name `<prefix>.<layer>.<rest>`, or None."""
        head, dot, rest = (self._below(name) or "").partition(".")
        ok = dot and rest and head.isdigit() and str(int(head)) == head
        return (int(head), rest) if ok else None

    def stacked(self, name: str) -> tuple[str, int] | None:
        """The stacked leaf's name and slot of the per-layer `name`, or None."""
        found = self.layer_of(name)
        if found is None or found[0] >= self.layers:
            return None
        layer, rest = found
        if self.under is None:
            return joined(self.prefix, rest), layer
        slot, position = divmod(layer, self.period)
        return joined(self.prefix, f"{self.under}.{position}.{rest}"), slot

    def slots(self, name: str) -> tuple[list[int], str] | None:
        """The layers the stacked leaf `name` holds, one per slot, and its path in a layer."""
        rest = self._below(name)
        if rest is None:
            return None
        if self.under is None:
            return list(range(self.layers)), rest
        key, _, rest = rest.partition(".")
        position, _, rest = rest.partition(".")
        if key != self.under or not position.isdigit() or not rest:
            return None
        j, repeats = int(position), self.layers // self.period
        return [r * self.period + j for r in range(repeats)], rest

    def per_layer(self, name: str) -> list[str] | None:
        """The per-layer names of the stacked leaf `name` (one per slot), or None."""
        found = self.slots(name)
        if found is None:
            return None
        layers, rest = found
        return [joined(self.prefix, f"{i}.{rest}") for i in layers]


def stacks_of(tree: object) -> list[StackAt]:
    """The outermost stacks of `tree`, the longest names first."""
    found = []
    leaves = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: is_wrapper(x) or stack_of(x) is not None
    )[0]
    for path, node in leaves:
        stack = stack_of(node)
        if stack is not None:
            prefix = ".".join(key_name(key) for key in path)
            found.append(StackAt(prefix, stack.length(node), stack.period(node), stack.pattern))
    return sorted(found, key=lambda s: -len(s.prefix))
