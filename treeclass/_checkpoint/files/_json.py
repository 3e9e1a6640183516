"""Strict JSON for checkpoint headers, as the reference safetensors reader: duplicate
keys, `NaN`/`Infinity` and lone surrogates refused, size and nesting bounded."""

from __future__ import annotations

import json
from typing import Any

# the reference reader's cap on a header (safetensors' MAX_HEADER_SIZE)
MAX_HEADER_BYTES = 100_000_000
# deeper than any checkpoint needs (a safetensors header nests 3 levels, our document a
# few more per level of a nested tuple), shallow enough for every recursive reader
MAX_DEPTH = 64


def _check_strings(strings: list[str]) -> None:
    try:
        "".join(strings).encode("utf-8")  # one check for many: joining adds no pair
    except UnicodeEncodeError:
        for text in strings:
            check_text(text, "the string")


def nesting_depth(value: Any, check_strings: bool) -> int:
    """How deeply lists and dicts nest in a value (`check_strings`: refuse invalid Unicode)."""
    peak, stack = 0, [(value, 1)] if type(value) in (dict, list) else []
    while stack:
        item, depth = stack.pop()
        peak = max(peak, depth)
        children = item.values() if type(item) is dict else item
        stack.extend((x, depth + 1) for x in children if type(x) is dict or type(x) is list)
        if check_strings:
            keys = list(item) if type(item) is dict else []
            _check_strings([x for x in children if type(x) is str] + keys)
    return peak


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return result


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_text(text: str, what: str) -> None:
    """Refuse a string that is not valid Unicode (a lone surrogate) as `what`."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{what} {text!r} is not valid UTF-8 ({error.reason})") from None


def loads(data: bytes | str) -> Any:
    """Parse `data` strictly; `ValueError` with the reason for anything refused."""
    size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"it is {size} bytes, more than the limit of {MAX_HEADER_BYTES}")
    text = data.decode("utf-8") if isinstance(data, bytes) else data  # UnicodeDecodeError
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except RecursionError:
        # the parser recurses once per level, in C, and stops cleanly at the interpreter's
        # limit: far deeper than MAX_DEPTH, so this is the same refusal, said earlier
        raise ValueError(f"it nests deeper than the limit of {MAX_DEPTH} levels") from None
    # decoded UTF-8 holds no lone surrogate; only an escape (`"\ud800"`) can make one
    depth = nesting_depth(value, check_strings="\\u" in text)
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests {depth} levels deep, more than the limit of {MAX_DEPTH}")
    return value
