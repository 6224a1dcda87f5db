"""The transition rules and the one function that applies them."""

import pytest
from sqlalchemy import select

from orchestrator.db.models import JobEvent, JobState
from orchestrator.repositories import jobs as jobs_repo
from orchestrator.states.core import IllegalTransition
from orchestrator.states.jobs import TERMINAL, is_allowed, lock_job, set_job_state
from tests.unit.api_helpers import new_job

S = JobState

LEGAL = [
    (S.QUEUED, S.STARTING),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.FAILED),
    (S.STARTING, S.RUNNING),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.CANCELLING),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.CANCELLING),
    (S.RUNNING, S.RESTARTING),
    (S.RESTARTING, S.RUNNING),
    (S.RESTARTING, S.RESTARTING),
    (S.STARTING, S.RESTARTING),
    (S.CANCELLING, S.CANCELLED),
    (S.CANCELLING, S.SUCCEEDED),
    # Preempted (docs/scheduling.md, "Preemption"): back to the queue, reason "preempted" only
    # (tests/unit/test_preemption.py).
    (S.STARTING, S.QUEUED),
    (S.RUNNING, S.QUEUED),
    (S.RESTARTING, S.QUEUED),
]
ILLEGAL = [
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.SUCCEEDED),
    (S.QUEUED, S.CANCELLING),
    (S.CANCELLING, S.QUEUED),
    (S.RUNNING, S.STARTING),
    (S.RUNNING, S.CANCELLED),
    (S.CANCELLING, S.FAILED),
    (S.CANCELLING, S.RUNNING),
]


@pytest.mark.parametrize(("src", "dst"), LEGAL)
def test_legal_transitions(src, dst):
    assert is_allowed(src, dst)


@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_illegal_transitions(src, dst):
    assert not is_allowed(src, dst)


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_are_final(terminal):
    assert not any(is_allowed(terminal, other) for other in S if other != terminal)


def test_set_job_state_writes_history_and_timestamps(sessions):
    job_id = new_job(sessions)
    for state, reason in [(S.STARTING, "admitted"), (S.RUNNING, "training_started"), (S.SUCCEEDED, "completed")]:
        with sessions.begin() as session:
            assert set_job_state(session, lock_job(session, job_id), state, reason, f"to {state}")
    with sessions() as session:
        job = lock_job(session, job_id)
        history = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all()
    assert [(e.from_state, e.to_state, e.reason) for e in history] == [
        (None, S.QUEUED, "submitted"),
        (S.QUEUED, S.STARTING, "admitted"),
        (S.STARTING, S.RUNNING, "training_started"),
        (S.RUNNING, S.SUCCEEDED, "completed"),
    ]
    assert job.state == S.SUCCEEDED and job.reason == "completed" and job.message == f"to {S.SUCCEEDED}"
    assert job.started_at is not None and job.finished_at is not None and job.finished_at >= job.started_at


def test_repeat_is_a_noop_and_illegal_changes_nothing(sessions):
    job_id = new_job(sessions)
    with sessions.begin() as session:
        job = lock_job(session, job_id)
        assert set_job_state(session, job, S.QUEUED, "again") is False
        with pytest.raises(IllegalTransition):
            set_job_state(session, job, S.RUNNING, "skipping STARTING")
    with sessions() as session:
        assert lock_job(session, job_id).state == S.QUEUED
        assert len(jobs_repo.list_events(session, job_id)) == 1
