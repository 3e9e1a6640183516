"""Sharding by rules: a table of (selection, partition spec), checked, then used to place.

A rule selects what `.at` selects (never a second matcher); the check collects every
problem before anything is allocated; `init_like` / `shardings_like` place what follows
the model by key path.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ._at import at, selection
from ._fields import fields
from ._roles import fields_holder
from ._structure import block_depths, describe, is_wrapper, jax_children, path_str
from ._values import array_type, closest

_T = TypeVar("_T")
_UNMATCHED = ("error", "replicate")
_SHOWN_PROBLEMS = 50

# -- messages ---------------------------------------------------------------------------------

_RULE_TYPE_MSG = (
    "Rule {index} of the sharding rules is {found}; a rule is a tuple of one or more "
    "selectors followed by a partition spec, e.g.\n"
    "    (tc.glob('blocks.*.mlp.up.weight'), ('embed', 'mlp'))\n"
    "    (Linear, 'bias', P())"
)
_SPEC_TYPE_MSG = (
    "Rule {index} ends with {found}; the last item of a rule is its partition spec: a "
    "`PartitionSpec` or a tuple with one entry per axis of the leaf (an axis name, a tuple "
    "of axis names, or None), e.g. `('embed', 'mlp')`, `P(None, 'mlp')`, `P()`."
)
_SPEC_ENTRY_MSG = (
    "Rule {index}'s spec {spec} has the entry {found} at position {position}; an entry is "
    "an axis name (a str), a tuple of axis names, or None (the axis is not split)."
)
_AXES_TYPE_MSG = (
    "`axes` maps logical axis names to mesh axes: a mapping of str to a mesh axis name, a "
    "tuple of them, or None (not split); got {found} for {name!r}."
)
_UNUSED_NAME_MSG = (
    "`axes` maps {name!r}, but no rule uses that name, so the mapping would change nothing "
    "(the rules use {used}).{hint}"
)
_UNMATCHED_MSG = "`unmatched` is 'error' or 'replicate', got {found!r}."
_PROBLEMS_MSG = (
    "The sharding rules do not fit {root} on the mesh {mesh}: {count} problem(s), all "
    "found before anything was allocated:\n{problems}"
)
_NO_MESH_MSG = (
    "`tc.shardings_like` takes the mesh of the replicated leaves from the `NamedSharding`s "
    "of `like`, but `like` has none. Pass the mesh: `tc.shardings_like(tree, like, mesh=mesh)`."
)

# problems, one line each (each names a key path, or the rule it is about)
_UNMATCHED_LEAF = (
    "`{path}` {what}: no rule matches it (add a rule, or pass `unmatched='replicate'` to "
    "replicate such leaves over the mesh)"
)
_RANK = "`{path}` {what}: {rule} gives a spec of {got} entries, {want}"
_UNKNOWN_AXIS = (
    "{rule} uses the axis name {name!r}, which is neither a logical name of `axes` "
    "({logical}) nor an axis of the mesh ({mesh_axes})"
)
_UNKNOWN_MESH_AXIS = (
    "`axes` maps {name!r} to {target!r}, which is not an axis of the mesh ({mesh_axes}); "
    "{rule} uses it"
)
_UNKNOWN_BLOCK_AXIS = (
    "`block_axis` is {name!r}, which is neither a logical name of `axes` ({logical}) nor an "
    "axis of the mesh ({mesh_axes}); the stacked leaves need it"
)
_TWICE = (
    "`{path}` {what}: {rule} maps {logical} to {spec}, which splits two axes over the mesh "
    "axis {axis!r}; a mesh axis can split one axis of a leaf"
)
_INDIVISIBLE = (
    "`{path}` {what}: {rule} splits axis {dim} (size {size}) in {parts} over {over} (spec "
    "{spec}), and {size} is not divisible by {parts}"
)
_CUT_HEADS = (
    "`{path}` {what}: {rule} splits axis {dim} in {parts} over {over}, which cuts its "
    "{count} heads ({owner}={count}) across devices, each holding part of a head; split it "
    "over a mesh axis whose size divides {count}, or not at all (None)"
)
_SELECTION_FAILS = "{rule} cannot select in {root}: {error}"
_SOME_BLOCKS = (
    "{rule} selects some blocks of a stack only, at {where}: a stacked leaf is one array "
    "with one layout for all its blocks. Select every block (`blocks.*....`); the block "
    "axis gets `block_axis`"
)
_UNUSED = (
    "{rule} matches no leaf of {root} (a typo in a selector leaves its leaves to other "
    "rules); remove it, or fix its selector"
)
_SHADOWED = (
    "{rule} selects {leaves}, but {taken} by an earlier rule ({earlier}): the first rule "
    "that selects a leaf gives its spec, so this rule gives none. Put the narrower rule "
    "first, or remove it"
)


# -- the rule table ---------------------------------------------------------------------------


def _spec_entries(spec: object, index: int) -> tuple[Any, ...]:
    """A rule's spec as a tuple of entries, each None, a name, or a tuple of names."""
    if not isinstance(spec, P | tuple | list):
        raise TypeError(_SPEC_TYPE_MSG.format(index=index, found=describe(spec)))
    out: list[Any] = []
    for position, entry in enumerate(spec):
        names = _axis_names(entry)
        if names is None:
            found = describe(entry)
            raise TypeError(
                _SPEC_ENTRY_MSG.format(index=index, spec=spec, found=found, position=position)
            )
        out.append(None if entry is None else names[0] if len(names) == 1 else names)
    return tuple(out)


