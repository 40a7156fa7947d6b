"""Each variant of a ``mixstack bench deepmd`` case in a process of its own (``--processes``):
built side by side, then timed by one coordinator in interleaved rounds.

A compiled variant's first frame traces deepmd-kit's model in Python (``make_fx``, then
AOTAutograd) before Inductor compiles it, one core's work of 1.5-3 minutes a variant, so a case's
variants built one after another take the sum (both configs' six, ~14 minutes on an H100).
Here each variant's process (``serve``) builds it with the payload's ``build`` (the bench's: its
model, first frame, accuracy against the case's float64 frame, peak memory) while the others build
theirs, and the case waits for its slowest variant only.  From then on the GPU work runs in
one process at a time: the coordinator's ``time_interleaved`` asks each worker for one frame in
rotating order, and each times its own frame with CUDA events (``Remote.clock`` returns them); then
each breakdown and MD run in turn.  Every variant holds its models and its graph's memory, all at
once, until the case ends.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from multiprocessing.connection import wait

import torch

from ..measure.timing import Task, clock_for

POLL_S = 2.0          # how often a coordinator waiting on builds checks its time budget
CLOSE_S = 10.0        # how long a closed worker may take to exit before it is killed


class WorkerGone(RuntimeError):
    """A worker's process exited without answering (a crash, or killed for memory)."""


class Worker:
    """One variant's process.  ``call(command, *args)`` runs ``command`` there and returns its
    answer; a command that raised there raises ``RuntimeError`` here with its message."""

    def __init__(self, key: str, payload: dict, ctx=None):
        ctx = ctx or multiprocessing.get_context("spawn")
        self.key = key
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, key, payload), name=f"mixstack-{key}")
        self.process.start()
        child.close()

    def receive(self):
        """The worker's next message ``(kind, value)``."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(CLOSE_S)
            raise WorkerGone(f"its process exited without answering (exit code {self.process.exitcode})") from None

    def call(self, command: str, *args):
        self.conn.send((command, args))
        kind, value = self.receive()
        if kind == "error":
            raise RuntimeError(value)
        return value

    def close(self, *, wait: float = CLOSE_S) -> None:
        """Ask the process to end, and kill it where it has not within ``wait`` seconds."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("close", ()))
        self.process.join(wait)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class Remote:
    """A variant built in a ``Worker``, as ``deepmd_bench.run_case`` uses it: a task for the
    interleaved timing (the worker's own frame time is the sample), its breakdown, its MD run."""

    clock = staticmethod(lambda fn: fn())       # the task returns the seconds its worker measured

    def __init__(self, worker: Worker):
        self.worker = worker

    def task(self) -> Task:
        return Task(run=lambda: self.worker.call("frame"))

    def breakdown(self) -> dict:
        return self.worker.call("breakdown")

    def md(self, path: str, atoms) -> dict:
        return self.worker.call("md", path, atoms)

    def close(self) -> None:
        self.worker.close()


def serve(conn, key: str, payload: dict) -> None:
    """A worker's life: ``payload["build"](key, entry, payload, on_step)`` builds variant ``key``
    (its steps said to the coordinator as they end) into an object with ``run`` (one frame),
    ``breakdown()`` and ``md(path, atoms)``; the worker answers ``("built", entry)``, or
    ``("failed", entry)`` with the build's ``not_run``, then runs the commands ``frame``,
    ``breakdown``, ``md`` until ``close``."""
    entry: dict = {}
    try:
        variant = payload["build"](key, entry, payload, lambda text: conn.send(("step", text)))
    except Exception as err:
        entry.setdefault("not_run", f"failed in {key}: {type(err).__name__}: {err}")
        conn.send(("failed", entry))
        conn.close()
        return
    conn.send(("built", entry))
    clock = clock_for(torch.device(payload["device"]))
    commands = {"frame": lambda: clock(variant.run), "breakdown": variant.breakdown, "md": variant.md}
    while True:
        try:
            command, args = conn.recv()
        except EOFError:                                   # the coordinator is gone
            return
        if command == "close":
            conn.close()
            return
        try:
            conn.send(("ok", commands[command](*args)))
        except Exception as err:
            first = str(err).splitlines()[0][:200] if str(err) else ""
            conn.send(("error", f"{type(err).__name__}: {first}".rstrip(": ")))


@contextlib.contextmanager
def _compile_threads(workers: int):
    """Inductor's compile pool in each worker sized to its share of the host's cores (the workers
    inherit the variable); the caller's setting, where it made one, is kept."""
    name = "TORCHINDUCTOR_COMPILE_THREADS"
    previous = os.environ.get(name)
    if previous is None:
        os.environ[name] = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)


def build_all(keys, case: dict, payload: dict, progress, *, ctx=None, poll: float = POLL_S) -> dict:
    """Every variant of ``keys`` built in a ``Worker`` of its own at once (``payload``: what
    ``serve`` reads, a ``device`` and a ``build`` among it); ``case["variants"]``
    filled as each reports; returns ``{key: Remote}`` of those built.  A variant whose build
    failed or whose process died is marked not run with the reason; once ``progress`` is out of
    time, the workers still building are stopped and marked so."""
    return collect(start(keys, payload, ctx=ctx), case, progress, poll=poll)


def start(keys, payload: dict, *, ctx=None, share: int | None = None) -> dict[str, Worker]:
    """A ``Worker`` building each variant of ``keys`` (see ``build_all``), started now; ``share``:
    how many workers build at once in all (the compile threads are split among them; default
    ``len(keys)``), where several cases' builds run together (``--build-ahead``)."""
    workers: dict[str, Worker] = {}
    try:
        with _compile_threads(share or len(keys)):
            for key in keys:
                workers[key] = Worker(key, payload, ctx)
    except BaseException:
        for worker in workers.values():
            worker.close(wait=0)
        raise
    return workers


def collect(workers: dict[str, Worker], case: dict, progress, *, poll: float = POLL_S) -> dict:
    """``start``'s workers waited for (see ``build_all``): ``{key: Remote}`` of those built."""
    built, answered = {}, set()
    try:
        pending = {w.conn: w for w in workers.values()}
        while pending:
            for conn in wait(list(pending), timeout=poll):
                worker = pending[conn]
                entry = case["variants"].setdefault(worker.key, {})
                try:
                    kind, value = worker.receive()
                except WorkerGone as gone:
                    entry["not_run"] = f"failed while building: {gone}"
                    del pending[conn]
                    continue
                if kind == "step":
                    progress.on_step(value)
                    continue
                del pending[conn]
                answered.add(worker.key)
                entry.update(value)
                if kind == "built":
                    built[worker.key] = Remote(worker)
                progress.on_write(progress.record)
            why = progress.out_of_time() if pending else None
            if why:
                for worker in pending.values():
                    case["variants"].setdefault(worker.key, {})["not_run"] = f"{why}, while building"
                break
    finally:
        for key, worker in workers.items():
            if key not in built:                   # a failed build ends by itself; one still building is killed
                worker.close(wait=CLOSE_S if key in answered else 0)
    return built

