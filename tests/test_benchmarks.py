"""The benchmark suite runs end to end (smoke mode) and reports what it promises.

No test asserts a timing: the smoke mode times one call per implementation on the
smallest models, which checks the plumbing and the cross-implementation correctness
checks, not speed. The statistics (intervals, verdicts, re-measuring, scaling fits) and
the labelling of failures are checked on synthetic timings.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` run without `python -m`: find the benchmarks package
    sys.path.insert(0, str(ROOT))

from benchmarks import cases as cases_module  # noqa: E402
from benchmarks import cli as cli_module  # noqa: E402
from benchmarks import runner as runner_module  # noqa: E402
from benchmarks import stacked as stacked_module  # noqa: E402
from benchmarks.cases import (  # noqa: E402
    FULL_SIZES,
    SMOKE_SIZES,
    Case,
    Entry,
    Target,
    canonical,
)
from benchmarks.checkpoint import (  # noqa: E402
    CheckpointSize,
    _numpy_layers,
    _Savers,
    size_for_mb,
)
from benchmarks.cli import main, select_cases  # noqa: E402
from benchmarks.peers import PeerMissing, get_kit, import_peer  # noqa: E402
from benchmarks.plots import plot_ratios, plot_scaling  # noqa: E402
from benchmarks.publish import MARK_END, MARK_START, replace_block  # noqa: E402
from benchmarks.report import evaluate_target, format_markdown, growth_verdict, to_json  # noqa: E402
from benchmarks.runner import (  # noqa: E402
    CaseResult,
    EntryResult,
    progress_summary,
    run_case,
    target_verdict,
)
from benchmarks.scaling import (  # noqa: E402
    ScalingCase,
    ScalingRow,
    relative_exponent,
    run_scaling,
    scaling_cases,
)
from benchmarks.stacked import StackSize, stacked_cases  # noqa: E402
from benchmarks.stats import bootstrap_interval, fit_exponent, judge, judge_best  # noqa: E402
from benchmarks.suite import all_cases  # noqa: E402
from benchmarks.timing import (  # noqa: E402
    Plan,
    Prepared,
    Series,
    measure,
    median_ratio,
    one_call_per_sample,
)

SMOKE_PLAN = Plan(rounds=1, sample_s=0.0, warmup=0, calibrate=False)
# children run on the CPU: on a TPU machine this process holds the chip, which one
# process at a time may open
CPU_CHILD = {**os.environ, "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run of the whole suite: exit status, Markdown, JSON, plot path."""
    folder = tmp_path_factory.mktemp("smoke")
    json_path, plot_path = folder / "results.json", folder / "ratios.png"
    scaling_path, markdown_path = folder / "scaling.png", folder / "results.md"
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    # --async-dispatch: leave JAX's global dispatch setting alone for the other tests
    # (the subprocess test below covers the default, synchronous mode)
    arguments = [
        "--smoke",
        "--async-dispatch",
        "--json",
        str(json_path),
        "--plot",
        str(plot_path),
        "--scaling-plot",
        str(scaling_path),
        "--markdown",
        str(markdown_path),
    ]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(arguments)
    return {
        "status": status,
        "markdown": out.getvalue(),
        "markdown_file": markdown_path.read_text(),
        "progress": err.getvalue(),
        "json": json.loads(json_path.read_text()),
        "plot": plot_path,
        "scaling_plot": scaling_path,
    }


# -- the whole suite in smoke mode ------------------------------------------------------------


def test_smoke_run_exits_zero(smoke):
    assert smoke["status"] == 0, smoke["progress"]


def _smoke_case_names():
    return [
        "workload_training_loop",
        *(case.name for case in all_cases(SMOKE_SIZES)),
        "checkpoint_save",
        "checkpoint_load",
        "checkpoint_foreign_rules",
        "checkpoint_hf_sharded_rules",
    ]


def test_smoke_run_reports_every_case(smoke):
    expected = _smoke_case_names()
    assert [case["name"] for case in smoke["json"]["cases"]] == expected
    for name in expected:
        assert f"### `{name}`" in smoke["markdown"]


def test_smoke_run_reports_every_scaling_case_with_its_exponents(smoke):
    expected = [case.name for case in scaling_cases(SMOKE_SIZES, "smoke")]
    assert [case["name"] for case in smoke["json"]["scaling"]] == expected
    for case in smoke["json"]["scaling"]:
        assert case["status"] == "ran", case
        treeclass = next(row for row in case["rows"] if row["role"] == "treeclass")
        assert len(treeclass["times_s"]) >= 2 and treeclass["k"] is not None, case["name"]
        assert f"### `{case['name']}`" in smoke["markdown"]
    assert "### Exponents at a glance" in smoke["markdown"]


def test_smoke_run_reuses_each_main_case_at_the_sizes_both_time(smoke):
    reused = {case["name"]: case["reused_sizes"] for case in smoke["json"]["scaling"]}
    assert reused == {
        "scaling_flatten": [4],
        "scaling_dispatch": [],
        "scaling_train_step": [2, 4],
        "scaling_set_deep": [4],
        "scaling_apply_selector": [4],
        "scaling_tree_mask": [],
        "scaling_repr": [],
        "scaling_tree_summary": [],
        "scaling_stacked_compile": [4],
    }


def test_smoke_run_counts_the_stacked_compile_in_blocks(smoke):
    units = {case["name"]: case["unit"] for case in smoke["json"]["scaling"]}
    assert units.pop("scaling_stacked_compile") == "blocks"
    assert set(units.values()) == {"layers"}
    assert (
        "n counts blocks; the stacked model should compile in a time flat in N"
        in (smoke["markdown"])
    )


def test_smoke_run_times_every_implementation_of_the_stacked_cases(smoke):
    implementations = [
        "treeclass",
        "treeclass, unrolled",
        "plain JAX (lax.scan)",
        "equinox (hand-written scan)",
        "flax.nnx (nnx.scan)",
    ]
    stacked = {c["name"]: c for c in smoke["json"]["cases"] if c["name"].startswith("stacked_")}
    assert list(stacked) == [
        "stacked_compile_4_blocks",
        "stacked_step_4_blocks",
        "stacked_init_4_blocks",
    ]
    for case in stacked.values():
        assert case["status"] == "ran", case["skip_reason"]
        assert all(row["status"] == "ok" for row in case["rows"]), case["rows"]
    for name in ("stacked_compile_4_blocks", "stacked_step_4_blocks"):
        assert [row["name"] for row in stacked[name]["rows"]] == implementations
    scaling = next(c for c in smoke["json"]["scaling"] if c["name"] == "scaling_stacked_compile")
    assert [row["name"] for row in scaling["rows"]] == implementations
    for row in scaling["rows"]:
        assert list(row["times_s"]) == ["2", "4"] and row["notes"] == [], row


def test_report_sections_come_in_the_order_of_their_numbers(smoke):
    numbers = [
        int(line[3:].split(".")[0])
        for line in smoke["markdown"].splitlines()
        if line.startswith("## ") and line[3].isdigit()
    ]
    assert numbers == sorted(set(numbers)) and len(numbers) >= 8, numbers


def test_markdown_file_is_what_stdout_shows(smoke):
    assert smoke["markdown_file"] == smoke["markdown"]


def test_smoke_run_has_no_implementation_with_wrong_numbers(smoke):
    wrong = [
        (case["name"], row["name"], row["note"])
        for case in smoke["json"]["cases"]
        for row in case["rows"]
        if row["status"] == "wrong"
    ]
    assert wrong == []


def test_every_case_runs_or_says_why_it_was_skipped(smoke):
    for case in smoke["json"]["cases"]:
        assert case["status"] in ("ran", "skipped")
        if case["status"] == "skipped":
            assert case["skip_reason"], case["name"]


def test_treeclass_and_floor_rows_are_timed_in_every_case_that_ran(smoke):
    for case in smoke["json"]["cases"]:
        if case["status"] != "ran":
            continue
        by_role = {row["role"]: row for row in case["rows"]}
        treeclass = by_role["treeclass"]
        if treeclass["status"] == "unavailable":  # a feature in progress: said, not hidden
            assert "not ready" in treeclass["note"], case["name"]
        else:
            assert treeclass["status"] == "ok", (case["name"], treeclass)
            assert treeclass["vs_treeclass"] == pytest.approx(1.0)
        if "floor" in by_role:
            assert by_role["floor"]["status"] == "ok", (case["name"], by_role["floor"])
            assert by_role["floor"]["vs_floor"] == pytest.approx(1.0)


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
    assert names == {
        "treeclass",
        "dict/list",
        "register_dataclass",
        "flax.struct",
        "equinox (jax.jit)",
        "equinox (filter_jit)",
        "pytreeclass",
        "sepes",
    }


def test_header_names_backend_device_versions_and_dispatch(smoke):
    header = smoke["json"]["header"]
    assert header["backend"] in ("cpu", "gpu", "tpu")
    assert header["device_kind"]
    assert header["mode"] == "smoke"
    assert header["dispatch"].split()[0] in ("synchronous", "asynchronous")
    assert {"jax", "treeclass", "equinox", "flax", "pytreeclass", "sepes"} <= set(
        header["versions"]
    )
    assert f"- backend: {header['backend']}" in smoke["markdown"]
    assert "- dispatch: " in smoke["markdown"]


def test_targets_appear_as_a_column_and_a_summary(smoke):
    assert (
        "| implementation | median | vs treeclass | vs floor | target | note |"
        in (smoke["markdown"])
    )
    assert "## Targets (docs/architecture.md)" in smoke["markdown"]
    assert "| case | target | treeclass | interval | verdict |" in smoke["markdown"]
    targeted = [c for c in smoke["json"]["cases"] if c["target"] is not None]
    assert len(targeted) >= 9
    for case in targeted:
        if case["status"] != "ran":
            continue
        target = case["target"]
        if target["status"] is None:
            assert target["summary"].startswith("not measured") and target["reason"]
        else:
            assert target["status"] in ("met", "missed", "within noise"), case["name"]
            assert target["low"] <= target["measured"] <= target["high"]
            assert target["summary"].startswith("smoke, not meaningful: ")


