"""What the control plane hands Ray to start one attempt of a job: a fixed command and a whole runtime_env.

The control plane builds the submission's ``runtime_env`` here, in ``runtime_env``, and the backend passes
it to Ray as it is. It holds ``env_vars`` and, for a run with its own code (``code`` in the spec), a
``working_dir`` and its ``pip`` requirements. The ``working_dir`` is the URI of the STORED package in Ray's
package store (``gcs://_ray_pkg_<sha256 of the stored zip>.zip``, uploaded by the backend when Ray lacks
it), never text from the spec; ``pip`` is the spec's requirements, whose shape the contract checked
(``orchestrator_contract.code``). Only what a driver needs goes in, and never a secret: Ray lists a job's
``runtime_env``, metadata and entrypoint to every process on the cluster (one trust domain, docs/security.md),
so not even the run's own token. The driver gets a one-use claim code instead (``new_driver_claim``), which it
exchanges at its start for the token (``orchestrator.services.run_claims``); a code read from Ray's job table
is then worth nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

from sqlalchemy.orm import Session

from orchestrator.auth import generate_secret, hash_secret
from orchestrator.backend import ClusterBackend
from orchestrator.code_storage import CodeStorage
from orchestrator.db.models import Job, Sweep
from orchestrator.repositories import code as code_repo
from orchestrator.settings import Settings
from orchestrator.states.jobs import issue_driver_claim
from orchestrator_contract.logs import DEDUP_ALLOW

DRIVER_MODULE = "workers.train.driver"
CLAIM_CODE_ENV = "ORCHESTRATOR_CLAIM_CODE"  # what workers.runtime.claim reads
RAY_PACKAGE_PREFIX = "_ray_pkg_"  # Ray's own name for uploaded packages (ray/_private/runtime_env/packaging.py)
CODE_MISSING = "code_missing"  # the reason a run fails with when its code package is gone


class CodeMissing(LookupError):
    """The run's code package is gone (its row, or its stored zip while Ray lacks a copy): the run can never
    start, so it fails (``code_missing``) instead of being retried."""


def ray_package_uri(package_sha256: str) -> str:
    """The stored zip's name in Ray's package store, content-addressed like Ray's own uploads."""
    assert len(package_sha256) == 64 and package_sha256.isalnum(), package_sha256
    return f"gcs://{RAY_PACKAGE_PREFIX}{package_sha256}.zip"


@dataclass(frozen=True)
class CodeMount:
    """A run's code, read off its package row: where it is stored, its name for Ray, what pip installs."""

    project_id: str
    sha256: str  # the package's (its stored file's name)
    package_sha256: str  # the stored zip's: its name in Ray's store
    package_size: int
    requirements: tuple[str, ...] = ()

    @property
    def uri(self) -> str:
        return ray_package_uri(self.package_sha256)

    @property
    def id(self) -> str:
        return f"sha256:{self.sha256}"

    def upload(self, backend: ClusterBackend, settings: Settings) -> None:
        """Into Ray's package store, if Ray does not hold it already (BackendUnavailable: retried later;
        CodeMissing: the stored zip is gone and Ray has no copy)."""
        storage = CodeStorage(settings.code_storage_path)

        @contextmanager
        def open_stored() -> Iterator[BinaryIO]:
            # Checked before opening: a FileNotFoundError is an OSError, which the backend takes for Ray
            # being unreachable (retried every tick, forever).
            if not storage.exists(self.project_id, self.sha256):
                raise CodeMissing(
                    f"code package {self.id} is gone from storage ({storage.path_of(self.project_id, self.sha256)}) "
                    "and Ray has no copy of it: upload it again and submit a new run"
                )
            with storage.open(self.project_id, self.sha256) as source:
                yield source

        backend.upload_package(self.uri, open_stored, self.package_size)


def code_mount(session: Session, run: Job | Sweep) -> CodeMount | None:
    """The run's code (a job's ``code``, a sweep's base job's), its package marked used now; None without.
    CodeMissing when its package is gone (checked at submit, and a package a run names is never collected,
    so only deleted by hand)."""
    spec = run.spec.get("base", run.spec) if isinstance(run, Sweep) else run.spec
    code = spec.get("code")
    if not code:
        return None
    mount = package_mount(session, run.project_id, code)
    if mount is None:
        raise CodeMissing(
            f"code package {code['id']} is gone from project {run.project_id}: upload it again and submit a new run"
        )
    code_repo.mark_used(session, code_repo.get_package(session, run.project_id, code["id"]))
    return mount


