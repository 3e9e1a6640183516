"""Pickling keeps class identity: cloudpickle round trips of classes shipped by value.

cloudpickle ships a class defined in `__main__` (a script, a notebook cell) or in a
function by value. Unpickled in a process where that class is alive, it must come back as
the live class with its live record, so equality, copies and the jit cache are unchanged.
In a fresh process the class is rebuilt from its description, and instances made there
have the same static fields and tree definitions as the shipped ones. The checks run in
turn as `__main__` of one script in a fresh interpreter (one start for the three), each
with a jitted `step` of its own, so that no check sees another's traces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import copy, subprocess, sys
import cloudpickle, jax, jax.numpy as jnp
import treeclass as tc

class Linear(tc.TreeClass):  # defined in __main__, as in a notebook cell
    weight: jax.Array
    act: str = tc.field(default="relu", static=True)

    def __call__(self, x):
        return x @ self.weight

class Stack(tc.TreeClass, leafwise=True):  # a hand-written __init__
    def __init__(self, layers, tag="stack"):
        self.layers = tuple(layers)
        self.tag = tc.freeze(tag)

def make_local():
    class Local(tc.TreeClass):
        bias: jax.Array
    return Local

Local = make_local()
traces = []

@jax.jit
def step(tree):
    traces.append(1)
    return jax.tree_util.tree_map(lambda x: x * 2, tree)
"""

_SAME_PROCESS = """
models = [
    Linear(jnp.ones((2, 2))),
    Linear(jnp.ones((2, 2)), act="gelu"),
    Stack([Linear(jnp.ones((2, 2))), Linear(jnp.zeros((2, 2)))]),
    Local(jnp.ones(3)),
]
records = {cls: cls._tc_info for cls in (Linear, Stack, Local)}
for model in models:
    traces.clear()
    step(model)
    for _ in range(3):
        back = cloudpickle.loads(cloudpickle.dumps(model))
        assert type(back) is type(model)
        assert all(cls._tc_info is record for cls, record in records.items())
        assert back == model and copy.deepcopy(model) == model and copy.copy(model) == model
        treedef = jax.tree_util.tree_structure(model)
        assert jax.tree_util.tree_structure(back) == treedef
        step(back)
        step(copy.deepcopy(model))
    assert len(traces) == 1, f"{type(model).__name__} compiled {len(traces)} times"
assert cloudpickle.loads(cloudpickle.dumps(Linear)) is Linear
traces.clear()
step(Linear(jnp.ones((2, 2))))  # made after the round trips: a cache hit
assert not traces
assert Linear(jnp.ones((2, 2))).at["weight"].set(jnp.zeros((2, 2))).weight.sum() == 0.0
assert (models[2] + models[2]).layers[0].weight.sum() == 8.0
print("ok")
"""

_THERE_AND_BACK = """
model = Linear(jnp.ones((2, 2)), act="gelu")
record = Linear._tc_info
relay = '''
import sys, cloudpickle, jax.numpy as jnp
shipped = cloudpickle.loads(sys.stdin.buffer.read())
assert shipped.act == "gelu" and shipped(jnp.ones((1, 2))).tolist() == [[2.0, 2.0]]
sys.stdout.buffer.write(cloudpickle.dumps(shipped))
'''
result = subprocess.run(
    [sys.executable, "-c", relay], input=cloudpickle.dumps(model), capture_output=True
)
assert result.returncode == 0, result.stderr.decode()[-2000:]
back = cloudpickle.loads(result.stdout)  # described by the other process
assert type(back) is Linear and Linear._tc_info is record
assert back == model and copy.deepcopy(model) == model
traces.clear()
step(model)
step(back)
assert len(traces) == 1
print("ok")
"""


_IN_A_FRESH_PROCESS = """
class Scaled(tc.TreeClass):
    weight: jax.Array
    heads: int = tc.field(default=2, static=True)

    def __post_init__(self):
        pass

models = (Linear(jnp.ones((2, 2)), act="gelu"), Scaled(jnp.ones(2), heads=4), Local(jnp.ones(3)))
reader = '''
import copy, sys, cloudpickle, jax, jax.numpy as jnp
models = cloudpickle.loads(sys.stdin.buffer.read())
traces = []

@jax.jit
def step(tree):
    traces.append(1)
    return tree

Linear, Scaled, Local = map(type, models)
made = (Linear(jnp.zeros((2, 2)), act="gelu"), Scaled(jnp.zeros(2), heads=4), Local(jnp.zeros(3)))
for model, new in zip(models, made):
    traces.clear()
    # a static field made here is static, as in the process that defined the class
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(model)
    assert len(jax.tree_util.tree_leaves(new)) == 1
    out = step(new)
    step(out), step(model), step(copy.deepcopy(model))
    assert len(traces) == 1 and out == new and copy.deepcopy(model) == model
assert made[1].heads == 4 and made[0].act == "gelu"
print("ok")
'''
result = subprocess.run(
    [sys.executable, "-c", reader], input=cloudpickle.dumps(models), capture_output=True
)
assert result.returncode == 0, result.stderr.decode()[-2000:]
print(result.stdout.decode().strip())
"""


# a fresh jitted step and trace list for each check
_STEP = """
traces = []

@jax.jit
def step(tree):
    traces.append(1)
    return jax.tree_util.tree_map(lambda x: x * 2, tree)
"""

_CHECKS = {
    "same_process": _SAME_PROCESS,
    "there_and_back": _THERE_AND_BACK,
    "in_a_fresh_process": _IN_A_FRESH_PROCESS,
}

# runs each check's code at the top level of `__main__` (its classes are `__main__`'s, as
# in a script), and prints `{check: what it printed, or its traceback}` as the last line
_RUNNER = """
import contextlib, io, json, traceback
results = {}
for _name, _code in CHECKS.items():
    exec(STEP, globals())
    _out = io.StringIO()
    try:
        with contextlib.redirect_stdout(_out):
            exec(compile(_code, _name, "exec"), globals())
        results[_name] = _out.getvalue().strip()
    except Exception:
        results[_name] = traceback.format_exc()
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("pickling")
    script = folder / "script.py"
    checks = {name: textwrap.dedent(body) for name, body in _CHECKS.items()}
    script.write_text(
        textwrap.dedent(_PRELUDE)
        + f"CHECKS = {checks!r}\nSTEP = {textwrap.dedent(_STEP)!r}\n"
        + textwrap.dedent(_RUNNER)
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=folder,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_cloudpickle_round_trip_in_the_same_process_keeps_the_live_class(checked):
    assert checked["same_process"] == "ok", checked["same_process"]


def test_cloudpickle_round_trip_through_another_process_keeps_the_live_class(checked):
    assert checked["there_and_back"] == "ok", checked["there_and_back"]


def test_cloudpickled_class_with_static_fields_builds_instances_in_a_fresh_process(checked):
    assert checked["in_a_fresh_process"] == "ok", checked["in_a_fresh_process"]
