"""The fixes a failed (or lossy) load suggests, from names, shapes and dtypes together: a
pair only where it fits, a policy only for what no rule fits."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from ..files._source import dtype_name
from ._catalog import Catalog, Stored
from ._check import Checker, LoadReport, similarity
from ._stacks import StackAt, stacks_of
from ._walk import STATIC, TENSOR

_LESS = (
    "{source}: restored {restored} of the template's paths; {count} more that it holds "
    "under another name, dtype or layout were not restored and keep the template's "
    "values: {paths}. Fixes that fit:"
)


def listed(paths: Sequence[object], limit: int = 5) -> str:
    shown = ", ".join(map(str, paths[:limit]))
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


_DIGITS = re.compile(r"(?:^|(?<=\.))\d+(?=\.|$)")


def _pattern(name: str) -> tuple[str, tuple[str, ...]]:
    """A name with its number segments as captures (`h.3.w` -> `h.{i}.w`), and them."""
    found = _DIGITS.findall(name)
    letters = iter("ijklmn")
    return _DIGITS.sub(lambda m: "{" + next(letters, "p") + "}", name), tuple(found)


def _rule_between(source: str, target: str) -> tuple[str, str]:
    """A key rule from `source` to `target`, shared number segments as captures."""
    numbers = _DIGITS.findall(source)
    if numbers and numbers == _DIGITS.findall(target):
        return _pattern(source)[0], _pattern(target)[0]
    return source, target


class Fixes:
    """The fixes a failed load suggests, computed from its problems."""

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

    def warn(self, report: LoadReport) -> None:
        """Warn when a non-strict load kept values the checkpoint holds under another name."""
        lines = [
            line
            for line in self.lines()
            if not line.startswith("- to ") and "has another shape" not in line
        ]
        if self.fixable:
            message = _LESS.format(
                source=self.source.title,
                restored=len(report.restored),
                count=len(self.fixable),
                paths=listed(self.fixable),
            )
            warnings.warn(message + "\n" + "\n".join(lines), stacklevel=4)

    def lines(self) -> list[str]:
        checker = self.checker
        out: list[str] = []
        self.fixable: list[str] = []  # paths a suggested fix would restore
        renames: dict[tuple[str, ...], None] = {}
        partnered: set[str] = set()  # the file's names a suggested rule reads
        stacked = self._per_layer()
        done = set(stacked)  # template names a suggested rule fills
        missing = [(w, e) for k, w, e, _ in checker.problem_entries if k == "missing"]
        by_pattern = self._by_pattern([e.name for _, e in missing])
        self.fixable.extend(where for where, entry in missing if entry.name in stacked)

        def pair(where: str, entry: Any, name: str, rule: tuple[str, ...]) -> None:
            renames[rule] = None
            partnered.add(name)
            done.add(entry.name)
            if entry.kind != STATIC:  # (a static value is compared, not restored)
                self.fixable.append(where)

        def fitting(entry: Any, names: Iterable[str | None]) -> list[tuple[str, tuple]]:
            return [
                (name, rule)
                for name in names
                if name is not None
                and name not in partnered
                and (rule := self._rule(entry, name)) is not None
            ]

        # a rename from the closest name, or the one of the same numbers, where it fits; then
        # from the one related name that fits (`embed_tokens` for `embed`)
        choices = (
            lambda e: fitting(e, (checker.closest(e.name), by_pattern.get(e.name)))[:1],
            lambda e: fitting(e, checker.unused) if _is_data(e) else [],
        )
        for choose in choices:
            for where, entry in missing:
                found = [] if entry.name in done else choose(entry)
                if len(found) == 1:
                    pair(where, entry, *found[0])
        # the one tensor of a shape and dtype on each side: a rename, whatever the names
        alone: dict[tuple, tuple[list[tuple[str, Any]], list[str]]] = {}
        for where, entry in missing:
            if entry.name not in done and _is_data(entry):
                key = (tuple(entry.value.shape), dtype_name(entry.value))
                alone.setdefault(key, ([], []))[0].append((where, entry))
        for name in checker.unused:
            stored = self.source.stored(name)
            if name not in partnered and stored is not None and stored.category == TENSOR:
                key = (tuple(stored.shape), stored.dtype)
                alone.setdefault(key, ([], []))[1].append(name)
        for mine, names in alone.values():
            if len(mine) == 1 and len(names) == 1:
                (where, entry), name = mine[0], names[0]
                pair(where, entry, name, _rule_between(name, entry.name))
        for kind, where, entry, stored in checker.problem_entries:
            if kind not in ("dtype", "shape") or stored is None:
                continue
            steps = _steps(entry, stored)
            shapes = f"{list(stored.shape)} for {list(entry.value.shape)}"
            rule = f"rules=[({entry.name!r}, {entry.name!r}, lambda w: w{steps})]"
            if steps is None:
                out.append(
                    f"- {where} has another shape in {self.source.label} ({shapes}): build "
                    "the template with the configuration the checkpoint was saved with"
                )
                continue
            self.fixable.append(where)
            if kind == "shape":
                out.append(f"- {where} is stored transposed ({shapes}): {rule}")
            else:
                out.append(
                    f"- {where} is {stored.dtype} in {self.source.label} and "
                    f"{dtype_name(entry.value)} in the template: convert it while loading "
                    f"with a key rule, {rule}, or build the template with {stored.dtype}"
                )
        out.extend(self._renames(list(renames)))
        out.extend(stacked.values())
        out.extend(getattr(self.source, "fixes", ()))  # (a key rule catalog's own)
        lonely_missing = [e for _, e in missing if e.name not in done]
        shard = _index_of(self.source) if missing else None
        if shard is not None:
            out.append(
                f"- {shard[0]} is one shard of the indexed folder whose index is "
                f"{shard[1]}: load the index, {self.call.replace('path', repr(shard[1]), 1)}"
            )
        if lonely_missing and self.missing == "error":
            if any(isinstance(e.value, jax.ShapeDtypeStruct) for e in lonely_missing):
                out.append(
                    "- paths the checkpoint lacks need values: build the template with "
                    'concrete arrays and load with missing="keep" to keep them'
                )
            else:
                count = len(lonely_missing)
                out.append(
                    "- to keep the template's values where the checkpoint has none: "
                    f'{self.call[:-1]}, missing="keep") ({count} '
                    f"lea{'ves' if count > 1 else 'f'} left unrestored)"
                )
        lonely_unused = [n for n in checker.unused if n not in partnered]
        if lonely_unused and self.unexpected == "error" and not stacked:
            count = len(lonely_unused)
            out.append(
                "- to leave out what the template has no place for: "
                f'{self.call[:-1]}, unexpected="ignore") ({count} '
                f"tensor{'s' if count > 1 else ''} of {self.source.label} left unread)"
            )
        return out

    def _rule(self, entry: Any, close: str) -> tuple[str, ...] | None:
        """The key rule reading the file's `close` into `entry`, or None if it cannot fit."""
        theirs = self.source.stored(close)
        if not _related(close, entry.name):
            return None
        rule: tuple[str, ...] = _rule_between(close, entry.name)
        if not _is_tensor(entry):
            return None if theirs is not None and theirs.category == TENSOR else rule
        steps = None if theirs is None or theirs.category != TENSOR else _steps(entry, theirs)
        if steps is None:
            return None
        return (*rule, f"lambda w: w{steps}") if steps else rule

    def _by_pattern(self, missing: list[str]) -> dict[str, str]:
        """Missing names paired with unused ones of the same numbers and last segment."""

        def patterns(names: Iterable[str]) -> dict[tuple[str, str], dict[tuple, str]]:
            out: dict[tuple[str, str], dict[tuple, str]] = {}
            for name in names:
                pattern, numbers = _pattern(name)
                if numbers:
                    out.setdefault((pattern, name.rsplit(".", 1)[-1]), {})[numbers] = name
            return out

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
        """The key rules for stacked paths whose layers the checkpoint holds one by one."""
        groups: dict[str, dict[int, str]] = {}
        for name in self.checker.unused:
            for match in _DIGITS.finditer(name):
                pattern = name[: match.start()] + "{i}" + name[match.end() :]
                groups.setdefault(pattern, {})[int(match.group())] = name
        found: dict[str, str] = {}
        used: set[tuple[str, int]] = set()  # each file name fills one slot
        parents: dict[str, str] = {}  # a template parent -> the file parent it was read from
        flipped: dict[StackAt, bool] = {}  # a stack whose file stores 2-D weights [out, in]
        chosen = []
        stacks = stacks_of(self.like)
        for kind, where, entry, _ in self.checker.problem_entries:
            if kind != "missing" or not _is_tensor(entry) or not entry.value.shape:
                continue
            hit = next(((s, slots) for s in stacks if (slots := s.slots(entry.name))), None)
            if hit is None:  # a leaf of no stack: its first axis need not be layers
                continue
            stack, (layers, leaf) = hit
            rest, target = tuple(entry.value.shape[1:]), f"{stack.prefix}[{{i}}].{leaf}"
            wanted = target.replace("[{i}]", ".{i}")

            fits = []
            for pattern, members in groups.items():
                taken = any((pattern, i) in used or i not in members for i in layers)
                if taken or not _related(pattern, wanted):
                    continue
                # every slot has a tensor of the block's shape, or of its transpose
                shapes = {getattr(self.source.stored(members[i]), "shape", None) for i in layers}
                flip = _flip(rest, shapes.pop()) if len(shapes) == 1 else None
                if flip is not None:
                    fits.append((pattern, flip))
            sibling = parents.get(_parent(wanted))
            fits.sort(key=lambda c: (_parent(c[0]) != sibling, -similarity(c[0], wanted), c[0]))
            if not fits:
                continue
            if len(fits) > 1 and _parent(fits[0][0]) != sibling:
                if similarity(fits[0][0], wanted) == similarity(fits[1][0], wanted):
                    continue  # two names fit alike (`attn.c_proj`, `mlp.c_proj`): no guess
            pattern, flip = fits[0]
            used.update((pattern, i) for i in layers)
            parents[_parent(wanted)] = _parent(pattern)
            if flip:
                flipped[stack] = True
            chosen.append((where, entry, stack, layers, pattern, target, flip))
        for where, entry, stack, layers, pattern, target, flip in chosen:
            rest = tuple(entry.value.shape[1:])
            if not flip and flipped.get(stack) and len(rest) == 2 and rest[0] == rest[1]:
                flip = ".T"  # a square weight of a file storing its others [out, in]
            shown = f"0..{layers[-1]}" if layers == list(range(len(layers))) else None
            shown = shown or ", ".join(map(str, layers[:4])) + (", ..." if len(layers) > 4 else "")
            rule = f"({pattern!r}, {target!r}" + (", lambda w: w.T)" if flip else ")")
            found[entry.name] = (
                f"- {where} is a stack of {len(layers)} layers, and the checkpoint holds "
                f"them one by one ({pattern!r} for i in {shown}): map each onto its block of "
                f"the stack with a key rule, rules=[{rule}]"
            )
        return found


