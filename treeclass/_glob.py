"""The one key-path pattern language (`tc.glob`, sharding rules, checkpoint key rules; the
syntax: `glob`'s docstring), parsed once into segments and run two ways: an NFA over key
names for walking trees (`Glob.advance`; `_selectors.GlobMatcher` runs it over a tree),
and a regex over dotted names for key rules (`Glob.regex`).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

_GLOB_SYNTAX = (
    "Pattern syntax: segments separated by '.', each matched against a key's name with "
    "fnmatch wildcards ('*', '?'); '[0]' or '0' for a sequence index, \"['key']\" for a "
    "dict key (quoted: literal, no wildcards), '**' for any number of levels; captures "
    "'{name}' (one segment), '{name*}' (one or more), '{name:a|b}' (one of the values). "
    "Examples: 'layers.*.weight', '**.bias', 'layers[0].weight', 'layers.{i}.{rest*}'."
)
# a capture as written in a pattern: `{name}`, `{name*}`, `{name:a|b}`
CAPTURE = re.compile(r"\{([A-Za-z_]\w*)(\*?)(?::([^{}.]*))?\}")
_TOKEN = re.compile(CAPTURE.pattern + r"|[*?{}]")
_WILDCARDS = re.compile(r"[*?]")
_STAR, _ONE = ("*",), ("?",)  # fnmatch wildcards among a segment's tokens


class Capture(NamedTuple):
    """A capture of a pattern: its name, whether it takes one or more segments
    (`{name*}`), and the values it is limited to (`{name:a|b}`; empty: any)."""

    name: str
    many: bool
    values: tuple[str, ...]


def _tokens(text: str, pattern: str) -> tuple[Any, ...]:
    """A segment's text as literal strings, wildcards (`_STAR`, `_ONE`) and `Capture`s."""
    out: list[Any] = []
    at = 0
    for match in _TOKEN.finditer(text):
        if match.start() > at:
            out.append(text[at : match.start()])
        at = match.end()
        token = match.group()
        if match.group(1) is not None:
            name, many, values = match.group(1, 2, 3)
            if values is not None and (many or not all(values.split("|"))):
                raise ValueError(
                    f"The capture {token!r} in {pattern!r} lists values wrongly: "
                    "'{name:a|b}' takes one segment among non-empty values, and a capture of "
                    f"many segments ('{{name*}}') takes any. {_GLOB_SYNTAX}"
                )
            if many and text != token:
                raise ValueError(
                    f"The capture {token!r} in {pattern!r} takes one or more whole segments: "
                    f"write it as a segment of its own ('a.{token}.b'). {_GLOB_SYNTAX}"
                )
            out.append(Capture(name, bool(many), tuple(values.split("|")) if values else ()))
        elif token in "{}":
            raise ValueError(
                f"Stray {token!r} in {pattern!r}: a capture is '{{name}}', '{{name*}}' or "
                "'{name:a|b}' with a name of letters, digits and '_' (a dict key with braces: "
                f"\"['{{key}}']\"). {_GLOB_SYNTAX}"
            )
        else:
            out.append(_STAR if token == "*" else _ONE)
    if at < len(text):
        out.append(text[at:])
    return tuple(out)


def _name_regex(
    tokens: tuple[Any, ...],
    char: str,
    seen: set[str] | None = None,
    choices: Mapping[str, tuple[str, ...]] | None = None,
    many: frozenset[str] = frozenset(),
) -> str:
    """Tokens as a regex body (`char`: one character); with `seen`, captures are groups."""
    parts = []
    for token in tokens:
        if isinstance(token, str):
            parts.append(re.escape(token))
        elif token is _STAR or token is _ONE:
            parts.append(char + "*" if token is _STAR else char)
        elif seen is not None and token.name in seen:
            parts.append(f"(?P={token.name})")
        else:
            values = token.values or (choices or {}).get(token.name)
            if values:
                body = "|".join(map(re.escape, values))
            elif token.many or token.name in many:
                body = r"[^.]+(?:\.[^.]+)*?"
            else:
                body = char + "+"
            if seen is None:
                parts.append(f"(?:{body})")
            else:
                seen.add(token.name)
                parts.append(f"(?P<{token.name}>{body})")
    return "".join(parts)


