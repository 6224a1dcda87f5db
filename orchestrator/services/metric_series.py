"""Metric points as chart series: one series per metric and attempt (a restart starts a new segment), on an
x-axis of steps, epochs or time, downsampled per series (``orchestrator.services.downsample``) and aligned
on one shared x for each chart. Pure functions over ``(attempt, epoch, step, created_at, values)`` rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from orchestrator.services.downsample import DEFAULT_POINTS, finite, minmax

XAxis = Literal["step", "epoch", "time"]
Point = tuple[int, int, int, datetime | None, dict[str, Any]]  # created_at: needed on the time axis only
SKIPPED = frozenset({"epoch", "step", "attempt"})  # positions, not metrics


def chart_group(metric: str) -> str:
    """Which chart a metric is drawn on: every loss together, every accuracy together, anything else alone."""
    lowered = metric.lower()
    if "loss" in lowered:
        return "loss"
    if "acc" in lowered:
        return "accuracy"
    return metric


def _seconds(when: datetime) -> float:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def raw_series(points: Iterable[Point], x_axis: XAxis) -> dict[tuple[str, int], tuple[list[float], list[float]]]:
    """``{(metric, attempt): (xs, ys)}``, finite values only. On the epoch axis each (attempt, epoch) is one
    point: the mean of the values reported in that epoch."""
    series: dict[tuple[str, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    if x_axis == "epoch":
        sums: dict[tuple[str, int, int], list[float]] = defaultdict(lambda: [0.0, 0])
        for attempt, epoch, _step, _when, values in points:
            for name, value in values.items():
                number = finite(value)
                if number is not None and name not in SKIPPED:
                    acc = sums[(name, attempt, epoch)]
                    acc[0] += number
                    acc[1] += 1
        for (name, attempt, epoch), (total, count) in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            xs, ys = series[(name, attempt)]
            xs.append(float(epoch))
            ys.append(total / count)
        return dict(series)
    for attempt, _epoch, step, when, values in points:
        x = float(step) if x_axis == "step" else _seconds(when)  # type: ignore[arg-type]
        for name, value in values.items():
            number = finite(value)
            if number is not None and name not in SKIPPED:
                xs, ys = series[(name, attempt)]
                xs.append(x)
                ys.append(number)
    if x_axis == "time":  # points come in (attempt, step) order; time order can differ across attempts only
        for key, (xs, ys) in series.items():
            order = sorted(range(len(xs)), key=xs.__getitem__)
            series[key] = ([xs[i] for i in order], [ys[i] for i in order])
    return dict(series)


def _align(parts: list[tuple[str, int, list[float], list[float]]]) -> tuple[list[float], list[dict[str, Any]]]:
    """One shared x for several series; a series has null where it has no point."""
    xs = sorted({x for _, _, sx, _ in parts for x in sx})
    index = {x: i for i, x in enumerate(xs)}
    out = []
    for metric, attempt, sx, sy in parts:
        ys: list[float | None] = [None] * len(xs)
        for x, y in zip(sx, sy, strict=True):
            ys[index[x]] = y
        out.append({"metric": metric, "attempt": attempt, "y": ys})
    return xs, out


def charts(points: list[Point], x_axis: XAxis = "step", max_points: int = DEFAULT_POINTS) -> dict[str, Any]:
    """What a job's charts draw: ``{"x_axis", "charts": [{"title", "x", "series": [{"metric", "attempt",
    "y"}]}], "restarts": [{"attempt", "x"}], "points", "shown"}``; every series at most ``max_points`` long,
    its extremes kept."""
    series = raw_series(points, x_axis)
    groups: dict[str, list[tuple[str, int, list[float], list[float]]]] = defaultdict(list)
    shown = 0
    for (metric, attempt), (xs, ys) in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        xs, ys = minmax(xs, ys, max_points)
        shown += len(xs)
        groups[chart_group(metric)].append((metric, attempt, xs, ys))
    out = []
    for title in sorted(groups, key=lambda t: ({"loss": 0, "accuracy": 1}.get(t, 2), t)):
        x, aligned = _align(groups[title])
        out.append({"title": title, "x": x, "series": aligned})
    # Where each attempt after the first begins: the charts mark it (a restart resumed from a checkpoint).
    starts: dict[int, float] = {}
    for (_metric, attempt), (xs, _ys) in series.items():
        if xs and attempt > 1:
            starts[attempt] = min(starts.get(attempt, xs[0]), xs[0])
    restarts = [{"attempt": a, "x": x} for a, x in sorted(starts.items())]
    return {"x_axis": x_axis, "charts": out, "restarts": restarts, "points": len(points), "shown": shown}
