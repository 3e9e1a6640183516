"""The benchmark suite runs end to end (smoke mode) and reports what it promises.

No test asserts a timing: the smoke mode times one call per implementation on the
smallest models, which checks the plumbing and the cross-implementation correctness
checks, not speed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` run without `python -m`: find the benchmarks package
    sys.path.insert(0, str(ROOT))

from benchmarks import cases as cases_module  # noqa: E402
from benchmarks import runner as runner_module  # noqa: E402
from benchmarks.cases import SMOKE_SIZES, Case, Entry, Target, all_cases, canonical  # noqa: E402
from benchmarks.cli import main, select_cases  # noqa: E402
from benchmarks.peers import PeerMissing, get_kit  # noqa: E402
from benchmarks.report import evaluate_target, plot_ratios  # noqa: E402
from benchmarks.runner import CaseResult, EntryResult, run_case  # noqa: E402
from benchmarks.timing import Plan, Series, measure, median_best_ratio, median_ratio  # noqa: E402

SMOKE_PLAN = Plan(rounds=1, sample_s=0.0, warmup=0, calibrate=False)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of the whole suite: exit status, Markdown, JSON, plot path."""
    folder = tmp_path_factory.mktemp("smoke")
    json_path, plot_path = folder / "results.json", folder / "ratios.png"
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    # --async-dispatch: leave JAX's global dispatch setting alone for the other tests
    # (the subprocess test below covers the default, synchronous mode)
    arguments = ["--smoke", "--async-dispatch", "--json", str(json_path), "--plot", str(plot_path)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return {
        "status": status,
        "markdown": out.getvalue(),
        "progress": err.getvalue(),
        "json": json.loads(json_path.read_text()),
        "plot": plot_path,
    }


# -- the whole suite in smoke mode ------------------------------------------------------------


def test_smoke_run_exits_zero(smoke):
    assert smoke["status"] == 0, smoke["progress"]


def test_smoke_run_reports_every_case(smoke):
    expected = [case.name for case in all_cases(SMOKE_SIZES)]
    assert [case["name"] for case in smoke["json"]["cases"]] == expected
    for name in expected:
        assert f"### `{name}`" in smoke["markdown"]


def test_smoke_run_has_no_implementation_with_wrong_numbers(smoke):
    wrong = [(case["name"], row["name"], row["note"]) for case in smoke["json"]["cases"]
             for row in case["rows"] if row["status"] == "wrong"]
    assert wrong == []


def test_every_case_runs_or_says_why_it_was_skipped(smoke):
    for case in smoke["json"]["cases"]:
        assert case["status"] in ("ran", "skipped")
        if case["status"] == "skipped":
            assert case["note"], case["name"]


def test_treeclass_and_floor_rows_are_timed_in_every_case_that_ran(smoke):
    for case in smoke["json"]["cases"]:
        if case["status"] != "ran":
            continue
        by_role = {row["role"]: row for row in case["rows"]}
        assert by_role["treeclass"]["status"] == "ok", (case["name"], by_role["treeclass"])
        assert by_role["floor"]["status"] == "ok", (case["name"], by_role["floor"])
        assert by_role["floor"]["vs_floor"] == pytest.approx(1.0)
        assert by_role["treeclass"]["vs_treeclass"] == pytest.approx(1.0)


def test_timed_rows_carry_one_time_per_round(smoke):
    for case in smoke["json"]["cases"]:
        for row in case["rows"]:
            if row["status"] == "ok":
                assert len(row["times_s"]) == 1 and row["median_s"] > 0, row
            else:
                assert row["times_s"] == [] and row["note"], row


def test_every_peer_appears_in_the_dispatch_table(smoke):
    dispatch = next(c for c in smoke["json"]["cases"] if c["name"].startswith("dispatch_"))
    names = {row["name"] for row in dispatch["rows"]}
    assert names == {"treeclass", "dict/list", "register_dataclass", "flax.struct",
                     "equinox (jax.jit)", "equinox (filter_jit)", "pytreeclass", "sepes"}


def test_header_names_backend_device_versions_and_dispatch(smoke):
    header = smoke["json"]["header"]
    assert header["backend"] in ("cpu", "gpu", "tpu")
    assert header["device_kind"]
    assert header["mode"] == "smoke"
    assert header["dispatch"].split()[0] in ("synchronous", "asynchronous")
    assert {"jax", "treeclass", "equinox", "flax", "pytreeclass", "sepes"} <= set(
        header["versions"])
    assert f"- backend: {header['backend']}" in smoke["markdown"]
    assert "- dispatch: " in smoke["markdown"]


def test_targets_appear_as_a_column_and_a_summary(smoke):
    assert "| implementation | median | vs treeclass | vs floor | target | note |" in (
        smoke["markdown"])
    assert "## Targets (DESIGN.md section 5)" in smoke["markdown"]
    targeted = [c for c in smoke["json"]["cases"] if c["target"] is not None]
    assert len(targeted) >= 9
    for case in targeted:
        if case["status"] == "ran":
            assert case["target"]["met"] in (True, False), case["name"]


def test_published_comparison_is_shown_next_to_ours(smoke):
    case = next(c for c in smoke["json"]["cases"] if c["name"].startswith("pytreeclass_pub"))
    assert case["status"] == "ran", case["note"]
    published = {item["ratio"]: item for item in case["published"]}
    assert published["flax.struct / pytreeclass"]["published"] == 1.427
    assert published["equinox (filter_jit) / pytreeclass"]["published"] == 6.671
    assert published["flax.struct / pytreeclass"]["ours"] > 0
    assert "| flax.struct / pytreeclass | 1.427 |" in smoke["markdown"]


def test_progress_line_per_case_on_stderr(smoke):
    lines = [line for line in smoke["progress"].splitlines() if line.startswith("[")]
    assert len(lines) == len(all_cases(SMOKE_SIZES))
    assert lines[0].startswith(f"[ 1/{len(lines)}] flatten_4_fields ... ")


def test_plot_is_a_png(smoke):
    pytest.importorskip("matplotlib")
    assert smoke["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command line ---------------------------------------------------------------------------


def test_python_m_benchmarks_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", "flatten_4_fields"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "### `flatten_4_fields`" in done.stdout
    assert "- dispatch: synchronous (`jax_cpu_enable_async_dispatch=False`" in done.stdout
    assert "[1/1] flatten_4_fields ... 7 timed" in done.stderr


def test_importing_the_suite_imports_no_peer():
    code = ("import sys, benchmarks.cli, benchmarks.cases, benchmarks.report; "
            "print(sorted(m for m in ('flax', 'equinox', 'pytreeclass', 'sepes', 'optax', "
            "'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_only_selects_by_exact_name_substring_and_glob():
    cases = all_cases(SMOKE_SIZES)
    assert [c.name for c in select_cases(cases, "flatten_4_fields")] == ["flatten_4_fields"]
    assert [c.name for c in select_cases(cases, "flatten_4_f")] == [
        "flatten_4_fields", "keyed_flatten_4_fields"]
    assert {c.name for c in select_cases(cases, "dispatch")} == {
        "dispatch_2_layers", "dispatch_4_layers", "frozen_dispatch_4_layers"}
    assert [c.name for c in select_cases(cases, "keyed*8_fields")] == [
        "keyed_flatten_8_fields"]


def test_only_without_a_match_exits_2_and_lists_the_cases(capsys):
    assert main(["--smoke", "--only", "no_such_case"]) == 2
    message = capsys.readouterr().err
    assert "--only 'no_such_case' matches no case" in message
    assert "dispatch_2_layers" in message


def test_list_prints_every_case_name(capsys):
    assert main(["--smoke", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(case.name in printed for case in all_cases(SMOKE_SIZES))


def test_rounds_below_one_is_rejected(capsys):
    assert main(["--smoke", "--rounds", "0", "--only", "flatten_4_fields"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


# -- robustness: nothing a case does may crash the suite -----------------------------------------


def _tiny_case(entries, **kwargs):
    return Case(name="tiny", group="test", title="a test case", entries=lambda: entries,
                sync=None, **kwargs)


def _constant(value):
    return lambda: (lambda: {"a": jnp.asarray(value)})


def test_case_needing_a_missing_treeclass_feature_is_skipped(monkeypatch):
    monkeypatch.setattr(runner_module, "probe", lambda feature: f"{feature} is not ready (x)")
    case = _tiny_case([Entry("treeclass", "treeclass", _constant(1.0))], needs=("freeze",))
    result = run_case(case, SMOKE_PLAN, random.Random(0))
    assert (result.status, result.note) == ("skipped", "freeze is not ready (x)")


def test_case_needing_a_missing_module_is_skipped():
    case = _tiny_case([], modules=("no_such_module_for_tests",))
    result = run_case(case, SMOKE_PLAN, random.Random(0))
    assert result.status == "skipped"
    assert result.note == "needs no_such_module_for_tests (not installed)"


def test_missing_peer_is_a_skipped_row(monkeypatch):
    real = cases_module.get_kit

    def without_sepes(name):
        if name == "sepes":
            raise PeerMissing("sepes is not installed (pip install sepes)")
        return real(name)

    monkeypatch.setattr(cases_module, "get_kit", without_sepes)
    case = next(c for c in all_cases(SMOKE_SIZES) if c.name == "construct_4_layers")
    result = run_case(case, SMOKE_PLAN, random.Random(0))
    row = next(r for r in result.entries if r.name == "sepes")
    assert (row.status, row.note, row.series) == (
        "skipped", "sepes is not installed (pip install sepes)", None)
    assert result.timed("treeclass") is not None


def test_implementation_that_raises_is_a_failed_row():
    def broken():
        raise RuntimeError("no such API")

    entries = [Entry("treeclass", "treeclass", _constant(1.0)),
               Entry("broken", "peer", broken)]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    row = result.entries[1]
    assert (row.status, row.note) == ("failed", "setup raised RuntimeError: no such API")


def test_implementation_with_different_numbers_is_a_wrong_row_and_not_timed():
    entries = [Entry("dict/list", "floor", _constant(1.0)),
               Entry("treeclass", "treeclass", _constant(1.0)),
               Entry("off", "peer", _constant(2.0))]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    row = result.entries[2]
    assert row.status == "wrong" and row.series is None
    assert row.note.startswith("differs from dict/list: leaf ('a',): values differ")
    assert result.entries[1].status == "ok"


def test_wrong_numbers_make_the_command_exit_1(monkeypatch, capsys):
    entries = [Entry("dict/list", "floor", _constant(1.0)),
               Entry("treeclass", "treeclass", _constant(3.0))]
    monkeypatch.setattr("benchmarks.cases.all_cases", lambda sizes: [_tiny_case(entries)])
    assert main(["--smoke"]) == 1
    assert "wrong numbers (not timed): tiny: treeclass" in capsys.readouterr().err


# -- correctness checks and statistics ------------------------------------------------------------


def test_canonical_matches_dict_and_class_by_key_path():
    kit = get_kit("treeclass")
    model = kit.mlp([kit.linear(jnp.ones(2), jnp.zeros(2))])
    params = get_kit("dict").mlp([get_kit("dict").linear(jnp.ones(2), jnp.zeros(2))])
    assert canonical(model).keys() == canonical(params).keys() == {
        ("layers", 0, "weight"), ("layers", 0, "bias")}


def test_canonical_ignores_non_numeric_leaves():
    assert canonical({"name": "linear", "w": np.ones(1)}).keys() == {("w",)}


def test_median_ratio_is_the_median_of_per_round_ratios():
    a, b = Series(1, [1.0, 4.0, 9.0]), Series(1, [1.0, 1.0, 3.0])
    assert median_ratio(a, b) == 3.0  # per-round ratios 1, 4, 3
    assert median_best_ratio([a, b], Series(1, [0.5, 0.5, 1.0])) == 2.0  # 2, 2, 3


def test_measure_shuffles_the_order_in_each_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    series = measure(fns, None, Plan(rounds=8, sample_s=0.0, warmup=0, calibrate=False),
                     random.Random(3))
    rounds = [tuple(calls[i:i + 4]) for i in range(0, 32, 4)]
    assert all(sorted(order) == list("abcd") for order in rounds)
    assert len(set(rounds)) > 1
    assert all(len(s.times) == 8 for s in series.values())


def test_measure_calls_sync_on_every_result():
    synced = []
    measure({"a": lambda: 7}, synced.append, Plan(2, 0.0, 1, calibrate=False),
            random.Random(0))
    assert synced == [7, 7, 7]  # one warm-up call, then one call per round


def _result_with(times, target):
    case = _tiny_case([], target=target)
    rows = [EntryResult(name, role, "ok", series=Series(1, values))
            for name, role, values in times]
    return CaseResult(case, "ran", "", rows)


def test_ratio_target_reports_met_and_by_how_much():
    target = Target("<= 1.10x vs dict", "max_ratio", 1.10, ("dict/list",))
    result = _result_with([("treeclass", "treeclass", [1.0]), ("dict/list", "floor", [1.0])],
                          target)
    verdict = evaluate_target(result)
    assert verdict["met"] is True and verdict["measured"] == 1.0
    assert verdict["summary"] == "met by 9% (1.00x; target <= 1.10x vs dict)"


def test_speedup_target_reports_missed_and_by_how_much():
    target = Target(">= 10x faster", "min_speedup", 10.0, ("equinox", "sepes"))
    result = _result_with([("treeclass", "treeclass", [1.0]), ("equinox", "peer", [8.0]),
                           ("sepes", "peer", [5.0])], target)
    verdict = evaluate_target(result)
    assert verdict["met"] is False and verdict["measured"] == 5.0
    assert verdict["summary"].startswith("missed by 50% (5.0x faster")


def test_plot_without_matplotlib_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot_ratios([], "unused.png") == (
        "--plot needs matplotlib (pip install matplotlib); no plot written")