def _axis_names(x: Any) -> tuple[str, ...] | None:
    """An axis name, a tuple (or list) of them, or None (no axis), as a tuple; else None."""
    if x is None or isinstance(x, str):
        return () if x is None else (x,)
    if isinstance(x, (tuple, list)) and all(isinstance(e, str) for e in x):
        return tuple(x)
    return None


_Axes = tuple[str, ...]
_Sizes = dict[str, int]
_Problems = dict[str, None]  # ordered, without repeats


class _Leaf(NamedTuple):
    """A leaf being checked: its tree, key path, value and number of block axes."""

    tree: object
    path: tuple[Any, ...]
    value: Any
    depth: int

    def about(self) -> dict[str, str]:
        """The `path` and `what` of a problem about it."""
        return {"path": path_str(self.tree, self.path), "what": _what(self.value, self.depth)}


class _Rule:
    """One row of the table: its selectors (a chain, as `.at[a][b]`) and its spec."""

    __slots__ = ("index", "selectors", "entries", "text")

    def __init__(self, index: int, row: object) -> None:
        if not isinstance(row, tuple) or len(row) < 2:
            raise TypeError(_RULE_TYPE_MSG.format(index=index, found=describe(row)))
        self.index = index
        self.selectors = row[:-1]
        self.entries = _spec_entries(row[-1], index)
        chain = ", ".join(s.__name__ if isinstance(s, type) else repr(s) for s in self.selectors)
        self.text = f"rule {index} ({chain} -> {P(*self.entries)!r})"


