"""Class keywords: the core class keeps them, the package that owns them checks them."""

from __future__ import annotations

import pytest

import treeclass as tc
from treeclass import _class_keywords


def test_the_checkpoint_keywords_are_checked_at_class_definition():
    class Versioned(tc.TreeClass, version=2, migrations={1: {"w": "weight"}}):
        weight: float = 1.0

    assert tc.load.__module__.startswith("treeclass._checkpoint")  # the owner is loaded
    with pytest.raises(TypeError, match="version= takes its checkpoint version"):

        class Bad(tc.TreeClass, version=-1):
            pass

    with pytest.raises(ValueError, match="none from version 1 to 2"):

        class Gap(tc.TreeClass, version=3, migrations={0: {}, 2: {}}):
            pass

    assert Versioned(weight=2.0).weight == 2.0


def test_a_keyword_no_loaded_package_owns_is_an_error_naming_the_class():
    class Plain:
        pass

    with pytest.raises(TypeError, match=r"class Plain: the class keyword\(s\) \['color'\]"):
        _class_keywords.check_class_keywords(Plain, {"color": "red"})


def test_an_offered_check_sees_none_for_a_keyword_not_given(monkeypatch):
    seen = []
    monkeypatch.setitem(
        _class_keywords._CHECKS, ("color", "shade"), lambda cls, *v: seen.append((cls, v))
    )

    class Plain:
        pass

    _class_keywords.check_class_keywords(Plain, {"color": "red"})
    assert (Plain, ("red", None)) in seen
