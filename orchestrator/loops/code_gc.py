"""Deletes code packages nobody needs any more: no job or sweep names it (its spec's ``code.id``, in any
state: a finished run's checkpoints may still be resumed or served with its code) and it has not been used
(uploaded again, or started a run) for ``ORCHESTRATOR_CODE_RETENTION_DAYS``. The stored zip goes first,
then the row, in one transaction that checks both conditions again: a failed delete leaves the row, and the
next pass tries again."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.code_storage import CodeStorage
from orchestrator.db.models import CodePackage, utcnow
from orchestrator.repositories import code as code_repo
from orchestrator.settings import Settings
from orchestrator.storage import StorageError

log = logging.getLogger(__name__)


class CodeCollector:
    def __init__(self, sessions: sessionmaker[Session], storage: CodeStorage, settings: Settings):
        self.sessions = sessions
        self.storage = storage
        self.settings = settings

    def tick(self, now: datetime | None = None) -> list[str]:
        """One pass; returns the API ids of the packages it deleted."""
        before = (now or utcnow()) - timedelta(days=self.settings.code_retention_days)
        with self.sessions() as session:
            candidates = [p.id for p in code_repo.unused_since(session, before)]
        deleted = []
        for row_id in candidates:
            try:
                name = self._collect(row_id, before)
                if name:
                    deleted.append(name)
            except StorageError as exc:
                log.warning("code package %s: not deleted, trying again next pass: %s", row_id, exc)
        return deleted

    def _collect(self, row_id: str, before: datetime) -> str | None:
        with self.sessions.begin() as session:
            package = session.get(CodePackage, row_id)
            if package is None or package.last_used_at >= before:
                return None  # gone, or used since we looked
            if (package.project_id, package.sha256) in code_repo.referenced(session, [package.project_id]):
                return None
            self.storage.delete(package.project_id, package.sha256)  # storage first: a failure keeps the row
            code_repo.delete_package(session, package)
            log.info("deleted code package %s of project %s", package.sha256, package.project_id)
            return code_repo.api_id(package.sha256)