def _check_axes(axes: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for name, target in axes.items():
        names = _axis_names(target)
        if not isinstance(name, str) or names is None:
            found = describe(target if isinstance(name, str) else name)
            raise TypeError(_AXES_TYPE_MSG.format(found=found, name=name))
        out[name] = names
    return out


class ShardingRules:
    """An ordered table of (selection, partition spec) rules with logical axis names.

    **The first rule that selects a leaf gives its spec.** `specs`, `shardings`,
    `template` and `init` check the rules against a model and a mesh (an `AbstractMesh`
    needs no device) and raise one `ValueError` listing every problem by key path: a leaf
    no rule matches, a rule that gives no leaf, a spec of another rank, an unknown axis
    name, a mesh axis used twice in one leaf, an axis its mesh axes do not divide, or one
    that cuts a layer's heads (the sharding recipe shows each).

    **Arguments**

    - `rules`: the table, a sequence of tuples `(selector, ..., spec)`: one or more `.at`
      selectors (applied as `.at[a][b]`), then a `PartitionSpec` or a tuple with one entry
      per axis of the selected leaves (an axis name, a tuple of names, or None; a stacked
      leaf's spec is written for one block).
    - `axes`: logical axis name -> mesh axis, tuple of mesh axes, or None (unsplit);
      names not mapped here are mesh axes themselves.
    - `unmatched`: `"error"` (the default) or `"replicate"` for leaves no rule matches
      (as if a rule gave them `P()`: a stacked leaf's block axes still get `block_axis`).
    - `block_axis`: the (logical or mesh) axis name of the block axis of stacked leaves
      (default None: every device holds all the blocks of its part).

    **Raises**

    `TypeError` for a malformed rule, spec or `axes`; `ValueError` for another
    `unmatched`, or a mapped name no rule uses (naming the closest one).

    ```python
    import jax, jax.numpy as jnp
    from jax.sharding import AbstractMesh, PartitionSpec as P
    import treeclass as tc

    model = {"up": jnp.ones((4, 8)), "down": jnp.ones((8, 4)), "bias": jnp.ones(4)}
    rules = tc.ShardingRules(
        [(tc.glob("up"), ("embed", "mlp")), (tc.glob("down"), ("mlp", "embed")), ("bias", P())],
        axes={"embed": None, "mlp": "model"},
    )
    specs = rules.specs(jax.eval_shape(lambda: model), AbstractMesh((2, 4), ("data", "model")))
    assert specs["up"] == P(None, "model") and specs["bias"] == P()
    ```
    """

    __slots__ = ("rules", "axes", "unmatched", "block_axis")

    rules: tuple[_Rule, ...]
    axes: dict[str, tuple[str, ...]]
    unmatched: str
    block_axis: str | None

    def __init__(
        self,
        rules: Iterable[tuple[Any, ...]],
        *,
        axes: Mapping[str, Any] | None = None,
        unmatched: str = "error",
        block_axis: str | None = None,
    ) -> None:
        self.rules = tuple(_Rule(index, row) for index, row in enumerate(rules))
        self.axes = _check_axes(axes or {})
        if unmatched not in _UNMATCHED:
            raise ValueError(_UNMATCHED_MSG.format(found=unmatched))
        self.unmatched = unmatched
        if block_axis is not None and not isinstance(block_axis, str):
            raise TypeError(f"`block_axis` is an axis name or None, got {describe(block_axis)}.")
        self.block_axis = block_axis
        self._check_mapped(self.axes)

    def _check_mapped(self, axes: Mapping[str, Any]) -> None:
        """A mapped name no rule uses is a typo, or a rule missing: refuse it."""
        used = {name for rule in self.rules for e in rule.entries for name in _axis_names(e) or ()}
        used.update([self.block_axis] if self.block_axis is not None else [])
        for name in axes:
            if name not in used:
                close = closest(name, sorted(used))
                hint = f" Did you mean {close!r}?" if close is not None else ""
                raise ValueError(
                    _UNUSED_NAME_MSG.format(name=name, used=sorted(used) or "none", hint=hint)
                )

    def table(self) -> list[tuple[Any, ...]]:
        """The rules as given: a list of `(selector, ..., spec)` tuples, to build on."""
        return [(*rule.selectors, P(*rule.entries)) for rule in self.rules]

    def __repr__(self) -> str:
        rows = "".join(f"\n  {rule.text}," for rule in self.rules)
        axes = {name: (t[0] if len(t) == 1 else (t or None)) for name, t in self.axes.items()}
        return (
            f"ShardingRules([{rows}\n], axes={axes!r}, unmatched={self.unmatched!r}, "
            f"block_axis={self.block_axis!r})"
        )

    def with_axes(
        self, axes: Mapping[str, object] | None = None, /, **more: object
    ) -> ShardingRules:
        """The same rules with logical names mapped (added to, or replacing, `axes`)."""
        added = _check_axes({**(axes or {}), **more})
        self._check_mapped(added)
        out = copy.copy(self)
        out.axes = {**self.axes, **added}
        return out

    # -- applying the table -------------------------------------------------------------------

    def specs(self, tree: _T, mesh: Mesh | AbstractMesh) -> _T:
        """The mesh partition spec of every leaf of `tree`, after checking the rules.

        **Arguments**

        - `tree`: the model, abstract (`jax.eval_shape(build)`) or real; only the shapes
          of its leaves are read.
        - `mesh`: a `jax.sharding.Mesh` or `AbstractMesh`.

        **Returns**

        A tree of `PartitionSpec` (of mesh axes) with the structure of `tree`; a
        `ValueError` lists every problem (see the class), each naming its key path.

        ```python
        import jax.numpy as jnp
        from jax.sharding import AbstractMesh, PartitionSpec as P
        import treeclass as tc

        rules = tc.ShardingRules([(tc.glob("w"), ("data", None))], unmatched="replicate")
        mesh = AbstractMesh((2,), ("data",))
        assert rules.specs({"w": jnp.ones((4, 2)), "b": jnp.ones(2)}, mesh)["w"] == P("data", None)
        ```
        """
        specs, treedef = self._resolve(tree, mesh)
        return treedef.unflatten(specs)

    def shardings(self, tree: _T, mesh: Mesh | AbstractMesh) -> _T:
        """The `NamedSharding` of every leaf of `tree` on `mesh` (raises as `specs` does)."""
        specs, treedef = self._resolve(tree, mesh)
        return treedef.unflatten([NamedSharding(mesh, spec) for spec in specs])

    def template(self, tree: _T, mesh: Mesh | AbstractMesh) -> _T:
        """`tree` as `jax.ShapeDtypeStruct`s carrying their shardings: a restore target for
        `tc.load` (each process reads only its shards). Raises as `specs` does.
        """
        return jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(_shape(x), _dtype(x), sharding=s),
            tree,
            self.shardings(tree, mesh),
        )

    def init(
        self, mesh: Mesh | AbstractMesh, fn: Callable[..., _T], /, *args: Any, **kwargs: Any
    ) -> _T:
        """`fn(*args, **kwargs)` built directly in the shardings the rules give it.

        `fn` is traced once and the rules checked on the traced shapes; then each device
        makes only its own shards (on one process or many). A frozen value `fn` makes must
        not depend on a traced value.

        **Arguments**

        - `mesh`: the `jax.sharding.Mesh` to build on.
        - `fn`: the constructor (a class, or any function returning a pytree).
        - `*args`, `**kwargs`: its arguments, closed over (they may be Python values).

        **Returns**

        What `fn` returns, every leaf placed as the rules say; raises as `specs` does,
        before anything is allocated.

        ```python
        import jax
        import treeclass as tc

        mesh = jax.make_mesh((1,), ("data",))
        rules = tc.ShardingRules([(tc.glob("w"), ("embed", None))], axes={"embed": "data"})
        model = rules.init(mesh, lambda k: {"w": jax.random.normal(k, (4, 2))}, jax.random.key(0))
        assert model["w"].sharding.spec == jax.sharding.PartitionSpec("data", None)
        ```
        """
        return _run_traced_once(
            lambda: fn(*args, **kwargs), (), lambda abstract: self.shardings(abstract, mesh)
        )

    # -- the check ----------------------------------------------------------------------------

    def _resolve(self, tree: object, mesh: Mesh | AbstractMesh) -> tuple[list[P], Any]:
        """Every leaf's mesh spec and the tree's structure, or a `ValueError` listing every
        problem."""
        flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
        sizes = dict(mesh.shape)
        problems: dict[str, None] = {}  # ordered, without repeats
        depths = block_depths(tree)
        claims = self._claims(tree, flat, problems)
        mapped = {rule.index: self._mapped_entries(rule, sizes, problems) for rule in self.rules}
        block: tuple[str, ...] | None = ()
        if any(depths) and self.block_axis is not None:
            block = self._name(self.block_axis, sizes, problems, "block_axis")
        specs: list[P] = []
        heads = _declared_heads(tree)
        for (path, value), claimed, depth in zip(flat, claims, depths, strict=True):
            leaf = _Leaf(tree, path, value, depth)
            spec = self._leaf_spec(leaf, claimed, mapped, block, problems)
            if spec is not None and any(spec):
                self._check_fit(leaf, spec, claimed, sizes, problems, heads.get(tuple(path)))
                specs.append(P(*_entries_of(spec)))
            else:  # replicated (written so, or unmatched), or a problem
                specs.append(P())
        if problems:
            shown = list(problems)[:_SHOWN_PROBLEMS]
            lines = [f"  - {p}" for p in shown]
            if len(problems) > len(shown):
                lines.append(f"  ... and {len(problems) - len(shown)} more")
            raise ValueError(
                _PROBLEMS_MSG.format(
                    root=path_str(tree, ()),
                    mesh="(" + ", ".join(f"{name}={size}" for name, size in sizes.items()) + ")",
                    count=len(problems),
                    problems="\n".join(lines),
                )
            )
        return specs, treedef

    def _claims(self, tree: object, flat: list[Any], problems: dict[str, None]) -> list[Any]:
        """For every leaf, the first rule that selects it (None: no rule does)."""
        claims: list[_Rule | None] = [None] * len(flat)
        root = path_str(tree, ())
        # a selection may reach frozen values: counted as leaves, then dropped
        frozen = [is_wrapper(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=is_wrapper)]
        for rule in self.rules:
            try:
                flags = selection(at(tree, rule.selectors), is_wrapper).flags()
            except (LookupError, TypeError, ValueError, IndexError) as error:
                message = str(error).split("\n")[0]
                problems[_SELECTION_FAILS.format(rule=rule.text, root=root, error=message)] = None
                continue
            flags = [flag for flag, ice in zip(flags, frozen, strict=True) if not ice]
            # a stack's leaf has a flag per block, but one layout: selected whole or not at all
            some = [
                i for i, f in enumerate(flags) if type(f) is not bool and np.any(f) != np.all(f)
            ]
            if some:
                blocks = np.flatnonzero(np.asarray(flags[some[0]]).reshape(-1)).tolist()
                where = f"`{path_str(tree, flat[some[0]][0])}` (blocks {blocks})"
                problems[_SOME_BLOCKS.format(rule=rule.text, where=where)] = None
                continue
            selected = [i for i, f in enumerate(flags) if f is not False and np.all(f)]
            for index in selected:
                if claims[index] is None:
                    claims[index] = rule
            if not selected:
                problems[_UNUSED.format(rule=rule.text, root=root)] = None
            elif all(claims[index] is not rule for index in selected):
                earlier = ", ".join(dict.fromkeys(c.text for i in selected if (c := claims[i])))
                shown = ", ".join(f"`{path_str(tree, flat[i][0])}`" for i in selected[:3])
                leaves = shown + (f" and {len(selected) - 3} more" if len(selected) > 3 else "")
                taken = "it is taken" if len(selected) == 1 else "each is taken"
                text = _SHADOWED.format(rule=rule.text, leaves=leaves, taken=taken, earlier=earlier)
                problems[text] = None
        return claims

    def _name(
        self, name: str, sizes: dict[str, int], problems: dict[str, None], where: str
    ) -> tuple[str, ...] | None:
        """The mesh axes a spec name stands for, or None (a problem recorded)."""
        logical = ", ".join(map(repr, self.axes)) or "none"
        mesh_axes = ", ".join(map(repr, sizes))
        if name in self.axes:
            targets = self.axes[name]
            bad = [t for t in targets if t not in sizes]
            for target in bad:
                text = dict(name=name, target=target, mesh_axes=mesh_axes, rule=where)
                problems[_UNKNOWN_MESH_AXIS.format(**text)] = None
            return None if bad else targets
        if name in sizes:
            return (name,)
        unknown = _UNKNOWN_BLOCK_AXIS if where == "block_axis" else _UNKNOWN_AXIS
        problems[unknown.format(rule=where, name=name, logical=logical, mesh_axes=mesh_axes)] = None
        return None

    def _mapped_entries(
        self, rule: _Rule, sizes: dict[str, int], problems: dict[str, None]
    ) -> tuple[tuple[str, ...], ...] | None:
        """A rule's entries as tuples of mesh axes, or None when a name is unknown."""
        # every name is looked up, so that each unknown one is reported
        targets = [
            [self._name(name, sizes, problems, rule.text) for name in _axis_names(entry) or ()]
            for entry in rule.entries
        ]
        if any(t is None for per_entry in targets for t in per_entry):
            return None
        return tuple(tuple(axis for t in per_entry for axis in t or ()) for per_entry in targets)

    def _leaf_spec(
        self,
        leaf: _Leaf,
        rule: _Rule | None,
        mapped: dict[int, Any],
        block: Any,
        problems: _Problems,
    ) -> list[Any] | None:
        """The leaf's spec as a list of mesh-axis entries, or None (replicated / a problem)."""
        rank, depth = len(_shape(leaf.value)), leaf.depth
        if rule is None:
            if rank and self.unmatched == "error":
                problems[_UNMATCHED_LEAF.format(**leaf.about())] = None
                return None
            if depth and block:  # replicated as `P()` is: the block axes still split
                return [block] * depth + [()] * (rank - depth)
            return None
        written = len(rule.entries)
        if written and written != rank and not (depth and written == rank - depth):
            if depth:
                want = (
                    f"one per axis of a block ({rank - depth}; the block axes get "
                    f"`block_axis`), or {rank} with the block axes first"
                )
            else:
                want = f"one per axis of the leaf ({rank})"
            want = f"but it needs {want}, or none (`P()`: replicated)"
            problems[_RANK.format(**leaf.about(), rule=rule.text, got=written, want=want)] = None
            return None
        entries = mapped[rule.index]
        if entries is None:  # an unknown name: reported once, for the rule
            return None
        if rule.entries and len(rule.entries) == rank:  # every axis written, block axes too
            return list(entries)
        if depth and block is None:  # an unknown `block_axis`: reported once
            return None
        per_block = list(entries) if rule.entries else [()] * (rank - depth)  # P(): unsplit
        return [block] * depth + per_block if depth else per_block

    def _check_fit(
        self,
        leaf: _Leaf,
        spec: list[_Axes],
        rule: _Rule | None,
        sizes: _Sizes,
        problems: _Problems,
        heads: tuple[int, int, str] | None,
    ) -> None:
        """Problems: a mesh axis used twice, an axis its parts do not divide, or one whose
        `heads` (declared by the layer: count, axis, owner) its parts cut."""
        shape = _shape(leaf.value)
        used = [axis for axes in spec for axis in axes]
        twice = [axis for i, axis in enumerate(used) if axis in used[:i]]
        indivisible = []
        for dim, (size, axes) in enumerate(zip(shape, spec, strict=True)):
            parts = math.prod(sizes[a] for a in axes)
            if size % parts:
                indivisible.append((dim, size, axes, parts))
        cut = None
        if heads is not None and rule is not None:
            dim = leaf.depth + heads[1]
            parts = math.prod(sizes[a] for a in spec[dim])
            if heads[0] % parts and not shape[dim] % parts:  # (else fits, or indivisible)
                cut = dict(
                    dim=dim, parts=parts, over=_over(spec[dim]), count=heads[0], owner=heads[2]
                )
        if not twice and not indivisible and cut is None:  # the usual case: nothing to write
            return
        about = dict(
            leaf.about(),
            rule=rule.text if rule else "`block_axis` (no rule matches it: replicated)",
            spec=P(*_entries_of(spec)),
        )
        logical = repr(P(*(rule.entries if rule else ())))
        for axis in dict.fromkeys(twice):
            problems[_TWICE.format(**about, logical=logical, axis=axis)] = None
        for dim, size, axes, parts in indivisible:
            over = _over(axes, sizes)
            text = _INDIVISIBLE.format(**about, dim=dim, size=size, over=over, parts=parts)
            problems[text] = None
        if cut is not None:
            problems[_CUT_HEADS.format(**about, **cut)] = None


