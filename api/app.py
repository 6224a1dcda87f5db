"""The FastAPI application factory."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from api.auth_first import install_auth_first
from api.body_size import BodySizeLimit
from api.errors import install_error_handler
from api.http_metrics import HttpMetrics
from api.log_context import bind_log_context
from api.openapi import document_error_shapes
from api.request_id import RequestId
from api.routers import (
    clusters,
    code,
    deployments,
    health,
    identity,
    internal,
    jobs,
    metrics,
    plan,
    projects,
    sweeps,
    usage,
)
from api.ui.mount import install_ui
from orchestrator.backend import ClusterBackend
from orchestrator.control_plane import ControlPlane
from orchestrator.log_format import configure_logging
from orchestrator.settings import Settings

DESCRIPTION = """Submit distributed training jobs, hyperparameter sweeps and deployments to Ray over REST.
Authenticate with `Authorization: Bearer <key>`.

**Lists** are paged the same way everywhere: `?limit=` (at most a maximum page size, by default the
maximum unless the route says otherwise) and `?cursor=`; the next page's cursor is the `X-Next-Cursor`
response header, absent on the last page (`GET /v1/jobs` also has it in its body as `next_cursor`).

**Errors** answer `{"detail": ...}`: one message (`ErrorMessage`), or for a 422 about a field the list of
field errors FastAPI's request validation gives (`loc` names the field). The request and response models
are the `orchestrator_contract` package's: clients import them rather than copy them."""

MULTIPART_FRAMING_MB = 1 / 16  # a multipart body's boundaries and part headers, around the file's bytes


def serve_app() -> FastAPI:
    """`orchestrator serve`'s factory, which uvicorn calls in each worker process (ORCHESTRATOR_API_WORKERS):
    that process's logging as configured, then the app."""
    settings = Settings()
    configure_logging(settings.log_format)
    return create_app(settings)


def create_app(
    settings: Settings | None = None, backend: ClusterBackend | None = None, run_loops: bool = True
) -> FastAPI:
    service = ControlPlane(settings or Settings(), backend=backend, run_loops=run_loops)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(
        title="Ray training orchestrator",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # Log records name the job, sweep, trial or deployment a route's path names (api/log_context.py).
        dependencies=[Depends(bind_log_context)],
    )
    app.state.service = service
    settings = service.settings
    app.add_middleware(
        BodySizeLimit,
        max_mb=settings.max_body_mb,
        setting="ORCHESTRATOR_MAX_BODY_MB",
        larger={
            "/internal/": (settings.max_internal_body_mb, "ORCHESTRATOR_MAX_INTERNAL_BODY_MB"),
            # An upload: the package's cap, plus room for the multipart form's own framing (the file's own
            # bytes are held to the cap itself by orchestrator.services.code).
            "/v1/code": (
                settings.code_max_mb + MULTIPART_FRAMING_MB,
                "ORCHESTRATOR_CODE_MAX_MB plus 64 KB of form framing",
            ),
        },
    )
    # Outside the body cap, so its 413s count too; inside the request id, which answers an escaped error's 500.
    app.add_middleware(HttpMetrics, metrics=service.metrics)
    # Added last, so outermost: every answer carries X-Request-ID, the body-size middleware's 413 included.
    app.add_middleware(RequestId)
    for router in (
        health.router,
        identity.router,
        projects.router,
        clusters.router,
        jobs.router,
        code.router,
        sweeps.router,
        sweeps.trials_router,
        deployments.router,
        plan.router,
        usage.router,
        internal.router,
        internal.sweeps_router,
    ):
        app.include_router(router)
    if settings.metrics != "off":  # off: no such route, a 404 like any unknown path
        app.include_router(metrics.router)

    install_error_handler(app)  # every domain error (orchestrator.errors) -> its status, in one table
    install_ui(app)  # the dashboard under /ui (after the error handler: its pages answer errors in HTML)
    install_auth_first(app)  # a request's caller is checked before its body or parameters are refused (422)
    document_error_shapes(app)
    return app
