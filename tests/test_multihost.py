"""Several JAX processes on this machine under `jax.distributed`, as one process per host.

Each run starts its processes (`tests/multihost_worker.py`) on a free port of 127.0.0.1,
waits for them within a hard time limit, and kills by PID every process still running
when it ends, whether it passed, failed or timed out; a failure shows every process's
exit status and the end of its stderr. The runs, in order:

1. `train_and_save` then `sharding_rules`, in the same 2 processes x 2 CPU devices (one
   start of the processes for both): the model built in its shardings, a sharded train
   step against one device, frozen values, inspection from one process, equality and
   `.at[mask].get()` errors, an orbax save, `tc.save` from one process and from all, and
   its misuses; then the transformer of the sharding recipe built in place from its rule
   table, trained, saved and loaded into the rules' template;
2. `restore`, 2 fresh processes x 2 devices: the checkpoint restored into an abstract
   sharded template, then the next step;
3. `restore`, 1 process x 4 devices: the same checkpoint on another process count and
   another mesh;
4. `sharded_save`, 3 processes x 2 devices: a sharded `tc.save` written by every process,
   one whose share fails, and one whose process 2 dies (its exit status is expected).

Each worker reports its checks by name; each test below asserts one of them on every
process of a run. A new multi-process behaviour is a new check function in the worker
(added to a scenario) and a test here.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
from typing import NamedTuple

import pytest
from conftest import needs_read_counts

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")
ROOT = WORKER.parent.parent
PAGE = ROOT / "docs" / "recipes" / "multihost.md"
DIED = 17  # the status of a worker that dies on purpose (`multihost_worker.DIED`)
RUN_LIMIT_S = 150  # a run takes about 10 s; this bounds a hang, it is not a speed test
KILL_WAIT_S = 10
_TAIL = 6000


class Run(NamedTuple):
    """What each process of a run reported: `{check name: "ok" or its traceback}`."""

    processes: int
    results: tuple[dict[str, str], ...]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: pathlib.Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [line for line in text.splitlines() if not line.startswith("[Gloo]")]
    return "\n".join(lines)[-_TAIL:]


def _report(why: str, procs: list[subprocess.Popen], logs: list[pathlib.Path]) -> str:
    parts = [why]
    for i, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        parts.append(f"--- process {i} (pid {proc.pid}, exit {proc.returncode}) stderr ---")
        parts.append(_tail(log.with_suffix(".err")))
    return "\n".join(parts)


def run_workers(
    scenario: str,
    processes: int,
    devices: int,
    folder: pathlib.Path,
    limit_s: float = RUN_LIMIT_S,
    dies: dict[int, int] | None = None,
) -> Run:
    """Run `scenario` on `processes` processes of `devices` CPU devices each, within
    `limit_s`; `dies` maps a process that ends on purpose to its exit status."""
    try:
        port = str(_free_port())
    except OSError as error:  # e.g. `[Errno 97] Address family not supported by protocol`
        pytest.skip(
            f"this machine forbids loopback TCP sockets ({error}); the processes of a "
            "multi-process run meet on 127.0.0.1"
        )
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {
        **os.environ,
        # the checkout under test first (an installed treeclass may be another one), then
        # the inherited path, where this machine's jax may live
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(WORKER.parent), *inherited]),
        "JAX_PLATFORMS": "cpu",
    }
    procs: list[subprocess.Popen] = []
    logs = [folder / f"{scenario}-{processes}x{devices}-{i}.out" for i in range(processes)]
    try:
        for i, log in enumerate(logs):
            with open(log, "wb") as out, open(log.with_suffix(".err"), "wb") as err:
                args = [scenario, str(folder), str(i), str(processes), port, str(devices)]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WORKER), *args],
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        cwd=ROOT,
                    )
                )
        deadline = time.monotonic() + limit_s
        running = list(procs)
        while running:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(_report(f"{scenario}: over the {limit_s} s limit", procs, logs))
            try:  # a bounded wait on one process, then a look at all of them
                running[0].wait(timeout=min(left, 0.5))
            except subprocess.TimeoutExpired:
                pass
            for proc in [p for p in running if p.poll() is not None]:
                running.remove(proc)
                expected = (dies or {}).get(procs.index(proc), 0)
                if proc.returncode != expected:  # the others would wait for it: stop them all
                    pytest.fail(_report(f"{scenario}: a process failed", procs, logs))
        results = []
        for log in logs:
            lines = log.read_text().strip().splitlines()
            if not lines:
                pytest.fail(_report(f"{scenario}: a process reported nothing", procs, logs))
            results.append(json.loads(lines[-1]))
        return Run(processes, tuple(results))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # SIGKILL to this one PID
        for proc in procs:
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - a kill that did not land
                pass


def assert_check(run: Run, name: str, processes: list[int] | None = None) -> None:
    """`name` passed on every process of `run` (on `processes`, if given)."""
    for i, results in enumerate(run.results):
        if processes is not None and i not in processes:
            continue
        outcome = results.get(name, f"not run; the checks were {sorted(results)}")
        assert outcome == "ok", f"process {i} of {run.processes}: {outcome}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("multihost")


@pytest.fixture(scope="module")
def trained(folder: pathlib.Path) -> Run:
    # the rules' checks compile a transformer's train step twice (one device, sharded):
    # a longer bound
    return run_workers(
        "train_and_save+sharding_rules", processes=2, devices=2, folder=folder, limit_s=300
    )


@pytest.fixture(scope="module")
def restored(trained: Run, folder: pathlib.Path) -> Run:
    return run_workers("restore", processes=2, devices=2, folder=folder)


@pytest.fixture(scope="module")
def resharded(trained: Run, folder: pathlib.Path) -> Run:
    return run_workers("restore", processes=1, devices=4, folder=folder)


@pytest.fixture(scope="module")
def by_rules(trained: Run) -> Run:
    return trained  # the same processes ran the rules' checks after their own


def test_rules_build_the_docs_transformer_in_place_on_two_processes(by_rules):
    assert_check(by_rules, "rules_setup")
    assert_check(by_rules, "rules_init_in_place")


def test_rules_train_step_keeps_model_and_state_shardings_and_matches_one_device(by_rules):
    assert_check(by_rules, "rules_train_step_keeps_shardings")


def test_tc_load_into_a_rules_template_on_two_processes(by_rules):
    assert_check(by_rules, "rules_tc_load_into_template")


def test_a_rules_misfit_is_refused_on_every_process_before_allocation(by_rules):
    assert_check(by_rules, "rules_misfit_refused_on_every_process")


def test_reference_runs_on_one_device(trained):
    assert_check(trained, "one_device_run")


def test_model_is_initialised_directly_in_its_shardings(trained):
    assert_check(trained, "init_in_shardings")


def test_sharded_train_step_matches_one_device(trained):
    assert_check(trained, "train_step_matches_one_device")


def test_frozen_replicated_and_numpy_arrays_work_in_jit(trained):
    assert_check(trained, "frozen_values_work_in_jit")


def test_freezing_an_array_spread_over_processes_is_refused(trained):
    assert_check(trained, "freezing_a_spread_array_is_refused")


def test_printers_called_on_one_process_do_not_wait_for_the_others(trained):
    assert_check(trained, "inspection_from_one_process")


def test_equality_of_spread_leaves_names_the_leaf(trained):
    assert_check(trained, "equality_names_the_leaf")


def test_get_with_spread_element_mask_names_the_leaf(trained):
    assert_check(trained, "get_without_fill_names_the_leaf")


def test_orbax_saves_model_optimizer_state_and_key(trained):
    assert_check(trained, "orbax_save")


def test_orbax_restores_into_sharded_template_in_fresh_processes(restored):
    assert_check(restored, "restore_into_sharded_template")


def test_restored_state_trains_on_like_one_device(restored):
    assert_check(restored, "next_step_matches_one_device")


def test_orbax_restores_on_another_process_count_and_mesh(resharded):
    assert_check(resharded, "restore_into_sharded_template")
    assert_check(resharded, "next_step_matches_one_device")


def test_tc_save_writes_replicated_and_spread_arrays_from_every_process(trained):
    assert_check(trained, "tc_save_spread_arrays")


def test_tc_save_gathers_a_model_split_across_processes(trained):
    assert_check(trained, "tc_save_big_model")


def test_a_sharded_tc_save_is_written_by_every_process_in_balanced_shares(trained):
    # bytes written per process within 1.1x of total/P, nothing gathered or staged whole,
    # and a folder the `safetensors` package reads
    assert_check(trained, "tc_sharded_save_is_written_by_every_process")


@pytest.fixture(scope="module")
def three(folder: pathlib.Path) -> Run:
    # its last check kills process 2 on purpose
    return run_workers("sharded_save", processes=3, devices=2, folder=folder, dies={2: DIED})


def test_a_sharded_tc_save_on_three_processes_is_balanced_too(three):
    # an odd count: replicated tensors split three ways, blocks held by one process each
    assert_check(three, "tc_sharded_save_is_written_by_every_process")


def test_a_failed_share_fails_the_sharded_save_on_every_process(three):
    # one process failing its share: an error on all three, the old files untouched
    assert_check(three, "a_failed_share_fails_the_sharded_save_everywhere")


def test_a_process_dying_mid_save_ends_the_others_waits_within_the_timeout(three):
    # the survivors raise a TimeoutError naming the dead process; nothing half-written
    assert_check(three, "a_process_that_dies_mid_save_ends_the_others_waits", processes=[0, 1])


def test_tc_save_of_a_tree_with_nothing_spread_is_written_by_its_caller_alone(trained):
    # process 0 alone, process 1 alone, a file per process, one path from both, sharded
    assert_check(trained, "host_trees_are_written_by_their_caller_alone")


def test_tc_save_of_a_spread_tree_refuses_one_caller_or_different_trees_in_bounded_time(trained):
    # a TimeoutError naming the rule and the missing process; a ValueError naming the
    # first key path that differs; nothing written; the next save on both works
    assert_check(trained, "spread_trees_need_every_process")


def test_tc_load_into_sharded_template_keeps_frozen_and_static_values(restored):
    assert_check(restored, "tc_load_into_sharded_template")


@needs_read_counts
def test_tc_load_reads_about_each_process_share_of_the_file(restored):
    # each of 2 processes reads about half of the file by rows or blocks; by columns its
    # rows are coalesced into a few reads of at most twice what it needs
    assert_check(restored, "tc_load_reads_only_own_shards")


@needs_read_counts
def test_tc_load_on_another_process_count_and_mesh(resharded):
    assert_check(resharded, "tc_load_into_sharded_template")
    assert_check(resharded, "tc_load_reads_only_own_shards")


def test_runs_skip_naming_the_limit_where_loopback_sockets_are_forbidden(monkeypatch, tmp_path):
    def forbidden(*args, **kwargs):
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(socket, "socket", forbidden)
    with pytest.raises(pytest.skip.Exception, match=r"forbids loopback TCP sockets \(\[Errno 97\]"):
        run_workers("train_and_save", processes=2, devices=2, folder=tmp_path)


def test_workers_keep_the_inherited_python_path_after_the_checkout(monkeypatch, tmp_path):
    # a machine whose jax lives on PYTHONPATH: the workers must still find it
    started = []

    class Started(Exception):
        pass

    def popen(args, **kwargs):
        started.append(kwargs["env"]["PYTHONPATH"].split(os.pathsep))
        raise Started

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/site/jax", "", "/site/more"]))
    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(Started):
        run_workers("train_and_save", processes=2, devices=2, folder=tmp_path)
    assert started == [[str(ROOT), str(WORKER.parent), "/site/jax", "/site/more"]]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
     ("300", TypeError), (True, TypeError), (None, TypeError)],
)  # fmt: skip
def test_tc_save_refuses_a_timeout_that_is_not_a_positive_number(tmp_path, timeout, error):
    # checked in a run of one process too, before anything is written
    import numpy as np

    import treeclass as tc

    path = tmp_path / "x.safetensors"
    with pytest.raises(error, match=r"timeout= in seconds, a positive number; got"):
        tc.save(path, {"x": np.ones(2)}, timeout=timeout)
    assert not list(tmp_path.iterdir())
    tc.save(path, {"x": np.ones(2)}, timeout=0.25)  # a bound only waits matter to
    assert tc.load(path, {"x": np.zeros(2)})["x"].tolist() == [1.0, 1.0]


def test_page_shows_the_code_the_workers_run():
    # the page's multi-process blocks (fenced `py`, which the documentation test does not
    # run) must each be an excerpt of the worker: what the page shows is what runs here
    blocks = re.findall(r"^```(?:py|python skip)\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    assert blocks, "docs/recipes/multihost.md shows no multi-process code"
    source = WORKER.read_text()
    stale = [block.splitlines()[0] for block in blocks if block not in source]
    assert not stale, f"blocks of {PAGE.name} not found in {WORKER.name}: {stale}"
