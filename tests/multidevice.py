"""Running checks on 8 simulated CPU devices: the harness the multidevice check scripts share.

A check script (`multidevice_check.py`, `checkpoint_multidevice_check.py`) must start JAX
with `XLA_FLAGS=--xla_force_host_platform_device_count=8`, so it runs in a subprocess;
it reports each check's outcome as one JSON line (`report`), which the test module reads
back (`run_check_script`). This module imports no JAX: a script sets its flags first.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import traceback
import types
from collections.abc import Callable

DEVICE_COUNT = 8


def run_check_script(name: str) -> dict[str, str]:
    """Run `tests/<name>` on 8 CPU devices; `{check name: "ok" or its traceback}`."""
    script = pathlib.Path(__file__).with_name(name)
    # this checkout's treeclass first (an installed one may be another), ahead of the
    # caller's PYTHONPATH, which is kept: it may be where jax itself is installed
    path = [str(script.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        # the inherited flags kept (the tests' compiler settings, see conftest.py)
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={DEVICE_COUNT}".strip(),
        "PYTHONPATH": os.pathsep.join(path),
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(checks: dict[str, Callable[[], object]], limit: int = 8) -> None:
    """Run every check and print `{name: "ok" or the traceback}` as one JSON line; a check
    of several cases returns `{case: "ok" or the traceback}`, which stands for its "ok"."""
    results: dict[str, object] = {}
    for name, fn in checks.items():
        try:
            outcome = fn()
            results[name] = "ok" if outcome is None else outcome
        except Exception:
            results[name] = traceback.format_exc(limit=limit)
    print(json.dumps(results))


def page_definitions(page: pathlib.Path, section: str) -> dict:
    """The namespace of the python blocks of one section (`## ...`) of a docs page.

    Checks that run a page's model on many devices or processes take its definitions
    from the page itself, so that what the page shows is what they check. The blocks run
    in a fresh module registered in `sys.modules`, so that its classes pickle by name.
    """
    text = page.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    blocks = re.findall(
        r"^```python\n(.*?)^```", text[start : end if end > 0 else None], re.M | re.S
    )
    module = types.ModuleType("docs_" + re.sub(r"\W", "_", page.stem))
    sys.modules[module.__name__] = module
    for code in blocks:
        exec(compile(code, str(page), "exec"), module.__dict__)
    return module.__dict__