class _Segment(str):
    """One segment of a pattern: its text, `match` (truthy for a key name it matches; None
    for `**`), `repeat` (`{name*}`: one name or more) and `tokens` (None for a quoted key,
    matched literally). An unquoted bracket segment matches the name whose `repr` it is.
    """

    match: Callable[[Any], object] | None
    repeat: bool
    tokens: tuple[Any, ...] | None

    def _set(self, match: Any, tokens: Any, repeat: bool = False) -> _Segment:
        self.match, self.tokens, self.repeat = match, tokens, repeat
        return self

    @classmethod
    def dotted(cls, text: str, pattern: str) -> _Segment:
        if text == "**":
            return cls(text)._set(None, ())
        tokens = _tokens(text, pattern)
        if len(tokens) == 1 and isinstance(tokens[0], Capture) and tokens[0].many:
            return cls(text)._set(lambda name: True, tokens, repeat=True)
        if all(isinstance(t, str) for t in tokens):
            return cls(text)._set(lambda name: str(name) == text, tokens)
        regex = re.compile(f"(?s:{_name_regex(tokens, '.')})").fullmatch
        return cls(text)._set(lambda name: regex(str(name)), tokens)

    @classmethod
    def bracket(cls, content: str, pattern: str) -> _Segment:
        if len(content) >= 2 and content[0] == content[-1] and content[0] in "'\"":
            try:
                literal = ast.literal_eval(content)
            except (ValueError, SyntaxError):
                literal = content[1:-1]
            return cls(literal)._set(lambda name: isinstance(name, str) and name == literal, None)
        if not (_WILDCARDS.search(content) or CAPTURE.search(content)):
            return cls(content)._set(lambda name: repr(name) == content, (content,))
        tokens = _tokens(content, pattern)
        if any(isinstance(t, Capture) and t.many for t in tokens):
            raise ValueError(
                f"The capture in [{content}] of {pattern!r} takes one or more segments: "
                f"write it as a dotted segment ('a.{content}'). {_GLOB_SYNTAX}"
            )
        regex = re.compile(f"(?s:{_name_regex(tokens, '.')})").fullmatch
        return cls(content)._set(
            lambda name: regex(str(name)) is not None or repr(name) == content, tokens
        )

    def is_wild(self) -> bool:
        """Whether the segment matches names by wildcards (`*`, `?`, `**`, `[*]`)."""
        return self.match is None or any(t is _STAR or t is _ONE for t in self.tokens or ())


class Glob:
    """A parsed pattern (`segments`, `captures`) and its two back ends. An NFA state is a
    frozenset of positions in `segments`, from `start`; one holding `accept` (one past the
    last segment) has matched. Transitions are memoized per (state, name)."""

    __slots__ = ("pattern", "segments", "captures", "start", "accept", "_transitions")

    # memoization only: bounded, so unboundedly many distinct names cannot grow it
    _MAX_TRANSITIONS = 4096

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.segments = _parse_glob(pattern)
        self.captures = tuple(
            t for s in self.segments for t in s.tokens or () if isinstance(t, Capture)
        )
        self.accept = len(self.segments)
        self._transitions: dict[Any, frozenset[int]] = {}
        self.start = self._closure(frozenset([0]))

    def __repr__(self) -> str:
        return f"glob({self.pattern!r})"

    def dotted(self) -> str:
        """The pattern as a dotted name would be written (`layers[{i}].w`: `layers.{i}.w`)."""
        return ".".join(self.segments)

    def expects_name(self, position: int) -> bool:
        """Whether the segment at `position` must match one key name (not `**`, not past)."""
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
            segment = segments[p]
            if segment.match is None or segment.repeat:
                nxt.add(p)  # '**' and '{name*}' consume this level and may consume more
            if segment.match is not None and segment.match(name):
                nxt.add(p + 1)
        result = self._closure(frozenset(nxt)) if nxt else frozenset()
        if key is not None and len(self._transitions) < self._MAX_TRANSITIONS:
            self._transitions[key] = result
        return result

    def regex(
        self,
        choices: Mapping[str, tuple[str, ...]] | None = None,
        many: frozenset[str] = frozenset(),
    ) -> re.Pattern[str]:
        """The pattern as a regex over dotted names, each capture a named group; `choices`
        limits captures to values, `many` lets a `{name}` take several segments."""
        parts: list[str] = []
        seen: set[str] = set()
        dot = False  # whether a segment before needs a '.' before the next one
        for k, segment in enumerate(self.segments):
            if segment.match is None:  # '**'
                if k + 1 < len(self.segments) and self.segments[k + 1].match is None:
                    continue  # ('**.**' is '**')
                if k + 1 < len(self.segments):
                    parts.append((r"\." if dot else "") + r"(?:[^.]+\.)*")
                    dot = False
                else:
                    parts.append(r"(?:\.[^.]+)*" if dot else r"(?:[^.]+(?:\.[^.]+)*)?")
                continue
            parts.append(r"\." if dot else "")
            dot = True
            if segment.tokens is None:  # a quoted key: literal
                parts.append(re.escape(segment))
            else:
                parts.append(_name_regex(segment.tokens, "[^.]", seen, choices, many))
        return re.compile("".join(parts))


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
                segments.append(_Segment.dotted(current, pattern))
            elif not after_bracket:
                raise ValueError(f"Empty segment in glob {pattern!r}. {_GLOB_SYNTAX}")
            current, after_bracket = "", False
            i += 1
            if i == n:
                raise ValueError(f"Glob {pattern!r} ends with '.'. {_GLOB_SYNTAX}")
        elif char == "[":
            if current:
                segments.append(_Segment.dotted(current, pattern))
                current = ""
            close = _bracket_end(text, i, pattern)
            content = text[i + 1 : close].strip()
            if not content:
                raise ValueError(f"Empty brackets in glob {pattern!r}. {_GLOB_SYNTAX}")
            segments.append(_Segment.bracket(content, pattern))
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
        segments.append(_Segment.dotted(current, pattern))
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
            depth -= 1
        i += 1
    if quote is not None:
        raise ValueError(f"Unclosed quote in glob {pattern!r}. {_GLOB_SYNTAX}")
    raise ValueError(f"Unclosed '[' in glob {pattern!r}. {_GLOB_SYNTAX}")


