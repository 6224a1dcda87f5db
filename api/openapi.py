"""The error shapes in the OpenAPI schema: what clients (and the fuzz in tests/security) can rely on.

Every error answers ``{"detail": ...}`` (the contract's ``ErrorMessage`` or ``FieldErrors``,
``orchestrator_contract.rest.errors``). A 422 carries either FastAPI's list of field errors (request
validation, and every ``Invalid`` error with a ``loc`` such as ``SpecRejected``: same shape, ``loc`` names
the field) or one message string (a query the handler itself refuses, e.g. a cursor it never issued);
other 4xx carry one message string. FastAPI documents only the list form, so the schema is completed here
rather than left to disagree. The statuses and their meanings are ``api.errors.ERRORS``'s.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.errors import BODY_TOO_LARGE, ERRORS
from orchestrator_contract.rest import ErrorMessage

ERROR_MESSAGE = ErrorMessage.model_json_schema()
# Every operation documents these (a 422 only where FastAPI lists one: there the message form is added).
MESSAGE_STATUSES = dict(
    sorted({str(code): text for code, text in [*ERRORS.values(), BODY_TOO_LARGE] if code != 422}.items())
)


def document_error_shapes(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            schemas["ErrorMessage"] = ERROR_MESSAGE
            message = {"$ref": "#/components/schemas/ErrorMessage"}
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    responses = operation.setdefault("responses", {})
                    if "422" in responses:
                        content = responses["422"].setdefault("content", {}).setdefault("application/json", {})
                        listed = content.get("schema")
                        content["schema"] = {"anyOf": [listed, message]} if listed else message
                    for code, description in MESSAGE_STATUSES.items():
                        responses.setdefault(
                            code, {"description": description, "content": {"application/json": {"schema": message}}}
                        )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
