"""A run preempted for another project's run learns only that it was "a run of another project" and why (fair
share, quota), never that run's id or priority; a run of its own project is still named (docs/security.md,
"Preemption between projects").

The victim's owner reads its job over the REST API (the job, the list, its history) and the dashboard (the job's
page and the JSON it polls); the preemptor's owner reads why its run waits. Neither may see the other project's
run ids or priorities. Over the unit-test app (a fake cluster) and the scheduler's and reconciler's ticks, on
SQLite and PostgreSQL.
"""

from __future__ import annotations

from orchestrator.backend import RunStatus
from orchestrator_contract.jobs import DriverExit
from tests.unit.api_helpers import ADMIN, auth, make_project, reconcile, submit, tick
from tests.unit.ui_helpers import signed_in

ONE_CPU = {"num_workers": 1, "cpus_per_worker": 1}


def readable_by(client, key: str, job_id: str) -> list[str]:
    """Everything the key's holder can read about the job: REST (job, list, history) and the dashboard."""
    texts = [
        client.get(f"/v1/jobs/{job_id}", headers=auth(key)).text,
        client.get("/v1/jobs", headers=auth(key)).text,
        client.get(f"/v1/jobs/{job_id}/events", headers=auth(key)).text,
    ]
    signed_in(client, key)
    for page in (f"/ui/jobs/{job_id}", f"/ui/api/jobs/{job_id}"):
        answer = client.get(page)
        assert answer.status_code == 200, (page, answer.text)
        texts.append(answer.text)
    client.cookies.clear()
    return texts


def assert_names_none_of(texts: list[str], secrets: list[str]) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, (secret, text[:2000])


def test_a_run_preempted_for_another_projects_run_learns_neither_its_id_nor_its_priority(app, client, backend):
    """Project b borrows a CPU beyond its 1-CPU quota; project a's priority-7 job wants it back (quota).
    On the old code b's job read ``preempted by job <a's id> (priority 7) (quota): asked to checkpoint now and
    stop`` (the first assertion on its message failed), as later its history and ``last_preempted_by`` did, and
    a's job said "waiting for preempted run(s) to checkpoint and stop: job:<b's id>"."""
    backend.total = {"CPU": 2.0, "GPU": 0.0}
    b_project, b = make_project(client, "b")
    assert client.put(f"/v1/projects/{b_project}/quota", json={"max_cpus": 1}, headers=auth(ADMIN)).is_success
    within = submit(client, b["member"], scaling=ONE_CPU).json()["id"]
    borrowed = submit(client, b["member"], scaling=ONE_CPU).json()["id"]
    tick(app)
    assert client.get(f"/v1/jobs/{borrowed}", headers=auth(ADMIN)).json()["borrowing"] is True
    _, a = make_project(client, "a")
    wants = submit(client, a["member"], scaling=ONE_CPU, priority=7).json()["id"]

    tick(app)  # b's borrowing job is asked to checkpoint and stop
    marked = client.get(f"/v1/jobs/{borrowed}", headers=auth(b["member"])).json()
    assert (marked["state"], marked["reason"]) == ("STARTING", "preempting"), marked
    assert marked["message"] == "preempted by a run of another project (quota): asked to checkpoint now and stop"
    preemptor = client.get(f"/v1/jobs/{wants}", headers=auth(a["member"])).json()
    assert preemptor["reason"] == "preempting"
    assert preemptor["message"] == "waiting for preempted run(s) to checkpoint and stop: a run of another project"
    assert_names_none_of([str(preemptor)], [borrowed, within])

    backend.runs[f"{borrowed}-1"] = RunStatus.FAILED  # its driver checkpointed and exited PREEMPTED
    backend.exit_codes[f"{borrowed}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    requeued = client.get(f"/v1/jobs/{borrowed}", headers=auth(b["member"])).json()
    assert (requeued["state"], requeued["reason"]) == ("QUEUED", "preempted")
    assert requeued["message"].startswith("preempted by a run of another project (quota): checkpointed and stopped")
    assert requeued["last_preempted_by"] == "a run of another project (quota)"
    assert_names_none_of(readable_by(client, b["member"], borrowed), [wants, "priority 7"])

    tick(app)  # a's job starts; b's waits for something else and still says it was preempted
    waiting = client.get(f"/v1/jobs/{borrowed}", headers=auth(b["member"])).json()
    assert waiting["message"].startswith("preempted by a run of another project (quota); now ")
    assert_names_none_of(readable_by(client, b["member"], borrowed), [wants, "priority 7"])
    # The operator still sees who it was: a cluster-wide admin reads a's job, running on the freed CPU.
    assert client.get(f"/v1/jobs/{wants}", headers=auth(ADMIN)).json()["state"] == "STARTING"


def test_a_run_preempted_by_its_own_projects_run_still_names_it(app, client, backend):
    """Within a project the preemptor is named as before: id, priority and cause."""
    backend.total = {"CPU": 1.0, "GPU": 0.0}
    _, keys = make_project(client, "same")
    low = submit(client, keys["member"], scaling=ONE_CPU, priority=0).json()["id"]
    tick(app)
    high = submit(client, keys["member"], scaling=ONE_CPU, priority=10).json()["id"]
    tick(app)
    marked = client.get(f"/v1/jobs/{low}", headers=auth(keys["member"])).json()
    assert marked["message"] == f"preempted by job {high} (priority 10) (priority): asked to checkpoint now and stop"
    waiting = client.get(f"/v1/jobs/{high}", headers=auth(keys["member"])).json()
    assert waiting["message"] == f"waiting for preempted run(s) to checkpoint and stop: job:{low}"
    backend.runs[f"{low}-1"] = RunStatus.FAILED
    backend.exit_codes[f"{low}-1"] = DriverExit.PREEMPTED
    reconcile(app)
    assert client.get(f"/v1/jobs/{low}", headers=auth(keys["member"])).json()["last_preempted_by"] == (
        f"job {high} (priority 10) (priority)"
    )
