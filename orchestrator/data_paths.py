"""Data files a job names (tiny_gpt's ``text_path``; any config field marked ``orchestrator_contract.jobs.DATA_PATH``)
come only from the data roots the operator configured (``Settings.data_root_paths``).

A path is resolved (a relative one from the first root, ``<storage>/data``), links followed, and must then
lie inside a root, be a regular file and stay under ``ORCHESTRATOR_DATA_MAX_MB``. The stored spec names the
resolved path, so a link changed after submit does not move the job elsewhere. A refusal names the field
and the roots and nothing about the file: a path outside the roots is never even looked at.

The workers open the file on the Ray nodes: this check assumes the control plane sees the same files at the
same paths (a shared volume, as the Helm chart mounts). Once users run their own code on the cluster, that
code can read whatever a worker can: see docs/security.md.
"""

from __future__ import annotations

import os
import stat

from orchestrator_contract import workloads
from orchestrator_contract.jobs import JobSpec

Location = tuple[str, ...]  # where in a job spec: ("config", "text_path")


class DataPathRefused(ValueError):
    """The path may not be used; the message says what to fix."""


def data_files(spec: JobSpec) -> dict[Location, str]:
    """Every data file a job's spec names, by where it names it: its workload's config fields marked
    ``DATA_PATH`` that hold a string. A job and every value a sweep's trial can receive are checked through
    this one function (``orchestrator.services.submission``)."""
    descriptor = workloads.get(spec.workload or "")
    fields = [] if descriptor is None else descriptor.data_path_fields
    return {("config", name): spec.config[name] for name in fields if isinstance(spec.config.get(name), str)}


def resolve_data_path(value: str, roots: tuple[str, ...], max_bytes: int) -> str:
    """The real path of ``value`` when it is a regular file inside one of ``roots``, under ``max_bytes``."""
    if not roots:
        raise DataPathRefused(
            "no data root is configured: set ORCHESTRATOR_DATA_ROOTS (or use local storage, whose data/ folder is one)"
        )
    real = os.path.realpath(os.path.join(roots[0], value))  # an absolute value replaces the root
    if not any(real == root or real.startswith(root + os.sep) for root in roots):
        raise DataPathRefused(
            f"{value!r} is not inside a data root ({', '.join(roots)}): put the file there, or "
            "ask the operator to add its folder to ORCHESTRATOR_DATA_ROOTS"
        )
    try:
        info = os.stat(real)
    except OSError:
        raise DataPathRefused(f"{value!r} does not exist in the data roots") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataPathRefused(f"{value!r} is not a regular file")
    if info.st_size > max_bytes:
        raise DataPathRefused(
            f"{value!r} is {info.st_size} bytes, over the {max_bytes}-byte cap (ORCHESTRATOR_DATA_MAX_MB)"
        )
    return real