def package_mount(session: Session, project_id: str, code: dict[str, Any]) -> CodeMount | None:
    """A code spec's package as Ray takes it (a run's, or a served training function's), or None if gone."""
    package = code_repo.get_package(session, project_id, code["id"])
    if package is None:
        return None
    return CodeMount(
        project_id, package.sha256, package.package_sha256, package.package_size, tuple(code.get("requirements") or ())
    )


@dataclass(frozen=True)
class Launch:
    """One attempt's submission, read off the job row while it is locked and sent after the commit."""

    submission_id: str
    run_id: str
    entrypoint: str
    metadata: dict[str, str]
    code: CodeMount | None = None

    @classmethod
    def of(
        cls, run: Job | Sweep, kind: str = "job", module: str = DRIVER_MODULE, code: CodeMount | None = None
    ) -> Launch:
        """``run``'s current attempt, started by ``python -m <module> --<kind>-id ID --attempt N``."""
        # Ray Jobs runs the entrypoint through a shell, so it is built from server-made values only: the
        # run's id (uuid hex) and the attempt number. The driver fetches its spec from the control plane.
        assert run.id.isalnum(), run.id
        return cls(
            submission_id=run.submission_id,
            run_id=run.id,
            entrypoint=f"python -m {module} --{kind}-id {run.id} --attempt {int(run.attempt)}",
            metadata={f"{kind}_id": run.id, "attempt": str(run.attempt), "project_id": run.project_id},
            code=code,
        )

    def submit(self, backend: ClusterBackend, claim_code: str, settings: Settings) -> None:
        if self.code is not None:
            self.code.upload(backend, settings)
        backend.submit(self.submission_id, self.entrypoint, runtime_env(claim_code, settings, self.code), self.metadata)


def new_driver_claim(run: Job | Sweep) -> str:
    """A fresh one-use claim code for the run's next driver, which exchanges it for a new token at its start
    (``orchestrator.services.run_claims``). Only its hash is kept. The old driver's token stops working now, and
    an end the old attempt reported but Ray never confirmed is forgotten: this is a new attempt (or a new
    submission of it)."""
    code = generate_secret("jcl_")
    issue_driver_claim(run, hash_secret(code))
    return code


def runtime_env(claim_code: str, settings: Settings, code: CodeMount | None = None) -> dict[str, Any]:
    """Ray's ``runtime_env`` for one attempt's driver (its workers inherit it): with code, its stored package
    as the working directory (on ``sys.path`` too) and its requirements for pip."""
    env: dict[str, Any] = {"env_vars": driver_env(claim_code, settings)}
    if code is not None:
        env["working_dir"] = code.uri
        if code.requirements:
            env["pip"] = list(code.requirements)
    return env


def driver_env(claim_code: str, settings: Settings) -> dict[str, str]:
    """The driver's environment variables: a fixed list, built from settings that are safe to send, and the
    attempt's claim code (worth nothing once the driver exchanged it)."""
    return {
        "ORCHESTRATOR_URL": settings.control_plane_url,
        CLAIM_CODE_ENV: claim_code,
        # Two CPU workers on two cores oversubscribe fast with torch's default thread pool.
        "OMP_NUM_THREADS": "1",
        # How often the Train controller polls workers; ray.train.report blocks until it does.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(settings.train_poll_interval_s),
        # Its actor starts with every worker group, i.e. it competes for the CPU when a group restarts.
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1" if settings.watch_preemption else "0",
        # Each training worker's rank line, never held back by Ray's log deduplication (orchestrator_contract.logs).
        "RAY_DEDUP_LOGS_ALLOW_REGEX": DEDUP_ALLOW,
        # Ray Train's print patch sends a worker's print() to its logger and, as Ray's workers' stdout is not
        # sys.__stdout__, to stdout as well: every printed line reached the job's log twice. Off, print is print.
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        # How often rank 0 asks whether it is preempted, and the other ranks whether their stacks are wanted
        # (workers.runtime.control).
        "ORCHESTRATOR_CONTROL_POLL_S": str(settings.preemption_poll_s),
        "ORCHESTRATOR_STACKS_POLL_S": str(settings.hang_stacks_poll_s),
    }
