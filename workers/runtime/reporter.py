"""Tells the control plane what happened, without ever slowing training down.

``emit`` only appends to a bounded in-memory queue; a daemon thread posts batches to
``POST {url}/internal/v1/jobs/{job_id}/events`` (a sweep driver's: ``/internal/v1/sweeps/...``) and keeps retrying while the control plane is down,
so an outage of a minute or two loses nothing. The server treats events idempotently, so a batch
that is re-sent after a timeout (delivered, but the answer was lost) does no harm.

Bounds (``workers.runtime.retry``): a batch is retried after a transport error, a 5xx, a 408 or a 429 (any
answer but a 2xx or another 4xx), with jittered exponential waits from ``BACKOFF_MIN_S`` up to ``BACKOFF_MAX_S``
(each in [0, BACKOFF_MAX_S]), for as long as the reporter is open: no count or deadline, since ``close`` ends
it (the drivers and the training loop call ``flush`` with ``FINAL_FLUSH_TIMEOUT_S``, 60 s, first). Meanwhile at
most ``MAX_QUEUED_EVENTS`` wait (the oldest go first) and each request gets ``REQUEST_TIMEOUT_S``. Any other 4xx (a run's token refused: 401/403; a batch
the server will never accept) drops the batch at once, logged and counted in ``dropped``, never retried.
"""

from __future__ import annotations

import collections
import json
import logging
import threading

import httpx

from orchestrator_contract.jobs import CheckpointEvent, MetricsEvent, StateEvent
from workers.runtime.claim import RunToken, bearer
from workers.runtime.retry import RetryableStatus, RetryPolicy, Stopped, raise_if_retryable

log = logging.getLogger(__name__)
# httpx logs every request at INFO: one line per event batch would drown the job's own output.
logging.getLogger("httpx").setLevel(logging.WARNING)

MAX_QUEUED_EVENTS = 10_000
MAX_BATCH_EVENTS = 1000  # EventBatch.events allows at most 1000
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
REQUEST_TIMEOUT_S = 10.0


class EventReporter:
    """Buffers events and delivers them in order; with ``url=None`` it only logs them."""

    def __init__(
        self,
        url: str | None,
        job_id: str,
        attempt: int,
        token: RunToken | str,
        *,
        max_queued: int = MAX_QUEUED_EVENTS,
        backoff_min_s: float = BACKOFF_MIN_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        collection: str = "jobs",
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self._endpoint = f"{url.rstrip('/')}/internal/v1/{collection}/{job_id}/events" if url else None
        self._headers = bearer(token)  # a RunToken from a driver, or a plain string (scripts, tests)
        self._max_queued = max_queued
        # Unbounded in tries and time: `close` (its stop event) is what ends a batch's retries.
        self._retry = RetryPolicy(first_delay_s=backoff_min_s, cap_s=backoff_max_s)
        self._queue: collections.deque[dict] = collections.deque()
        self._in_flight = 0  # events taken off the queue and not yet acknowledged or dropped
        self._overflowing = False  # warn once per overflow episode, not once per dropped event
        self._dropped = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._endpoint:
            self._thread = threading.Thread(target=self._run, name=f"event-reporter-{job_id}", daemon=True)
            self._thread.start()

    def emit(self, event: StateEvent | MetricsEvent | CheckpointEvent) -> None:
        """Queue one event; never blocks on the network."""
        payload = event.model_dump(mode="json")
        if self._endpoint is None:
            log.info("event job=%s attempt=%s %s", self.job_id, self.attempt, json.dumps(payload))
            return
        with self._cond:
            if len(self._queue) >= self._max_queued:
                self._queue.popleft()
                self._dropped += 1
                if not self._overflowing:
                    self._overflowing = True
                    log.warning(
                        "event queue for job %s is full (%d events, control plane unreachable?): "
                        "dropping the oldest events until it drains",
                        self.job_id,
                        self._max_queued,
                    )
            self._queue.append(payload)
            self._cond.notify_all()

    @property
    def dropped(self) -> int:
        """Events lost to overflow or to a batch the control plane refused."""
        return self._dropped

    def flush(self, timeout_s: float) -> bool:
        """Wait until nothing is left to send; False if the timeout passed first.

        A batch the control plane refused (4xx) counts as done: it is logged and counted in ``dropped``.
        """
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._in_flight, timeout_s)

    def close(self) -> None:
        """Stop the sender thread. Call ``flush`` first: whatever is still queued is not sent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            left = len(self._queue) + self._in_flight
        if self._thread is not None:
            self._thread.join(timeout=REQUEST_TIMEOUT_S + 1)
        if left:
            log.warning("event reporter for job %s closed with %d events undelivered", self.job_id, left)

    # --- sender thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        with httpx.Client(headers=self._headers, timeout=REQUEST_TIMEOUT_S) as client:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._queue or self._stop.is_set())
                    if self._stop.is_set():
                        return
                    batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH_EVENTS))]
                    self._in_flight = len(batch)
                    if not self._queue:
                        self._overflowing = False
                delivered = self._send(client, batch)
                with self._cond:
                    if not delivered:
                        self._dropped += len(batch)
                    self._in_flight = 0
                    self._cond.notify_all()

    def _send(self, client: httpx.Client, batch: list[dict]) -> bool:
        """Post one batch until it is accepted (True) or refused for good (False). Returns early on close."""
        body = {"attempt": self.attempt, "events": batch}

        def post() -> httpx.Response:
            return raise_if_retryable(client.post(self._endpoint, json=body))

        try:
            response = self._retry.call(
                post,
                retry_on=(httpx.HTTPError, RetryableStatus),
                what=f"sending {len(batch)} events for job {self.job_id}",
                stop=self._stop,
                logger=log,
            )
        except Stopped:
            return False
        if response.is_success:
            return True
        log.error(
            "control plane refused %d events for job %s (HTTP %d: %s); dropping them",
            len(batch),
            self.job_id,
            response.status_code,
            response.text[:500],
        )
        return False
