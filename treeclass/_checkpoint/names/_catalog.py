"""The catalog protocol: what a checkpoint holds under each name (`Stored`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

from ..._structure import describe as structure_describe
from ..._values import array_type, short_repr
from ._walk import NUMBER, OBJECT, PLAIN, TENSOR, category, is_plain


def describe(value: object) -> str:
    """A template's or a checkpoint's value in messages (`an array f32[2,3]`)."""
    if is_plain(value) and type(value) in (tuple, list):
        return f"a `{type(value).__name__}` {short_repr(value)}"
    if category(value) in (TENSOR, NUMBER, PLAIN):
        return structure_describe(value)
    return f"a `{type(value).__name__}` (not data)"


class Stored(NamedTuple):
    """What a catalog holds under one name, as the checks see it."""

    category: str  # tensor or plain (a number or another plain value) or object
    dtype: str = ""  # tensors: the dtype's name ("float32", "key<fry>")
    shape: tuple = ()
    value: Any = None  # plain values: the value; objects: the type's name
    weak: bool | None = None  # tensors: weakly typed (None: the catalog does not say)

    def describe(self) -> str:
        if self.category == TENSOR:
            return "an array " + array_type(self.dtype, self.shape)
        if self.category == OBJECT:
            return f"a `{self.value}` (not saved)"
        return describe(self.value)


class Catalog(Protocol):
    """What `restore` reads: names, what is stored under each, and the values."""

    label: str  # "the file", in messages
    title: str  # "The checkpoint model.safetensors", at the head of an error
    call: str  # the call that loads it, with the template as `like`
    records_values: bool  # whether strings and static values are recorded
    problems: list[str]  # problems found before any entry is checked (report lines)

    def names(self) -> Iterable[str]: ...

    def stored(self, name: str) -> Stored | None: ...

    def fetch(self, name: str) -> Any: ...


class Wrapping:
    """A catalog over another, `inner`, named as it is (its own problems start empty)."""

    def __init__(self, inner: Catalog) -> None:
        self.inner = inner
        self.label, self.title, self.call = inner.label, inner.title, inner.call
        self.records_values = inner.records_values
        self.problems: list[str] = []
