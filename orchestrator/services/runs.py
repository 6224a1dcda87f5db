"""The two kinds of work the control plane runs as a Ray Job with attempts: training jobs and sweeps.

Both follow the job lifecycle, hold a driver's claim code and token and a submission id ``<id>-<attempt>``; the
scheduler, the reconciler and cancellation drive both through one ``RunKind`` instead of a copy per kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.admission import Demand, scaling_demand, sweep_demand
from orchestrator.backend import ClusterBackend, SubmissionTaken
from orchestrator.db.models import Job, JobState, Sweep
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.launch import CODE_MISSING, DRIVER_MODULE, CodeMissing, Launch, code_mount
from orchestrator.settings import Settings
from orchestrator.states import startup
from orchestrator.states.core import Lifecycle, lock_row
from orchestrator.states.jobs import JOB_LIFECYCLE, revoke_driver, set_job_state
from orchestrator.states.sweeps import SWEEP_LIFECYCLE, set_sweep_state
from orchestrator_contract.jobs import JobSpec, ScalingSpec
from orchestrator_contract.placement import Placement
from orchestrator_contract.sweeps import SweepSpec

Run = Job | Sweep
_NOT_STARTED = (JobState.STARTING, JobState.RESTARTING)  # submitted (or about to be), nothing heard yet
SUBMISSION_TAKEN = "submission_taken"  # Ray had another job under the attempt's submission id


@dataclass(frozen=True)
class RunKind:
    name: str  # "job" | "sweep": also the driver's --<name>-id argument
    model: type
    driver_module: str
    lifecycle: Lifecycle  # its rules and companions in the state engine
    set_state: Callable[..., bool]  # (session, run, to_state, reason, message="", again=False, new_attempt=False)
    queued: Callable[[Session], list]
    active: Callable[[Session], list]
    last_transition: Callable[[Session, str], Any]  # the history row of how it entered its state
    history: Callable[[Session, str], list]  # every history row, oldest first
    max_attempts: Callable[[Any], int]
    demand: Callable[[Any], Demand]

    def lock(self, session: Session, run_id: str) -> Run | None:
        return lock_row(session, self.model, run_id)

    def launch(self, session: Session, run: Run) -> Launch | None:
        """The run's current attempt, as it will be submitted (its code package, if any, marked used); None
        when its code package is gone: the run is then FAILED (code_missing), not retried every tick."""
        try:
            code = code_mount(session, run)
        except CodeMissing as exc:
            self.set_state(session, run, JobState.FAILED, CODE_MISSING, str(exc))
            return None
        return Launch.of(run, self.name, self.driver_module, code)

    def submit(
        self,
        sessions: sessionmaker[Session],
        launch: Launch,
        claim_code: str,
        backend: ClusterBackend,
        settings: Settings,
    ) -> None:
        """Send ``launch`` to Ray with its driver's claim code (``launch.new_driver_claim``), after the commit
        that made it (BackendUnavailable: the caller retries). When its stored package is gone and Ray has no
        copy, the run fails (code_missing) instead; when Ray has another job under its submission id (someone
        with the cluster's token took it), it fails (submission_taken) rather than follow that job as its own."""
        try:
            launch.submit(backend, claim_code, settings)
        except (CodeMissing, SubmissionTaken) as exc:
            reason = CODE_MISSING if isinstance(exc, CodeMissing) else SUBMISSION_TAKEN
            with sessions.begin() as session:
                run = self.lock(session, launch.run_id)
                if run is not None and run.submission_id == launch.submission_id and run.state in _NOT_STARTED:
                    self.set_state(session, run, JobState.FAILED, reason, str(exc))
            return
        with sessions.begin() as session:  # Ray took it: the start-up timeline's "submitted" (states.startup)
            run = self.lock(session, launch.run_id)
            if run is not None and run.submission_id == launch.submission_id:
                startup.mark(run, "submitted")


JOBS = RunKind(
    name="job",
    model=Job,
    driver_module=DRIVER_MODULE,
    lifecycle=JOB_LIFECYCLE,
    set_state=set_job_state,
    queued=jobs_repo.queued_jobs,
    active=jobs_repo.active_jobs,
    last_transition=jobs_repo.last_transition,
    history=jobs_repo.list_events,
    max_attempts=lambda job: JobSpec.model_validate(job.spec).retries.max_attempts,
    # The stored spec was validated at submission, defaults filled in: its scaling alone gives the demand.
    demand=lambda job: scaling_demand(ScalingSpec.model_validate(job.spec["scaling"])),
)

SWEEPS = RunKind(
    name="sweep",
    model=Sweep,
    driver_module="workers.tune.driver",
    lifecycle=SWEEP_LIFECYCLE,
    set_state=set_sweep_state,
    queued=sweeps_repo.queued_sweeps,
    active=sweeps_repo.active_sweeps,
    last_transition=sweeps_repo.last_transition,
    history=sweeps_repo.list_events,
    # The driver's attempts: the base job's budget (its trials' worker restarts use the rest of retries).
    max_attempts=lambda sweep: SweepSpec.model_validate(sweep.spec).base.retries.max_attempts,
    demand=lambda sweep: sweep_demand(SweepSpec.model_validate(sweep.spec)),
)

KINDS: tuple[RunKind, ...] = (JOBS, SWEEPS)


def kind_of(run: Run) -> RunKind:
    """The kind of a job or sweep row."""
    return JOBS if isinstance(run, Job) else SWEEPS


def may_be_preempted(spec: dict) -> bool:
    """A job's spec, or a sweep's: ``preemptible: false`` on the sweep or on its base exempts it."""
    return bool(spec.get("preemptible", True)) and bool((spec.get("base") or {}).get("preemptible", True))


def placement_of(spec: dict) -> Placement | None:
    """Where a job's spec, or a sweep's, asks to run: the sweep's own placement, else its base's (docs/clusters.md;
    ``SweepSpec.run_placement`` on the model)."""
    asked = spec.get("placement") or (spec.get("base") or {}).get("placement")
    return Placement.model_validate(asked) if asked else None


@dataclass(frozen=True)
class QueuedRun:
    kind: RunKind
    id: str
    priority: int
    created_at: datetime
    demand: Demand
    # Why it waits, as last noted (reason, message): the scheduler writes only a change.
    waiting: tuple[str, str] = ("", "")
    project_id: str = ""
    queued_at: datetime | None = None  # when it last entered QUEUED (the starvation clock); None: created_at
    last_preempted_at: datetime | None = None
    last_preempted_by: str = ""
    preemptible: bool = True  # its spec's: a run that may not be preempted never borrows (scheduling.policy)
    cluster: str | None = None  # placed before (it ran there, its checkpoints are there): it stays; None: not yet
    placement: Placement | None = None
    waiting_on: str | None = None  # the cluster it was last noted waiting for

    @property
    def named_cluster(self) -> str | None:
        """The cluster its spec names (``placement.cluster``), if any."""
        return self.placement.cluster if self.placement is not None else None

    @property
    def key(self) -> str:
        return f"{self.kind.name}:{self.id}"

    def waiting_message(self, why: tuple[str, str]) -> tuple[str, str]:
        """``why`` (reason, message) as noted on the run: a run back in the queue because it was preempted
        keeps saying so ("preempted by job 1f2e (priority 10) (priority); now waiting for resources: ...")
        while its reason says what it waits for now."""
        reason, message = why
        if (
            self.last_preempted_at is not None
            and self.queued_at is not None
            and self.last_preempted_at >= self.queued_at
        ):
            return reason, f"preempted by {self.last_preempted_by}; now {message}"
        return why


def queued_runs(session: Session) -> list[QueuedRun]:
    """Every QUEUED job and sweep, in admission order: priority, then age."""
    runs = [
        QueuedRun(
            kind,
            run.id,
            run.priority,
            run.created_at,
            kind.demand(run),
            (run.reason, run.message),
            run.project_id,
            run.queued_at,
            run.last_preempted_at,
            run.last_preempted_by,
            may_be_preempted(run.spec),
            run.cluster,
            placement_of(run.spec),
            run.waiting_on,
        )
        for kind in KINDS
        for run in kind.queued(session)
    ]
    return sorted(runs, key=lambda q: (-q.priority, q.created_at, q.id))


def active_demands(session: Session) -> list[dict[str, float]]:
    return [kind.demand(run).total for kind in KINDS for run in kind.active(session)]


@dataclass(frozen=True)
class ActiveRun:
    """An admitted job or sweep as the scheduler's policy sees it (``orchestrator.scheduling``)."""

    kind: RunKind
    id: str
    project_id: str
    priority: int
    created_at: datetime
    started_at: datetime | None
    request: dict[str, float]
    borrowing: bool
    preemptible: bool = True  # its spec's: the policy never counts a run that may not be preempted as a victim
    cluster: str | None = None  # None: the default cluster (a row from before clusters)

    @property
    def key(self) -> str:
        return f"{self.kind.name}:{self.id}"


def active_runs(session: Session) -> list[ActiveRun]:
    """Every admitted (STARTING .. CANCELLING) job and sweep with what it holds."""
    return [
        ActiveRun(
            kind,
            run.id,
            run.project_id,
            run.priority,
            run.created_at,
            run.started_at,
            kind.demand(run).total,
            run.borrowing,
            may_be_preempted(run.spec),
            run.cluster,
        )
        for kind in KINDS
        for run in kind.active(session)
    ]


def revoke_driver_tokens(session: Session, why: str) -> int:
    """No driver of an active run may report, or claim its token, any more (its cluster is gone: ``why``); the
    next attempt gets a new claim code. Each run's history says so."""
    revoked = 0
    for kind in KINDS:
        for run in kind.active(session):
            revoke_driver(session, kind.lifecycle, run, why)
            revoked += 1
    return revoked
