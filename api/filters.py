"""Query parameters that filter lists the same way on every route that has them."""

from typing import Annotated

from fastapi import Query

from orchestrator.repositories.names import MAX_NAME_PREFIX

NamePrefix = Annotated[
    str | None,
    Query(
        max_length=MAX_NAME_PREFIX,
        description=(
            "Only those whose name starts with this (taken literally, case-sensitive; "
            f"at most {MAX_NAME_PREFIX} characters)."
        ),
    ),
]
