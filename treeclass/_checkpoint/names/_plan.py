"""A rule table compiled against a template: the file's name for each of its tensors, what
cannot be bound both ways refused before any is computed (the checkpoints guide, "The plan")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..._values import is_prng_key, path_str
from ._catalog import describe
from ._rules import (
    Rule,
    bind,
    layer_rules,
    pattern_choices,
    reads_layers,
    source_hit,
    target_hits,
)
from ._stacks import stacks_of
from ._walk import NO_DATA, NUMBER, STATIC, TENSOR, entries, is_abstract


class Target(NamedTuple):
    """A model array an export reads: its name, key path (for messages) and value (one
    layer of it, `slot`, for a stack read by layers)."""

    name: str
    where: str
    value: Any
    slot: int | None
    shape: tuple
    dtype: Any
    # the rules that cannot give it: those reading its stack by layers, for a stack whole
    skip: frozenset[int] = frozenset()

    def get(self) -> Any:
        return self.value if self.slot is None else self.value[self.slot]


class Plan:
    """The tensors of `tree` bound to the file's names: rules' runs (their targets bound),
    and arrays no rule takes."""

    def __init__(self, tree: Any, rules: Sequence[Rule], action: str) -> None:
        self.action = action
        targets = _targets(tree, rules, action)
        self.groups, self.own = bind(rules, targets, lambda t: self._bound(rules, t))
        for (number, values), group in self.groups.items():
            rule = group.rule
            if len(group.bound) < len(rule.targets):
                have = [group.bound[k].where for k in sorted(group.bound)]
                lack = [n for k, n in enumerate(group.names("targets")) if k not in group.bound]
                raise ValueError(
                    f"{action}: key rule {rule.text()} writes {group.names('sources')} from all "
                    f"its targets; the model has {have} but not {lack}"
                )
            for position, source in enumerate(group.names("sources")):
                self._reads_back(rules, source, (number, position, values), rule.text())
        for target in self.own:
            self._reads_back(rules, target.name, None, f"{target.where} (under its own name)")

    def _bound(self, rules: Sequence[Rule], target: Target) -> tuple | None:
        """(rule number, target position, captured values) of the run giving `target`."""
        hits = [hit for hit in target_hits(rules, target.name) if hit[0] not in target.skip]
        if not hits:
            return None
        if len({number for number, _, _ in hits}) > 1:
            shown = " and ".join(rules[number].text() for number, _, _ in hits[:2])
            raise ValueError(
                f"{self.action}: {target.where} (named {target.name!r}) is a target of key "
                f"rules {shown}, so export cannot tell which source to write it to. "
                "Tell the rules apart, by the values a capture takes where they differ "
                "(`'layers.{i}.self_attn.{n:q|k|v|o}_proj.weight'`)"
            )
        number, position, match = hits[0]
        rule = rules[number]
        values = match.groupdict()
        # a capture the target does not use is known if its source allows one value
        values.update({c: v[0] for c, v in pattern_choices(rule.sources).items() if len(v) == 1})
        lacking = [c for c in rule.captures if c not in values]
        if lacking:
            raise ValueError(
                f"{self.action}: key rule {rule.text()} cannot be run backwards: its target "
                f"{rule.targets[position]!r} does not capture {lacking}, which its sources use"
            )
        return number, position, tuple(values[c] for c in rule.captures)

    def _reads_back(self, rules: Sequence[Rule], name: str, expected: Any, what: str) -> None:
        """Refuse a name of the file that load would not read as the plan wrote it."""
        hit = source_hit(rules, name)
        if hit == expected:
            return
        if hit is None:  # (a capture limited on the source side only)
            reader = "no key rule, so under its own name"
        else:
            reader = f"key rule {rules[hit[0]].text()}"
            if expected is not None and hit[0] == expected[0]:
                reader += f" with other captures ({dict(zip(rules[hit[0]].captures, hit[2]))})"
        raise ValueError(
            f"{self.action}: {what} writes {name!r}, which load reads through {reader}: the table "
            "would not read back what it writes. Make the rules tell the names apart (limit a "
            "capture, `{n:q|k|v}`, or order the rules so the narrower comes first)"
        )


def _targets(tree: Any, rules: Sequence[Rule], action: str) -> list[Target]:
    """The tree's data by name; a stacked leaf by its layers unless the rules take it whole."""
    stacks = stacks_of(tree)
    out = []
    for entry in entries(tree, action, f"{action}(path, value, rules=rules)"):
        if entry.kind == STATIC or entry.category not in (TENSOR, NUMBER):
            continue  # strings, functions, static fields: no foreign layout holds them
        where = path_str(tree, entry.path)
        value: Any = entry.value  # (a number's becomes an array below)
        if is_abstract(value):
            raise ValueError(NO_DATA.format(where=where, value=describe(value)))
        if entry.category == NUMBER:
            value = np.asarray(value)
        stack = next((s for s in stacks if s.per_layer(entry.name)), None)
        by_layers = (
            entry.category == TENSOR
            and stack is not None
            and (reads_layers(rules, stack, entry.name) or not target_hits(rules, entry.name))
        )
        names = (stack.per_layer(entry.name) or []) if by_layers and stack else [entry.name]
        if is_prng_key(value) and not any(target_hits(rules, name) for name in names):
            raise ValueError(
                f"{where} is a PRNG key array, which other libraries' layouts have no dtype "
                "for: export its key data with a rule carrying both directions, (name, "
                f"{entry.name!r}, jax.random.wrap_key_data, jax.random.key_data)"
            )
        if not by_layers:
            skip = frozenset(layer_rules(rules, stack, entry.name) if stack else ())
            out.append(
                Target(entry.name, where, value, None, tuple(value.shape), value.dtype, skip)
            )
            continue
        for slot, name in enumerate(names):
            where_slot, shape = f"{where}[{slot}]", tuple(value.shape[1:])
            out.append(Target(name, where_slot, value, slot, shape, value.dtype))
    return out
