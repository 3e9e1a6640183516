"""What type checkers see: the package, typed user code, and an installed treeclass.

Both checkers run once per session on the package and on `tests/typing/` (the config is
pyproject.toml's: pyright in basic mode, mypy for Python 3.10). The package must have no
error at all; a file in `tests/typing/` must get an error on exactly the lines its
`# E: both` / `# E: pyright` / `# E: mypy` markers name. A last test checks from a folder
outside the repository, as an editor would, that the installed treeclass is found and its
generated `__init__` seen.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import runpy
import subprocess
import sys
from collections import defaultdict

import pytest

ROOT = pathlib.Path(__file__).parents[1]
USER_CODE = sorted((ROOT / "tests" / "typing").glob("*.py"))
_MARKER = re.compile(r"#\s*E:\s*(both|pyright|mypy)\s*$")
_MYPY_LINE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<message>.*)$")
# no check for a newer pyright on PyPI at every run
_ENV = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}

Errors = dict[pathlib.Path, dict[int, list[str]]]  # file -> line -> messages


def _run(command: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    checker = command[2]  # [python, -m, checker, ...]
    if importlib.util.find_spec(checker) is None:
        pytest.skip(f"{checker} is not installed on this machine (pip install -e '.[test]')")
    return subprocess.run(command, cwd=cwd, env=_ENV, capture_output=True, text=True, timeout=600)


def _pyright(targets: list[str], cwd: pathlib.Path) -> Errors:
    done = _run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, *targets],
        cwd,
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not run:\n{done.stdout}\n{done.stderr}")
    errors: Errors = defaultdict(lambda: defaultdict(list))
    for item in report["generalDiagnostics"]:
        if item["severity"] == "error":
            line = item["range"]["start"]["line"] + 1
            errors[pathlib.Path(item["file"]).resolve()][line].append(item["message"])
    return errors


def _mypy(
    targets: list[str], cwd: pathlib.Path, *options: str, cache: str = ".mypy_cache"
) -> Errors:
    # one cache for the package's runs (and for `mypy` run by hand): jax is analysed once
    done = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(ROOT / cache),
            "--no-error-summary",
            "--no-pretty",
            *options,
            *targets,
        ],
        cwd,
    )
    if done.returncode not in (0, 1):
        pytest.fail(f"mypy did not run:\n{done.stdout}\n{done.stderr}")
    errors: Errors = defaultdict(lambda: defaultdict(list))
    for line in done.stdout.splitlines():
        found = _MYPY_LINE.match(line)
        if found:
            path = (cwd / found["file"]).resolve()
            errors[path][int(found["line"])].append(found["message"])
    return errors


@pytest.fixture(scope="session")
def pyright_errors() -> Errors:
    return _pyright(["treeclass", "tests/typing"], ROOT)


@pytest.fixture(scope="session")
def mypy_errors() -> Errors:
    return _mypy(["treeclass", "tests/typing"], ROOT, "--config-file", "pyproject.toml")


def _package_errors(errors: Errors) -> list[str]:
    package = ROOT / "treeclass"
    return [
        f"{path.relative_to(ROOT)}:{line}: {message}"
        for path, lines in sorted(errors.items())
        if package in path.parents
        for line, messages in sorted(lines.items())
        for message in messages
    ]


def test_package_has_no_pyright_error(pyright_errors):
    errors = _package_errors(pyright_errors)
    assert not errors, "\n".join(errors)


def test_package_has_no_mypy_error(mypy_errors):
    errors = _package_errors(mypy_errors)
    assert not errors, "\n".join(errors)


def _expected_lines(path: pathlib.Path, checker: str) -> set[int]:
    lines = path.read_text().splitlines()
    return {
        number
        for number, text in enumerate(lines, start=1)
        if (found := _MARKER.search(text)) and found[1] in ("both", checker)
    }


def _differences(path: pathlib.Path, errors: Errors, checker: str) -> list[str]:
    reported = errors.get(path.resolve(), {})
    expected = _expected_lines(path, checker)
    name = path.relative_to(ROOT)
    missed = [
        f"{name}:{line}: no error, but the line is marked"
        for line in sorted(expected - set(reported))
    ]
    extra = [
        f"{name}:{line}: unexpected error: {message}"
        for line in sorted(set(reported) - expected)
        for message in reported[line]
    ]
    return missed + extra


@pytest.mark.parametrize("path", USER_CODE, ids=lambda p: p.name)
def test_user_code_gets_exactly_the_marked_pyright_errors(path, pyright_errors):
    differences = _differences(path, pyright_errors, "pyright")
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("path", USER_CODE, ids=lambda p: p.name)
def test_user_code_gets_exactly_the_marked_mypy_errors(path, mypy_errors):
    differences = _differences(path, mypy_errors, "mypy")
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("path", USER_CODE, ids=lambda p: p.name)
def test_user_code_runs(path):
    runpy.run_path(str(path), run_name="typed_user_code")


_OUTSIDE = """\
import treeclass as tc


class Point(tc.TreeClass):
    x: float
    y: float = 0.0


Point(1.0, y=2.0)
Point("a")
"""


def _installed() -> bool:
    try:
        importlib.metadata.distribution("treeclass")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="treeclass is not installed (pip install -e .)")
@pytest.mark.parametrize("checker", ["pyright", "mypy"])
def test_an_installed_treeclass_is_found_from_outside_the_checkout(checker, tmp_path):
    # The folder holds a `treeclass` folder with no `__init__.py`, as the folder of a clone
    # does: the installed package must win over it (an import hook would lose to it).
    (tmp_path / "treeclass").mkdir()
    (tmp_path / "user.py").write_text(_OUTSIDE)
    if checker == "pyright":
        errors = _pyright(["user.py"], tmp_path)
    else:
        # with the project's settings (Python 3.10), none of them about where `treeclass` is
        # found; what is asserted is user.py's errors alone. Its own cache: run from outside
        # the checkout, the jaxlib stubs of typings/ are not on its path, and the package's
        # runs reusing what it wrote of jax would see `Device` as unknown
        errors = _mypy(
            ["user.py"],
            tmp_path,
            "--config-file",
            str(ROOT / "pyproject.toml"),
            cache=".mypy_cache_outside",
        )
    reported = {
        line: messages
        for path, lines in errors.items()
        for line, messages in lines.items()
        if path == (tmp_path / "user.py").resolve()
    }
    # only the wrong argument type: the import resolves and the __init__ is the fields'
    assert list(reported) == [10], reported
    done = subprocess.run(
        [sys.executable, "-c", "import treeclass; treeclass.TreeClass"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
