"""Plain HTTP to a Ray dashboard with token auth (no ray import: usable before Ray is configured).

Ray reads RAY_AUTH_MODE once, when it is imported, so the control plane does not rely on Ray's own
token loading: it sends the token itself, as an Authorization header.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def token_from_environment() -> str | None:
    """The token for a cluster named by RAY_ADDRESS, looked up the way Ray's own CLI does."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text().strip()
    return None


def token_ref_from_environment() -> str | None:
    """Where ``token_from_environment`` found the token, as a cluster's ``token_ref`` (docs/clusters.md)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "env:RAY_AUTH_TOKEN"
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if candidate and Path(candidate).is_file():
            return f"file:{candidate}"
    return None


def alive_nodes(dashboard_url: str, headers: dict[str, str], timeout_s: float = 10) -> list[dict[str, Any]]:
    """The State API's node list, alive nodes only. Raises httpx.HTTPError or KeyError on failure."""
    response = httpx.get(
        f"{dashboard_url.rstrip('/')}/api/v0/nodes",
        params={"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE", "limit": 10_000},
        headers=headers,
        timeout=timeout_s,
    )
    response.raise_for_status()
    return response.json()["data"]["result"]["result"]


def state_list(
    dashboard_url: str,
    headers: dict[str, str],
    resource: str,
    filters: dict[str, str] | None = None,
    detail: bool = False,
    timeout_s: float = 10,
) -> list[dict[str, Any]]:
    """One of the State API's lists (``actors``, ``tasks``, ``placement_groups``, ...), each filter an equality.
    ``detail`` adds the fields Ray leaves out by default (a task's ``required_resources``). Raises
    httpx.HTTPError or KeyError on failure."""
    params: list[tuple[str, str | int]] = [("limit", 10_000)]
    if detail:
        params.append(("detail", "true"))
    for key, value in (filters or {}).items():
        params += [("filter_keys", key), ("filter_predicates", "="), ("filter_values", value)]
    response = httpx.get(
        f"{dashboard_url.rstrip('/')}/api/v0/{resource}", params=params, headers=headers, timeout=timeout_s
    )
    response.raise_for_status()
    return response.json()["data"]["result"]["result"]


def train_worker_nodes(dashboard_url: str, headers: dict[str, str], ray_job_id: str, timeout_s: float = 10) -> set[str]:
    """The node ids of the live ``RayTrainWorker`` actors of one Ray job (the State API's actor list). Raises
    httpx.HTTPError or KeyError on failure."""
    filters = {"job_id": ray_job_id, "class_name": "RayTrainWorker", "state": "ALIVE"}
    actors = state_list(dashboard_url, headers, "actors", filters, timeout_s=timeout_s)
    return {str(actor["node_id"]) for actor in actors if actor.get("node_id")}


