"""The control plane's Prometheus metrics: one registry per ControlPlane (never the global one, so two apps in
one process, e.g. the unit tests, each count their own), the metrics themselves, and how a change in a
transaction is counted only once that transaction commits.

What moves which metric: the state engine's hooks count jobs submitted, finished, restarted and their
durations (``orchestrator/states/job_metrics.py``), sweeps submitted and finished
(``orchestrator/states/sweep_metrics.py``) and deployment rollouts by outcome
(``orchestrator/states/deployment_metrics.py``); ``orchestrator/backend/metered.py`` counts every call to
the cluster backend; ``orchestrator/loops/runner.py`` stamps each loop's last good tick; the API's
middleware (``api/http_metrics.py``) counts requests by route template. Jobs, sweeps and deployments by state
are read from the database at scrape time (``StateCollector``), so the gauges are right even after a restart.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.db.models import Deployment, DeploymentState, Job, JobState, Sweep

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
ROLLOUT_OUTCOMES = ("promoted", "failed")
RAY_OUTCOMES = ("ok", "unavailable", "rejected", "error")

# Seconds: a queue wait or a run spans seconds to days; an HTTP request milliseconds to a long follow.
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 24 * 3600, float("inf"))
RUN_BUCKETS = (10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 72 * 3600, float("inf"))
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, float("inf"))

# A restart's reason becomes a label value: a driver sends it (a short code such as "worker_died"), so only
# code-like values up to this many distinct ones are kept; anything else counts as "other".
_REASON = re.compile(r"[a-z][a-z0-9_]{0,47}")
MAX_RESTART_REASONS = 32


class Metrics:
    """Every metric of one control plane, on its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs_submitted = Counter("orchestrator_jobs_submitted", "Jobs submitted (stored QUEUED).", registry=r)
        self.jobs_finished = Counter(
            "orchestrator_jobs_finished", "Jobs that reached a terminal state, by that state.", ["state"], registry=r
        )
        self.job_restarts = Counter(
            "orchestrator_job_restarts",
            "Moves of a job to RESTARTING, by reason (driver_lost, driver_failed, start_timeout, a driver's code).",
            ["reason"],
            registry=r,
        )
        self.job_queue_wait = Histogram(
            "orchestrator_job_queue_wait_seconds",
            "Time from submission (QUEUED) to admission (STARTING).",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.job_run_duration = Histogram(
            "orchestrator_job_run_duration_seconds",
            "Time from a job's first RUNNING to its terminal state, by that state.",
            ["state"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.sweeps_submitted = Counter(
            "orchestrator_sweeps_submitted", "Sweeps submitted (stored QUEUED).", registry=r
        )
        self.sweeps_finished = Counter(
            "orchestrator_sweeps_finished",
            "Sweeps that reached a terminal state, by that state.",
            ["state"],
            registry=r,
        )
        self.deployment_rollouts = Counter(
            "orchestrator_deployment_rollouts",
            "Rollouts of a deployment's version (DEPLOYING, UPDATING) that ended: promoted (HEALTHY) or failed "
            "(FAILED, UNHEALTHY).",
            ["outcome"],
            registry=r,
        )
        self.ray_calls = Counter(
            "orchestrator_ray_api_calls",
            "Calls to the Ray cluster backend, by method and outcome (ok, unavailable, rejected, error).",
            ["method", "outcome"],
            registry=r,
        )
        self.loop_last_success = Gauge(
            "orchestrator_loop_last_success_timestamp_seconds",
            "Unix time of each background loop's last tick that ended without an error.",
            ["loop"],
            registry=r,
        )
        self.http_requests = Counter(
            "orchestrator_http_requests",
            "HTTP requests answered, by method, route template and status class (2xx, 4xx, ...).",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "orchestrator_http_request_duration_seconds",
            "Time to answer an HTTP request (to the end of its body), by method and route template.",
            ["method", "route"],
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        # Series that exist from the start, so a rate() or an increase() sees their first event.
        for state in TERMINAL_STATES:
            self.jobs_finished.labels(state)
            self.sweeps_finished.labels(state)
        for outcome in ROLLOUT_OUTCOMES:
            self.deployment_rollouts.labels(outcome)
        self._restart_reasons: set[str] = set()

    def restart_reason(self, reason: str) -> str:
        """``reason`` as a label value: bounded, so a driver cannot grow the series without limit."""
        if reason in self._restart_reasons:
            return reason
        if not _REASON.fullmatch(reason) or len(self._restart_reasons) >= MAX_RESTART_REASONS:
            return "other"
        self._restart_reasons.add(reason)
        return reason

    def watch_database(self, sessions: sessionmaker[Session]) -> None:
        """Jobs, sweeps and deployments by state, read at scrape time; and this registry named in every
        session, for the state engine's hooks (``metrics_of``)."""
        for collector in (
            StateCollector(sessions, Job, JobState, "orchestrator_jobs", "Jobs in the database, by state"),
            StateCollector(sessions, Sweep, JobState, "orchestrator_sweeps", "Sweeps in the database, by state"),
            StateCollector(
                sessions,
                Deployment,
                DeploymentState,
                "orchestrator_deployments",
                "Deployments in the database, by state",
            ),
        ):
            self.registry.register(collector)
        sessions.configure(info={**sessions.kw.get("info", {}), METRICS_KEY: self})

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class StateCollector(Collector):
    """``<name>{state}`` (``orchestrator_jobs``, ``orchestrator_sweeps``, ``orchestrator_deployments``): one
    GROUP BY of ``model`` at scrape time; every state of ``states`` present, 0 when none."""

    def __init__(self, sessions: sessionmaker[Session], model: type, states: type[enum.Enum], name: str, what: str):
        self.sessions = sessions
        self.model = model
        self.states = states
        self.name = name
        self.help = f"{what} (read at scrape time)."

    def describe(self) -> Iterable[Metric]:
        # Without describe(), registering would call collect(): a query before the migrations ran.
        return [GaugeMetricFamily(self.name, self.help, labels=["state"])]

    def collect(self) -> Iterable[Metric]:
        column = self.model.state
        try:
            with self.sessions() as session:
                counts = dict(session.execute(select(column, func.count()).group_by(column)).all())
        except Exception:
            # A scrape must not fail as a whole because the database is away: the other metrics still count.
            log.warning("metrics: %s by state could not be read", self.model.__tablename__, exc_info=True)
            return []
        family = GaugeMetricFamily(self.name, self.help, labels=["state"])
        for state in self.states:
            family.add_metric([state.value], counts.get(state, 0))
        return [family]


# --- counting what a transaction did, once it commits ------------------------------------------------------

METRICS_KEY = "orchestrator.metrics"
_PENDING_KEY = "orchestrator.metrics.pending"


def metrics_of(session: Session) -> Metrics | None:
    """The registry of the control plane whose session factory made ``session`` (None outside one)."""
    return session.info.get(METRICS_KEY)


def after_commit(session: Session, action: Callable[[], None]) -> None:
    """Run ``action`` once the session's transaction commits; never if it rolls back (a retried event or
    a conflict must not count twice)."""
    session.info.setdefault(_PENDING_KEY, []).append(action)


@event.listens_for(Session, "after_commit")
def _count_committed(session: Session) -> None:
    for action in session.info.pop(_PENDING_KEY, ()):
        try:
            action()
        except Exception:  # a metric must never break a commit that already happened
            log.warning("metrics: counting a committed change failed", exc_info=True)


@event.listens_for(Session, "after_transaction_end")
def _drop_uncommitted(session: Session, transaction) -> None:
    if transaction.parent is None:  # the outermost transaction: committed (already counted) or rolled back
        session.info.pop(_PENDING_KEY, None)
