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
import subprocess
import sys
import traceback
from collections.abc import Callable

DEVICE_COUNT = 8


def run_check_script(name: str) -> dict[str, str]:
    """Run `tests/<name>` on 8 CPU devices; `{check name: "ok" or its traceback}`."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICE_COUNT}",
    }
    script = pathlib.Path(__file__).with_name(name)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(checks: dict[str, Callable[[], None]], limit: int = 8) -> None:
    """Run every check and print `{name: "ok" or the traceback}` as one JSON line."""
    results = {}
    for name, fn in checks.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=limit)
    print(json.dumps(results))
