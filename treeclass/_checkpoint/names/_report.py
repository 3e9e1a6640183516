"""What a non-strict load reports: `LoadReport`, a value (hashable, compared by items)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple


class FrozenMapping(Mapping[str, tuple[str, ...]]):
    """A read-only mapping that is a value: hashable, equal (as any `Mapping`) to any mapping
    of its items."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> tuple[str, ...]:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


class LoadReport(NamedTuple):
    """What `load` / `from_state_dict` with `strict=False` could not restore.

    - `missing`: key paths of the template (`MLP.layers[0].weight`) with no value in the
      checkpoint: they keep the template's value.
    - `mismatched`: key paths whose checkpoint value has another shape, dtype or type, or
      whose static value differs: they keep the template's value.
    - `unexpected`: names in the checkpoint (`layers.2.weight`) with no place in the
      template: ignored.
    - `messages`: one line per problem, as `strict=True` would report it.
    - `restored`: key paths whose value came from the checkpoint.
    - `sources`: for each restored path, the checkpoint names it was read from (one,
      or several when a key rule concatenated them).
    - `migrations`: the migration steps of versioned classes that ran, in order
      (`"Encoder 1 -> 2 (rules) at encoder"`); see the class keyword `version=`.

    `kept` is `missing + mismatched`: every path left at the template's value. Key paths
    outside a partial load's selection appear nowhere.

    ```python
    import os, tempfile
    import jax.numpy as jnp
    import treeclass as tc

    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    tc.save(path, {"w": jnp.ones(2)})
    restored, report = tc.load(path, {"w": jnp.zeros(2), "b": jnp.zeros(1)}, strict=False)
    assert report.restored == ("tree['w']",) and report.missing == report.kept == ("tree['b']",)
    ```
    """

    missing: tuple[str, ...]
    mismatched: tuple[str, ...]
    unexpected: tuple[str, ...]
    messages: tuple[str, ...]
    restored: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = FrozenMapping()
    migrations: tuple[str, ...] = ()

    @property
    def kept(self) -> tuple[str, ...]:
        return self.missing + self.mismatched
