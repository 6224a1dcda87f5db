"""A job's own code: the ``code`` field of a job spec (a sweep's base job inherits it).

``id`` names a package uploaded with ``POST /v1/code`` in the job's project; the driver and every worker
run with its files as their working directory and on ``sys.path`` (Ray's ``runtime_env`` ``working_dir``,
built by the control plane from the stored package, never from this text). ``requirements`` are pip
requirement strings Ray's runtime env installs on the nodes, when the operator allows it
(``ORCHESTRATOR_ALLOW_REQUIREMENTS``): a name, extras and version specifiers only; no options
(``--index-url``), paths, URLs or environment markers.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from orchestrator_contract.base import Strict

CODE_ID_PATTERN = r"^sha256:[0-9a-f]{64}$"
_SPECIFIER = r"(===|==|~=|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+"
REQUIREMENT_PATTERN = (
    rf"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*\])?"
    rf"(\s*{_SPECIFIER}(\s*,\s*{_SPECIFIER})*)?$"
)
MAX_REQUIREMENTS = 64

Requirement = Annotated[str, StringConstraints(max_length=200, pattern=REQUIREMENT_PATTERN)]


class CodeSpec(Strict):
    id: str = Field(pattern=CODE_ID_PATTERN, description="A package of the job's project: POST /v1/code's `id`.")
    requirements: list[Requirement] = Field(
        default_factory=list,
        max_length=MAX_REQUIREMENTS,
        description='pip requirements installed on the nodes ("scipy==1.14.1", "numpy>=2,<3"): a name, extras '
        "and version specifiers only. Refused (422) when ORCHESTRATOR_ALLOW_REQUIREMENTS is off.",
    )
