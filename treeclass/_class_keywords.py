"""Class keywords that a package above the class gives a meaning to (`version=2`): the
core class never interprets them; the owning package offers its check when it loads, and
a keyword no loaded package checks is an error (a typo never passes silently).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# keyword names, in the order the owner declared them -> the owner's check
_CHECKS: dict[tuple[str, ...], Callable[..., None]] = {}


def offer_class_check(names: tuple[str, ...], check: Callable[..., None]) -> None:
    """Give the class keywords `names` a meaning: `check(cls, *values)` for every TreeClass
    subclass, with `None` for a keyword not given."""
    _CHECKS[tuple(names)] = check


def check_class_keywords(cls: type, given: Mapping[str, Any]) -> None:
    """Run the offered checks on the keyword values a class definition gave."""
    owned = {name for names in _CHECKS for name in names}
    stray = [name for name, value in given.items() if value is not None and name not in owned]
    if stray:
        raise TypeError(
            f"class {cls.__name__}: the class keyword(s) {stray} have no meaning here: "
            "the package that gives them one is not loaded"
        )
    for names, check in _CHECKS.items():
        check(cls, *(given.get(name) for name in names))
