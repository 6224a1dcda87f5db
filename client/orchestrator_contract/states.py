"""The states of every object the service keeps, and the roles of API keys: plain enums, no ORM.

Stored as their string values (``orchestrator.db.models``), answered as such by the REST API, and
imported by clients (SDK, CLI, dashboard) from here.
"""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class TrialState(enum.StrEnum):
    PENDING = "PENDING"  # created by the search, waiting for a slot
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # ran every epoch
    STOPPED = "STOPPED"  # stopped early by the scheduler (ASHA)
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"  # its sweep ended first (cancelled, failed, or lost it with a driver)


class DeploymentState(enum.StrEnum):
    QUEUED = "QUEUED"  # its newest version waits to be admitted: its project's quota, or room on the cluster
    DEPLOYING = "DEPLOYING"
    HEALTHY = "HEALTHY"
    UPDATING = "UPDATING"
    UNHEALTHY = "UNHEALTHY"
    FAILED = "FAILED"
    DELETED = "DELETED"
