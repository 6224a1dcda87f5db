"""An uploaded code package whose workload is digits (the same model, data and seed use as the built-in one),
so a run of it can be compared step for step with a digits run: the chaos scenario of a worker kill with
uploaded code, and ``bench/own_code.py``."""

from __future__ import annotations

import io
import zipfile

from tests.chaos.harness import Api

OWN_DIGITS_WORKLOAD = "own_digits:build"
OWN_DIGITS = {
    "own_digits.py": '''"""digits, as a user's own code: what the built-in workload builds."""

from workers.workloads import digits


def build(config, seed):
    return digits.build(config, seed)
''',
}


def zip_package(files: dict[str, str | bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return buffer.getvalue()


def upload(api: Api, package: bytes) -> str:
    """POST /v1/code; the package's id."""
    response = api.http.post("/v1/code", files={"file": ("code.zip", package)}, timeout=600)
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]
