"""The error shapes in the OpenAPI schema: what clients (and the fuzz in tests/security) can rely on.

Every error answers ``{"detail": ...}``. A 422 carries either FastAPI's list of field errors (request
validation, and every ``SpecRejected``: same shape, ``loc`` names the field) or one message string (a
query the handler itself refuses, e.g. a cursor it never issued); other 4xx carry one message string.
FastAPI documents only the list form, so the schema is completed here rather than left to disagree.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_MESSAGE = {
    "title": "ErrorMessage",
    "type": "object",
    "properties": {"detail": {"type": "string", "title": "Detail"}},
    "required": ["detail"],
}
MESSAGE_STATUSES = {
    "400": "Refused (e.g. an event no honest driver sends)",
    "401": "No key, or an unknown, revoked or expired one",
    "403": "The key's role may not do this",
    "404": "Not found (or not in the key's project)",
    "409": "Conflicts with the object's state or a taken name",
    "413": "The request body is over its cap",
    "429": "Over a per-key limit; see Retry-After",
}


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