def list_jobs(dashboard_url: str, headers: dict[str, str], timeout_s: float = 30) -> list[dict[str, Any]]:
    """Every job Ray knows (``GET /api/jobs/``: submissions and drivers that connected themselves, finished ones
    too). Raises httpx.HTTPError, or ValueError for a body that is not a list."""
    response = httpx.get(f"{dashboard_url.rstrip('/')}/api/jobs/", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    body = response.json()
    if not isinstance(body, list):
        raise ValueError(f"not a job list: {response.text[:200]}")
    return body


class JobNotFound(Exception):
    """Ray's dashboard answered that it has no record of the job (its own 404, not any 404)."""


def _job_answer(response: httpx.Response, submission_id: str) -> httpx.Response:
    """``response`` when it is a 2xx; JobNotFound for Ray's own answer about an unknown job (``job_head.py``:
    404 with "Job <id> does not exist"); httpx.HTTPStatusError for anything else. Classified by the status,
    never by the text alone: job ids are random hex and may hold "404" (0.7 % of them), and errors name them."""
    if response.status_code == 404 and response.text.strip() == f"Job {submission_id} does not exist":
        raise JobNotFound(submission_id)
    response.raise_for_status()
    return response


def job_url(dashboard_url: str, submission_id: str, route: str = "") -> str:
    if not submission_id or "/" in submission_id:
        raise ValueError(f"not a submission id: {submission_id!r}")
    return f"{dashboard_url.rstrip('/')}/api/jobs/{submission_id}{route}"


def job_details(dashboard_url: str, headers: dict[str, str], submission_id: str, timeout_s: float = 30) -> dict:
    """Ray's JobDetails of a submission (``GET /api/jobs/{id}``: status, message, driver_exit_code, ...).
    Raises JobNotFound, httpx.HTTPError, or ValueError for a body that is not one."""
    response = httpx.get(job_url(dashboard_url, submission_id), headers=headers, timeout=timeout_s)
    body = _job_answer(response, submission_id).json()
    if not isinstance(body, dict) or not isinstance(body.get("status"), str):
        raise ValueError(f"not a JobDetails: {response.text[:200]}")
    return body


def job_logs(dashboard_url: str, headers: dict[str, str], submission_id: str, timeout_s: float = 60) -> str:
    """The driver's whole output (``GET /api/jobs/{id}/logs``). Raises JobNotFound, httpx.HTTPError, or
    ValueError for a body that is not Ray's."""
    response = httpx.get(job_url(dashboard_url, submission_id, "/logs"), headers=headers, timeout=timeout_s)
    logs = _job_answer(response, submission_id).json().get("logs")
    if not isinstance(logs, str):
        raise ValueError(f"not a JobLogsResponse: {response.text[:200]}")
    return logs


def delete_job(dashboard_url: str, headers: dict[str, str], submission_id: str, timeout_s: float = 30) -> None:
    """Delete Ray's record of an ended submission (``DELETE /api/jobs/{id}``), which frees its id. Raises
    JobNotFound or httpx.HTTPError (Ray refuses to delete a job that has not ended)."""
    _job_answer(httpx.delete(job_url(dashboard_url, submission_id), headers=headers, timeout=timeout_s), submission_id)


def stop_job(dashboard_url: str, headers: dict[str, str], submission_id: str, timeout_s: float = 30) -> None:
    """Ask Ray to stop a submission (``POST /api/jobs/{id}/stop``; one that has ended already is fine).
    Raises JobNotFound or httpx.HTTPError."""
    _job_answer(
        httpx.post(job_url(dashboard_url, submission_id, "/stop"), headers=headers, timeout=timeout_s), submission_id
    )


SERVE_APPLICATIONS = "/api/serve/applications/"


def serve_applications(dashboard_url: str, headers: dict[str, str], timeout_s: float = 30) -> dict[str, Any]:
    """Serve's instance details (``ServeInstanceDetails``); ``applications`` is empty when Serve isn't
    running. Raises httpx.HTTPError on failure."""
    response = httpx.get(f"{dashboard_url.rstrip('/')}{SERVE_APPLICATIONS}", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    return response.json()


def put_serve_applications(
    dashboard_url: str, headers: dict[str, str], config: dict[str, Any], timeout_s: float = 120
) -> httpx.Response:
    """Declare Serve's whole set of applications (``ServeDeploySchema``). The first call starts Serve's
    controller and proxies, which takes seconds. Returns the response (400: Serve refused the config)."""
    return httpx.put(
        f"{dashboard_url.rstrip('/')}{SERVE_APPLICATIONS}", json=config, headers=headers, timeout=timeout_s
    )


def package_url(dashboard_url: str, uri: str) -> str:
    """Ray's package store through the dashboard: ``gcs://<name>`` is ``/api/packages/gcs/<name>``, the
    route Ray's own JobSubmissionClient uploads a working_dir through."""
    protocol, separator, name = uri.partition("://")
    if not separator or protocol != "gcs" or "/" in name:
        raise ValueError(f"not a Ray package URI: {uri}")
    return f"{dashboard_url.rstrip('/')}/api/packages/{protocol}/{name}"


def package_exists(dashboard_url: str, headers: dict[str, str], uri: str, timeout_s: float = 30) -> bool:
    """Whether Ray's store holds the package (asking also pins it there for a while, as Ray's client relies
    on). Raises httpx.HTTPError on failure."""
    response = httpx.get(package_url(dashboard_url, uri), headers=headers, timeout=timeout_s)
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


def put_package(
    dashboard_url: str, headers: dict[str, str], uri: str, chunks: Iterator[bytes], size: int, timeout_s: float = 600
) -> None:
    """Upload a zip into Ray's store, streamed in ``chunks`` (``size`` bytes in all). Raises httpx.HTTPError."""
    response = httpx.put(
        package_url(dashboard_url, uri),
        content=chunks,
        headers={**headers, "Content-Length": str(size), "Content-Type": "application/octet-stream"},
        timeout=timeout_s,
    )
    response.raise_for_status()
