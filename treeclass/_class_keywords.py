"""Class keywords that a package above the class gives a meaning to.

`class Model(tc.TreeClass, version=2, migrations={1: {"w": "weight"}})`: the core class
accepts such keywords but never interprets them, so it knows nothing of files. The
package that owns a keyword offers its check when it loads (`offer_class_check`); at
class definition, `TreeClass.__init_subclass__` hands every offered keyword's value to
`check_class_keywords`, which runs the checks (they raise on bad values and keep what
they accept on the class). A keyword given a value that no loaded package checks is an
error, so a typo or a missing package never passes silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["offer_class_check", "check_class_keywords"]

# keyword names, in the order the owner declared them -> the owner's check
_CHECKS: dict[tuple[str, ...], Callable[..., None]] = {}


def offer_class_check(names: tuple[str, ...], check: Callable[..., None]) -> None:
    """Give the class keywords `names` a meaning: `check(cls, *values)` at class definition.

    The check runs for every TreeClass subclass, with `None` for a keyword not given,
    so an undeclared class can still inherit its base's data.
    """
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
