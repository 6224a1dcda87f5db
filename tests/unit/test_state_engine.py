"""The one state engine (``orchestrator.states``): nothing else assigns a state or a companion field, the
attempt and version-pointer rules, and the trials' history."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.db.models import DeploymentState, JobState, TrialState
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.repositories import projects as projects_repo
from orchestrator.repositories import sweeps as sweeps_repo
from orchestrator.services.preemption import mark_preempted
from orchestrator.services.runs import revoke_driver_tokens
from orchestrator.states.core import IllegalTransition
from orchestrator.states.deployments import lock_deployment, record_deployment_created, set_deployment_state
from orchestrator.states.jobs import PREEMPTING, issue_driver_claim, issue_driver_token, lock_job, set_job_state
from orchestrator.states.sweeps import lock_sweep, set_sweep_state, set_trial_state
from orchestrator_contract.sweeps import SweepSpec
from tests.unit.api_helpers import new_job

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "orchestrator" / "states"
# A row's state and the fields that change with it: only the engine assigns them.
GUARDED = frozenset(
    {
        "state",
        "attempt",
        "started_at",
        "finished_at",
        "live_version",
        "failed_version",
        "rollout_started_at",
        "deleted_at",
        # Preemption: asked (request_preemption), counted and remembered (the requeue's hooks).
        "preempt_requested_at",
        "preempt_by",
        "preemptions",
        "last_preempted_at",
        "last_preempted_by",
        "queued_at",
        # The driver's credentials: claim code, the claim's nonce and the token it was given.
        "claim_hash",
        "claimed_by",
        "token_hash",
    }
)


# --- the AST check ---------------------------------------------------------------------------------------


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [leaf for element in target.elts for leaf in _flatten(element)]
    if isinstance(target, ast.Starred):
        return _flatten(target.value)
    return [target]


def guarded_assignments(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: what`` for every assignment of a guarded attribute in ``source``: an Assign, AugAssign or
    AnnAssign target (tuples unpacked), ``setattr(x, "<name>", ...)``, or ``.values(<name>=...)`` (a SQL
    UPDATE around the engine)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        for target in _targets(node):
            for leaf in _flatten(target):
                if isinstance(leaf, ast.Attribute) and leaf.attr in GUARDED:
                    found.append(f"{filename}:{node.lineno}: assigns .{leaf.attr}")
        if isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Name)
                and func.id == "setattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in GUARDED
            ):
                found.append(f"{filename}:{node.lineno}: setattr(..., {node.args[1].value!r})")
            if isinstance(func, ast.Attribute) and func.attr == "values":
                found.extend(
                    f"{filename}:{node.lineno}: .values({kw.arg}=...)" for kw in node.keywords if kw.arg in GUARDED
                )
    return found


def _checked_files() -> list[Path]:
    files = [*sorted((ROOT / "orchestrator").rglob("*.py")), *sorted((ROOT / "api").rglob("*.py"))]
    return [f for f in files if ENGINE not in f.parents and "migrations" not in f.parts]


def test_only_the_engine_assigns_a_state_or_a_companion_field():
    checked = _checked_files()
    assert len(checked) > 20 and any(f.name == "reconciler.py" for f in checked)  # the scan sees the tree
    found = [hit for f in checked for hit in guarded_assignments(f.read_text(), str(f.relative_to(ROOT)))]
    assert found == [], "assign these through orchestrator.states (a transition or its hooks):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "job.state = JobState.RUNNING",
        "run.attempt += 1",
        "deployment.live_version: int = deployment.version",
        "deployment.failed_version, x = deployment.version, 1",
        "a = trial.finished_at = now",
        "setattr(job, 'started_at', now)",
        "session.execute(update(Job).values(state='FAILED'))",
        "for j in jobs:\n    if j:\n        j.deleted_at = None",
        "run.preempt_requested_at = utcnow()",
        "run.token_hash = ''",
        "sweep.preemptions += 1",
    ],
)
def test_the_check_finds_an_assignment_outside_the_engine(snippet):
    assert len(guarded_assignments(snippet)) == 1


def test_the_check_lets_reads_and_other_fields_be():
    snippet = (
        "if job.state == S.RUNNING and job.attempt > 1:\n"
        "    job.latest_metrics = {'a': job.started_at}\n"
        "    app.state.service = service\n"
        "    kind.set_state(session, job, S.FAILED, 'x')\n"
        "    values = dict(state=job.state)\n"
    )
    assert guarded_assignments(snippet) == []


# --- the engine on a database ----------------------------------------------------------------------------


def test_admission_starts_an_attempt_and_a_restart_into_a_new_driver_starts_the_next(sessions):
    job_id = new_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert job.attempt == 0
        set_job_state(session, job, JobState.STARTING, "admitted")
        assert job.attempt == 1
        set_job_state(session, job, JobState.RUNNING, "training_started")
        set_job_state(session, job, JobState.RESTARTING, "worker_died")  # Ray Train restarts: the same attempt
        assert job.attempt == 1
        set_job_state(session, job, JobState.RESTARTING, "driver_lost", new_attempt=True)  # implies again
        assert job.attempt == 2
        with pytest.raises(ValueError, match="only a move to RESTARTING"):
            set_job_state(session, job, JobState.RUNNING, "resumed", new_attempt=True)
        assert job.state == JobState.RESTARTING and job.attempt == 2  # nothing changed
    with sessions() as session:
        rows = [(e.from_state, e.to_state, e.reason, e.attempt) for e in jobs_repo.list_events(session, job_id)]
    # Admission's row carries the attempt it starts; the restart's row the attempt that was lost.
    assert rows == [
        (None, JobState.QUEUED, "submitted", 0),
        (JobState.QUEUED, JobState.STARTING, "admitted", 1),
        (JobState.STARTING, JobState.RUNNING, "training_started", 1),
        (JobState.RUNNING, JobState.RESTARTING, "worker_died", 1),
        (JobState.RESTARTING, JobState.RESTARTING, "driver_lost", 1),
    ]


def test_a_preemption_request_and_a_revoked_driver_are_history_rows_but_not_transitions(sessions):
    job_id = new_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        set_job_state(session, job, JobState.STARTING, "admitted")
        set_job_state(session, job, JobState.RUNNING, "training_started")
        issue_driver_claim(job, "claim-hash")
        issue_driver_token(job, "token-hash", "nonce-hash")
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert mark_preempted(session, job, "job 1f2e", "priority")
        assert not mark_preempted(session, job, "job 9a9a", "priority")  # asked once: no second row
        assert job.preempt_by == "job 1f2e (priority)" and job.preempt_requested_at is not None
        assert (job.state, job.reason) == (JobState.RUNNING, PREEMPTING)
    with sessions.begin() as session:
        assert revoke_driver_tokens(session, "the Ray head was lost") == 1
        job = lock_job(session, job_id)
        assert (job.token_hash, job.claim_hash, job.reason) == ("", "", "driver_revoked")
    with sessions() as session:
        rows = [(e.from_state, e.to_state, e.reason, e.message) for e in jobs_repo.list_events(session, job_id)]
        # The reconciler's clocks ("how long STARTING", "heard from since") read the last transition.
        assert jobs_repo.last_transition(session, job_id).reason == "training_started"
    assert rows[-2:] == [
        (
            JobState.RUNNING,
            JobState.RUNNING,
            PREEMPTING,
            "preempted by job 1f2e (priority): asked to checkpoint now and stop",
        ),
        (JobState.RUNNING, JobState.RUNNING, "driver_revoked", "the Ray head was lost: its driver's token is revoked"),
    ]


def test_a_trial_has_a_history_from_its_creation_to_its_end(sessions):
    spec = SweepSpec.model_validate(
        {
            "base": {"workload": "digits", "epochs": 2, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}},
            "search_space": {"lr.base": {"type": "loguniform", "low": 1e-3, "high": 0.3}},
        }
    )
    with sessions.begin() as session:
        sweep_id = sweeps_repo.create_sweep(session, projects_repo.ensure_default_project(session).id, spec).id
    with sessions.begin() as session:
        sweep = lock_sweep(session, sweep_id)
        set_sweep_state(session, sweep, JobState.STARTING, "admitted")
        set_sweep_state(session, sweep, JobState.RUNNING, "started")
        done = sweeps_repo.add_trial(session, sweep_id, "exp_00000", {"lr.base": 0.01})
        open_ = sweeps_repo.add_trial(session, sweep_id, "exp_00001", {"lr.base": 0.1})
        done_id, open_id = done.id, open_.id
        assert set_trial_state(session, done, TrialState.RUNNING, "started")
        assert set_trial_state(session, done, TrialState.RUNNING, "started") is False  # a repeat: no row
        assert set_trial_state(session, done, TrialState.SUCCEEDED, "completed", "every epoch")
        with pytest.raises(IllegalTransition, match=f"trial {done_id} cannot go from SUCCEEDED to RUNNING"):
            set_trial_state(session, done, TrialState.RUNNING, "late")
        assert done.started_at is not None and done.finished_at >= done.started_at
    with sessions.begin() as session:  # the sweep ends, and takes its open trial with it
        sweep = lock_sweep(session, sweep_id)
        set_sweep_state(session, sweep, JobState.CANCELLING, "cancel_requested")
        set_sweep_state(session, sweep, JobState.CANCELLED, "cancelled")
    with sessions() as session:
        history = {
            trial_id: [(e.from_state, e.to_state, e.reason, e.message, e.attempt) for e in rows]
            for trial_id in (done_id, open_id)
            for rows in [sweeps_repo.list_trial_events(session, trial_id)]
        }
        page, cursor = sweeps_repo.page_trial_events(session, done_id, None, 2)
        rest, end = sweeps_repo.page_trial_events(session, done_id, cursor, 2)
    assert history[done_id] == [
        (None, TrialState.PENDING, "created", "", 1),
        (TrialState.PENDING, TrialState.RUNNING, "started", "", 1),
        (TrialState.RUNNING, TrialState.SUCCEEDED, "completed", "every epoch", 1),
    ]
    assert history[open_id] == [
        (None, TrialState.PENDING, "created", "", 1),
        (TrialState.PENDING, TrialState.CANCELLED, "sweep_ended", "the sweep ended CANCELLED (cancelled)", 1),
    ]
    assert [e.to_state for e in [*page, *rest]] == [TrialState.PENDING, TrialState.RUNNING, TrialState.SUCCEEDED]
    assert end is None


def test_the_version_pointers_follow_the_deployments_state(sessions):
    D = DeploymentState

    def new_version(session, deployment):
        deployments_repo.add_version(
            session,
            deployment,
            checkpoint_id=None,
            checkpoint_path="/nowhere",
            job_id=None,
            checkpoint={},
            config={},
            source={},
            settings={},
        )

    with sessions.begin() as session:
        project = projects_repo.ensure_default_project(session)
        deployment = deployments_repo.create_deployment(session, project.id, "d", "digits", "/d")
        new_version(session, deployment)
        record_deployment_created(session, deployment, "version 1 from somewhere")
        assert deployment.message == "deploying version 1 from somewhere"
        assert deployment.rollout_started_at == deployment.created_at
        deployment_id = deployment.id
    with sessions.begin() as session:
        deployment = lock_deployment(session, deployment_id)
        set_deployment_state(session, deployment, D.HEALTHY, "deployed")  # promoted
        assert (deployment.live_version, deployment.failed_version, deployment.rollout_started_at) == (1, None, None)
        new_version(session, deployment)
        set_deployment_state(session, deployment, D.UPDATING, "new_version", again=True)
        assert deployment.rollout_started_at is not None
        set_deployment_state(session, deployment, D.UNHEALTHY, "rollout_timeout")  # not promoted: version 1 serves
        assert (deployment.live_version, deployment.failed_version) == (1, 2)
        new_version(session, deployment)
        set_deployment_state(session, deployment, D.UPDATING, "rollback", again=True)  # a new target
        assert (deployment.live_version, deployment.failed_version) == (1, None)
        set_deployment_state(session, deployment, D.HEALTHY, "updated")
        assert (deployment.live_version, deployment.failed_version) == (3, None)
        set_deployment_state(session, deployment, D.UNHEALTHY, "app_missing")  # Serve trouble: no version failed
        set_deployment_state(session, deployment, D.HEALTHY, "recovered")
        assert (deployment.live_version, deployment.failed_version) == (3, None)
        set_deployment_state(session, deployment, D.DELETED, "deleted")
        assert deployment.deleted_at is not None and deployment.updated_at == deployment.deleted_at
    with sessions() as session:
        rows = [(e.from_state, e.to_state, e.version) for e in deployments_repo.list_events(session, deployment_id)]
    assert rows[0] == (None, D.DEPLOYING, 1) and rows[-1] == (D.HEALTHY, D.DELETED, 3) and len(rows) == 9
