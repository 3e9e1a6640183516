"""Pickling keeps class identity: cloudpickle round trips of classes shipped by value.

cloudpickle ships a class defined in `__main__` (a script, a notebook cell) or in a
function by value. Unpickled in a process where that class is alive, it must come back as
the live class with its live record, so equality, copies and the jit cache are unchanged.
In a fresh process the class is rebuilt from its description, and instances made there
have the same static fields and tree definitions as the shipped ones. Each check runs a
script as `__main__` in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def _run_as_main(tmp_path, body: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(body))
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_cloudpickle_round_trip_in_the_same_process_keeps_the_live_class(tmp_path):
    _run_as_main(tmp_path, _SAME_PROCESS)


def test_cloudpickle_round_trip_through_another_process_keeps_the_live_class(tmp_path):
    _run_as_main(tmp_path, _THERE_AND_BACK)


def test_cloudpickled_class_with_static_fields_builds_instances_in_a_fresh_process(tmp_path):
    _run_as_main(tmp_path, _IN_A_FRESH_PROCESS)
