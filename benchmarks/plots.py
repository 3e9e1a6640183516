"""The two PNG plots, drawn from `report.to_json`'s dict (or a saved `--json` file).

- `plot_ratios` (`--plot`): per case, every timed row's ratio to the floor (or to
  treeclass where the case has no floor), a horizontal bar on a log scale;
- `plot_scaling` (`--scaling-plot`): per scaling case, time against layers on log-log
  axes, one line per implementation, with a dotted slope-1 guide through treeclass's
  first point (a line parallel to it is linear growth).

matplotlib is imported only here, when a plot is asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot_ratios", "plot_scaling"]

_NEEDS_MATPLOTLIB = "{flag} needs matplotlib (pip install matplotlib); no plot written"


def _pyplot(flag: str) -> tuple[Any, str | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, _NEEDS_MATPLOTLIB.format(flag=flag)
    return plt, None


def plot_ratios(data: dict[str, Any], path: str) -> str | None:
    """Write a PNG bar chart of every timed row's ratio to the floor (or to treeclass).

    **Returns**

    `None` on success, or a one-line reason no plot was written (matplotlib missing).
    """
    plt, reason = _pyplot("--plot")
    if reason is not None:
        return reason
    panels = []
    for case in data["cases"]:
        rows = [row for row in case["rows"] if row["median_s"] is not None]
        if case["status"] != "ran" or not rows:
            continue
        roles = {row["role"] for row in rows}
        key, label = ("vs_floor", "floor") if "floor" in roles else ("vs_treeclass", "treeclass")
        bars = [(row, row[key]) for row in rows if row[key] is not None]
        if bars:
            panels.append((case["name"], label, bars))
    if not panels:
        return "nothing was timed; no plot written"
    columns = 3
    count = len(panels)
    rows_of_panels = (count + columns - 1) // columns
    figure, axes = plt.subplots(
        rows_of_panels, columns, squeeze=False, figsize=(6 * columns, 2.6 * rows_of_panels)
    )
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    for axis, (title, label, bars) in zip(axes.flat, panels):
        _draw_ratio_panel(axis, title, label, bars)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return None


def _color(role: str) -> str:
    return (
        "tab:orange"
        if role == "treeclass"
        else "tab:gray"
        if role in ("floor", "baseline")
        else "tab:blue"
    )


def _draw_ratio_panel(
    axis: Any, title: str, label: str, bars: list[tuple[dict[str, Any], float]]
) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    names = [row["name"].replace(" (", "\n(") for row, _ in bars][::-1]
    values = [value for _, value in bars][::-1]
    colors = [_color(row["role"]) for row, _ in bars][::-1]
    # bars grow from 1x (the divisor) to the ratio, so faster rows point left
    axis.barh(names, [v - 1.0 for v in values], left=1.0, color=colors)
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set_xscale("log")
    low, high = min(values + [1.0]) / 1.3, max(values + [1.0]) * 1.6
    axis.set_xlim(low, high)
    ticks = [2.0**k for k in range(-10, 16) if low <= 2.0**k <= high]
    if len(ticks) < 3:
        ticks = [
            t
            for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 1.75, 2, 2.5, 3)
            if low <= t <= high
        ]
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    for y, value in enumerate(values):
        axis.text(
            value * (1.04 if value >= 1 else 0.96),
            y,
            f"{value:.2f}x",
            va="center",
            ha="left" if value >= 1 else "right",
            fontsize=7,
        )
    axis.set_title(title, fontsize=9)
    axis.set_xlabel(f"time / {label} time (log scale; left of 1x is faster)", fontsize=8)
    axis.tick_params(labelsize=7)


def plot_scaling(data: dict[str, Any], path: str) -> str | None:
    """Write a PNG of time against layers (log-log), one panel per scaling case.

    **Returns**

    `None` on success, or a one-line reason no plot was written.
    """
    plt, reason = _pyplot("--scaling-plot")
    if reason is not None:
        return reason
    panels = [
        case
        for case in data.get("scaling", [])
        if case["status"] == "ran" and any(len(row["times_s"]) >= 2 for row in case["rows"])
    ]
    if not panels:
        return "no scaling case has two sizes timed; no scaling plot written"
    columns = 4
    count = len(panels)
    rows_of_panels = (count + columns - 1) // columns
    figure, axes = plt.subplots(
        rows_of_panels, columns, squeeze=False, figsize=(4.6 * columns, 3.8 * rows_of_panels)
    )
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    for axis, case in zip(axes.flat, panels):
        _draw_scaling_panel(axis, case)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return None


# every colour but treeclass's orange, so that no peer is mistaken for it
_PEER_COLORS = (
    "tab:blue",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
)


def _draw_scaling_panel(axis: Any, case: dict[str, Any]) -> None:
    peers = 0
    for row in case["rows"]:
        points = sorted((int(n), t) for n, t in row["times_s"].items())
        if len(points) < 2:
            continue
        sizes, times = zip(*points)
        mine, floor = row["role"] == "treeclass", row["role"] == "floor"
        if mine:
            color = "tab:orange"
        elif floor:
            color = "tab:gray"
        else:
            color, peers = _PEER_COLORS[peers % len(_PEER_COLORS)], peers + 1
        label = f"{row['name']} (k={row['k']:.2f})" if row["k"] is not None else row["name"]
        axis.plot(
            sizes,
            times,
            marker="o",
            markersize=3,
            label=label,
            linewidth=2.4 if mine else 1.0,
            color=color,
            linestyle="--" if floor else "-",
            zorder=3 if mine else 2,
        )
        if mine:
            guide = [times[0] * n / sizes[0] for n in sizes]
            axis.plot(
                sizes, guide, color="black", linestyle=":", linewidth=0.8, label="slope 1 (linear)"
            )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_title(case["name"], fontsize=9)
    axis.set_xlabel(case.get("unit", "layers"), fontsize=8)
    axis.set_ylabel("seconds per call", fontsize=8)
    axis.tick_params(labelsize=7)
    axis.legend(fontsize=6, loc="upper left")
