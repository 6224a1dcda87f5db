"""Downsampling a metric series for a chart: pure functions, no I/O.

``minmax`` keeps, in each of ``max_points // 2`` equal-count buckets, the point with the smallest and the one
with the largest value (in their order), and always the first and the last point: a spike or a dip of one
point survives (a chart of a loss that blew up shows it), the output never has more than ``max_points``
points, and a series that already fits is returned as it is. Points must come in x order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_POINTS = 2000  # per series: a chart a few thousand pixels wide shows no more
MAX_POINTS = 10_000  # what a caller may ask for at most


def minmax_indices(ys: Sequence[float], max_points: int) -> list[int]:
    """The indices of ``ys`` that ``minmax`` keeps, ascending."""
    n = len(ys)
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, not {max_points}")
    if n <= max_points:
        return list(range(n))
    buckets = (max_points - 2) // 2  # each keeps 2; the first and last points are 2 more
    inner = n - 2
    keep = [0]
    for b in range(buckets):
        start = 1 + b * inner // buckets
        end = 1 + (b + 1) * inner // buckets
        if start >= end:
            continue
        lo = hi = start
        lo_value = hi_value = ys[start]
        for i in range(start + 1, end):
            value = ys[i]
            if value < lo_value:
                lo, lo_value = i, value
            elif value > hi_value:
                hi, hi_value = i, value
        keep.extend(sorted({lo, hi}))
    keep.append(n - 1)
    return keep


def minmax(xs: Sequence[float], ys: Sequence[float], max_points: int = DEFAULT_POINTS) -> tuple[list, list]:
    """``(xs, ys)`` reduced to at most ``max_points`` points with every bucket's extremes kept."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    if len(ys) <= max_points:
        return list(xs), list(ys)
    keep = minmax_indices(ys, max_points)
    return [xs[i] for i in keep], [ys[i] for i in keep]


def finite(value: object) -> float | None:
    """``value`` as a float if it is a finite number (a metric may be a string, a bool, NaN or missing)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None
