"""Checking a sharding rule table against a large abstract model, before anything exists.

The model is a transformer's layout at scale: `blocks` blocks of eight leaves (the q, k,
v and output projections, the MLP's up and down weights, two norm scales), abstract
(`jax.ShapeDtypeStruct` leaves, as `jax.eval_shape` gives them), 10,000 leaves in a run.
Two rows:

- **treeclass**: `tc.ShardingRules(...).specs(abstract, mesh)`, six rules (globs, a
  union of names, a class) with logical names mapped to a 2-d `AbstractMesh`: every
  selection made by `.at`, and every check (unmatched leaves, shadowed rules, rank,
  divisibility, axis names) done;
- **hand-written** (the floor): `jax.tree_util.tree_map_with_path` with the same rules as
  regular expressions over `keystr`, first match wins, no check at all.

Both give the same specs (checked). No target: the check runs once, before a model is
built; the figure says what it costs.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .cases import Case, Entry, Sizes

__all__ = ["rules_check_case", "sharding_cases"]

_GROUP = "6. construction, leafwise"  # building a sharded model: its rules come first
_WIDTH, _HIDDEN = 64, 256
_AXES = {"embed": "data", "heads": "model", "mlp": "model"}
_MESH_AXES = (("data", 2), ("model", 4))
_CODES = {None: 0, "data": 1, "model": 2}


@functools.cache
def _classes() -> tuple[type, type, type]:
    import treeclass as tc

    class Linear(tc.TreeClass):
        weight: Any

    class Norm(tc.TreeClass):
        scale: Any

    class Block(tc.TreeClass):
        def __init__(self) -> None:
            square = jax.ShapeDtypeStruct((_WIDTH, _WIDTH), jnp.float32)
            self.q, self.k, self.v, self.out = (Linear(square) for _ in range(4))
            self.up = Linear(jax.ShapeDtypeStruct((_WIDTH, _HIDDEN), jnp.float32))
            self.down = Linear(jax.ShapeDtypeStruct((_HIDDEN, _WIDTH), jnp.float32))
            self.attn_norm = Norm(jax.ShapeDtypeStruct((_WIDTH,), jnp.float32))
            self.mlp_norm = Norm(jax.ShapeDtypeStruct((_WIDTH,), jnp.float32))

    return Linear, Norm, Block


@functools.cache
def _model(blocks: int) -> Any:
    import treeclass as tc

    Block = _classes()[2]

    class Model(tc.TreeClass):
        def __init__(self) -> None:
            self.blocks = tuple(Block() for _ in range(blocks))

    return Model()


def _rules() -> Any:
    from jax.sharding import PartitionSpec as P

    import treeclass as tc

    Norm = _classes()[1]
    return tc.ShardingRules(
        [
            (tc.glob("blocks.*"), ("q", "k", "v"), "weight", ("embed", "heads")),
            (tc.glob("blocks.*.out.weight"), ("heads", "embed")),
            (tc.glob("blocks.*.up.weight"), ("embed", "mlp")),
            (tc.glob("blocks.*.down.weight"), ("mlp", "embed")),
            (tc.glob("blocks.*.attn_norm.scale"), (None,)),  # first match: before the class
            (Norm, P()),
        ],
        axes=_AXES,
    )


_HAND_WRITTEN = [
    (re.compile(r"\.blocks\[\d+\]\.(q|k|v)\.weight$"), ("embed", "heads")),
    (re.compile(r"\.blocks\[\d+\]\.out\.weight$"), ("heads", "embed")),
    (re.compile(r"\.blocks\[\d+\]\.up\.weight$"), ("embed", "mlp")),
    (re.compile(r"\.blocks\[\d+\]\.down\.weight$"), ("mlp", "embed")),
    (re.compile(r"_norm\.scale$"), (None,)),
]


def _hand_written(model: Any) -> Any:
    from jax.sharding import PartitionSpec as P

    def spec(path: Any, leaf: Any) -> Any:
        text = jax.tree_util.keystr(path)
        for pattern, names in _HAND_WRITTEN:
            if pattern.search(text):
                return P(*(_AXES.get(n) if n is not None else None for n in names))
        return P()

    return jax.tree_util.tree_map_with_path(spec, model)


def _canon(specs: Any) -> dict[tuple, np.ndarray]:
    """Each leaf's spec as numbers (an unsplit axis 0, `data` 1, `model` 2), by key path."""
    out = {}
    for path, spec in jax.tree_util.tree_flatten_with_path(specs)[0]:
        rank = 2 if "norm" not in jax.tree_util.keystr(path) else 1
        entries = list(spec) + [None] * (rank - len(spec))
        key = tuple(getattr(k, "name", getattr(k, "idx", None)) for k in path)
        out[key] = np.array([_CODES[e] for e in entries])
    return out


def rules_check_case(leaves: int) -> Case:
    """`tc.ShardingRules.specs` on an abstract model of `leaves` leaves (8 per block)."""
    blocks = max(1, leaves // 8)

    def treeclass() -> Any:
        from jax.sharding import AbstractMesh

        model, rules = _model(blocks), _rules()
        mesh = AbstractMesh(tuple(s for _, s in _MESH_AXES), tuple(n for n, _ in _MESH_AXES))
        return lambda: rules.specs(model, mesh)

    def floor() -> Any:
        model = _model(blocks)
        return lambda: _hand_written(model)

    return Case(
        name=f"sharding_rules_check_{blocks * 8}_leaves",
        group=_GROUP,
        title=f"check a rule table of 6 rules on an abstract model of {blocks * 8:,} leaves",
        entries=lambda: [
            Entry("treeclass", "treeclass", treeclass, note="`ShardingRules.specs`", canon=_canon),
            Entry("hand-written", "floor", floor, note="regex on `keystr`, no check", canon=_canon),
        ],
        sync=None,
        note=(
            "No target: the check runs once, before a model is built, and the floor checks "
            "nothing (no unmatched leaf, shadowed rule, rank or divisibility)."
        ),
    )


def sharding_cases(sizes: Sizes) -> list[Case]:
    """The rule-check case: 10,000 leaves in a run (`sizes.large_fields * 10`), 80 in smoke.

    ```python
    from benchmarks.cases import SMOKE_SIZES
    from benchmarks.sharding import sharding_cases

    assert [c.name for c in sharding_cases(SMOKE_SIZES)] == ["sharding_rules_check_80_leaves"]
    ```
    """
    return [rules_check_case(sizes.large_fields * 10)]
