"""The glob language of `tc.glob`: a key-path pattern and the automaton that runs it.

A pattern is parsed once per pattern string into segments, each matching one key name
(`layers`, `*`, `[0]`, `['a.b']`) or, `**`, any number of levels. Matching runs the
segments as a small NFA whose state is the set of pattern positions reached so far;
`Glob.advance` moves it over one key name. What a match selects in a tree, and the error
of a glob that selects nothing, belong to the selectors (`_selectors.GlobMatcher`).
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
from collections.abc import Callable
from typing import Any

__all__ = ["Glob", "glob"]

_GLOB_SYNTAX = (
    "Glob syntax: segments separated by '.', each matched against a key's name with "
    "fnmatch wildcards ('*', '?'); '[0]' or '0' for a sequence index, \"['key']\" for a "
    "dict key (quoted: literal, no wildcards), '**' for any number of levels. Examples: "
    "'layers.*.weight', '**.bias', 'layers[0].weight'."
)
_WILDCARDS = re.compile(r"[*?\[]")


class _Segment(str):
    """One segment of a glob: its text, and how it matches a key's name.

    A dotted segment (`layers.*`) matches `str(name)` with fnmatch wildcards. A bracket
    segment is what `jax.tree_util.keystr` writes for one key: quoted (`['a.b']`) it is a
    literal string; unquoted (`[0]`, `[(1, 2)]`) it matches the name whose `repr` it is,
    or, holding wildcards (`[*]`), `str(name)` with fnmatch.
    """

    match: Callable[[Any], object] | None  # truthy for a name that matches; None for '**'

    @classmethod
    def dotted(cls, text: str) -> _Segment:
        segment = cls(text)
        if text == "**":
            segment.match = None
        else:
            regex = re.compile(fnmatch.translate(text)).match
            segment.match = lambda name: regex(name if isinstance(name, str) else str(name))
        return segment

    @classmethod
    def bracket(cls, content: str) -> _Segment:
        if len(content) >= 2 and content[0] == content[-1] and content[0] in "'\"":
            try:
                literal = ast.literal_eval(content)
            except (ValueError, SyntaxError):
                literal = content[1:-1]
            segment = cls(literal)
            segment.match = lambda name: isinstance(name, str) and name == literal
            return segment
        segment = cls(content)
        if _WILDCARDS.search(content):
            regex = re.compile(fnmatch.translate(content)).match
            segment.match = lambda name: regex(str(name)) is not None or repr(name) == content
        else:
            segment.match = lambda name: repr(name) == content
        return segment


class Glob:
    """A parsed pattern (`segments`) and its automaton.

    A state is a frozenset of positions in `segments`; `start` is the state before any
    name, and a state holding `accept` (one past the last segment) has matched the whole
    pattern. Transitions are memoized per (state, name), since layers repeat the same
    names.
    """

    __slots__ = ("pattern", "segments", "start", "accept", "_transitions")

    # memoization only (a pure function of the pattern): bounded, so a tree with
    # unboundedly many distinct names cannot grow it without limit
    _MAX_TRANSITIONS = 4096

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.segments = _parse_glob(pattern)
        self.accept = len(self.segments)
        self._transitions: dict[Any, frozenset[int]] = {}
        self.start = self._closure(frozenset([0]))

    def __repr__(self) -> str:
        return f"glob({self.pattern!r})"

    def expects_name(self, position: int) -> bool:
        """Whether the segment at `position` must match one key name (not `**`, not past
        the end)."""
        return position < self.accept and self.segments[position].match is not None

    def _closure(self, positions: frozenset[int]) -> frozenset[int]:
        segments = self.segments
        out = set(positions)
        todo = list(positions)
        while todo:  # '**' may match no level at all: skip over it
            p = todo.pop()
            if p < len(segments) and segments[p].match is None and p + 1 not in out:
                out.add(p + 1)
                todo.append(p + 1)
        return frozenset(out)

    def advance(self, state: frozenset[int], name: object) -> frozenset[int]:
        """The state after one more key `name` (empty: the pattern cannot match below)."""
        # 1, 1.0 and True are equal but different names; strings (most names) need no type
        key: Any = (state, name) if type(name) is str else (state, type(name), name)
        try:
            return self._transitions[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable custom key name
            key = None
        segments = self.segments
        nxt: set[int] = set()
        for p in state:
            if p >= self.accept:
                continue
            match = segments[p].match
            if match is None:
                nxt.add(p)  # '**' consumes this level and may consume more
            elif match(name):
                nxt.add(p + 1)
        result = self._closure(frozenset(nxt)) if nxt else frozenset()
        if key is not None and len(self._transitions) < self._MAX_TRANSITIONS:
            self._transitions[key] = result
        return result


def _parse_glob(pattern: str) -> tuple[_Segment, ...]:
    segments: list[_Segment] = []
    current = ""
    after_bracket = False
    text = pattern[1:] if pattern.startswith(".") else pattern  # keystr paths start with '.'
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == ".":
            if current:
                segments.append(_Segment.dotted(current))
            elif not after_bracket:
                raise ValueError(f"Empty segment in glob {pattern!r}. {_GLOB_SYNTAX}")
            current, after_bracket = "", False
            i += 1
            if i == n:
                raise ValueError(f"Glob {pattern!r} ends with '.'. {_GLOB_SYNTAX}")
        elif char == "[":
            if current:
                segments.append(_Segment.dotted(current))
                current = ""
            close = _bracket_end(text, i, pattern)
            content = text[i + 1 : close].strip()
            if not content:
                raise ValueError(f"Empty brackets in glob {pattern!r}. {_GLOB_SYNTAX}")
            segments.append(_Segment.bracket(content))
            after_bracket = True
            i = close + 1
        elif char == "]":
            raise ValueError(f"Unbalanced ']' in glob {pattern!r}. {_GLOB_SYNTAX}")
        else:
            if after_bracket:
                raise ValueError(
                    f"Expected '.' or '[' after ']' in glob {pattern!r}. {_GLOB_SYNTAX}"
                )
            current += char
            i += 1
    if current:
        segments.append(_Segment.dotted(current))
    if not segments:
        raise ValueError(f"Empty glob pattern. {_GLOB_SYNTAX}")
    return tuple(segments)


def _bracket_end(text: str, start: int, pattern: str) -> int:
    """The index of the `]` closing the `[` at `start`, skipping quoted strings."""
    depth, quote, i = 0, None, start + 1
    while i < len(text):
        char = text[i]
        if quote is not None:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")}":
            depth -= 1
        elif char == "]":
            if depth <= 0:
                return i
        i += 1
    if quote is not None:
        raise ValueError(f"Unclosed quote in glob {pattern!r}. {_GLOB_SYNTAX}")
    raise ValueError(f"Unclosed '[' in glob {pattern!r}. {_GLOB_SYNTAX}")


@functools.lru_cache(maxsize=256)
def _compiled_glob(pattern: str) -> Glob:
    # `tc.glob("...")` written inline in a loop returns the same object, which keeps its
    # memoized transitions
    return Glob(pattern)


def glob(pattern: str) -> Any:
    """A key-path pattern: one string that reaches nodes any number of levels down.

    **Syntax.** The pattern is a sequence of segments, each matching one level of the
    key path below the current level:

    - segments are separated by `.`; a leading `.` is allowed, so the output of
      `jax.tree_util.keystr` for a path is a pattern matching exactly that path;
    - a segment is matched against the key's name with `fnmatch` wildcards, case
      sensitively: `*` (any characters), `?` (one character). The name of an attribute
      (`GetAttrKey`) is its name, of a dict entry `str(key)`, of a sequence entry its
      index in decimal (`0`, `1`, ...; negative indices are not supported);
    - `[...]` is a segment of its own, written as `keystr` writes a key: `layers[0]` is
      the index 0, `['a.b']` the dict key `'a.b'`. Inside quotes a key is literal (no
      wildcards, may contain `.`, `[` and `*`); unquoted brackets may hold wildcards (`[*]`);
    - `**` matches any number of levels, including none.

    The whole pattern must match: `"layers.*"` selects each layer (whole subtrees),
    `"layers.*.weight"` each layer's weight. A matching node is not looked into further.
    A pattern that matches nothing is an error (`LookupError`) naming the closest keys.

    **Arguments**

    - `pattern`: the pattern string.

    **Returns**

    A selector for `.at[...]`.

    ```python
    import treeclass as tc

    tree = {"layers": [{"weight": 1.0, "bias": 0.0}, {"weight": 2.0, "bias": 0.0}]}
    new = tc.at(tree)[tc.glob("layers.*.weight")].apply(lambda w: w * 10)
    assert [layer["weight"] for layer in new["layers"]] == [10.0, 20.0]
    assert tc.at(tree)[tc.glob("**.bias")].reduce(lambda a, b: a + b) == 0.0
    ```
    """
    if not isinstance(pattern, str):
        raise TypeError(f"`glob` expects a pattern string, got {pattern!r}.")
    return _compiled_glob(pattern)
