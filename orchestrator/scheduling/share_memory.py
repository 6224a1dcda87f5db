"""Fair share's memory after a restart (docs/scheduling.md): each project's decayed dominant share rebuilt from the usage
ledger (``usage_intervals``), so a new leader, or a restarted one, orders projects as the one before it would
have, instead of forgetting who just filled the cluster.

The leader keeps, per project, the larger of what it holds now and what it held before halved every
``fair_share_half_life_s`` (``policy.decayed_shares``, folded in each tick). Over a history that is the largest,
over every moment t, of the project's dominant share at t decayed by ``now - t``: for each stretch of constant
holdings, its share decayed from its end. ``ledger_shares`` computes exactly that from the ledger's stretches;
the running leader only samples at its ticks, so the two agree to within what changes between two ticks.
Only the last ``HALF_LIVES`` half-lives are read (older holdings have decayed below 1/32): closed stretches
that ended since then and the open ones, through the ledger's ``ended_at`` index (``usage.load_intervals``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.admission import RESOURCES
from orchestrator.scheduling.policy import dominant_share
from orchestrator.usage import load_intervals

HALF_LIVES = 5  # how far back the ledger is read: 0.5 ** 5, about 3 % of a share, is where memory ends
_FLOOR = 1e-6  # policy.decayed_shares forgets a share below this


def ledger_shares(
    stretches: Iterable[Any], capacity: Mapping[str, float], now: datetime, half_life_s: float
) -> dict[str, float]:
    """Each project's decayed dominant share at ``now`` from ledger rows (``project_id``, ``workers``, ``cpus``,
    ``gpus`` per worker, ``started_at``, ``ended_at``: None while held), over the cluster's ``capacity``."""
    if half_life_s <= 0:
        return {}
    since = now - timedelta(seconds=HALF_LIVES * half_life_s)
    changes: dict[str, list[tuple[datetime, dict[str, float]]]] = defaultdict(list)
    for row in stretches:
        start, end = max(row.started_at, since), min(row.ended_at or now, now)
        if end <= start:
            continue
        held = {"CPU": row.workers * row.cpus, "GPU": row.workers * row.gpus}
        changes[row.project_id].append((start, held))
        changes[row.project_id].append((end, {r: -v for r, v in held.items()}))
    shares: dict[str, float] = {}
    for project_id, points in changes.items():
        points.sort(key=lambda point: point[0])
        holding = dict.fromkeys(RESOURCES, 0.0)
        best = 0.0
        for i, (at, delta) in enumerate(points):
            for r in RESOURCES:
                holding[r] += delta.get(r, 0.0)
            until = points[i + 1][0] if i + 1 < len(points) else now
            if until > at:  # a stretch of constant holdings [at, until): its share, decayed from its end
                age_s = (now - until).total_seconds()
                best = max(best, dominant_share(holding, capacity) * 0.5 ** (age_s / half_life_s))
        if best > _FLOOR:
            shares[project_id] = best
    return shares


def seed_shares(session: Session, capacity: Mapping[str, float], now: datetime, half_life_s: float) -> dict[str, float]:
    """``ledger_shares`` over the ledger's last ``HALF_LIVES`` half-lives (bounded: an indexed range read)."""
    if half_life_s <= 0:
        return {}
    since = now - timedelta(seconds=HALF_LIVES * half_life_s)
    return ledger_shares(load_intervals(session, None, since, now), capacity, now, half_life_s)
