"""Every code example in README.md and docs/ runs, and shown output is checked.

Convention for the markdown files: the ```python blocks of one file run in order in one
namespace (a fresh module per file), so a page reads like a session. A ```python block
followed directly by a ```text block (or a ```mermaid block, which the site renders as a
picture) must print exactly that text. A block whose info string has `skip` (e.g.
```python skip) is not run; use it only for shell-dependent or illustrative snippets.
Blocks in other languages (```bash, or ```py embedding a file with `--8<--`) are not run.

Also checked here: the sharding recipe on four simulated devices, that every public name
has an API reference entry and a docstring with a runnable example, and that the site
builds with `mkdocs build --strict` and no warning.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import pathlib
import re
import subprocess
import sys
import types

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_API_ENTRY = re.compile(r"^::: (treeclass[\w.]*)\s*$", re.MULTILINE)
# the modules whose `__all__` is the public API, documented in docs/api/
_PUBLIC_MODULES = ("treeclass", "treeclass.optim")


def _markdown_files() -> list[pathlib.Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.exists()]


def _blocks(text: str) -> list[tuple[str, str, str | None, int]]:
    """(info, code, expected output or None, first line of code) for each python block."""
    found = [(m.group(1).strip(), m.group(2), m.start(), m.end()) for m in _BLOCK.finditer(text)]
    result = []
    for i, (info, code, start, end) in enumerate(found):
        words = info.split()
        if not words or words[0] != "python" or "skip" in words[1:]:
            continue
        expected = None
        if i + 1 < len(found):
            next_info, next_code, next_start, _ = found[i + 1]
            shown = next_info.split()[:1] in (["text"], ["mermaid"])
            if shown and text[end:next_start].strip() == "":
                expected = next_code
        line = text.count("\n", 0, start) + 2  # the fence line, then the code
        result.append((info, code, expected, line))
    return result


def _page_namespace(path: pathlib.Path) -> dict:
    """A fresh module for one page, registered so that its classes can be pickled."""
    module_name = "docs_page_" + re.sub(r"\W", "_", str(path.relative_to(ROOT).with_suffix("")))
    module = types.ModuleType(module_name)
    sys.modules[module_name] = module
    return module.__dict__


def _run_page(path: pathlib.Path) -> None:
    blocks = _blocks(path.read_text())
    namespace = _page_namespace(path)
    name = str(path.relative_to(ROOT))
    for _info, code, expected, line in blocks:
        out = io.StringIO()
        # padding with newlines makes tracebacks point at the line in the markdown file
        source = "\n" * (line - 1) + code
        # the pages compare float32 results at float32 tolerances: a TPU multiplies float32
        # matrices in bfloat16 passes unless asked for full precision (a no-op on the CPU)
        with contextlib.redirect_stdout(out), jax.default_matmul_precision("highest"):
            exec(compile(source, name, "exec"), namespace)
        if expected is not None:
            assert out.getvalue().rstrip() == expected.rstrip(), (
                f"the block at {name}:{line} printed something else than the page shows"
            )


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_examples_run_and_print_what_they_show(path: pathlib.Path) -> None:
    _run_page(path)


def test_sharding_recipe_runs_on_several_devices() -> None:
    # the in-process run above sees one CPU device; the recipe must hold for several
    page = ROOT / "docs" / "recipes" / "sharding.md"
    if not page.exists():
        pytest.skip("no sharding recipe")
    code = (
        "import sys, pathlib, jax\n"
        "assert jax.device_count() == 4, jax.devices()\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import test_examples\n"
        f"test_examples._run_page(pathlib.Path({str(page)!r}))\n"
    )
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        # the inherited flags kept (the tests' compiler settings, see conftest.py)
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        "--xla_force_host_platform_device_count=4".strip(),
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_has_python_examples() -> None:
    assert _blocks((ROOT / "README.md").read_text()), "README.md should show runnable examples"


def _public_names() -> list[str]:
    names = []
    for module_name in _PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional dependency (optax) is not installed
            continue
        names += [f"{module_name}.{name}" for name in module.__all__]
    return names


def _resolve(full_name: str) -> object:
    module_name, _, name = full_name.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        documented.update(_API_ENTRY.findall(page.read_text()))
    missing = [name for name in _public_names() if name not in documented]
    assert not missing, f"add `::: NAME` entries to docs/api/ for: {', '.join(missing)}"


_DOC_EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# a bold heading (**Arguments**) with its list on the next line renders as one paragraph
_HEADING_WITHOUT_BLANK = re.compile(r"^\*\*[A-Z][\w ]*\*\*\n(?!\n)", re.MULTILINE)
# Known docstring problems (name -> what is wrong), waiting for a fix in the module that
# owns the docstring. Each entry must still be a problem, so that a fix removes it here.
_KNOWN_DOCSTRING_PROBLEMS: dict[str, str] = {}


def _docstring_problems(obj: object) -> list[str]:
    doc = inspect.getdoc(obj) or ""
    problems = []
    examples = _DOC_EXAMPLE.findall(doc)
    if not examples and not inspect.ismodule(obj):  # a module's members carry examples
        problems.append("no ```python example")
    if _HEADING_WITHOUT_BLANK.search(doc):
        problems.append("a **Heading** line not followed by a blank line")
    for code in examples:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, "<docstring>", "exec"), {"__name__": "docstring"})
        except Exception as error:  # reported with the public name below
            problems.append(f"example raises {type(error).__name__}: {error}")
    return problems


@pytest.mark.parametrize("name", _public_names())
def test_public_docstring_has_a_runnable_example(name: str) -> None:
    problems = _docstring_problems(_resolve(name))
    if name in _KNOWN_DOCSTRING_PROBLEMS:
        assert problems, f"{name} is fixed: remove it from _KNOWN_DOCSTRING_PROBLEMS"
        return
    assert not problems, f"docstring of {name}: " + "; ".join(problems)


def test_docs_site_builds_without_warnings(tmp_path: pathlib.Path) -> None:
    if not (ROOT / "mkdocs.yml").exists():
        pytest.fail("mkdocs.yml is missing: the documentation site must build in CI")
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed on this machine (pip install -e '.[test]')")
    # mkdocs-material prints a banner about its future; it is not a warning about our docs
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output


def test_no_project_file_points_to_a_design_doc_outside_the_repo() -> None:
    # the project's own design document is docs/architecture.md
    files = [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "treeclass").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.md"),
    ]
    offenders = [str(f.relative_to(ROOT)) for f in files if "DESIGN.md" in f.read_text()]
    assert not offenders
    assert (ROOT / "docs" / "architecture.md").exists()
