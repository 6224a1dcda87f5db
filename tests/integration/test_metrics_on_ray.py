"""GET /metrics scraped before and after one real job on the session's Ray cluster: every counter moved by
exactly what that job did (the unit tests do the same over a fake cluster, tests/unit/test_metrics.py)."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import TERMINAL

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset], float]


def scrape(admin) -> Samples:
    response = admin.http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_a_real_job_moves_the_counters_by_what_it_did(admin, member):
    before = scrape(admin)
    response = member.submit(name="metrics-probe", epochs=1, scaling={"num_workers": 2, "cpus_per_worker": 0.5})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    polls = 0  # GET /v1/jobs/{job_id}, counted here so the route's counter can be checked exactly
    deadline = time.monotonic() + 300
    while True:
        job = member.job(job_id)
        polls += 1
        if job["state"] in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert job["state"] == "SUCCEEDED", f"{job['state']} ({job['reason']}): {job['message'][-2000:]}"
    after = scrape(admin)

    assert moved(before, after, "orchestrator_jobs_submitted_total") == 1
    assert moved(before, after, "orchestrator_jobs_finished_total", state="SUCCEEDED") == 1
    assert moved(before, after, "orchestrator_jobs_finished_total", state="FAILED") == 0
    assert moved(before, after, "orchestrator_job_queue_wait_seconds_count") == 1
    assert moved(before, after, "orchestrator_job_run_duration_seconds_count", state="SUCCEEDED") == 1
    ran = moved(before, after, "orchestrator_job_run_duration_seconds_sum", state="SUCCEEDED")
    assert 0 < ran < 300, ran
    assert moved(before, after, "orchestrator_jobs", state="SUCCEEDED") == 1  # the database's gauge
    assert moved(before, after, "orchestrator_ray_api_calls_total", method="submit", outcome="ok") == 1
    # HTTP by route template: the one submit, this test's polls, the driver's event batches (at least its
    # running and succeeded), and never a job's id as a label.
    http = "orchestrator_http_requests_total"
    assert moved(before, after, http, method="POST", route="/v1/jobs", status="2xx") == 1
    assert moved(before, after, http, method="GET", route="/v1/jobs/{job_id}", status="2xx") == polls
    assert moved(before, after, http, method="POST", route="/internal/v1/jobs/{job_id}/events", status="2xx") >= 2
    assert moved(before, after, http, method="GET", route="/metrics", status="2xx") == 1  # the first scrape
    assert (
        moved(before, after, "orchestrator_http_request_duration_seconds_count", method="POST", route="/v1/jobs") == 1
    )
    assert not any(job_id in str(labels) for _, labels in after)
