"""Which checkpoints a run keeps and which one is its best: one rule for jobs and for sweep trials.

- **Order.** A checkpoint's ``id`` says when it was recorded: a job checkpoint's row id, a trial's epoch.
  Newer means a larger ``id``.
- **Best.** By a metric and a mode (max or min); checkpoints without a finite value of the metric don't
  count. **Ties go to the newer checkpoint** — everywhere: retention's ``keep_best``, a job's "best"
  deployment source, a trial's best epoch. It is also how Ray Train breaks ties, so no rule here can
  disagree with a folder Ray kept.
- **Kept.** The newest ``keep`` plus the best ``keep_best.count``; the latest is always kept.
- **Trials** keep their latest checkpoint plus the best ``base.checkpoint.keep`` by the sweep's metric
  (``trial_retention``): what PBT clones and a restored trial resumes (the latest), and what a
  deployment of the trial loads (the best).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator_contract.jobs import KeepBestSpec
from orchestrator_contract.sweeps import SweepSpec

T = TypeVar("T")


@dataclass(frozen=True)
class RecordedCheckpoint:
    id: int  # identity, and the order checkpoints were recorded in
    path: str
    step: int
    metrics: dict[str, Any] = field(default_factory=dict)


def score(metrics: dict[str, Any] | None, metric: str) -> float | None:
    """The metric's value when it is a finite number; None otherwise (such a checkpoint is never "best")."""
    value = (metrics or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best_first(
    items: Iterable[T],
    metric: str,
    mode: str,
    *,
    metrics: Callable[[T], dict[str, Any] | None],
    order: Callable[[T], Any],
) -> list[T]:
    """``items`` that carry ``metric``, best first; equal values: the newer (larger ``order``) first."""
    sign = 1.0 if mode == "max" else -1.0
    scored = [
        (sign * value, order(item), item) for item in items if (value := score(metrics(item), metric)) is not None
    ]
    scored.sort(key=lambda entry: (entry[0], entry[1]), reverse=True)
    return [item for _, _, item in scored]


def select_kept(checkpoints: Sequence[RecordedCheckpoint], keep: int, keep_best: KeepBestSpec | None) -> set[int]:
    """Ids of the checkpoints retention keeps: the newest ``keep`` and the best ``keep_best.count`` by its
    metric. The latest is always kept."""
    ordered = sorted(checkpoints, key=lambda c: c.id)
    kept = {c.id for c in ordered[-max(keep, 1) :]}
    if keep_best is not None:
        ranked = best_first(ordered, keep_best.metric, keep_best.mode or "max", metrics=_metrics, order=_id)
        kept |= {c.id for c in ranked[: keep_best.count]}
    return kept


def trial_retention(spec: SweepSpec) -> tuple[int, KeepBestSpec]:
    """A trial's ``(keep, keep_best)``: its latest checkpoint and the best ``base.checkpoint.keep`` by the
    sweep's metric."""
    return 1, KeepBestSpec(metric=spec.metric, mode=spec.mode, count=spec.base.checkpoint.keep)


def _metrics(c: RecordedCheckpoint) -> dict[str, Any]:
    return c.metrics


def _id(c: RecordedCheckpoint) -> int:
    return c.id
