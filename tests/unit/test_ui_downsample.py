"""The dashboard's downsampler (orchestrator/services/downsample.py): bounded output, extremes kept, small
series unchanged."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.services.downsample import finite, minmax, minmax_indices


def test_a_series_that_fits_passes_through_unchanged():
    xs, ys = list(range(10)), [float(v) for v in (5, 3, 9, 1, 1, 2, 8, 0, 4, 4)]
    assert minmax(xs, ys, 10) == (xs, ys)
    assert minmax(xs[:3], ys[:3], 4) == (xs[:3], ys[:3])
    assert minmax([], [], 100) == ([], [])


@pytest.mark.parametrize(("n", "max_points"), [(100_000, 2000), (100_001, 2001), (5, 4), (9999, 37), (2001, 2000)])
def test_the_output_is_bounded_ordered_and_made_of_input_points(n, max_points):
    rng = random.Random(n)
    xs = list(range(n))
    ys = [rng.gauss(0, 1) for _ in range(n)]
    out_x, out_y = minmax(xs, ys, max_points)
    assert len(out_x) == len(out_y) <= max_points
    assert len(out_x) >= max_points - 2  # it does not throw away more than it must
    assert out_x == sorted(set(out_x))  # x order, no point twice
    assert all(ys[x] == y for x, y in zip(out_x, out_y, strict=True))
    assert out_x[0] == 0 and out_x[-1] == n - 1  # the ends are kept


def test_the_extremes_survive_even_a_single_point_spike():
    n = 100_000
    ys = [1.0 - i / n for i in range(n)]  # a falling loss ...
    ys[31_337] = 50.0  # ... that blew up once
    ys[77_777] = -3.0  # ... and dipped once
    out_x, out_y = minmax(list(range(n)), ys, 2000)
    assert max(out_y) == 50.0 and out_x[out_y.index(50.0)] == 31_337
    assert min(out_y) == -3.0 and out_x[out_y.index(-3.0)] == 77_777


def test_every_bucket_keeps_its_own_extremes():
    """Not only the global ones: the local minimum and maximum of every bucket are in the output."""
    rng = random.Random(7)
    n, max_points = 10_000, 102
    ys = [rng.random() for _ in range(n)]
    kept = set(minmax_indices(ys, max_points))
    buckets, inner = (max_points - 2) // 2, n - 2
    for b in range(buckets):
        start, end = 1 + b * inner // buckets, 1 + (b + 1) * inner // buckets
        window = ys[start:end]
        assert start + window.index(min(window)) in kept
        assert start + window.index(max(window)) in kept


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="at least 4"):
        minmax_indices([1.0] * 10, 3)
    with pytest.raises(ValueError, match="2 x values but 3 y values"):
        minmax([1, 2], [1.0, 2.0, 3.0])


def test_finite_keeps_numbers_only():
    assert finite(3) == 3.0 and finite(0.5) == 0.5
    assert finite(math.nan) is None and finite(math.inf) is None
    assert finite(True) is None and finite("0.3") is None and finite(None) is None
