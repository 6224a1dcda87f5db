"""Query parameters that filter lists the same way on every route that has them."""

from typing import Annotated

from fastapi import Query

from orchestrator.errors import Invalid
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


def label_filters(items: list[str] | None, max_filters: int) -> dict[str, str]:
    """``key=value`` filters (``?label=``, repeated) as a mapping; a bad one is a 422 saying what to fix."""
    if len(items or []) > max_filters:
        raise Invalid(f"{len(items or [])} label filters: at most {max_filters} (ORCHESTRATOR_MAX_LABEL_FILTERS)")
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Invalid(f"label filter {item!r} must be key=value")
        labels[key] = value
    return labels
