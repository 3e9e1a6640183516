"""The fixes a failed (or lossy) load suggests, computed from the checker's problems.

A key rule for a renamed path (a migration when the file is treeclass's own), `astype`
for another dtype, a transpose for a transposed weight, a key rule onto a stack's blocks
for per-layer tensors in a stacked template, a policy for names only one side has.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from ._catalog import Catalog
from ._check import Checker
from ._report import LoadReport
from ._source import dtype_name
from ._stacks import stacks_of
from ._walk import STATIC, TENSOR

__all__ = ["Fixes", "listed", "warn_if_less"]

_LESS = (
    "{source}: restored {restored} of the template's paths; {count} more that it holds "
    "under another name, dtype or layout were not restored and keep the template's "
    "values: {paths}. Fixes that fit:"
)


def listed(paths: Sequence[object], limit: int = 5) -> str:
    shown = ", ".join(map(str, paths[:limit]))
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def warn_if_less(
    like: Any, source: Catalog, checker: Checker, report: LoadReport, missing: str, unexpected: str
) -> None:
    """Warn when a non-strict load kept template values where the checkpoint holds the
    data under another name, dtype or layout (what a fix would restore), with the count
    and the fixes; a path the checkpoint has nothing for, or another shape of, is only
    reported."""
    fixes = Fixes(like, source, checker, missing, unexpected)
    lines = [
        line
        for line in fixes.lines()
        if not line.startswith("- to ") and "has another shape" not in line
    ]
    if fixes.fixable:
        message = _LESS.format(
            source=source.title,
            restored=len(report.restored),
            count=len(fixes.fixable),
            paths=listed(fixes.fixable),
        )
        warnings.warn(message + "\n" + "\n".join(lines), stacklevel=4)


_DIGITS = re.compile(r"(?:^|(?<=\.))\d+(?=\.|$)")


def _pattern(name: str) -> tuple[str, tuple[str, ...]]:
    """A name with its number segments as captures (`h.3.w` -> `h.{i}.w`), and them."""
    found = _DIGITS.findall(name)
    letters = iter("ijklmn")
    return _DIGITS.sub(lambda m: "{" + next(letters, "p") + "}", name), tuple(found)


def _rule_between(source: str, target: str) -> tuple[str, str]:
    """A key rule mapping `source` (a file name) to `target` (a template name), with the
    number segments they share as captures (one rule for every layer)."""
    numbers = [n for n in _DIGITS.findall(source) if n in _DIGITS.findall(target)]
    if numbers and _DIGITS.findall(source) == _DIGITS.findall(target):
        return _pattern(source)[0], _pattern(target)[0]
    return source, target


class Fixes:
    """The fixes a failed load suggests, computed from its problems (see the module's
    docstring)."""

    def __init__(
        self, like: Any, source: Catalog, checker: Checker, missing: str, unexpected: str
    ) -> None:
        self.like, self.source, self.checker = like, source, checker
        self.missing, self.unexpected = missing, unexpected
        self.call = source.call.replace("like", "model")

    def text(self) -> str:
        lines = self.lines()
        if not lines:
            lines = ["- fix the template (or the checkpoint) where they differ, as listed"]
        return "Fixes that fit these problems:\n" + "\n".join(lines)

    def lines(self) -> list[str]:
        checker = self.checker
        out: list[str] = []
        self.fixable: list[str] = []  # paths a suggested fix would restore
        renames: dict[tuple[str, ...], None] = {}
        partnered: set[str] = set()
        stacked = self._per_layer()
        by_pattern = self._by_pattern()
        for kind, where, entry, stored in checker.problem_entries:
            if kind == "missing":
                if entry.name in stacked:
                    self.fixable.append(where)
                    continue
                close = checker.closest(entry.name) or by_pattern.get(entry.name)
                if close is not None and close not in partnered:
                    if entry.kind != STATIC:  # (a static value is compared, not restored)
                        self.fixable.append(where)
                    partnered.add(close)
                    rule: tuple[str, ...] = _rule_between(close, entry.name)
                    theirs = self.source.stored(close)
                    shape = tuple(getattr(entry.value, "shape", ()))
                    if (
                        theirs is not None
                        and len(shape) == 2
                        and shape[0] != shape[1]
                        and tuple(theirs.shape) == shape[::-1]
                    ):  # a PyTorch-style [out, in] weight for an [in, out] one
                        rule = (*rule, "lambda w: w.T")
                    renames[rule] = None
            elif kind == "dtype" and stored is not None:
                self.fixable.append(where)
                out.append(
                    f"- {where} is {stored.dtype} in {self.source.label} and "
                    f"{dtype_name(entry.value)} in the template: convert it while loading "
                    f"with a key rule, rules=[({entry.name!r}, {entry.name!r}, lambda w: "
                    f"w.astype(jnp.{dtype_name(entry.value)}))], or build the template "
                    f"with {stored.dtype}"
                )
            elif kind == "shape" and stored is not None:
                shape = tuple(entry.value.shape)
                if len(shape) == 2 and tuple(stored.shape) == shape[::-1] and shape[0] != shape[1]:
                    self.fixable.append(where)
                    out.append(
                        f"- {where} is stored transposed ({list(stored.shape)} for "
                        f"{list(shape)}): rules=[({entry.name!r}, {entry.name!r}, "
                        "lambda w: w.T)]"
                    )
                else:
                    out.append(
                        f"- {where} has another shape in {self.source.label} "
                        f"({list(stored.shape)} for {list(shape)}): build the template "
                        "with the configuration the checkpoint was saved with"
                    )
        out.extend(self._renames(list(renames)))
        out.extend(stacked.values())
        out.extend(getattr(self.source, "fixes", ()))  # (a key rule catalog's own)
        lonely_missing = [
            e
            for k, _, e, _ in checker.problem_entries
            if k == "missing"
            and e.name not in stacked
            and checker.closest(e.name) is None
            and e.name not in by_pattern
        ]
        if lonely_missing and self.missing == "error":
            if any(isinstance(e.value, jax.ShapeDtypeStruct) for e in lonely_missing):
                out.append(
                    "- paths the checkpoint lacks need values: build the template with "
                    'concrete arrays and load with missing="keep" to keep them'
                )
            else:
                out.append(
                    "- to keep the template's values where the checkpoint has none: "
                    f'{self.call[:-1]}, missing="keep")'
                )
        lonely_unused = [n for n in checker.unused if n not in partnered]
        if lonely_unused and self.unexpected == "error" and not stacked:
            out.append(
                "- to leave out what the template has no place for: "
                f'{self.call[:-1]}, unexpected="ignore")'
            )
        return out

    def _by_pattern(self) -> dict[str, str]:
        """Missing names paired with unused ones of the same layout of numbers: the
        layers of `layers.{i}.w` for those of `blocks.{i}.w` (same numbers, same last
        segment) when no name is close enough by its letters."""

        def patterns(names: Iterable[str]) -> dict[tuple[str, str], dict[tuple, str]]:
            out: dict[tuple[str, str], dict[tuple, str]] = {}
            for name in names:
                pattern, numbers = _pattern(name)
                if numbers:
                    out.setdefault((pattern, name.rsplit(".", 1)[-1]), {})[numbers] = name
            return out

        missing = [e.name for k, _, e, _ in self.checker.problem_entries if k == "missing"]
        theirs = patterns(self.checker.unused)
        paired: dict[str, str] = {}
        for (_, last), mine in patterns(missing).items():
            for (_, other_last), names in theirs.items():
                if other_last == last and set(names) == set(mine):
                    paired.update({mine[n]: names[n] for n in mine})
                    break
        return paired

    def _renames(self, rules: list[tuple[str, ...]]) -> list[str]:
        if not rules:
            return []
        shown = ", ".join(
            "(" + ", ".join([repr(r[0]), repr(r[1]), *r[2:]]) + ")" for r in rules[:6]
        )
        more = ", ..." if len(rules) > 6 else ""
        line = f"- renamed paths: map the checkpoint's names with key rules, rules=[{shown}{more}]"
        if getattr(self.source, "class_versions", None) is not None and self.source.records_values:
            line += (
                "; if your class renamed them since the save, declare it once instead: "
                "bump the class's version= and give migrations={old version: {old name: "
                "new name}} (names relative to the class)"
            )
        return [line]

    def _per_layer(self) -> dict[str, str]:
        """Stacked template paths whose layers the checkpoint holds one by one (`h.0.w`,
        `h.1.w` for a `[L, ...]` leaf): the key rule mapping them onto the stack's slots,
        or, for a leaf of no stack, the unstack recipe, by template name."""
        groups: dict[str, dict[int, str]] = {}
        for name in self.checker.unused:
            for match in _DIGITS.finditer(name):
                pattern = name[: match.start()] + "{i}" + name[match.end() :]
                groups.setdefault(pattern, {})[int(match.group())] = name
        # by last segment: each template path meets only its own
        by_last: dict[str, list[tuple[str, dict[int, str]]]] = {}
        for pattern, members in groups.items():
            by_last.setdefault(pattern.rsplit(".", 1)[-1], []).append((pattern, members))
        found: dict[str, str] = {}
        stacks = stacks_of(self.like)
        for kind, where, entry, _ in self.checker.problem_entries:
            if kind != "missing" or entry.category != TENSOR or not entry.value.shape:
                continue
            rest = tuple(entry.value.shape[1:])
            stack = next((s for s in stacks if s.slots(entry.name) is not None), None)
            # the layers the leaf holds: a stack's (every P-th for a periodic pattern), or
            # 0..L-1 for a `[L, ...]` leaf of no stack
            slots = stack.slots(entry.name) if stack is not None else None
            layers = slots[0] if slots is not None else list(range(entry.value.shape[0]))
            candidates = by_last.get(entry.name.rsplit(".", 1)[-1], [])
            for pattern, members in candidates[:8]:
                if stack is None and sorted(members) != layers:
                    continue  # a plain leaf: its layers are exactly the file's
                if not all(i in members for i in layers):
                    continue
                parts = [self.source.stored(members[i]) for i in layers]
                if not all(p is not None and tuple(p.shape) == rest for p in parts):
                    continue
                shown = (
                    f"i in 0..{layers[-1]}"
                    if layers == list(range(len(layers)))
                    else (
                        "i in "
                        + ", ".join(map(str, layers[:4]))
                        + (", ..." if len(layers) > 4 else "")
                    )
                )
                head = (
                    f"- {where} is a stack of {len(layers)} layers, and the checkpoint holds "
                    f"them one by one ({pattern!r} for {shown}): "
                )
                if stack is not None:  # a key rule fills the stack's slots in this load
                    target = stack.pattern(entry.name)
                    found[entry.name] = (
                        head + "map each onto its block of the stack with a key rule, "
                        f"rules=[({pattern!r}, {target!r})]"
                    )
                    break
                per_layer = self.call.replace("model", "tc.unstack_all(model)", 1)
                found[entry.name] = (
                    head + "load into the per-layer layout and stack again, model = "
                    f"tc.restack({per_layer}, model) (with rules= if the per-layer names "
                    "differ from the template's unstacked key paths)"
                )
                break
        return found
