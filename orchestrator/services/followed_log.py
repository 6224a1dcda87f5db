"""One followed job's output, read once for everyone who follows it (``orchestrator.services.logs.LogFollows``).

While Ray has the attempt, its log tail (``ClusterBackend.tail_logs``) hands over each byte once and then only
what is printed next; once Ray has lost it (or cannot be reached), the archived copy is read from the byte where
the last read of it stopped. Each complete line is judged once, as it arrives (``log_lines.LineViewer``): its
rank and how it is served. A follower then sends its part of the lines it has not sent, and nothing is read
again or filtered again per follower or per poll (docs/security.md, finding 11: every poll re-read the whole log from
Ray and from the archive, and ran the view over all of it for each follower).

Lines are counted the same way in both sources (the archive is Ray's output with escape codes removed, which
never removes a line break), so a read from one source continues where the other stopped: a new tail, which
Ray always starts from the first byte, skips the lines already had; the archive is read on from its own offset
and only its lines past those already had are added.
"""

from __future__ import annotations

import asyncio
import logging

from orchestrator.backend import BackendUnavailable, RunNotFound
from orchestrator.backend.registry import ClusterBackends
from orchestrator.loops.log_archive import LogArchive
from orchestrator.services.log_lines import LineViewer, Shown, strip_ansi

log = logging.getLogger(__name__)

# How the last read of the attempt ended: Ray's tail ended with the run (nothing more will be printed); Ray has
# no such run; Ray could not be reached; the tail broke while the run goes on. After the last three the archive
# was read, and the next poll tries Ray again.
ENDED, LOST, UNAVAILABLE, BROKEN = "ended", "lost", "unavailable", "broken"


