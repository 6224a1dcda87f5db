"""The deployment pages: ``/ui/deployments`` (a list, paged, filters in the URL) and ``/ui/deployments/{name or
id}`` (its versions with their source checkpoint, its state history, its replicas, a rollback button for members,
and a "try it" form), and the JSON they poll and post to (``/ui/api/deployments...``).

Lookups are the REST API's (``deployments_repo.get_by_name`` with the user's scope; an id, checked against the
same scope): another project's deployment is a 404 and a list shows nothing of it.

"Try it" goes through the control plane (the browser may not reach Serve, and Serve answers no CORS): the
control plane sends the request to the deployment's URL and hands back the answer as it came, status and body.
A deployment with ``auth: project`` needs a key of its project: the session holds no key (only its id), so the
form asks for one, sends it to the deployment only, and keeps it nowhere."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from api.deps import ControlPlaneDep, SessionDep
from api.ui.auth import CsrfUser, UiMember, UiUser, UiUserDep
from api.ui.jobs import Cursor, Limit
from api.ui.list_query import list_query
from api.ui.live import json_answer
from api.ui.templating import render
from api.views import deployment_out
from orchestrator.db.models import Deployment, DeploymentState
from orchestrator.errors import Conflict, Invalid, NotFound, TooMany
from orchestrator.repositories import deployments as deployments_repo
from orchestrator.use_cases.deployments import rollback_deployment
from orchestrator_contract import workloads

router = APIRouter()
api_router = APIRouter(prefix="/api")

PAGE_SIZES = (25, 50, 100, 200)
EVENTS_SHOWN = 200  # the newest state changes on the page
TRY_TIMEOUT_S = 30.0
TRY_ANSWER_CHARS = 64 * 1024  # of a deployment's answer, shown; the rest is cut (said so)
# "Try it" holds a worker thread while the deployment answers (up to TRY_TIMEOUT_S): bounded per signed-in key
# and for the whole process, so nobody can tie up the API's thread pool with slow deployments.
TRY_PER_USER = 2
TRY_IN_ALL = 8

StateFilter = Annotated[
    list[DeploymentState] | None, Query(description="Repeat to match any of several; default: all but DELETED.")
]


def deployment_or_404(session: Session, ref: str, user: UiUser) -> Deployment:
    """By name (the live one, else the newest deleted: the REST API's lookup), else by id; in the user's scope."""
    deployment = deployments_repo.get_by_name(session, ref, user.scope)
    if deployment is None:
        by_id = session.get(Deployment, ref)
        if by_id is not None and (user.scope is None or by_id.project_id == user.scope):
            deployment = by_id
    if deployment is None:
        raise NotFound(f"no deployment {ref}")
    return deployment


def deployment_row(deployment: Deployment, serve_urls: Mapping[str | None, str]) -> dict[str, Any]:
    out = deployment_out(deployment, serve_urls)
    return {
        "id": out.id,
        "project_id": out.project_id,
        "name": out.name,
        "workload": out.workload,
        "state": out.state.value,
        "reason": out.reason,
        "message": out.message,
        "url": out.url,
        "version": out.version,
        "serving_version": out.serving_version,
        "replicas_running": sum(1 for r in out.replicas if r.state == "RUNNING"),
        "replicas": len(out.replicas),
        "created_at": out.created_at.isoformat(),
    }


def version_view(version: dict[str, Any]) -> dict[str, Any]:
    """A version as the page shows it: where its checkpoint came from (a job, or a sweep's trial) and a link."""
    checkpoint = version.get("checkpoint") or {}
    if checkpoint.get("trial_id"):
        origin = {
            "kind": "trial",
            "label": f"trial {checkpoint['trial_id']}",
            "href": f"/ui/sweeps/{checkpoint.get('sweep_id', '')}",
        }
    elif version.get("job_id"):
        origin = {"kind": "job", "label": f"job {version['job_id']}", "href": f"/ui/jobs/{version['job_id']}"}
    else:
        origin = {"kind": "checkpoint", "label": "checkpoint (its job is gone)", "href": None}
    settings = version.get("settings") or {}
    replicas = settings.get("replicas")
    return {
        **version,
        "origin": origin,
        "epoch": checkpoint.get("epoch"),
        "step": checkpoint.get("step"),
        "metrics": checkpoint.get("metrics") or {},
        "replicas_text": (
            f"{replicas['min']}-{replicas['max']} (autoscaling)" if isinstance(replicas, dict) else str(replicas)
        ),
    }


def deployment_detail(session: Session, deployment: Deployment, serve_urls: Mapping[str | None, str]) -> dict[str, Any]:
    """What the deployment page shows and polls: the REST ``DeploymentOut`` (JSON), its versions newest first
    with where each came from, and the newest state changes."""
    out = deployment_out(deployment, serve_urls).model_dump(mode="json")
    events = deployments_repo.list_events(session, deployment.id)[-EVENTS_SHOWN:]
    return {
        "deployment": out,
        "versions": [version_view(v) for v in reversed(out["versions"])],
        "events": [
            {
                "from_state": e.from_state.value if e.from_state else None,
                "to_state": e.to_state.value,
                "reason": e.reason,
                "message": e.message,
                "version": e.version,
                "created_at": e.created_at.isoformat(),
            }
            for e in reversed(events)
        ],
        "can_roll_back": deployment.state != DeploymentState.DELETED and deployment.version >= 2,
        "deleted": deployment.state == DeploymentState.DELETED,
    }


def list_page(session, service, user, state, cursor, limit) -> tuple[list[dict], str | None]:
    """One page of the deployments list: the REST list's query in the user's scope."""
    rows, next_cursor = deployments_repo.list_deployments(session, user.scope, state, cursor, limit)
    urls = service.serve_urls(session)
    return [deployment_row(d, urls) for d in rows], next_cursor


# --- pages --------------------------------------------------------------------------------------------------


@router.get("/deployments")
def deployments_page(
    request: Request,
    session: SessionDep,
    service: ControlPlaneDep,
    user: UiUserDep,
    state: StateFilter = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Response:
    rows, next_cursor = list_page(session, service, user, state, cursor, limit)
    return render(
        request,
        "deployments.html",
        user,
        session=session,
        rows=rows,
        states=list(DeploymentState),
        chosen_states={s.value for s in state or []},
        limit=limit,
        page_sizes=PAGE_SIZES,
        first_page=cursor is None,
        next_url=f"/ui/deployments?{list_query(state, limit, next_cursor)}" if next_cursor else None,
        first_url=f"/ui/deployments?{list_query(state, limit)}",
        live_url=f"/ui/api/deployments?{list_query(state, limit, cursor)}",
    )


@router.get("/deployments/{ref}")
def deployment_page(
    request: Request, ref: str, session: SessionDep, service: ControlPlaneDep, user: UiUserDep
) -> Response:
    deployment = deployment_or_404(session, ref, user)
    detail = deployment_detail(session, deployment, service.serve_urls(session))
    descriptor = workloads.describe(deployment.workload)  # a body to start from: its workload's example
    example = dict(descriptor.example_request) if descriptor and descriptor.example_request else None
    return render(
        request,
        "deployment.html",
        user,
        session=session,
        d=detail["deployment"],
        versions=detail["versions"],
        events=detail["events"],
        can_roll_back=detail["can_roll_back"],
        deleted=detail["deleted"],
        example=json.dumps(example) if example is not None else "{}",
        page={"id": deployment.id, "name": deployment.name, "can_write": user.can_write},
    )


@router.post("/deployments/{ref}/rollback")
def rollback(ref: str, session: SessionDep, user: UiMember) -> Response:
    """The REST rollback (``rollback_deployment``): back to the version before the newest, as a new version.
    409 (on the page) when there is nothing to roll back to."""
    deployment = rollback_deployment(session, user.scope, deployment_or_404(session, ref, user).name)
    session.commit()
    return RedirectResponse(f"/ui/deployments/{deployment.name}", status_code=303)


# --- JSON -----------------------------------------------------------------------------------------------------


@api_router.get("/deployments")
def deployments_json(
    request: Request,
    session: SessionDep,
    service: ControlPlaneDep,
    user: UiUserDep,
    state: StateFilter = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> Response:
    rows, next_cursor = list_page(session, service, user, state, cursor, limit)
    return json_answer(request, {"items": rows, "next_cursor": next_cursor})


@api_router.get("/deployments/{ref}")
def deployment_json(
    request: Request, ref: str, session: SessionDep, service: ControlPlaneDep, user: UiUserDep
) -> Response:
    deployment = deployment_or_404(session, ref, user)
    return json_answer(request, deployment_detail(session, deployment, service.serve_urls(session)))


class TryRequest(BaseModel):
    """What the "try it" form sends: the method, the body (JSON text) and, for ``auth: project``, a key."""

    method: Literal["POST", "GET"] = "POST"
    body: str = Field("", max_length=4 * 1024 * 1024)
    key: str | None = Field(None, max_length=512, description="A key of the deployment's project; kept nowhere.")


_in_flight: Counter[str] = Counter()
_in_flight_lock = threading.Lock()


@contextmanager
def _try_slot(user: UiUser):
    """One of the bounded "try it" slots, or 429 saying which bound."""
    who = user.principal.key_id or "admin-token"
    with _in_flight_lock:
        if _in_flight[who] >= TRY_PER_USER:
            raise TooMany(f"at most {TRY_PER_USER} try-it requests of one key at once: wait for the answers")
        if sum(_in_flight.values()) >= TRY_IN_ALL:
            raise TooMany(f"at most {TRY_IN_ALL} try-it requests at once on this control plane: try again shortly")
        _in_flight[who] += 1
    try:
        yield
    finally:
        with _in_flight_lock:
            _in_flight[who] -= 1
            if not _in_flight[who]:
                del _in_flight[who]


@api_router.post("/deployments/{ref}/try")
def try_it(ref: str, request_body: TryRequest, service: ControlPlaneDep, user: CsrfUser) -> Response:
    """Send one request to the deployment's URL and answer what came back: ``status`` (the deployment's),
    ``answer`` (its JSON, else its text), ``elapsed_ms``. A deployment that cannot be reached is a 502 that
    says where it was sent and what failed. Any signed-in user of the project may (it changes nothing: a
    viewer's key calls the deployment as well), with the CSRF token (it is a POST)."""
    with service.sessions() as session:  # released before the deployment is called
        deployment = deployment_or_404(session, ref, user)
        out = deployment_out(deployment, service.serve_urls(session))
    if out.state == DeploymentState.DELETED:
        raise Conflict(f"deployment {out.name} was deleted: its route answers nothing")
    payload = None
    if request_body.method == "POST":
        try:
            payload = json.loads(request_body.body or "null")
        except ValueError as error:
            raise Invalid(f"the body is not JSON: {error}") from None
        if len(request_body.body.encode()) > out.max_body_mb * 1024 * 1024:
            raise Invalid(f"the body is over the deployment's max_body_mb ({out.max_body_mb:g} MB)")
    headers = {"Authorization": f"Bearer {request_body.key.strip()}"} if (request_body.key or "").strip() else {}
    started = time.monotonic()
    try:
        with (
            _try_slot(user),
            httpx.stream(
                request_body.method,
                out.url,
                json=payload if request_body.method == "POST" else None,
                headers=headers,
                timeout=TRY_TIMEOUT_S,
                follow_redirects=False,
            ) as answer,
        ):
            # Read no more than is shown (4 bytes a character at most, and one over to know it was cut):
            # a model's answer of any size must not be held whole in the control plane.
            raw = bytearray()
            for chunk in answer.iter_bytes():
                raw += chunk
                if len(raw) > 4 * TRY_ANSWER_CHARS:
                    break
    except httpx.TimeoutException:
        return JSONResponse(
            {"detail": f"the deployment at {out.url} did not answer within {TRY_TIMEOUT_S:g} s", "url": out.url},
            status_code=504,
        )
    except httpx.HTTPError as error:
        return JSONResponse(
            {"detail": f"could not reach the deployment at {out.url}: {error or type(error).__name__}", "url": out.url},
            status_code=502,
        )
    elapsed_ms = round((time.monotonic() - started) * 1000, 1)
    text = raw.decode(answer.encoding or "utf-8", errors="replace")
    truncated = len(text) > TRY_ANSWER_CHARS
    body: Any = text[:TRY_ANSWER_CHARS]
    if not truncated:
        try:
            body = json.loads(text)
        except ValueError:
            pass
    return JSONResponse(
        {
            "url": out.url,
            "method": request_body.method,
            "status": answer.status_code,
            "ok": answer.is_success,
            "elapsed_ms": elapsed_ms,
            "content_type": answer.headers.get("content-type", ""),
            "answer": body,
            "truncated": truncated,
        }
    )
