"""Admits queued jobs and sweeps when the cluster has room for all of a job's workers (a sweep's concurrent
trials) at once, under each project's quota, in weighted fair-share order between projects and priority
then age within one; a run that waited past the starvation guard goes first and holds a reservation
(``orchestrator.scheduling.policy``, docs/scheduling.md). The tick loads only queued and active runs.

With several Ray clusters (docs/clusters.md) each queued run is first given a cluster (``scheduling.placement``),
then each cluster is planned on its own: its capacity, the runs and replicas on it, and quotas less what each
project holds on its other clusters; fair shares are measured against all of them together."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import ClusterCapacity, Demand, never_fits
from orchestrator.backend import BackendUnavailable, ClusterBackend, RayJob
from orchestrator.backend.registry import ClusterBackends, ClusterEntry, backends_of
from orchestrator.db.models import JobState, utcnow
from orchestrator.repositories import clusters as clusters_repo
from orchestrator.request_context import log_context
from orchestrator.scheduling.deployments import carry_out, queued_deployments
from orchestrator.scheduling.placement import ClusterView, ToPlace, combined, place, quotas_here
from orchestrator.scheduling.policy import (
    Holding,
    Preemption,
    TickPlan,
    Waiting,
    decayed_shares,
    dominant_share,
    plan_tick,
)
from orchestrator.scheduling.quotas import project_quotas, serving_holdings
from orchestrator.scheduling.share_memory import seed_shares
from orchestrator.services import preemption
from orchestrator.services.foreign_jobs import foreign_jobs, held_by
from orchestrator.services.launch import new_driver_claim
from orchestrator.services.runs import QueuedRun, RunKind, active_runs, queued_runs
from orchestrator.settings import Settings
from orchestrator.states.jobs import TERMINAL, note_waiting

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, sessions: sessionmaker[Session], backends: ClusterBackends | ClusterBackend, settings: Settings):
        self.sessions = sessions
        self.backends = backends_of(backends, sessions, settings.cluster_name)
        self.settings = settings
        # Each project's decayed dominant share (fair share's memory), and when it was last brought up to date.
        # A new leader (or a restart) seeds it from the usage ledger at its first tick (scheduling.share_memory).
        self.shares: dict[str, float] | None = None
        self._shares_at = 0.0

    def tick(self, now: datetime | None = None) -> TickPlan | None:
        with self.sessions() as session:
            queued = queued_runs(session)
            deployments = queued_deployments(session)  # new versions whose replicas wait for room (docs/scheduling.md)
            if not queued and not deployments:
                return None
            active = active_runs(session)
            # Serve replicas (0 CPU by default) hold their share of the cluster and of their project's quota.
            # Jobs and sweeps may be preempted unless their spec exempts them: the policy must know, or it plans
            # a preemption choose_victims refuses, and that one a tick blocks every other (docs/security.md). Serving
            # replicas never are.
            holding = [
                Holding(
                    a.key,
                    a.project_id,
                    a.request,
                    a.priority,
                    a.started_at,
                    a.borrowing,
                    preemptible=a.preemptible,
                    cluster=a.cluster,
                )
                for a in active
            ] + serving_holdings(session)
            projects = {run.project_id for run in [*queued, *deployments]} | {h.project_id for h in holding}
            quotas = project_quotas(session, projects)
            bound = clusters_repo.bindings(session, projects)
            entries = self.backends.refresh(session)
        default = self.backends.default_name
        views = self._views(entries)
        # Each run's cluster for this tick (scheduling.placement), then each cluster planned on its own.
        placed = place(
            [ToPlace(q.key, q.project_id, q.demand, q.placement, q.cluster) for q in queued]
            + [ToPlace(d.key, d.project_id, d.demand, pinned=d.cluster or default) for d in deployments],
            views,
            holding,
            bound,
            default,
            quotas,
        )
        waiting = [
            Waiting(q.key, q.project_id, q.priority, q.created_at, q.demand, q.queued_at, preemptible=q.preemptible)
            for q in queued
        ]
        waiting += [d.waiting() for d in deployments]
        now = now or utcnow()
        shares = self._decayed_shares(holding, combined(v.capacity for v in views.values() if v.capacity), now)
        plan = TickPlan(waits=dict(placed.waits))
        asks: list[Preemption] = []
        for name, view in views.items():
            here = [w for w in waiting if placed.cluster.get(w.key) == name]
            if not here:
                continue
            on_it = [h for h in holding if (h.cluster or default) == name]
            elsewhere = [h for h in holding if (h.cluster or default) != name]
            part = plan_tick(
                here,
                on_it,
                quotas_here(quotas, elsewhere, name),
                view.capacity,
                shares,
                now,
                self.settings.starvation_s,
            )
            # What this cluster admits counts against the quotas of the clusters planned after it, this tick.
            admitted = {key for key, _ in part.admit}
            holding += [
                Holding(w.key, w.project_id, w.demand.total, is_run=w.is_run, cluster=name)
                for w in here
                if w.key in admitted
            ]
            plan.admit += part.admit
            plan.waits.update(part.waits)
            plan.fail.update(part.fail)
            plan.reserved_for = plan.reserved_for or part.reserved_for
            if part.preemption is not None:
                asks.append(part.preemption)
        plan.preemption = asks[0] if asks else None
        carry_out(self.sessions, plan, deployments)  # rolls out the deployments admitted; notes why others wait

        runs = {run.key: run for run in queued}
        for key, borrowing in plan.admit:
            run = runs.get(key)
            if run is None:
                continue  # a deployment's version: rolled out above
            with log_context(**{f"{run.kind.name}_id": run.id}):  # log lines name the job or sweep
                self._admit(run.kind, run.id, placed.cluster[key], borrowing)
        for key in plan.fail:
            run = runs[key]
            with log_context(**{f"{run.kind.name}_id": run.id}):
                self._fail(run.kind, run.id, run.demand, views[placed.cluster[key]].capacity)
        waits = dict(plan.waits)
        for ask in asks:  # one per cluster at most: its victims are on that cluster
            self._preempt(ask, runs, waits)

        # Only the reasons that changed, in one transaction: a long queue that stays put (hundreds of
        # jobs waiting for a busy cluster) costs one read a tick, not a locked write per job.
        # Each with the cluster it waits for: where it was planned this tick, else where it must go.
        notes = [
            (run, run.waiting_message(why), placed.cluster.get(key) or run.cluster or run.named_cluster)
            for key, why in waits.items()
            if (run := runs.get(key)) is not None
        ]
        self._note_waiting([note for note in notes if note[1:] != (note[0].waiting, note[0].waiting_on)])
        return plan

    def _views(self, entries: list[ClusterEntry]) -> dict[str, ClusterView]:
        """Every registered cluster with what it holds now (None where it can't be reached) and what Ray jobs the
        control plane did not submit hold on it; the default cluster always, registered or not (a test's lone
        backend)."""
        labels = {e.name: e.labels for e in entries}
        labels.setdefault(self.backends.default_name, {})
        capacities: dict[str, ClusterCapacity] = {}
        errors: dict[str, str] = {}
        live: dict[str, list[RayJob]] = {}
        for name in sorted(labels):
            try:
                backend = self.backends.get(name)
                capacities[name] = backend.capacity()
            except BackendUnavailable as exc:
                errors[name] = str(exc)
                continue
            try:
                live[name] = backend.live_jobs()
            except BackendUnavailable as exc:  # its capacity answered: plan on it, counting nothing outside
                log.warning("cluster %s: could not list its Ray jobs, none counted as foreign: %s", name, exc)
        outside: dict[str, list[RayJob]] = {}
        if any(live.values()):
            with self.sessions() as session:
                outside = foreign_jobs(session, live, self.backends.default_name)
        return {
            name: ClusterView(name, labels[name], None, errors[name])
            if name in errors
            else ClusterView(name, labels[name], replace(capacities[name], held_outside=held_by(outside.get(name, []))))
            for name in sorted(labels)
        }

    def _preempt(self, ask: Preemption, runs: dict[str, QueuedRun], waits: dict[str, tuple[str, str]]) -> None:
        """The policy said a run cannot start otherwise (a lower-priority run of its project, a run borrowing
        beyond its quota, or a project above its fair share holds what it needs): preemption.choose_victims picks
        among those eligible (skipping runs already on their way out) and preempt() asks each to checkpoint now
        and stop; the reconciler requeues them, and a later tick admits the waiting run."""
        trigger = ask.trigger_of
        with self.sessions() as session:  # read only when needed: a tick that preempts nobody skips it
            candidates = preemption.preemption_candidates(session)
        eligible = [c for c in candidates if c.key in trigger]
        victims = preemption.choose_victims(ask.need, ask.free, eligible) or []
        preemptor = runs[ask.for_key]
        # A victim of another project learns only that, and the cause; the preemptor, only how many of
        # another project's runs it waits for (docs/security.md): never the other's run ids or priorities.
        stopping = [
            v
            for v in victims
            if preemption.preempt(
                self.sessions,
                v.id,
                preemption.preemptor_named(
                    preemptor.kind.name, preemptor.id, preemptor.priority, preemptor.project_id, v.project_id
                ),
                trigger[v.key],
                preemption.kind_named(v.kind),
            )
        ]
        if stopping or any(c.preempting for c in eligible):
            named = preemption.victims_named(stopping, preemptor.project_id) or "already asked"
            waits[ask.for_key] = ("preempting", f"waiting for preempted run(s) to checkpoint and stop: {named}")

    def _decayed_shares(self, holding: list[Holding], capacity: ClusterCapacity, at: datetime) -> dict[str, float]:
        """Each project's dominant share now, folded into the decayed shares (``policy.decayed_shares``); at the
        first tick, into those the usage ledger gives (``share_memory.seed_shares``): what each project held
        over the last few half-lives, decayed as this process would have."""
        if self.shares is None:
            with self.sessions() as session:
                self.shares = seed_shares(session, capacity.total, at, self.settings.fair_share_half_life_s)
            self._shares_at = time.monotonic()
        per_project: dict[str, dict[str, float]] = {}
        for h in holding:
            bucket = per_project.setdefault(h.project_id, {})
            for resource, amount in h.request.items():
                bucket[resource] = bucket.get(resource, 0.0) + amount
        current = {p: dominant_share(request, capacity.total) for p, request in per_project.items()}
        now = time.monotonic()
        self.shares = decayed_shares(self.shares, now - self._shares_at, current, self.settings.fair_share_half_life_s)
        self._shares_at = now
        return self.shares

    def _admit(self, kind: RunKind, run_id: str, cluster: str, borrowing: bool = False) -> bool:
        with self.sessions.begin() as session:
            run = kind.lock(session, run_id)
            if run is None or run.state != JobState.QUEUED:
                return False  # cancelled (or admitted) since we looked
            claim_code = new_driver_claim(run)
            run.borrowing = borrowing  # past its project's quota, on idle capacity: preempted first
            run.cluster = cluster  # where it runs from now on (scheduling.placement): its checkpoints will be there
            # Admission starts the next attempt (the state engine bumps it: orchestrator.states.jobs).
            kind.set_state(
                session, run, JobState.STARTING, "admitted", f"attempt {run.attempt + 1} submitted to Ray on {cluster}"
            )
            launch = kind.launch(session, run)
            if launch is None:
                return False  # its code package is gone: FAILED (code_missing)
        # Submitted after the commit: if this process dies here, the reconciler finds the STARTING run
        # with no Ray job and submits the same submission id, which Ray runs at most once.
        try:
            backend = self.backends.get(cluster)
            kind.submit(self.sessions, launch, claim_code, backend, self.settings)
            log.info("%s %s: submitted %s to %s", kind.name, run_id, launch.submission_id, cluster)
        except BackendUnavailable as exc:
            log.warning("%s %s: submit failed, the reconciler will retry: %s", kind.name, run_id, exc)
            return True
        with self.sessions() as session:
            run = session.get(kind.model, run_id)
            cancelled = run is not None and (run.state in TERMINAL or run.state == JobState.CANCELLING)
        if cancelled:
            backend.stop(launch.submission_id)  # cancelled while we were submitting
        return True

    def _fail(self, kind: RunKind, run_id: str, demand: Demand, capacity: ClusterCapacity) -> None:
        impossible = never_fits(demand, capacity)
        with self.sessions.begin() as session:
            run = kind.lock(session, run_id)
            if run is None or run.state != JobState.QUEUED or not impossible:
                return
            kind.set_state(session, run, JobState.FAILED, "insufficient_resources", f"can never run: {impossible}")

    def _note_waiting(self, waits: list[tuple[QueuedRun, tuple[str, str], str | None]]) -> None:
        if not waits:
            return
        with self.sessions.begin() as session:
            for queued_run, (reason, message), cluster in waits:
                run = queued_run.kind.lock(session, queued_run.id)
                if run is not None and run.state == JobState.QUEUED:  # not cancelled since we looked
                    note_waiting(run, reason, message, waiting_on=cluster)