def _declared_heads(tree: object) -> dict[tuple[Any, ...], tuple[int, int, str]]:
    """Where the layers of `tree` declare heads: key path -> (head count, axis, owner).

    Field metadata: `{"heads": (count_field, axis_name)}` on a sublayer, `{"axes": (...)}`
    on the arrays below it, `{"rename_axes": {...}}` on a field between (a LoRA's factors).
    """
    found: dict[tuple[Any, ...], tuple[int, int, str]] = {}

    def walk(node: object, path: tuple[Any, ...], heads: Any, renames: tuple[Any, ...]) -> None:
        holder = fields_holder(node)  # the node, or a stack's block, whose fields these are
        declared = {} if holder is None else {f.name: f.metadata for f in fields(holder)}
        for key, child in jax_children(node) or ():
            meta = declared.get(getattr(key, "name", ""), {})  # no field is named ""
            here, names = heads, renames
            if "heads" in meta:
                count, axis = meta["heads"]
                owner = f"{type(holder).__name__}.{count}"
                here, names = (getattr(holder, count), axis, owner), ()
            if "rename_axes" in meta:
                names = (meta["rename_axes"], *names)  # the innermost renames first
            if here is not None and "axes" in meta:
                axes = list(meta["axes"])
                for mapping in names:
                    axes = [mapping.get(a, a) for a in axes]
                if here[1] in axes:
                    found[path + (key,)] = (here[0], axes.index(here[1]), here[2])
            walk(child, (*path, key), here, names)

    walk(tree, (), None, ())
    return found