@functools.lru_cache(maxsize=256)
def parse(pattern: str) -> Glob:
    """The parsed pattern, one object per string: `tc.glob("...")` written inline in a
    loop keeps its memoized transitions, and a rule table is parsed once."""
    return Glob(pattern)


def glob(pattern: str) -> Any:
    """A key-path pattern: one string that reaches nodes any number of levels down.

    The same language writes the globs of `tc.ShardingRules` and the key rules of
    `tc.load` / `tc.save`. The whole pattern must match, and a matching node is not looked
    into further; a pattern that matches nothing is an error (`LookupError`) naming the
    closest keys.

    **Arguments**

    - `pattern`: segments separated by `.`, each matching one level below the current
      one (a leading `.` is allowed, so `jax.tree_util.keystr` of a path matches it):
        - a name with `fnmatch` wildcards, case sensitive: `*` (any characters), `?` (one
          character); an attribute is matched by its name, a dict entry by `str(key)`, a
          sequence entry by its index in decimal (not negative);
        - `[...]`, as `keystr` writes a key: `layers[0]`, `['a.b']` (quoted: literal, may
          hold `.`, `[` and `*`; unquoted brackets may hold wildcards, `[*]`);
        - `**`: any number of levels, none included;
        - captures, which select as `*` here (key rules write their values into their
          targets): `{name}` one level, also within a segment (`{n}_proj`); `{name:a|b}`
          one level among the values; `{name*}` (a segment of its own) one level or more.
          A repeated capture name is refused (`ValueError`).

    **Returns**

    A selector for `.at[...]`.

    ```python
    import treeclass as tc

    tree = {"layers": [{"weight": 1.0, "bias": 0.0}, {"weight": 2.0, "bias": 0.0}]}
    new = tc.at(tree)[tc.glob("layers.*.weight")].apply(lambda w: w * 10)
    assert [layer["weight"] for layer in new["layers"]] == [10.0, 20.0]
    ```
    """
    if not isinstance(pattern, str):
        raise TypeError(f"`glob` expects a pattern string, got {pattern!r}.")
    parsed = parse(pattern)
    names = [c.name for c in parsed.captures]
    twice = next((n for k, n in enumerate(names) if n in names[:k]), None)
    if twice is not None:
        raise ValueError(
            f"The glob {pattern!r} captures {{{twice}}} twice: in a key rule that means "
            "equal values, which `tc.glob` does not compare. Give the captures different "
            "names, or write '*'."
        )
    return parsed
