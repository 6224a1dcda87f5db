"""Users' code packages: upload (multipart), read, list. Always within the caller's project."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from api.deps import ControlPlaneDep, CurrentKey, SessionDep, WriterKey
from api.paging import Page
from orchestrator.db.models import CodePackage
from orchestrator.errors import Invalid, NotFound
from orchestrator.repositories import code as code_repo
from orchestrator.services.code import UploadSlots, store_upload
from orchestrator.use_cases.projects import target_project
from orchestrator_contract.rest import CodeFileOut, CodePackageOut, CodeUploaded, Paged

router = APIRouter(prefix="/v1/code", tags=["code"])

ProjectQuery = Annotated[str | None, Query(description="Cluster-wide admins only: the project (default: 'default').")]
UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {"file": {"type": "string", "format": "binary", "description": ".zip or .tar.gz"}},
            }
        }
    },
}


def _upload_slots(request: Request, limit: int) -> UploadSlots:
    """This app's slots (made at its first upload: the event loop's thread, so no two are made)."""
    slots = getattr(request.app.state, "code_upload_slots", None)
    if slots is None:
        slots = request.app.state.code_upload_slots = UploadSlots(limit)
    return slots


def _out(package: CodePackage, with_files: bool = False) -> CodePackageOut:
    return CodePackageOut(
        id=code_repo.api_id(package.sha256),
        project_id=package.project_id,
        size=package.size,
        files=package.file_count,
        created_at=package.created_at,
        last_used_at=package.last_used_at,
        file_list=[CodeFileOut(**f) for f in package.files] if with_files else None,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Upload a code package",
    openapi_extra={"requestBody": UPLOAD_BODY},
    responses={200: {"model": CodeUploaded, "description": "The project already had these bytes"}},
)
async def upload_code(
    request: Request,
    service: ControlPlaneDep,
    principal: WriterKey,
    response: Response,
    project_id: ProjectQuery = None,
) -> CodeUploaded:
    """A `.zip` or `.tar.gz` of a directory in the multipart form field `file` (at most ORCHESTRATOR_CODE_MAX_MB:
    413 past it, ORCHESTRATOR_CODE_MAX_FILES files, twice as many entries of any kind,
    ORCHESTRATOR_CODE_MAX_UNPACKED_MB unpacked). Every entry is checked before anything is stored: an absolute
    path, `..`, a link, a device file or FIFO, or bytes that are not such an archive are a 422 naming the entry.
    201 with the package's id (`sha256:` of the bytes); the same bytes again in the same project are stored once
    and answer 200 with the same id. More than ORCHESTRATOR_CODE_MAX_CONCURRENT_UPLOADS uploads at once: 429
    with Retry-After."""

    def project() -> str:
        with service.sessions() as session:
            return target_project(session, principal, project_id)

    target = await run_in_threadpool(project)  # 401/403/404 before a byte of the body is read
    with _upload_slots(request, service.settings.code_max_concurrent_uploads).slot():  # 429 past the cap
        async with request.form(max_files=1, max_fields=4) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise Invalid("a .zip or .tar.gz file in the multipart form field 'file' is required", ("file",))
            # In a thread of its own, not one of the pool the sync routes share (anyio's default limiter): a
            # slow archive must not take the drivers' report routes' threads. The slots bound these threads.
            uploaded = await anyio.to_thread.run_sync(
                store_upload,
                service.sessions,
                service.code_storage,
                service.settings,
                target,
                upload.file,
                limiter=anyio.CapacityLimiter(1),
            )
    if not uploaded.created:
        response.status_code = status.HTTP_200_OK
    package = uploaded.package
    return CodeUploaded(id=code_repo.api_id(package.sha256), size=package.size, files=package.file_count)


@router.get("", summary="List code packages")
def list_code(
    session: SessionDep, principal: CurrentKey, page: Page, project_id: ProjectQuery = None
) -> list[CodePackageOut] | Paged[CodePackageOut]:
    """The project's packages, newest first, without their file lists; paged (X-Next-Cursor)."""
    target = target_project(session, principal, project_id)
    return page.answer([_out(p) for p in page.fetch(lambda c, n: code_repo.list_packages(session, target, c, n))])


@router.get("/{package_id}", summary="Get a code package and its files")
def get_code(
    package_id: str, session: SessionDep, principal: CurrentKey, project_id: ProjectQuery = None
) -> CodePackageOut:
    """Its size, dates and files (paths and sizes). Another project's package is 404."""
    target = target_project(session, principal, project_id)
    package = code_repo.get_package(session, target, package_id)
    if package is None:
        raise NotFound(f"no code package {package_id}")
    return _out(package, with_files=True)