def test_header_defines_the_columns_and_met_by(smoke):
    markdown = smoke["markdown"]
    assert "- columns: *median* is one call's time" in markdown
    assert "*met by X%* / *missed by X%*: the median is X% of the limit" in markdown
    assert "never counted against treeclass" in markdown


def test_report_cites_no_file_missing_from_the_repository(smoke):
    assert "DESIGN.md" not in smoke["markdown"]
    for path in (ROOT / "benchmarks").glob("*.py"):
        assert "DESIGN.md" not in path.read_text(), path.name


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
    main_lines = [line for line in lines if not line.startswith("[scaling")]
    assert len(main_lines) == len(_smoke_case_names())
    assert main_lines[0].startswith(f"[ 1/{len(main_lines)}] workload_training_loop ... ")
    scaling_lines = [line for line in lines if line.startswith("[scaling")]
    assert len(scaling_lines) == len(scaling_cases(SMOKE_SIZES, "smoke"))


def test_plots_are_pngs(smoke):
    pytest.importorskip("matplotlib")
    assert smoke["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert smoke["scaling_plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_peer_failure_in_the_smoke_run_is_labelled_as_the_peers(smoke):
    failed = [
        (case, row)
        for case in smoke["json"]["cases"]
        for row in case["rows"]
        if row["status"] == "failed" and row["owner"] == "peer"
    ]
    for case, row in failed:
        assert "FAILED" not in smoke["progress"].split(case["name"], 1)[1].splitlines()[0]
        assert f"| {row['name']} | — |" in smoke["markdown"]
    assert (
        "peer failed (the peer's error; not counted against treeclass)" in (smoke["markdown"])
        or not failed
    )


# -- the command line ---------------------------------------------------------------------------


def test_python_m_benchmarks_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--only", "flatten_4_fields"],
        cwd=ROOT,
        env=CPU_CHILD,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "### `flatten_4_fields`" in done.stdout
    assert "- dispatch: synchronous (`jax_cpu_enable_async_dispatch=False`" in done.stdout
    assert "[1/1] flatten_4_fields ... 7 timed" in done.stderr


def test_importing_the_suite_imports_no_peer():
    code = (
        "import sys, benchmarks.cli, benchmarks.cases, benchmarks.report; "
        "print(sorted(m for m in ('flax', 'equinox', 'pytreeclass', 'sepes', 'optax', "
        "'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=CPU_CHILD,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_only_selects_by_exact_name_substring_and_glob():
    cases = [*all_cases(SMOKE_SIZES), *scaling_cases(SMOKE_SIZES, "smoke")]
    assert [c.name for c in select_cases(cases, "flatten_4_fields")] == ["flatten_4_fields"]
    assert [c.name for c in select_cases(cases, "flatten_4_f")] == [
        "flatten_4_fields",
        "keyed_flatten_4_fields",
    ]
    assert {c.name for c in select_cases(cases, "dispatch")} == {
        "dispatch_2_layers",
        "dispatch_4_layers",
        "frozen_dispatch_4_layers",
        "scaling_dispatch",
    }
    assert [c.name for c in select_cases(cases, "keyed*8_fields")] == ["keyed_flatten_8_fields"]
    assert [c.name for c in select_cases(cases, "scaling_repr")] == ["scaling_repr"]


def test_only_without_a_match_exits_2_and_lists_the_cases(capsys):
    assert main(["--smoke", "--only", "no_such_case"]) == 2
    message = capsys.readouterr().err
    assert "--only 'no_such_case' matches no case" in message
    assert "dispatch_2_layers" in message


def test_list_prints_every_case_name(capsys):
    assert main(["--smoke", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in _smoke_case_names())
    assert all(case.name in printed for case in scaling_cases(SMOKE_SIZES, "smoke"))


def test_checkpoints_run_only_when_asked_and_quick_leaves_out_full_only_cases(capsys):
    assert main(["--quick", "--list"]) == 0
    printed = capsys.readouterr().out
    assert "checkpoint_save" not in printed and "pytreeclass_published" not in printed
    assert main(["--list"]) == 0
    printed = capsys.readouterr().out
    assert "checkpoint_save" not in printed and "pytreeclass_published" in printed
    assert main(["--quick", "--list", "--checkpoint-mb", "32"]) == 0
    assert "checkpoint_save: save a 32 MiB model (2 layers" in capsys.readouterr().out
    assert main(["--list", "--checkpoint-mb", "1024"]) == 0
    printed = capsys.readouterr().out
    assert "checkpoint_save: save a 1 GiB model (64 layers of f32[2048,2048]" in printed


def test_rounds_below_one_is_rejected(capsys):
    assert main(["--smoke", "--rounds", "0", "--only", "flatten_4_fields"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


# -- robustness: nothing a case does may crash the suite -----------------------------------------


def _tiny_case(entries, **kwargs):
    return Case(
        name="tiny", group="test", title="a test case", entries=lambda: entries, sync=None, **kwargs
    )


def _constant(value):
    return lambda: lambda: {"a": jnp.asarray(value)}


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
        "skipped",
        "sepes is not installed (pip install sepes)",
        None,
    )
    assert result.timed("treeclass") is not None


def test_a_missing_peer_module_names_what_to_install():
    with pytest.raises(
        PeerMissing, match=r"^no_such_peer is not installed \(pip install no_such_peer\)$"
    ):
        import_peer("no_such_peer.sub")
    with pytest.raises(PeerMissing, match=r"\(pip install no-such-peer\)$"):
        import_peer("no_such_peer", "no-such-peer")
    assert import_peer("json.decoder").__name__ == "json.decoder"


def test_implementation_that_raises_is_a_failed_row():
    def broken():
        raise RuntimeError("no such API")

    entries = [Entry("treeclass", "treeclass", _constant(1.0)), Entry("broken", "peer", broken)]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    row = result.entries[1]
    assert (row.status, row.note) == ("failed", "setup raised RuntimeError: no such API")


def test_implementation_with_different_numbers_is_a_wrong_row_and_not_timed():
    entries = [
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("off", "peer", _constant(2.0)),
    ]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    row = result.entries[2]
    assert row.status == "wrong" and row.series is None
    assert row.note.startswith("differs from dict/list: leaf ('a',): values differ")
    assert result.entries[1].status == "ok"


def _only_cases(monkeypatch, cases):
    monkeypatch.setattr(cli_module, "_build_cases", lambda args, mode: (cases, []))


def test_wrong_numbers_make_the_command_exit_1(monkeypatch, capsys):
    entries = [
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("treeclass", "treeclass", _constant(3.0)),
    ]
    _only_cases(monkeypatch, [_tiny_case(entries)])
    assert main(["--smoke", "--async-dispatch"]) == 1
    assert "wrong numbers (not timed): tiny: treeclass" in capsys.readouterr().err


def test_a_peers_wrong_numbers_are_the_peers_and_exit_0(monkeypatch, capsys):
    entries = [
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("off", "peer", _constant(2.0)),
    ]
    _only_cases(monkeypatch, [_tiny_case(entries)])
    assert main(["--smoke", "--async-dispatch"]) == 0
    captured = capsys.readouterr()
    assert (
        "peers that gave different numbers (not timed, not counted against treeclass): tiny: off"
    ) in captured.err
    assert "| off | — | — | — |  | peer gave different numbers (not timed; not counted " in (
        captured.out
    )


# -- correctness checks and statistics ------------------------------------------------------------


def test_canonical_matches_dict_and_class_by_key_path():
    kit = get_kit("treeclass")
    model = kit.mlp([kit.linear(jnp.ones(2), jnp.zeros(2))])
    params = get_kit("dict").mlp([get_kit("dict").linear(jnp.ones(2), jnp.zeros(2))])
    assert (
        canonical(model).keys()
        == canonical(params).keys()
        == {("layers", 0, "weight"), ("layers", 0, "bias")}
    )


def test_canonical_ignores_non_numeric_leaves():
    assert canonical({"name": "linear", "w": np.ones(1)}).keys() == {("w",)}


def test_median_ratio_is_the_median_of_per_round_ratios():
    a, b = Series(1, [1.0, 4.0, 9.0]), Series(1, [1.0, 1.0, 3.0])
    assert median_ratio(a, b) == 3.0  # per-round ratios 1, 4, 3


def test_prepared_work_runs_before_each_sample_and_is_not_timed():
    prepared, called = [], []
    fn = Prepared(lambda: called.append(1), lambda: (prepared.append(1), time.sleep(0.05)))
    series = measure(
        {"x": fn}, None, Plan(rounds=3, sample_s=0.0, warmup=1, calibrate=False), random.Random(0)
    )
    assert len(prepared) == 3 and len(called) == 4  # one warm-up call, then three samples
    assert max(series["x"].times) < 0.04  # the 50 ms of preparation is outside the clock


def test_checkpoint_saves_remove_the_previous_file_before_each_sample(tmp_path):
    size = CheckpointSize(layers=2, width=8)
    savers = _Savers(size, str(tmp_path), _numpy_layers(size))
    save = savers.save("numpy")
    save()
    assert os.path.exists(savers.path("numpy"))
    save.prepare()
    assert not os.path.exists(savers.path("numpy"))
    save.prepare()  # nothing there: nothing to do


def test_measure_shuffles_the_order_in_each_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    series = measure(
        fns, None, Plan(rounds=8, sample_s=0.0, warmup=0, calibrate=False), random.Random(3)
    )
    rounds = [tuple(calls[i : i + 4]) for i in range(0, 32, 4)]
    assert all(sorted(order) == list("abcd") for order in rounds)
    assert len(set(rounds)) > 1
    assert all(len(s.times) == 8 for s in series.values())


def test_measure_calls_sync_on_every_result():
    synced = []
    measure({"a": lambda: 7}, synced.append, Plan(2, 0.0, 1, calibrate=False), random.Random(0))
    assert synced == [7, 7, 7]  # one warm-up call, then one call per round


def _result_with(times, target):
    case = _tiny_case([], target=target)
    rows = [EntryResult(name, role, "ok", series=Series(1, values)) for name, role, values in times]
    return CaseResult(case, "ran", "", rows)


def test_ratio_target_reports_met_and_by_how_much():
    target = Target("<= 1.10x vs dict", "max_ratio", 1.10, ("dict/list",))
    result = _result_with(
        [("treeclass", "treeclass", [1.0]), ("dict/list", "floor", [1.0])], target
    )
    verdict = evaluate_target(result)
    assert verdict["met"] is True and verdict["measured"] == 1.0
    assert verdict["status"] == "met" and verdict["margin"] == pytest.approx(1 / 11)
    assert verdict["summary"] == (
        "met by 9% (1.00x; 95% interval 1.00-1.00; target <= 1.10x vs dict)"
    )


def test_speedup_target_reports_missed_and_by_how_much():
    target = Target(">= 10x faster", "min_speedup", 10.0, ("equinox", "sepes"))
    result = _result_with(
        [("treeclass", "treeclass", [1.0]), ("equinox", "peer", [8.0]), ("sepes", "peer", [5.0])],
        target,
    )
    verdict = evaluate_target(result)
    assert verdict["met"] is False and verdict["measured"] == 5.0
    assert verdict["summary"].startswith("missed by 50% (5.0x faster")


def test_quick_verdicts_are_labelled_indicative():
    target = Target("<= 1.10x vs dict", "max_ratio", 1.10, ("dict/list",))
    result = _result_with(
        [("treeclass", "treeclass", [1.0, 1.0, 1.0]), ("dict/list", "floor", [1.0, 1.0, 1.0])],
        target,
    )
    verdict = evaluate_target(result, mode="quick")
    assert verdict["indicative"] and verdict["summary"].startswith("indicative: met by 9%")
    data = to_json(_header("quick"), [result])
    markdown = format_markdown(data)
    assert "| `tiny` | <= 1.10x vs dict | 1.00x | 1.00-1.00 | met by 9% (indicative) |" in (
        markdown
    )
    assert "every verdict is indicative only" in markdown


def test_fastest_of_target_pairs_with_the_baseline_of_lowest_median():
    target = Target("<= 1.2x the fastest", "max_ratio_fastest", 1.2, ("a", "b"))
    # b's median (1.0) is below a's (2.0): every round is paired with b, even the one
    # where a happened to be faster
    assert target.per_round([1.0, 3.0, 1.0], [[2.0, 0.5, 2.0], [1.0, 1.0, 0.5]]) == (
        [1.0, 3.0, 2.0]
    )
    assert target.direction == "at_most"
    speedup = Target(">= 2x faster", "min_speedup", 2.0, ("a", "b"))
    assert speedup.per_round([1.0, 0.5], [[4.0, 4.0], [3.0, 3.0]]) == [3.0, 6.0]


def test_report_names_the_baseline_a_fastest_of_target_was_paired_with():
    target = Target("<= 1.2x the fastest", "max_ratio_fastest", 1.2, ("a", "b"))
    result = _result_with(
        [
            ("treeclass", "treeclass", [1.0, 1.0, 1.0]),
            ("a", "peer", [0.5, 3.0, 3.0]),
            ("b", "peer", [2.0, 1.0, 1.0]),
        ],
        target,
    )
    verdict = evaluate_target(result)
    assert verdict["paired_with"] == "b" and verdict["measured"] == 1.0
    markdown = format_markdown(to_json(_header(), [result]))
    assert "| b | 1 s |" in markdown and "target baseline (the fastest, by median)" in markdown
    assert "candidate baseline" in markdown
    plain = evaluate_target(
        _result_with(
            [("treeclass", "treeclass", [1.0]), ("dict/list", "floor", [1.0])],
            Target("<= 2x", "max_ratio", 2.0, ("dict/list",)),
        )
    )
    assert "paired_with" not in plain


def test_fastest_of_is_not_biased_by_each_rounds_luckiest_baseline():
    # treeclass and four baselines with one and the same distribution: fast (1 s) in three
    # rounds of eight, slow (3 s) in five, each at other rounds. Every round some baseline
    # is fast, so the least of four is always 1 s, and dividing by it judges treeclass at
    # its median, 3x: "missed", for a library exactly as fast as the others. Pairing with
    # one implementation gives the even verdict.
    pattern = [3.0, 3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0]

    def shifted(k):
        return pattern[-k:] + pattern[:-k] if k else list(pattern)

    treeclass, bases = shifted(0), [shifted(k) for k in (1, 2, 4, 6)]
    per_round_minimum = [t / min(b) for t, *b in zip(treeclass, *bases)]
    assert statistics.median(per_round_minimum) == 3.0  # the bias this rule avoids
    target = Target("<= 1.2x the fastest", "max_ratio_fastest", 1.2, ("a", "b", "c", "d"))
    values = target.per_round(treeclass, bases)
    assert statistics.median(values) == 1.0
    assert judge("at_most", 1.2, values).status != "missed"


def test_a_target_needs_a_baseline():
    target = Target("<= 1.2x the fastest", "max_ratio_fastest", 1.2, ("a",))
    with pytest.raises(ValueError, match="at least one timed baseline"):
        target.paired_with([1.0], [])
    assert target.per_round([], [[1.0]]) == []


def test_train_step_is_judged_against_register_dataclass_in_the_same_run():
    steps = [case for case in all_cases(SMOKE_SIZES) if case.name.startswith("train_step_")]
    assert [case.name for case in steps] == ["train_step_2_layers", "train_step_4_layers"]
    for case in steps:
        target = case.target
        assert (target.kind, target.limit, target.baselines) == (
            "max_ratio",
            1.0,
            ("register_dataclass",),
        )
        # the paired value is treeclass's time over register_dataclass's, per round
        assert target.per_round([1.02, 1.0], [[1.0, 1.0]]) == [1.02, 1.0]


def test_stacked_cases_take_their_model_from_the_runs_sizes():
    sizes = dataclasses.replace(SMOKE_SIZES, blocks=3, block_width=5, block_batch=1)
    assert [case.name for case in stacked_cases(sizes)] == [
        "stacked_compile_3_blocks",
        "stacked_step_3_blocks",
        "stacked_init_3_blocks",
    ]
    assert "3 blocks of width 5, batch 1" in stacked_cases(sizes)[1].title
    assert [case.name for case in stacked_cases(FULL_SIZES)][0] == "stacked_compile_48_blocks"


def test_stacked_cases_carry_the_issues_targets_and_the_suites_rounds():
    compile_, step, init = stacked_cases(FULL_SIZES)
    assert (compile_.target.kind, compile_.target.limit, compile_.target.baselines) == (
        "min_speedup",
        10.0,
        ("treeclass, unrolled",),
    )
    assert (step.target.kind, step.target.limit, step.target.baselines) == (
        "max_ratio",
        1.1,
        ("treeclass, unrolled",),
    )
    assert init.target is None
    full = cli_module.PLANS["full"]
    # a compile is one call per sample, eight rounds, re-measured once when within noise
    assert compile_.plan(full) == dataclasses.replace(one_call_per_sample(full), rounds=8)
    # a step is calibrated as the main cases are, on the wall clock, and re-measured too
    assert (step.plan(full).rounds, step.plan(full).clock) == (9, "wall")
    assert step.plan(full).remeasures == full.remeasures and step.plan(full).calibrate


def test_scaling_stacked_compile_is_untargeted_counts_blocks_and_raises_the_budget():
    for mode in ("full", "quick"):
        case = next(
            c for c in scaling_cases(FULL_SIZES, mode) if c.name == "scaling_stacked_compile"
        )
        assert case.sizes == (12, 48, 96) and case.unit == "blocks" and case.budget_s >= 300
        at_96 = case.case_at(96)
        assert (at_96.name, at_96.target) == ("scaling_stacked_compile_96", None)
        assert "96 blocks of width 256" in at_96.title
        assert at_96.plan(cli_module.PLANS[mode]).rounds == 3
        assert case.reuse(48) == "stacked_compile_48_blocks"


def test_stacked_compile_traces_and_compiles_the_step_anew_on_every_call(monkeypatch):
    traced = []
    block = stacked_module._block

    def counting_block(*args):
        traced.append(1)
        return block(*args)

    monkeypatch.setattr(stacked_module, "_block", counting_block)
    size = dataclasses.replace(SMOKE_SIZES, blocks=2, block_width=2, block_batch=1)
    entries = {entry.name: entry for entry in stacked_module._compile_entries(StackSize.of(size))}
    compile_step = entries["treeclass"].build()
    first = compile_step()
    after_first = len(traced)
    second = compile_step()
    assert after_first > 0 and len(traced) == 2 * after_first
    assert first.step is not second.step
    canon = entries["treeclass"].canon
    assert cases_module.compare(canon(first), canon(second)) is None


def test_checkpoint_cases_take_five_rounds_and_remeasure_once():
    plan = one_call_per_sample(Plan(rounds=21, sample_s=0.02, warmup=3, remeasures=2))
    assert (plan.rounds, plan.remeasures, plan.clock, plan.calibrate) == (5, 1, "wall", False)
    assert one_call_per_sample(Plan(rounds=1, sample_s=0.0, warmup=0)).rounds == 1


def test_target_not_measured_when_treeclass_is_not_available():
    target = Target("<= 2x", "max_ratio", 2.0, ("base",))
    case = _tiny_case([], target=target)
    rows = [
        EntryResult("treeclass", "treeclass", "unavailable", "`.replace` is not ready"),
        EntryResult("base", "peer", "ok", series=Series(1, [1.0])),
    ]
    verdict = evaluate_target(CaseResult(case, "ran", "", rows))
    assert verdict["status"] is None
    assert (verdict["summary"], verdict["reason"]) == (
        "not measured (treeclass not available)",
        "`.replace` is not ready",
    )


def _header(mode="full"):
    return {
        "date": "today",
        "command": "python -m benchmarks",
        "mode": mode,
        "machine": "m",
        "load_average": "0",
        "python": "3",
        "backend": "cpu",
        "device_kind": "cpu",
        "device_count": 1,
        "dispatch": "synchronous",
        "versions": {"jax": "0"},
        "timing": {
            "rounds": 5,
            "sample_s": 0.002,
            "warmup_calls": 1,
            "calibrated": True,
            "clock": "wall",
            "remeasures": 1,
            "remeasure_rounds": 10,
        },
    }


def test_plot_without_matplotlib_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    data = {"cases": [], "scaling": []}
    assert plot_ratios(data, "unused.png") == (
        "--plot needs matplotlib (pip install matplotlib); no plot written"
    )
    assert plot_scaling(data, "unused.png") == (
        "--scaling-plot needs matplotlib (pip install matplotlib); no plot written"
    )


# -- bootstrap intervals and verdicts on synthetic per-round ratios ----------------------------


def test_bootstrap_interval_holds_the_median_and_is_reproducible():
    values = [1.0, 1.2, 0.9, 1.1, 1.05, 0.95, 1.3, 1.0, 0.98]
    low, high = bootstrap_interval(values)
    assert low <= statistics.median(values) <= high
    assert min(values) <= low and high <= max(values)
    assert bootstrap_interval(values) == (low, high)


def test_bootstrap_interval_of_one_value_is_that_value():
    assert bootstrap_interval([1.5]) == (1.5, 1.5)


def test_bootstrap_interval_narrows_with_more_rounds_and_widens_with_noise():
    rng = random.Random(1)
    few = [1.0 + rng.gauss(0, 0.1) for _ in range(7)]
    many = [1.0 + rng.gauss(0, 0.1) for _ in range(63)]
    noisy = [1.0 + rng.gauss(0, 0.3) for _ in range(63)]

    def width(values):
        low, high = bootstrap_interval(values)
        return high - low

    assert width(many) < width(few)
    assert width(noisy) > width(many)


def test_judge_at_most_met_missed_and_within_noise():
    assert judge("at_most", 1.10, [1.00, 1.01, 0.99, 1.02, 1.00]).status == "met"
    assert judge("at_most", 1.10, [1.20, 1.22, 1.19, 1.25, 1.21]).status == "missed"
    noisy = judge("at_most", 1.10, [1.05, 1.15, 1.08, 1.13, 1.11, 1.02, 1.18])
    assert noisy.status == "within noise" and noisy.low < 1.10 < noisy.high


def test_judge_at_least_met_missed_and_within_noise():
    assert judge("at_least", 10.0, [20.0, 22.0, 25.0]).status == "met"
    assert judge("at_least", 10.0, [5.0, 6.0, 4.0]).status == "missed"
    assert judge("at_least", 10.0, [8.0, 12.0, 9.0, 11.0, 10.5]).status == "within noise"


def test_judge_margin_is_signed_and_relative_to_the_limit():
    assert judge("at_most", 2.0, [1.5]).margin == pytest.approx(0.25)
    assert judge("at_most", 2.0, [2.5]).margin == pytest.approx(-0.25)
    assert judge("at_least", 10.0, [12.0]).margin == pytest.approx(0.2)


def test_judge_touching_the_limit_counts_as_met():
    assert judge("at_most", 1.1, [1.1, 1.1, 1.1]).status == "met"


def test_judge_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown target kind"):
        judge("about", 1.0, [1.0])


# -- re-measuring a case whose interval straddles its target -------------------------------------


def _scripted_measure(monkeypatch, batches):
    """Make `runner.measure` return the next batch of per-round times on each call."""
    calls = []

    def fake(fns, sync, plan, rng, numbers=None):
        calls.append({"names": sorted(fns), "rounds": plan.rounds, "numbers": numbers})
        times = batches[len(calls) - 1]
        return {name: Series(1, list(times[name])) for name in fns}

    monkeypatch.setattr(runner_module, "measure", fake)
    return calls


def _targeted_case():
    target = Target("<= 1.10x vs dict", "max_ratio", 1.10, ("dict/list",))
    entries = [
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("peer", "peer", _constant(1.0)),
    ]
    return _tiny_case(entries, target=target)


_STRADDLING = [1.02, 1.18, 1.05, 1.16, 1.09]
_PLAN = Plan(rounds=5, sample_s=0.0, warmup=0, calibrate=False, remeasures=2)


def test_case_within_noise_is_remeasured_until_the_verdict_is_clear(monkeypatch):
    calls = _scripted_measure(
        monkeypatch,
        [
            {"treeclass": _STRADDLING, "dict/list": [1.0] * 5, "peer": [2.0] * 5},
            {"treeclass": [1.0] * 10, "dict/list": [1.0] * 10},
        ],
    )
    result = run_case(_targeted_case(), _PLAN, random.Random(0))
    assert len(calls) == 2
    assert calls[1]["names"] == ["dict/list", "treeclass"]  # the target's rows only
    assert calls[1]["rounds"] == 10 and calls[1]["numbers"] == {"treeclass": 1, "dict/list": 1}
    assert result.extra_rounds == 10
    assert len(result.timed("treeclass").times) == 15 and len(result.timed("peer").times) == 5
    assert target_verdict(result).status == "met"
    assert "15 rounds" not in evaluate_target(result)["summary"]
    assert "after 10 more rounds" in evaluate_target(result)["summary"]


def test_clear_verdict_is_not_remeasured(monkeypatch):
    calls = _scripted_measure(
        monkeypatch, [{"treeclass": [1.0] * 5, "dict/list": [1.0] * 5, "peer": [2.0] * 5}]
    )
    result = run_case(_targeted_case(), _PLAN, random.Random(0))
    assert len(calls) == 1 and result.extra_rounds == 0


def test_remeasuring_stops_after_the_plans_limit_and_stays_within_noise(monkeypatch):
    straddle = {"treeclass": _STRADDLING * 2, "dict/list": [1.0] * 10}
    calls = _scripted_measure(
        monkeypatch,
        [{"treeclass": _STRADDLING, "dict/list": [1.0] * 5, "peer": [2.0] * 5}, straddle, straddle],
    )
    result = run_case(_targeted_case(), _PLAN, random.Random(0))
    assert len(calls) == 3 and result.extra_rounds == 20
    assert target_verdict(result).status == "within noise"


# -- failures are labelled by whose they are -------------------------------------------------------


def test_peer_failure_is_labelled_the_peers_in_progress_and_report():
    def broken():
        raise RuntimeError("no such API")

    entries = [
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("sepes", "peer", broken),
    ]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    line = progress_summary(result)
    assert "peer failed, not counted against treeclass: sepes" in line
    assert "FAILED" not in line
    markdown = format_markdown(to_json(_header(), [result]))
    assert (
        "| sepes | — | — | — |  | peer failed (the peer's error; not counted against "
        "treeclass): setup raised RuntimeError: no such API |"
    ) in markdown


def test_treeclass_failure_is_labelled_failed():
    def broken():
        raise RuntimeError("boom")

    entries = [Entry("treeclass", "treeclass", broken), Entry("dict/list", "floor", _constant(1.0))]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    assert "treeclass FAILED" in progress_summary(result)
    assert "| FAILED: setup raised RuntimeError: boom |" in format_markdown(
        to_json(_header(), [result])
    )


def test_row_needing_a_missing_feature_is_not_available_and_the_others_run(monkeypatch):
    monkeypatch.setattr(runner_module, "probe", lambda feature: f"{feature} is not ready (x)")
    entries = [
        Entry("treeclass", "treeclass", _constant(1.0), needs=("replace",)),
        Entry("dict/list", "floor", _constant(1.0)),
    ]
    result = run_case(_tiny_case(entries), SMOKE_PLAN, random.Random(0))
    assert (result.entries[0].status, result.entries[0].note) == (
        "unavailable",
        "replace is not ready (x)",
    )
    assert result.status == "ran" and result.timed("dict/list") is not None
    assert "treeclass not available" in progress_summary(result)


# -- scaling fits on synthetic series ---------------------------------------------------


def test_fit_exponent_of_linear_and_quadratic_series():
    sizes = [10, 100, 1000, 10000]
    assert fit_exponent(sizes, [2e-6 * n for n in sizes]) == pytest.approx(1.0)
    assert fit_exponent(sizes, [3e-9 * n**2 for n in sizes]) == pytest.approx(2.0)


def test_fit_exponent_is_a_least_squares_slope_through_noise():
    rng = random.Random(0)
    sizes = [10, 30, 100, 300, 1000, 3000, 10000]
    times = [1e-6 * n * math.exp(rng.gauss(0, 0.05)) for n in sizes]
    assert fit_exponent(sizes, times) == pytest.approx(1.0, abs=0.05)


def test_fit_exponent_needs_two_sizes():
    with pytest.raises(ValueError, match="two or more"):
        fit_exponent([10], [1.0])
    with pytest.raises(ValueError, match="two different sizes"):
        fit_exponent([10, 10], [1.0, 2.0])


def test_scaling_row_reports_the_fit_and_the_last_step():
    row = ScalingRow("x", "peer", {10: 1e-5, 100: 1e-4, 1000: 1e-2})
    assert row.k == pytest.approx(1.5)
    assert row.k_last == pytest.approx(2.0)
    assert ScalingRow("y", "peer", {10: 1.0}).k is None


def _scaling_case(times_by_size, sizes=(10, 100, 1000), reuse=None):
    """A scaling case whose rows 'take' the given synthetic times (scripted measure)."""

    def case_at(n):
        entries = [
            Entry(name, role, _constant(1.0))
            for name, role in (("treeclass", "treeclass"), ("dict/list", "floor"), ("slow", "peer"))
        ]
        return _tiny_case(entries)

    return ScalingCase("scaling_tiny", "a tiny operation", case_at, sizes, reuse=reuse)


def test_run_scaling_fits_each_implementation_and_leaves_out_the_slow(monkeypatch):
    times = {
        10: {"treeclass": 1e-5, "dict/list": 1e-5, "slow": 1e-3},
        100: {"treeclass": 1e-4, "dict/list": 1e-4, "slow": 1e-1},
        1000: {"treeclass": 1e-3, "dict/list": 1e-3},
    }
    calls = []

    def fake(fns, sync, plan, rng, numbers=None):
        n = (10, 100, 1000)[len(calls)]
        calls.append(sorted(fns))
        return {name: Series(1, [times[n][name]]) for name in fns}

    monkeypatch.setattr(runner_module, "measure", fake)
    result = run_scaling(_scaling_case(times), SMOKE_PLAN, random.Random(0), budget_s=5.0)
    assert calls[2] == ["dict/list", "treeclass"]  # slow: 0.1 s at 100, ~10 s at 1,000
    rows = {row.name: row for row in result.rows}
    assert rows["treeclass"].k == pytest.approx(1.0)
    assert rows["slow"].k == pytest.approx(2.0) and sorted(rows["slow"].times) == [10, 100]
    assert rows["slow"].notes == ["not timed from n=1,000: projected 10 s per call (k=2.00 so far)"]


def test_a_scaling_cases_own_budget_keeps_a_slow_row_the_runs_budget_would_leave_out(
    monkeypatch,
):
    times = {
        10: {"treeclass": 1e-5, "dict/list": 1e-5, "slow": 1e-3},
        100: {"treeclass": 1e-4, "dict/list": 1e-4, "slow": 1e-1},
        1000: {"treeclass": 1e-3, "dict/list": 1e-3, "slow": 10.0},
    }
    calls = []

    def fake(fns, sync, plan, rng, numbers=None):
        n = (10, 100, 1000)[len(calls) % 3]
        calls.append(sorted(fns))
        return {name: Series(1, [times[n][name]]) for name in fns}

    monkeypatch.setattr(runner_module, "measure", fake)
    roomy = dataclasses.replace(_scaling_case(times), budget_s=100.0)
    result = run_scaling(roomy, SMOKE_PLAN, random.Random(0), budget_s=5.0)
    assert calls[2] == ["dict/list", "slow", "treeclass"]  # ~30 s projected: within 100 s
    assert sorted(result.row("slow").times) == [10, 100, 1000] and result.row("slow").notes == []
    # a case's budget raises the run's, never lowers it
    tight = dataclasses.replace(_scaling_case(times), budget_s=1e-9)
    result = run_scaling(tight, SMOKE_PLAN, random.Random(0), budget_s=math.inf)
    assert sorted(result.row("slow").times) == [10, 100, 1000]


def test_run_scaling_reuses_a_main_case_measured_in_the_same_run(monkeypatch):
    calls = _scripted_measure(
        monkeypatch, [{"treeclass": [2e-4], "dict/list": [2e-4], "slow": [2e-4]}]
    )
    earlier_case = _tiny_case([])
    earlier = CaseResult(
        earlier_case,
        "ran",
        "",
        [
            EntryResult("treeclass", "treeclass", "ok", series=Series(1, [2e-5])),
            EntryResult("dict/list", "floor", "ok", series=Series(1, [2e-5])),
        ],
    )
    case = _scaling_case({}, sizes=(10, 100), reuse=lambda n: f"main_{n}")
    result = run_scaling(case, SMOKE_PLAN, random.Random(0), earlier={"main_10": earlier})
    assert len(calls) == 1 and result.reused == [10]
    assert result.row("treeclass").times == {10: 2e-5, 100: 2e-4}


def test_scaling_sizes_per_mode_and_the_train_step_stops_early():
    full = {case.name: case.sizes for case in scaling_cases(SMOKE_SIZES, "full")}
    assert full["scaling_flatten"] == (10, 100, 1000, 10000)
    assert full["scaling_train_step"] == (10, 100, 1000)
    quick = {case.name: case.sizes for case in scaling_cases(SMOKE_SIZES, "quick")}
    assert quick["scaling_repr"] == (10, 100, 1000) and quick["scaling_train_step"] == (10, 100)
    assert set(full) == {
        "scaling_flatten",
        "scaling_dispatch",
        "scaling_train_step",
        "scaling_set_deep",
        "scaling_apply_selector",
        "scaling_tree_mask",
        "scaling_repr",
        "scaling_tree_summary",
        "scaling_stacked_compile",
    }
    assert full["scaling_stacked_compile"] == (12, 48, 96)  # blocks, not layers


def _scaling_report(name, treeclass, floor, **case):
    """A report of one scaling case at 10 and 100 layers, with treeclass's and the floor's
    rows, each given as `(time at 10, time at 100, k)`; `case` adds or replaces keys."""

    def row(name, role, times):
        at_10, at_100, k = times
        return {
            "name": name,
            "role": role,
            "times_s": {"10": at_10, "100": at_100},
            "k": k,
            "k_last": k,
            "notes": [],
        }

    scaling = {
        "name": name,
        "title": name,
        "note": "",
        "status": "ran",
        "skip_reason": "",
        "sizes": [10, 100],
        "reused_sizes": [],
        "seconds": 0.0,
        "floor_k": floor[2],
        "floor_k_last": floor[2],
        "rows": [row("treeclass", "treeclass", treeclass), row("dict/list", "floor", floor)],
        **case,
    }
    return {"header": _header(), "cases": [], "scaling": [scaling]}


def test_scaling_markdown_flags_treeclass_above_linear():
    data = _scaling_report("scaling_x", (1e-6, 1e-4, 2.0), (1e-6, 1e-5, 1.0))
    markdown = format_markdown(data)
    assert "| **treeclass** | 1 µs | 100 µs | **2.00** (above 1.1) | **2.00** (above 1.1) |  |" in (
        markdown
    )
    assert (
        "| `scaling_x` | **2.00** (above 1.1) | **2.00** (above 1.1) | 1.00 | 1.00 | "
        "— | **above linear** | treeclass (2.00) |" in markdown
    )


def test_scaling_markdown_names_a_unit_other_than_layers():
    blocks = _scaling_report(
        "scaling_z", (1e-6, 1e-6, 0.0), (1e-6, 1e-6, 0.0), unit="blocks", note="flat"
    )
    assert "\nn counts blocks; flat.\n" in format_markdown(blocks)
    layers = _scaling_report("scaling_z", (1e-6, 1e-6, 0.0), (1e-6, 1e-6, 0.0), note="flat")
    assert "\nflat.\n" in format_markdown(layers) and "n counts" not in format_markdown(layers)


def test_relative_exponent_is_the_slope_of_the_ratio_to_the_floor():
    sizes = (10, 100, 1000, 10000)
    floor = {n: 1e-7 * n**1.3 for n in sizes}  # JAX's own cost, above linear
    same_growth = {n: 1.1e-7 * n**1.3 for n in sizes}  # a constant 1.1x of the floor
    faster_growth = {n: 1e-7 * n**1.5 for n in sizes}
    assert relative_exponent(same_growth, floor) == pytest.approx(0.0, abs=1e-9)
    assert relative_exponent(faster_growth, floor) == pytest.approx(0.2)
    # only the sizes both timed count; fewer than two gives no exponent
    assert relative_exponent({10: 1.0, 100: 10.0, 1000: 100.0}, {10: 1.0, 100: 10.0}) == (
        pytest.approx(0.0, abs=1e-9)
    )
    assert relative_exponent({10: 1.0}, floor) is None


def test_growth_verdict_tells_the_libraries_growth_from_jaxs():
    assert growth_verdict(1.05, 0.0) == "linear"
    assert growth_verdict(1.10, 0.5) == "linear"  # shown as 1.10: not above the limit
    assert growth_verdict(1.30, 0.02) == "as the floor (JAX's own growth)"
    assert growth_verdict(1.30, 0.10) == "as the floor (JAX's own growth)"
    assert growth_verdict(1.30, 0.11) == "**above linear**"
    assert growth_verdict(1.30, None) == "**above linear**"
    assert growth_verdict(None, None) == "—"


def test_scaling_markdown_says_when_treeclass_grows_as_the_floor():
    data = _scaling_report(
        "scaling_y", (1.1e-6, 2.2e-5, 1.30), (1e-6, 2e-5, 1.30), treeclass_k_over_floor=0.0
    )
    assert (
        "| 1.30 | 1.30 | +0.00 | as the floor (JAX's own growth) | treeclass (1.30), "
        "dict/list (1.30) |" in format_markdown(data)
    )


# -- publishing and the checkpoint case's plumbing --------------------------------------


def test_publish_replaces_only_the_marked_block():
    page = f"intro\n{MARK_START} old -->\nold figures\n{MARK_END}\noutro\n"
    new = replace_block(page, "| new | table |\n")
    assert new.startswith("intro\n" + MARK_START) and new.endswith(f"{MARK_END}\noutro\n")
    assert "| new | table |" in new and "old figures" not in new
    assert replace_block(new, "| new | table |\n") == new


def test_publish_refuses_a_page_without_markers():
    with pytest.raises(ValueError, match="has no generated benchmark block"):
        replace_block("no markers here", "x", "README.md")


def test_checkpoint_size_defaults_to_one_gibibyte_of_2048_wide_layers():
    size = size_for_mb(1024)
    assert (size.layers, size.width, size.largest_leaf) == (64, 2048, 2048 * 2048 * 4)
    assert size.label == "1 GiB"
    assert size_for_mb(1).layers == 1


def test_checkpoint_memory_child_reports_a_peak(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.checkpoint",
            "--memory",
            "numpy",
            "--layers",
            "2",
            "--width",
            "64",
            "--folder",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=CPU_CHILD,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["extra"] >= 0 and report["method"]
    assert list(tmp_path.iterdir()) == []  # the child removes what it wrote


def test_foreign_weights_case_loads_the_same_model_both_ways_and_removes_its_file(tmp_path):
    from benchmarks.foreign import SMOKE_FOREIGN, _loads, measure_memory

    loads = _loads(SMOKE_FOREIGN, str(tmp_path))
    ours, theirs = (loads[name]() for name in ("treeclass", "safetensors load_file + tree_map"))
    assert cases_module.compare(canonical(ours), canonical(theirs)) is None
    assert ours.blocks[1].up.shape == (16, 32)  # [in, out]: transposed from [2w, w]
    memory = measure_memory(SMOKE_FOREIGN, str(tmp_path))
    assert [row["name"] for row in memory["rows"]] == [
        "treeclass",
        "safetensors load_file + tree_map",
    ]
    assert all(row["extra"] > 0 for row in memory["rows"]) and memory["action"] == "load"
    assert list(tmp_path.iterdir()) == []


def test_hf_sharded_case_loads_the_same_model_both_ways_from_shards_and_removes_them(tmp_path):
    from benchmarks.hfsharded import SMOKE_HF, _fixture, _loads, measure_memory

    loads = _loads(SMOKE_HF, str(tmp_path))
    names = ["treeclass", "safetensors safe_open + assignment by hand"]
    ours, theirs = (loads[name]() for name in names)
    assert cases_module.compare(canonical(ours), canonical(theirs)) is None
    assert len(ours.blocks) == 2 and ours.blocks[1].up.w.shape == (16, 64)  # [in, out]
    index, _ = _fixture(SMOKE_HF, str(tmp_path))
    shards = [name for name in os.listdir(os.path.dirname(index)) if name.startswith("model-")]
    assert len(shards) > 2 and all(name.endswith(".safetensors") for name in shards)
    memory = measure_memory(SMOKE_HF, str(tmp_path))
    assert [row["name"] for row in memory["rows"]] == names and memory["action"] == "load"
    assert all(row["extra"] > 0 for row in memory["rows"])
    reads = f"read {SMOKE_HF.nbytes} of {SMOKE_HF.nbytes} tensor bytes"  # each byte once
    assert reads in memory["rows"][0]["note"], memory["rows"][0]["note"]
    assert list(tmp_path.iterdir()) == []


# -- the transformer workload, several backends side by side, merging runs ------------------------


def test_transformer_case_reports_steps_tokens_and_mfu_columns(smoke):
    case = next(c for c in smoke["json"]["cases"] if c["name"] == "transformer_training_loop")
    assert case["status"] == "ran" and case["rate"][0] == "steps/s"
    assert case["work"]["tokens"] > 0 and case["work"]["flops"] > 0
    timed = {row["name"] for row in case["rows"] if row["status"] == "ok"}
    assert {"treeclass", "treeclass, unrolled", "plain JAX (lax.scan)"} <= timed
    assert "| implementation | median | steps/s | tokens/s | MFU |" in smoke["markdown"]
    header = smoke["json"]["header"]
    if header["peak_flops"] is None:
        # a device whose peak is not known (the CPU): MFU reads n/a and the header says how
        # to state one
        assert f"- peak for MFU: not known for {header['device_kind']}" in smoke["markdown"]
        assert "`--peak-tflops` states a nominal one" in smoke["markdown"]
    else:  # an accelerator in the table (a TPU v5e)
        peak = header["peak_flops"]
        line = f"- peak for MFU: {peak['flops'] / 1e12:g} TFLOP/s ({peak['source']})"
        assert line in smoke["markdown"]


def test_transformer_treeclass_rows_are_the_nn_model_and_agree_with_plain_jax(smoke):
    import treeclass as tc
    from benchmarks.transformer import _arrays, _nn_model, gpt_size

    # the runner compares every row's first loss with the floor's (plain JAX) at the
    # case's rtol and marks a row that differs "wrong": these passed at the smoke size
    case = next(c for c in smoke["json"]["cases"] if c["name"] == "transformer_training_loop")
    rows = {row["name"]: row for row in case["rows"]}
    assert rows["plain JAX (lax.scan)"]["role"] == "floor"
    for name in ("treeclass", "treeclass, unrolled"):
        assert rows[name]["status"] == "ok" and "`tc.nn" in rows[name]["note"], rows[name]
    # the rows' model: tc.nn layers holding the shared arrays in their own layouts
    size = gpt_size("smoke", "cpu")
    stacked, unrolled = _nn_model(size, unrolled=False), _nn_model(size, unrolled=True)
    assert isinstance(stacked.blocks, tc.Stacked) and len(stacked.blocks) == size.blocks
    assert isinstance(unrolled.blocks, tuple)
    assert all(isinstance(b, tc.nn.DecoderBlock) for b in unrolled.blocks)
    a, d = _arrays(size), size.width
    for block, i in ((stacked.blocks[1], 1), (unrolled.blocks[0], 0)):
        np.testing.assert_array_equal(block.self_attn.k_proj.weight, a["qkv"][i][:, d : 2 * d].T)
        np.testing.assert_array_equal(block.mlp.down_proj.weight, a["down"][i].T)
        assert block.input_layernorm.bias is None and block.mlp.up_proj.bias is None
    np.testing.assert_array_equal(stacked.wte.weight, a["wte"])


def test_gpt_sizes_are_gpt2_small_on_an_accelerator_and_scale_down_elsewhere():
    from benchmarks.transformer import gpt_size

    tpu = gpt_size("full", "tpu")
    assert (tpu.blocks, tpu.width, tpu.heads, tpu.seq, tpu.vocab) == (12, 768, 12, 1024, 50304)
    assert gpt_size("quick", "tpu").steps < tpu.steps
    cpu = gpt_size("full", "cpu")
    assert cpu.flops_per_step < tpu.flops_per_step / 100
    assert gpt_size("quick", "cpu").steps < cpu.steps
    assert gpt_size("full", "tpu", batch=16).batch == 16


def test_gpt_model_flops_follow_the_6n_plus_attention_count():
    from benchmarks.transformer import GPTSize

    size = GPTSize(blocks=2, width=8, heads=2, seq=4, batch=3, vocab=10, steps=1)
    n = 2 * 12 * 8 * 8 + 10 * 8
    assert size.matmul_params == n
    assert size.flops_per_step == (6 * n + 12 * 2 * 4 * 8) * 3 * 4


def test_mfu_is_taken_against_the_known_or_the_stated_peak():
    from benchmarks.transformer import peak_flops

    assert peak_flops("TPU v5 lite")[0] == 197e12
    assert peak_flops("cpu") is None
    flops, source = peak_flops("cpu", nominal_tflops=2.0)
    assert flops == 2e12 and "nominal" in source


def _as_cpu_run(data):
    # the smoke run as a CPU run's results, whichever backend it ran on
    cpu = json.loads(json.dumps(data))
    cpu["header"].update(backend="cpu", device_kind="cpu", peak_flops=None)
    return cpu


def _as_tpu_run(data):
    tpu = json.loads(json.dumps(data))
    tpu["header"].update(
        backend="tpu",
        device_kind="TPU v5 lite",
        peak_flops={"flops": 197e12, "source": "the chip's documentation"},
    )
    return tpu


def test_summary_shows_several_runs_side_by_side_with_their_machine_lines(smoke):
    from benchmarks.report import format_summary

    cpu, tpu = _as_cpu_run(smoke["json"]), _as_tpu_run(smoke["json"])
    block = format_summary([cpu, tpu], "assets")
    assert "- **CPU**: " in block and "- **TPU v5 lite**: " in block
    head = "| case | target | CPU: treeclass | CPU: verdict | TPU v5 lite: treeclass | "
    assert head in block
    assert "CPU: `transformer_training_loop` (steps/s" in block
    tpu_line = next(line for line in block.splitlines() if line.startswith("TPU v5 lite: `transf"))
    assert "% MFU" in tpu_line and "tokens/s" in tpu_line
    assert "(assets/ratios-cpu.png)" in block and "(assets/ratios-tpu.png)" in block


def test_stacked_targets_are_judged_on_the_accelerator_and_host_cases_say_so(smoke):
    from benchmarks.report import format_summary, scope_remark

    cases = {case["name"]: case for case in smoke["json"]["cases"]}
    stacked, flatten = cases["stacked_step_4_blocks"], cases["flatten_4_fields"]
    assert "judged on the accelerator" in scope_remark(stacked, "cpu")
    assert scope_remark(stacked, "tpu") == ""
    assert "measures the host" in scope_remark(flatten, "tpu")
    assert scope_remark(flatten, "cpu") == ""
    block = format_summary([_as_cpu_run(smoke["json"]), _as_tpu_run(smoke["json"])], "assets")
    row = next(line for line in block.splitlines() if line.startswith("| `stacked_step_4"))
    cpu_verdict = row.split(" | ")[3]
    assert "accelerator's target" in cpu_verdict and "missed" not in cpu_verdict


def test_merge_replaces_cases_in_place_adds_new_ones_to_their_group_and_changes_no_input():
    from benchmarks.cli import merge_results

    base = {
        "header": {"mode": "full", "date": "d0", "command": "c0"},
        "cases": [
            {"name": "a", "group": "1", "v": 0},
            {"name": "b", "group": "1", "v": 0},
            {"name": "c", "group": "2", "v": 0},
        ],
        "scaling": [{"name": "s", "v": 0}],
    }
    new = {
        "header": {"mode": "quick", "date": "d1", "command": "c1"},
        "cases": [
            {"name": "b", "group": "1", "v": 1},
            {"name": "n", "group": "1", "v": 1},
            {"name": "z", "group": "9", "v": 1},
        ],
        "scaling": [{"name": "s", "v": 1}, {"name": "t", "v": 1}],
    }
    before = json.dumps([base, new], sort_keys=True)
    merged = merge_results(base, new)
    assert json.dumps([base, new], sort_keys=True) == before
    assert [(c["name"], c["v"], c["mode"]) for c in merged["cases"]] == [
        ("a", 0, "full"),
        ("b", 1, "quick"),
        ("n", 1, "quick"),
        ("c", 0, "full"),
        ("z", 1, "quick"),
    ]
    assert [(c["name"], c["v"]) for c in merged["scaling"]] == [("s", 1), ("t", 1)]
    assert merged["header"]["command"] == "c0"
    assert merged["header"]["merged"] == [
        {
            "date": "d1",
            "command": "c1",
            "mode": "quick",
            "load_average": None,
            "cases": ["b", "n", "z", "s", "t"],
        }
    ]


def test_only_new_cases_run_and_merge_into_an_earlier_json_file(tmp_path, capsys):
    path = tmp_path / "results.json"
    assert main(["--smoke", "--async-dispatch", "--only", "flatten_4_f", "--json", str(path)]) == 0
    first = json.loads(path.read_text())
    assert [c["name"] for c in first["cases"]] == ["flatten_4_fields", "keyed_flatten_4_fields"]
    arguments = ["--smoke", "--async-dispatch", "--only", "replace_3_fields,flatten_4_f"]
    status = main([*arguments, "--skip", "keyed", "--merge-into", str(path)])
    assert status == 0
    merged = json.loads(path.read_text())
    assert [c["name"] for c in merged["cases"]] == [
        "flatten_4_fields",
        "keyed_flatten_4_fields",
        "replace_3_fields",
    ]
    assert merged["header"]["merged"][0]["cases"] == ["flatten_4_fields", "replace_3_fields"]
    assert "- merged in (" in capsys.readouterr().out


def test_merging_into_a_file_that_is_not_a_run_is_refused(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text('{"not": "a run"}')
    arguments = ["--smoke", "--async-dispatch", "--only", "replace_3_fields"]
    assert main([*arguments, "--merge-into", str(path)]) == 2
    assert "not a `python -m benchmarks --json` file" in capsys.readouterr().err
    assert path.read_text() == '{"not": "a run"}'


def test_publish_renders_every_run_and_copies_every_runs_plots(smoke, tmp_path):
    from benchmarks.publish import publish

    (tmp_path / "docs").mkdir()
    page = f"intro\n{MARK_START} -->\nold\n{MARK_END}\nafter\n"
    for name in ("README.md", "docs/performance.md"):
        (tmp_path / name).write_text(page)
    plots = tmp_path / "plots"
    plots.mkdir()
    for name in ("ratios-cpu.png", "ratios-tpu.png", "scaling-tpu.png"):
        (plots / name).write_bytes(b"png")
    runs = [_as_cpu_run(smoke["json"]), _as_tpu_run(smoke["json"])]
    assert publish(runs, str(tmp_path), str(plots)) == ["README.md", "docs/performance.md"]
    readme = (tmp_path / "README.md").read_text()
    assert "(benchmarks/ratios-tpu.png)" in readme and "(benchmarks/scaling-tpu.png)" in readme
    assert "(benchmarks/scaling-cpu.png)" not in readme  # no such plot: not shown
    assert readme.startswith("intro\n") and readme.endswith(f"{MARK_END}\nafter\n")
    assert sorted(p.name for p in (tmp_path / "docs" / "assets").iterdir()) == [
        "ratios-cpu.png",
        "ratios-tpu.png",
        "scaling-tpu.png",
    ]
    assert publish(runs, str(tmp_path), str(plots), check=True) == []


def test_a_call_the_clock_sees_take_no_time_counts_one_tick(monkeypatch):
    # a coarse process clock (seen on a TPU machine's virtualised host) reads 0 for one
    # fast call: the smoke run divided by that time and crashed
    from benchmarks import timing

    monkeypatch.setitem(timing.CLOCKS, "cpu", lambda: 5.0)
    plan = Plan(rounds=1, sample_s=0.0, warmup=0, calibrate=False, clock="cpu")
    series = measure({"a": lambda: 1, "b": lambda: 2}, None, plan, random.Random(0))
    assert series["a"].times[0] > 0 and series["b"].times[0] > 0
    assert median_ratio(series["a"], series["b"]) == 1.0


def test_no_two_benchmark_modules_import_each_other():
    # the case modules take the `Case` vocabulary from `cases`; only `suite` gathers them
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                graph.setdefault(path.stem, set()).add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
                graph.setdefault(path.stem, set()).add(node.module.split(".")[1])

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            here = todo.pop()
            for there in graph.get(here, ()):
                if there == goal:
                    return True
                if there not in seen:
                    seen.add(there)
                    todo.append(there)
        return False

    cycles = sorted(m for m in graph if reaches(m, m))
    assert not cycles, f"benchmark modules in an import cycle: {cycles}"


# -- verdicts that hold between runs ---------------------------------------------------------------


def test_a_remeasure_times_the_floor_with_the_target_rows_so_vs_floor_pairs_shared_rounds(
    monkeypatch,
):
    # the target is against a hand-written baseline, the floor is a row of its own: a
    # re-measure extends the floor too, so its ratio rests on the rounds the medians use
    target = Target("<= 1.10x vs hand-written", "max_ratio", 1.10, ("hand",))
    entries = [
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("hand", "baseline", _constant(1.0)),
        Entry("floor", "floor", _constant(1.0)),
    ]
    calls = _scripted_measure(
        monkeypatch,
        [
            {"treeclass": _STRADDLING, "hand": [1.0] * 5, "floor": [1.2] * 5},
            {"treeclass": [0.9] * 10, "hand": [1.0] * 10, "floor": [1.0] * 10},
        ],
    )
    plan = dataclasses.replace(_PLAN, remeasures=1)
    result = run_case(_tiny_case(entries, target=target), plan, random.Random(0))
    assert calls[1]["names"] == ["floor", "hand", "treeclass"]
    assert {len(result.timed(n).times) for n in ("treeclass", "hand", "floor")} == {15}
    row = next(
        r for r in to_json(_header(), [result])["cases"][0]["rows"] if r["name"] == "treeclass"
    )
    # 15 paired rounds: 5 of treeclass/floor about 0.85-0.98, 10 of 0.9: the median is 0.9,
    # on the side the medians (0.9 s against 1.0 s) say
    assert row["vs_floor"] == pytest.approx(0.9)
    assert row["median_s"] < result.timed("floor").median


def test_median_ratio_pairs_only_the_rounds_both_series_ran():
    # round i with round i; the longer series' extra rounds have no partner
    assert median_ratio(Series(1, [1.0, 2.0, 9.0, 9.0]), Series(1, [1.0, 1.0])) == 1.5
    with pytest.raises(ValueError, match="a round both series ran"):
        median_ratio(Series(1, []), Series(1, [1.0]))


# compile times as on the TPU host: stacked 0.39-0.51 s; unrolled in two groups, about
# 2.65-3 s and 6.4-8.3 s; two runs of 8 rounds with 6 and 3 rounds in the fast group
_STACKED_COMPILES = [0.47, 0.51, 0.46, 0.39, 0.4, 0.45, 0.42, 0.44]
_MOSTLY_FAST = [2.7, 2.65, 2.8, 2.9, 2.75, 8.1, 2.85, 7.9]
_MOSTLY_SLOW = [8.14, 2.65, 8.27, 6.42, 7.69, 8.3, 2.9, 2.7]


def test_best_of_verdict_is_the_same_whichever_rounds_land_in_the_slow_group():
    target = Target(">= 10x faster", "min_speedup", 10.0, ("unrolled",))
    paired = [
        judge("at_least", 10.0, target.per_round(_STACKED_COMPILES, [times])).measured
        for times in (_MOSTLY_FAST, _MOSTLY_SLOW)
    ]
    assert paired[1] > 2 * paired[0]  # 6.8x against 16.9x: the figure the groups move
    verdicts = [
        judge_best("at_least", 10.0, _STACKED_COMPILES, times)
        for times in (_MOSTLY_FAST, _MOSTLY_SLOW, sorted(_MOSTLY_SLOW))
    ]
    # each run reaches the fast group: 2.65 s / 0.39 s, 6.8x, the same verdict every time
    assert {v.status for v in verdicts} == {"missed"}
    assert [v.measured for v in verdicts] == [pytest.approx(2.65 / 0.39)] * 3
    assert all(v.low <= v.measured <= v.high < 10.0 and v.rounds == 8 for v in verdicts)


def test_best_of_verdict_is_within_noise_when_the_fast_group_is_one_sample():
    # a single fast unrolled compile among slow ones: the resampled minima often miss it
    unrolled = [1.9, 8.0, 8.1, 8.2, 7.9, 8.3, 8.0, 8.1]
    stacked = [0.2] * 8
    assert judge_best("at_least", 10.0, stacked, unrolled).status == "within noise"
    assert judge_best("at_most", 1.1, [1.0, 1.0], [1.0, 1.0]).status == "met"
    with pytest.raises(ValueError, match="at least one time"):
        judge_best("at_most", 1.1, [], [1.0])


def test_stacked_compile_is_judged_on_each_implementations_fastest_sample():
    compile_ = stacked_cases(FULL_SIZES)[0]
    assert compile_.target.statistic == "best"
    assert "two groups" in stacked_module.compile_case.__doc__
    result = _result_with(
        [
            ("treeclass", "treeclass", [0.2, 0.21, 0.2, 0.22]),
            ("treeclass, unrolled", "baseline", [8.1, 2.7, 8.3, 2.65]),
        ],
        compile_.target,
    )
    verdict = evaluate_target(result)
    assert verdict["statistic"] == "best" and verdict["measured"] == pytest.approx(13.25)
    assert "of each implementation's fastest sample" in verdict["summary"]
    with pytest.raises(ValueError, match="unknown target statistic"):
        target_verdict(
            _result_with(
                [("treeclass", "treeclass", [1.0]), ("b", "floor", [1.0])],
                Target("x", "max_ratio", 1.1, ("b",), statistic="mean"),
            )
        )


def _transformer_result(times):
    from benchmarks.transformer import gpt_size, transformer_case

    case = transformer_case(gpt_size("smoke", "cpu"))
    rows = [
        EntryResult(name, role, "ok", series=Series(1, list(values)))
        for name, role, values in times
    ]
    return CaseResult(case, "ran", "", rows)


def test_transformer_verdict_says_the_stacked_step_against_the_unrolled_one():
    # as on the TPU: tc.Stacked as fast as plain lax.scan, 1.41x slower than unrolled
    result = _transformer_result(
        [
            ("treeclass", "treeclass", [0.141, 0.141, 0.141]),
            ("treeclass, unrolled", "baseline", [0.1, 0.1, 0.1]),
            ("plain JAX (lax.scan)", "floor", [0.141, 0.141, 0.141]),
        ]
    )
    verdict = evaluate_target(result)
    assert verdict["status"] == "met"
    assert verdict["summary"].endswith(
        "; beside it, tc.Stacked step / unrolled step: 1.41x (95% interval 1.41-1.41, "
        "3 paired rounds)"
    )
    data = to_json(_header(), [result])
    (beside,) = data["cases"][0]["beside"]
    assert (beside["numerator"], beside["denominator"]) == ("treeclass", "treeclass, unrolled")
    assert beside["measured"] == pytest.approx(1.41)
    markdown = format_markdown(data)
    assert (
        "| `transformer_training_loop` (beside) | tc.Stacked step / unrolled step | 1.41x | "
        "1.41-1.41 | reported beside the target, no target of its own |"
    ) in markdown
    assert "Beside the target (no target of its own): tc.Stacked step / unrolled step: 1.41x" in (
        markdown
    )


def test_a_beside_ratio_of_an_untimed_row_reads_not_measured():
    result = _transformer_result(
        [("treeclass", "treeclass", [1.0]), ("plain JAX (lax.scan)", "floor", [1.0])]
    )
    assert evaluate_target(result)["summary"].endswith(
        "beside it, tc.Stacked step / unrolled step: not measured"
    )
    (beside,) = to_json(_header(), [result])["cases"][0]["beside"]
    assert beside["measured"] is None and beside["rounds"] is None


def test_a_remeasure_extends_the_rows_of_a_beside_ratio(monkeypatch):
    entries = [
        Entry("treeclass", "treeclass", _constant(1.0)),
        Entry("dict/list", "floor", _constant(1.0)),
        Entry("peer", "peer", _constant(1.0)),
    ]
    target = Target("<= 1.10x vs dict", "max_ratio", 1.10, ("dict/list",))
    case = _tiny_case(entries, target=target, beside=(("treeclass / peer", "treeclass", "peer"),))
    calls = _scripted_measure(
        monkeypatch,
        [
            {"treeclass": _STRADDLING, "dict/list": [1.0] * 5, "peer": [2.0] * 5},
            {"treeclass": [1.0] * 10, "dict/list": [1.0] * 10, "peer": [2.0] * 10},
        ],
    )
    result = run_case(case, dataclasses.replace(_PLAN, remeasures=1), random.Random(0))
    assert calls[1]["names"] == ["dict/list", "peer", "treeclass"]
    (beside,) = to_json(_header(), [result])["cases"][0]["beside"]
    assert beside["rounds"] == 15 and beside["measured"] == 0.5


def _finetune_extra(**changes):
    row = {"name": "treeclass", "extra": 3 * 2**20, "note": "n"}
    extra = {
        "heading": "Device memory XLA plans for one compiled LoRA train step "
        "(`compiled.memory_analysis()`), against the frozen base of 2.0 MiB (all its leaves):",
        "column": "planned device peak",
        "per": "x frozen base",
        "reference_bytes": 2 * 2**20,
        "rows": [row],
        "how": "h",
        "target": {"text": "t", "summary": "s"},
    }
    return {**extra, **changes}


def test_finetune_memory_table_says_it_is_the_device_plan_against_the_whole_base():
    from benchmarks import report as report_module

    text = "\n".join(report_module._memory_markdown(_finetune_extra()))
    assert "Device memory XLA plans for one compiled LoRA train step" in text
    assert "| implementation | planned device peak | x frozen base | note |" in text
    assert "| **treeclass** | 3.0 MiB | 1.50x | n |" in text
    assert "host memory" not in text and "largest leaf" not in text
    # a table saved before (as the published TPU run holds) reads the same way
    old = _finetune_extra(action="LoRA train step (XLA's plan)", largest_leaf=2 * 2**20)
    for key in ("heading", "column", "per", "reference_bytes"):
        del old[key]
    old["header"] = None
    assert "\n".join(report_module._memory_markdown(old)) == text


def test_finetune_case_reports_the_planned_peak_against_the_frozen_base():
    from benchmarks.finetune import FinetuneSize, _measure_all

    extra = _measure_all(FinetuneSize("t", blocks=1, width=8, batch=1, length=2))
    assert extra["reference_bytes"] == 12 * 8 * 8 * 4 and extra["per"] == "x frozen base"
    assert "memory_analysis" in extra["heading"] and "largest_leaf" not in extra


def test_small_training_cases_say_they_time_dispatch_not_compute():
    from benchmarks.nn import nn_case
    from benchmarks.workload import WorkloadSize

    note = nn_case(WorkloadSize(512, 4, 256, 10)).note
    assert "about 1.6 GFLOP" in note and "dispatch" in note and "not compute" in note
    steps = [c for c in all_cases(FULL_SIZES) if c.name.startswith("train_step_")]
    assert [c.name for c in steps] == ["train_step_10_layers", "train_step_100_layers"]
    assert "about 76,800 FLOP" in steps[1].note and "dispatch" in steps[1].note


def _tiny_finetune():
    from benchmarks.finetune import FinetuneSize

    return FinetuneSize("tiny", blocks=2, width=8, batch=1, length=2)


def test_returned_gradient_case_checks_no_base_leaves_the_jit_and_judges_against_the_floor():
    from benchmarks.finetune import finetune_grads_case

    case = finetune_grads_case(_tiny_finetune())
    assert (case.target.kind, case.target.limit, case.target.baselines) == (
        "max_ratio",
        1.1,
        ("plain JAX (base as an argument)",),
    )
    result = run_case(case, SMOKE_PLAN, random.Random(0))
    assert [(row.role, row.status) for row in result.entries] == [
        ("treeclass", "ok"),
        ("baseline", "ok"),
        ("floor", "ok"),
    ]
    data = to_json(_header(), [result])["cases"][0]
    assert data["target"]["status"] is not None and data["beside"][0]["rounds"] == 1
    # the split row's check (its first call passed it) refuses a whole-model gradient
    from benchmarks import finetune

    size = _tiny_finetune()
    whole = finetune._grad_whole(size)()  # a zero array for every leaf of the frozen base
    assert finetune.output_bytes(whole) > size.base_bytes
    with pytest.raises(AssertionError, match="frozen base"):
        finetune.check_split_grads(whole, size)
    assert [c.name for c in all_cases(FULL_SIZES) if "returned_grads" in c.name] == [
        "finetune_returned_grads_10MB",
        "finetune_returned_grads_100MB",
        "finetune_returned_grads_1GB",
    ]


def test_compute_bound_transformer_is_skipped_off_an_accelerator_with_the_reason():
    from benchmarks.transformer import COMPUTE_BOUND, compute_bound_case

    case = compute_bound_case()
    assert any(c.name == "transformer_compute_bound" for c in all_cases(FULL_SIZES))
    assert not any(c.name == "transformer_compute_bound" for c in all_cases(SMOKE_SIZES))
    assert case.work["flops"] == COMPUTE_BOUND.flops_per_step * COMPUTE_BOUND.steps
    assert case.beside == (("tc.Stacked step / unrolled step", "treeclass", "treeclass, unrolled"),)
    if jax.default_backend() != "cpu":  # it runs there: the accelerator's own suite run
        assert jax.default_backend() in case.backends
        return
    result = run_case(case, SMOKE_PLAN, random.Random(0))
    assert (result.status, result.note) == (
        "skipped",
        "runs on tpu or gpu only (sized for an accelerator); this run's backend is cpu",
    )
    markdown = format_markdown(to_json(_header(), [result]))
    assert "Skipped: runs on tpu or gpu only" in markdown


def test_compute_bound_transformer_fills_a_tpu_v5e_and_reports_mfu_per_row():
    from benchmarks.transformer import COMPUTE_BOUND, compute_bound_case

    size = COMPUTE_BOUND
    # heads of 128 (the TPU's matrix unit), 8,192 tokens a step, about 10 TFLOP; three
    # rows' parameters and two adam moments (float32) leave the chip's 15.7 GiB room for
    # one step's temporaries (6.5 GB, as XLA planned them on a TPU v5e)
    assert size.width // size.heads == 128 and size.tokens == 8192
    assert size.flops_per_step > 10e12
    n_params = size.matmul_params + size.seq * size.width + (2 * size.blocks + 1) * size.width
    assert 3 * 12 * n_params < 15.7 * 2**30 - 6.5e9
    case = compute_bound_case()
    entries = case.entries()
    assert [(e.name, e.role) for e in entries] == [
        ("treeclass", "treeclass"),
        ("treeclass, unrolled", "baseline"),
        ("plain JAX (lax.scan)", "floor"),
    ]
    assert "remat=" in entries[0].note and "same policy" in entries[2].note
    # as on a TPU v5e: every row carries its MFU, and the stacked step's ratio to the
    # unrolled one is shown beside
    rows = [
        EntryResult(e.name, e.role, "ok", e.note, series=Series(1, [t] * 3))
        for e, t in zip(entries, (0.5, 0.45, 0.5))
    ]
    header = {**_header(), "backend": "tpu", "device_kind": "TPU v5 lite"}
    header["peak_flops"] = {"flops": 197e12, "source": "the chip's documentation"}
    markdown = format_markdown(to_json(header, [CaseResult(case, "ran", "", rows)]))
    mfu = case.work["flops"] / 0.45 / 197e12
    assert f"| treeclass, unrolled | 450 ms | 11.1 | 91,022 | {mfu:.1%} |" in markdown
    assert "tc.Stacked step / unrolled step: 1.11x" in markdown


def test_scan_gap_probe_times_its_variants_and_they_compute_the_same_step(tmp_path):
    from benchmarks import scan_gap

    out = tmp_path / "gap.json"
    variants = ["unrolled", "scan_cast_once_remat_dots"]
    assert scan_gap.main(["--small", "--steps", "1", *variants, "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["variant"] for r in results] == variants
    assert all(r["compile_s"] > 0 and r["step_ms_median"] > 0 for r in results)
    # the same model and steps: a scan with remat and a cast changes the schedule only
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-2)
    with pytest.raises(SystemExit):
        scan_gap.main(["no_such_variant"])
