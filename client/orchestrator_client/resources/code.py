"""Code packages: ``client.code.upload(path)`` (a directory packed, or a .zip/.tar.gz sent as is), ``get``,
``list``. A job runs one by naming it in its spec: ``{"code": {"id": uploaded.id}, ...}``."""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from orchestrator_client.packing import PackError, pack_directory
from orchestrator_client.paging import Pager
from orchestrator_client.transport import Transport
from orchestrator_contract.rest import CodePackageOut, CodeUploaded

ARCHIVE_TYPES = {".zip": "application/zip", ".tar.gz": "application/gzip", ".tgz": "application/gzip"}


def _archive_type(path: Path) -> str | None:
    name = path.name.lower()
    return next((kind for suffix, kind in ARCHIVE_TYPES.items() if name.endswith(suffix)), None)


class CodePackages:
    """``client.code``."""

    def __init__(self, transport: Transport) -> None:
        self._http = transport

    def upload(self, path: str | Path, project_id: str | None = None) -> CodeUploaded:
        """Upload ``path``: a directory is packed (``.gitignore`` and ``.orchignore`` honoured, ``.git/`` left
        out: ``orchestrator_client.packing``); a ``.zip`` or ``.tar.gz`` file is sent as it is. The same bytes
        twice give the same id (the server stores them once), so an upload is retried like a GET."""
        path = Path(path)
        if path.is_dir():
            packed = pack_directory(path)
            with packed.file:
                return self._send(packed.file, f"{path.resolve().name or 'code'}.zip", "application/zip", project_id)
        kind = _archive_type(path)
        if kind is None:
            raise PackError(f"{path}: upload a directory, a .zip or a .tar.gz")
        with open(path, "rb") as archive:
            return self._send(archive, path.name, kind, project_id)

    def _send(self, data: IO[bytes], name: str, kind: str, project_id: str | None) -> CodeUploaded:
        def files() -> dict[str, Any]:
            data.seek(0)  # every try sends the whole file
            return {"file": (name, data, kind)}

        response = self._http.request(
            "POST", "/v1/code", files=files, params={"project_id": project_id}, idempotent=True
        )
        return CodeUploaded.model_validate(response.json())

    def get(self, package_id: str, project_id: str | None = None) -> CodePackageOut:
        """A package with its file list (paths and sizes)."""
        response = self._http.request("GET", f"/v1/code/{package_id}", params={"project_id": project_id})
        return CodePackageOut.model_validate(response.json())

    def list(
        self, project_id: str | None = None, limit: int | None = None, page_size: int | None = None
    ) -> Pager[CodePackageOut]:
        """The project's packages, newest first (without file lists)."""
        return Pager(
            self._http,
            "/v1/code",
            CodePackageOut.model_validate,
            params={"project_id": project_id},
            limit=limit,
            page_size=page_size,
        )