def _over(axes: tuple[str, ...], sizes: dict[str, int] | None = None) -> str:
    """`mesh axis 'x'`, or `mesh axes 'x' x 'y'` (with `sizes`: `(2 x 4)` after)."""
    names = " x ".join(repr(a) for a in axes)
    if len(axes) == 1:
        return f"mesh axis {names}"
    counts = f" ({' x '.join(str(sizes[a]) for a in axes)})" if sizes else ""
    return f"mesh axes {names}{counts}"


def _entries_of(spec: list[tuple[str, ...]]) -> list[Any]:
    return [None if not axes else axes[0] if len(axes) == 1 else axes for axes in spec]


def _shape(x: Any) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def _dtype(x: object) -> Any:
    dtype = getattr(x, "dtype", None)
    return dtype if dtype is not None else jax.numpy.result_type(x)


def _what(leaf: object, depth: int) -> str:
    """`f32[3,4,8]`, and for a stacked leaf `(stacked: 3 blocks of [4,8])`."""
    shape = _shape(leaf)
    text = array_type(_dtype(leaf), shape)
    if depth:
        blocks = "x".join(map(str, shape[:depth]))
        return f"{text} (stacked: {blocks} blocks of [{','.join(map(str, shape[depth:]))}])"
    return text


# -- what follows the model -------------------------------------------------------------------


