"""Metrics as a pandas DataFrame. pandas is optional (``pip install 'orchestrator-client[pandas]'``): it is
imported here, when a frame is asked for, never when the SDK is."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

PANDAS_MISSING = (
    "metrics_df() needs pandas, which is not installed: pip install 'orchestrator-client[pandas]' "
    "(or pip install pandas); metrics() gives the same rows without it"
)


def metrics_frame(points: Iterable[BaseModel]):
    """One row per point: its fields but ``values`` (attempt, epoch, step, created_at...), then one column per
    metric name, in the order they first appear (a metric a point lacks is NaN)."""
    try:
        import pandas
    except ImportError as exc:
        raise ImportError(PANDAS_MISSING) from exc
    rows: list[dict[str, Any]] = []
    for point in points:
        row = point.model_dump(exclude={"values", "checkpoint_path"})
        for name, value in point.values.items():  # type: ignore[attr-defined]
            row.setdefault(name, value)  # a metric named like a position field (epoch) never overwrites it
        rows.append(row)
    return pandas.DataFrame(rows)