def _flip(shape: tuple, stored: tuple | None) -> str | None:
    """`""` for a stored shape that is `shape`, `".T"` for a non-square 2-D one transposed (a
    PyTorch-style [out, in] weight for an [in, out] one), else None."""
    if stored == shape:
        return ""
    return ".T" if len(shape) == 2 and shape[0] != shape[1] and stored == shape[::-1] else None


def _steps(entry: Any, theirs: Stored) -> str | None:
    """The methods making the stored tensor `theirs` fit `entry` (`.T`, `.astype(...)`, both,
    or none: `""`), or None if no transpose or conversion makes it fit."""
    steps, dtype = _flip(tuple(entry.value.shape), theirs.shape), dtype_name(entry.value)
    if steps is None:
        return None
    return steps + (f".astype(jnp.{dtype})" if theirs.dtype != dtype else "")


def _parent(pattern: str) -> str:
    return pattern.rsplit(".", 1)[0]


def _is_tensor(entry: Any) -> bool:
    return entry.category == TENSOR and hasattr(entry.value, "shape")


def _related(a: str, b: str) -> bool:
    """Whether the words telling two leaves from their siblings meet (`norm` in `LayerNorm`;
    not `LayerNorm.bias` and `q_proj.bias`)."""
    a_parts, b_parts = a.split("."), b.split(".")
    if a_parts[-1] == b_parts[-1] and len(a_parts) > 1 and len(b_parts) > 1:
        if a_parts[-2] == b_parts[-2] or (a_parts[-2].isdigit() and b_parts[-2].isdigit()):
            return True  # one leaf of one layer (`layers.3.w`, `blocks.3.w`)
    x = [p for p in a_parts if not p.isdigit()]
    y = [p for p in b_parts if not p.isdigit()]
    if len(x) > 1 and len(y) > 1 and x[-1] == y[-1]:
        x, y = x[-2:-1], y[-2:-1]
    else:
        x, y = x[-2:], y[-2:]
    words = lambda parts: {w.lower() for p in parts for w in re.split(r"[_\W]+", p) if w}  # noqa: E731
    return any(
        u == v or (min(len(u), len(v)) > 1 and (u in v or v in u))
        for u in words(x)
        for v in words(y)
    )


def _is_data(entry: Any) -> bool:
    return _is_tensor(entry) and entry.kind != STATIC


_SHARD = re.compile(r"^(.*)-\d{5}-of-\d{5}\.safetensors$")


def _index_of(source: Any) -> tuple[str, str] | None:
    """(the shard, its folder's index) when `source` reads one shard of an indexed folder."""
    location = getattr(source, "location", None) or getattr(
        getattr(source, "inner", None), "location", None
    )
    if not isinstance(location, str):
        return None
    found = _SHARD.match(os.path.basename(location))
    if found is None:
        return None
    index = os.path.join(os.path.dirname(location), f"{found.group(1)}.safetensors.index.json")
    return (location, index) if os.path.isfile(index) else None