def shardings_like(tree: _T, like: object, *, mesh: Mesh | AbstractMesh | None = None) -> _T:
    """Shardings for `tree` (an optimizer state) from those of the model it follows.

    Each leaf takes the sharding of the model leaf whose key path is the longest suffix
    of its own and whose shape is its own (`[0].mu.blocks.up.weight` follows
    `blocks.up.weight`); every other leaf (step counts) is replicated over the mesh.

    **Arguments**

    - `tree`: the tree to place, abstract (`jax.eval_shape(opt.init, model)`) or real.
    - `like`: the model's shardings (a tree of `Sharding`s), or the model itself (its
      arrays' `.sharding`), or a template of `ShapeDtypeStruct`s with shardings.
    - `mesh`: the mesh of the replicated leaves; by default that of `like`'s first
      `NamedSharding`.

    **Returns**

    A tree of `Sharding`s with the structure of `tree`.

    ```python
    import jax, jax.numpy as jnp, optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import treeclass as tc

    mesh = jax.make_mesh((1,), ("data",))
    params = {"w": jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P("data", None)))}
    state = jax.eval_shape(optax.adam(1e-3).init, params)
    placed = tc.shardings_like(state, params)
    assert placed[0].mu["w"].spec == P("data", None) and placed[0].count.spec == P()
    ```
    """
    by_path: dict[tuple[Any, ...], tuple[tuple[int, ...] | None, Any]] = {}
    for path, x in jax.tree_util.tree_flatten_with_path(
        like, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )[0]:
        sharding = x if isinstance(x, jax.sharding.Sharding) else getattr(x, "sharding", None)
        if sharding is None:
            continue
        if mesh is None and isinstance(sharding, NamedSharding):
            mesh = sharding.mesh
        shape = None if isinstance(x, jax.sharding.Sharding) else _shape(x)
        by_path[tuple(path)] = (shape, sharding)
    if mesh is None:
        raise ValueError(_NO_MESH_MSG)
    replicated = NamedSharding(mesh, P())

    def place(path: tuple[Any, ...], x: object) -> Any:
        path = tuple(path)
        for start in range(len(path)):
            found = by_path.get(path[start:])
            if found is not None:
                shape, sharding = found
                return sharding if shape is None or shape == _shape(x) else replicated
        return replicated

    return jax.tree_util.tree_map_with_path(place, tree)