class FollowedLog:
    def __init__(self, job_id: str, backends: ClusterBackends, archive: LogArchive, keep_ray_chatter: bool):
        self.job_id, self.backends, self.archive = job_id, backends, archive
        self.cluster: str | None = None  # the job's cluster, as its row last said (a queued job is placed later)
        self.keep_ray_chatter = keep_ray_chatter
        self.lock = asyncio.Lock()  # one poll at a time: the job's row read and the reads started once a poll
        self.checked_at = float("-inf")
        self.gone = False  # the job's row is gone
        self.read_attempt = 0  # the attempt whose log is being read (not a row: the job's own is in the database)
        self.generation = 0  # grows when a new attempt starts a new log: followers start from its first line
        self._pump: asyncio.Task | None = None
        self._begin(0)

    # --- what followers read ---

    def since(self, position: int, rank: int | None) -> str:
        """What is served of the lines from ``position`` on (``rank``'s only, when given)."""
        return "".join(
            shown.text
            for shown in self.entries[position:]
            if shown.text is not None and (rank is None or shown.rank == rank)
        )

    def start_of_tail(self, rank: int | None, tail: int | None) -> int:
        """The position from which ``since`` gives the last ``tail`` lines served (all of them: None)."""
        if tail is None:
            return 0
        position, found = len(self.entries), 0
        while position > 0 and found < tail:
            position -= 1
            shown = self.entries[position]
            found += shown.text is not None and (rank is None or shown.rank == rank)
        return position

    # --- once a poll, with the job's row ---

    async def update(self, attempt: int, ended: bool, grace_passed: bool) -> None:
        """Bring the reads in line with the job: a new attempt starts a new log; a read that stopped before the
        run's end is started again; the log is finished once the job has ended and its driver exited (its
        tail ended, or Ray lost it), or the grace for that has passed."""
        if self.finished:
            return
        if attempt != self.read_attempt:
            self._begin(attempt)
        reading = self._pump is not None and not self._pump.done()
        if ended and (attempt == 0 or (not reading and self._outcome in (ENDED, LOST, UNAVAILABLE))):
            self._finish()
        elif ended and grace_passed and (reading or self._outcome == BROKEN):
            # The driver outlived its grace: what Ray handed over so far is all, or else the archive's copy.
            self._stop_reading()
            if not self.caught_up:
                await self._read_archive(self.generation)
            self._finish()
        elif attempt and not reading and self._outcome != ENDED:
            self._pump = asyncio.get_running_loop().create_task(self._read(self.generation))

    def close(self) -> None:
        """Nobody follows it any more: stop reading."""
        self._stop_reading()

    # --- the reads ---

    def _begin(self, attempt: int) -> None:
        self._stop_reading()
        if attempt != self.read_attempt:
            self.generation += 1
        self.read_attempt = attempt
        self.entries: list[Shown] = []
        self.caught_up = attempt == 0  # what was printed when the read began has been read
        self.finished = False
        self._viewer = LineViewer(self.keep_ray_chatter)
        self._partial = ""  # what follows the last complete line
        self._outcome: str | None = None
        self._archive_at = (0, 0)  # (bytes, lines) of the archived copy read so far

    def _stop_reading(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None

    def _finish(self) -> None:
        self._stop_reading()
        if self._partial:  # the last line, with no line break after it
            self._add(strip_ansi(self._partial).splitlines(keepends=True))
            self._partial = ""
        self.finished = True

    def _add(self, lines: list[str]) -> None:
        judge = self._viewer.judge
        self.entries.extend(judge(line) for line in lines)

    async def _read(self, generation: int) -> None:
        submission_id = f"{self.job_id}-{self.read_attempt}"
        try:
            await self._read_live(submission_id, generation)
            outcome = ENDED if await self._run_finished(submission_id) else BROKEN
        except RunNotFound:
            outcome = LOST
        except BackendUnavailable as exc:
            log.info("following %s: Ray unreachable, reading the archived copy: %s", submission_id, exc)
            outcome = UNAVAILABLE
        except Exception:  # a surprise from Ray's client: said, and handled as Ray unreachable
            log.exception("following %s: reading Ray's log tail failed", submission_id)
            outcome = UNAVAILABLE
        if outcome in (LOST, UNAVAILABLE):
            await self._read_archive(generation)
        if generation == self.generation:
            self._outcome = outcome

    async def _read_live(self, submission_id: str, generation: int) -> None:
        skip = len(self.entries)  # a tail starts at the first byte: the lines already had are not added again
        pending = ""
        async for chunk in self.backends.get(self.cluster).tail_logs(submission_id):
            if generation != self.generation or self.finished:
                return
            text = pending + chunk.text
            cut = text.rfind("\n") + 1
            pending = text[cut:]
            if cut:
                lines = strip_ansi(text[:cut]).splitlines(keepends=True)
                dropped = min(skip, len(lines))
                skip -= dropped
                self._add(lines[dropped:])
            if not skip:
                self._partial = pending
            if chunk.at_end:
                self.caught_up = True

    async def _run_finished(self, submission_id: str) -> bool:
        """Whether the tail ended because the run did (else its connection broke: it is read again)."""
        try:
            return (await asyncio.to_thread(self.backends.get(self.cluster).info, submission_id)).status.finished
        except BackendUnavailable:
            return False

    async def _read_archive(self, generation: int) -> None:
        """The archived copy's bytes past those read of it; its lines past those already had are added."""
        offset, lines_read = self._archive_at
        try:
            data = await asyncio.to_thread(self.archive.read_from, self.job_id, self.read_attempt, offset, self.cluster)
        except OSError as exc:
            log.warning("following %s-%d: cannot read the archived copy: %s", self.job_id, self.read_attempt, exc)
            data = None
        if generation != self.generation or self.finished:
            return
        if data:
            cut = data.rfind(b"\n") + 1
            lines = data[:cut].decode(errors="replace").splitlines(keepends=True)
            self._add(lines[max(0, len(self.entries) - lines_read) :])
            self._archive_at = (offset + cut, lines_read + len(lines))
            if self._archive_at[1] == len(self.entries):
                self._partial = data[cut:].decode(errors="replace")
        self.caught_up = True
