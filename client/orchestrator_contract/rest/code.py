"""What ``/v1/code`` answers: a code package's id, size and files (the upload is a multipart file)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class CodeFileOut(BaseModel):
    path: str = Field(description="Relative to the package's root ('/'-separated).")
    size: int = Field(description="Bytes.")


class CodeUploaded(BaseModel):
    """``POST /v1/code``'s answer."""

    id: str = Field(description="sha256:<hex of the uploaded bytes>: what a job spec's code.id names.")
    size: int = Field(description="Bytes uploaded.")
    files: int = Field(description="Files in the package.")


class CodePackageOut(BaseModel):
    """A package (``GET /v1/code/{id}``; without ``file_list`` in ``GET /v1/code``)."""

    id: str = Field(description="sha256:<hex of the uploaded bytes>.")
    project_id: str = Field(description="The project it belongs to (another project's is 404).")
    size: int = Field(description="Bytes uploaded.")
    files: int = Field(description="Files in the package.")
    created_at: datetime = Field(description="When it was first uploaded (UTC).")
    last_used_at: datetime = Field(description="When a job or sweep last started with it (or its upload).")
    file_list: list[CodeFileOut] | None = Field(None, description="Its files (GET /v1/code/{id} only).")