def _run_traced_once(
    fn: Callable[..., Any], args: tuple[Any, ...], place: Callable[[Any], Any]
) -> Any:
    """`fn(*args)` traced once, placed by `place(abstract result)`, run under `jax.jit`."""
    from jax.extend.core import jaxpr_as_fun

    traced = jax.jit(fn).trace(*args)
    shardings = place(traced.out_info)  # checks come first: nothing is allocated yet
    run = jaxpr_as_fun(traced.jaxpr)
    out_tree = traced.out_tree

    def replay(*leaves: Any) -> Any:
        return out_tree.unflatten(run(*leaves))

    return jax.jit(replay, out_shardings=shardings)(*jax.tree_util.tree_leaves(args))


def init_like(fn: Callable[..., _T], tree: object, /, *args: Any, **kwargs: Any) -> _T:
    """`fn(tree, *args, **kwargs)` under `jax.jit`, its result placed like `tree`.

    `tc.init_like(opt.init, model)` makes the optimizer state with each leaf in the
    sharding `tc.shardings_like` gives it (plain `jit` would put zeros on one device).

    **Arguments**

    - `fn`: a function of the tree (and `args`, `kwargs`), such as an optimizer's `init`;
    - `tree`: the tree whose leaves' shardings the result follows (positional only);
    - `*args`, `**kwargs`: passed to `fn` after `tree`.

    **Returns**

    `fn`'s result, each leaf placed as `tc.shardings_like(result, tree)` says.

    ```python
    import jax, jax.numpy as jnp, optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import treeclass as tc

    mesh = jax.make_mesh((1,), ("data",))
    params = {"w": jax.device_put(jnp.ones((4, 2)), NamedSharding(mesh, P("data", None)))}
    state = tc.init_like(optax.adam(1e-3).init, params)
    assert state[0].mu["w"].sharding.spec == P("data", None)
    ```
    """
    return _run_traced_once(
        lambda t: fn(t, *args, **kwargs), (tree,), lambda out: shardings_like(out, tree)
    )
