"""Background jobs of ``dyntc serve``: work of minutes that one request starts and later requests
read, so that no client holds a connection open for minutes.
Today one kind: a discovery that first adapts the backbone (``POST /discover`` with ``adapt_s``).

- **One at a time.** A job trains on the cores the service embeds with; a second one is refused
  (409, naming the running job) rather than halving both.
- **In this process.** A job and its result live in the memory of the service process that started
  it: another replica answers 404, a restart forgets it (start it again). Nothing of it is written
  to the store or to the embedding cache on disk.
- **Bounded.** Finished jobs are kept :data:`KEEP_S` seconds, at most :data:`KEEP` of them.
- **Unguessable.** A job's id is 128 random bits; reading it needs what starting it needed.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

#: Finished jobs kept at most, and for at most this many seconds.
KEEP = 16
KEEP_S = 3_600.0


class JobConflict(Exception):
    """A job is running; its id is ``running``."""

    def __init__(self, running: "Job"):
        super().__init__(f"a {running.kind} job is running (GET {running.url}): one runs at a time; start this "
                         "one when it has finished")
        self.running = running


@dataclass
class Job:
    id: str
    kind: str  #: the route it belongs to, e.g. "discover"
    source: str  #: what it works on, e.g. "captures" or "texts" (the captured texts need the token to read)
    started: float  #: time.time()
    status: str = "running"  #: running, done or failed
    finished: float | None = None
    result: dict | None = None
    error: str | None = None

    @property
    def url(self) -> str:
        return f"/{self.kind}/jobs/{self.id}"

    def to_dict(self) -> dict:
        end = self.finished if self.finished is not None else time.time()
        body = {"job": self.id, "kind": self.kind, "status": self.status, "source": self.source, "url": self.url,
                "started": round(self.started, 3), "seconds": round(end - self.started, 3)}
        if self.status == "done":
            body["result"] = self.result
        elif self.status == "failed":
            body["error"] = self.error
        return body


class Jobs:
    """The jobs of one service process (see the module docstring)."""

    def __init__(self, keep: int = KEEP, keep_s: float = KEEP_S):
        self.keep, self.keep_s = keep, keep_s
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, kind: str, source: str, work: Callable[[], dict]) -> Job:
        """Run `work` in a thread as a new job; raises :class:`JobConflict` while another runs.
        `work` returns the job's JSON-able result; a :class:`~dyntc.errors.DyntcError` it raises
        becomes the job's error, word for word, any other exception its type and message."""
        with self._lock:
            self._prune()
            running = next((j for j in self._jobs.values() if j.status == "running"), None)
            if running is not None:
                raise JobConflict(running)
            job = Job(id=secrets.token_hex(16), kind=kind, source=source, started=time.time())
            self._jobs[job.id] = job
        threading.Thread(target=self._run, args=(job, work), daemon=True, name=f"dyntc-{kind}-job").start()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            self._prune()
            return self._jobs.get(job_id)

    def _run(self, job: Job, work: Callable[[], dict]) -> None:
        from dyntc.errors import DyntcError

        try:
            result, error = work(), None
        except DyntcError as exc:
            result, error = None, str(exc)
        except Exception as exc:  # the service goes on; the job says what broke, stderr has the trace
            traceback.print_exc(file=sys.stderr)
            result, error = None, f"{type(exc).__name__}: {exc}"
        with self._lock:
            job.result, job.error = result, error
            job.status, job.finished = ("failed" if error is not None else "done"), time.time()

    def _prune(self) -> None:
        finished = sorted((j for j in self._jobs.values() if j.finished is not None), key=lambda j: -j.finished)
        now = time.time()
        for i, job in enumerate(finished):
            if i >= self.keep or now - job.finished > self.keep_s:
                del self._jobs[job.id]
