"""Compile ahead: run warm-up tasks in worker processes before the measuring process needs them.

Why: a first call compiles, and compiling is most of what ``mixstack tune`` and
``mixstack bench grid`` spend (BENCHMARKS.md, "A cheaper sweep" and "The grid run").
Triton keeps every compiled kernel on disk (``TRITON_CACHE_DIR``), keyed on the source,
the constexprs, the specialisation of the arguments (an int equal to 1, an int divisible
by 16, a pointer aligned to 16 bytes) and the launch options; Inductor keeps compiled
graphs on disk too (its FX graph and AOTAutograd caches).  A worker that compiles the
same kernel fills that cache, and the measuring process then only loads it.  Compiles
are single-threaded work on the host, so N workers compile about N at a time.

Two kinds of task:

- a kernel launch (``LaunchSpec``): the parent records the launches a run would make
  (``record``: the launchers run with every kernel launch recorded instead of run, as
  ``compiler_report`` does, so nothing runs on the device), keeps one per distinct
  compile (``launch_tasks``), and a worker compiles each with Triton's
  ``JITFunction.warmup``: the same specialisation from the same argument values,
  without a launch;
- any picklable module-level function with its arguments (``Task``): the grid's
  compiled reference, which must be compiled by dynamo and Inductor from the same
  shapes, dynamic marks and order as the measured run for the caches to hit.

``Pool.run`` reports each task's seconds and error; a failed warm-up is logged and never
raised: the measuring process then compiles that kernel itself.  Workers are spawned
(never forked from a process that holds a CUDA context), inherit the environment
(``MIXSTACK_*``, ``TRITON_*``, ``TORCHINDUCTOR_*``: the same caches and switches) and
split the host's cores for Inductor's own compile threads.  ``Pool.submit`` returns at once:
``mixstack tune`` waits for a key's tasks before timing it; ``mixstack bench grid`` measures one
batch of keys while the workers compile the next, and keeps the tasks that run on the GPU for
more than milliseconds (its compiled references) out of that overlap (BENCHMARKS.md, "The whole
grid": a worker's forward and backward beside a timing moved its medians).  Nothing here prints.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

log = logging.getLogger(__name__)

MAX_AUTO_WORKERS = 8
# The variables a worker must share with its parent: mixstack's switches and table folder,
# Triton's cache and interpreter, Inductor's cache folder and options.
ENV_PREFIXES = ("MIXSTACK_", "TRITON_", "TORCHINDUCTOR_", "TORCH_", "CUDA_VISIBLE_DEVICES", "XDG_CACHE_HOME")


def auto_workers(cpus: int | None = None) -> int:
    """The default worker count: half the host's cores, at most ``MAX_AUTO_WORKERS``; 0 (no
    warm-up) where that is under 2 (one worker compiles no faster than the parent)."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    n = min(MAX_AUTO_WORKERS, cpus // 2)
    return n if n >= 2 else 0


def resolve_workers(value, option: str = "warm_workers") -> int:
    """``None`` or ``"auto"``: ``auto_workers()``; else a count >= 0 (0: no warm-up)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return auto_workers()
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{option} takes a worker count (0: no warm-up) or 'auto', got {value!r}") from None
    if n < 0:
        raise ValueError(f"{option} takes a worker count >= 0 (0: no warm-up), got {n}")
    return n


@dataclass(frozen=True)
class Task:
    """One warm-up: ``fn(*args)``; ``fn`` a module-level function (workers unpickle it by name)."""

    name: str
    fn: Callable
    args: tuple = ()


@dataclass(frozen=True)
class Result:
    """What a task did: its seconds in the worker, and ``error`` (``None``: it ran)."""

    name: str
    seconds: float
    error: str | None = None


@dataclass
class Summary:
    """One ``Pool.run``: every result, and the wall seconds of the whole batch."""

    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 0

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.error is not None]

    def describe(self) -> str:
        busy = sum(r.seconds for r in self.results)
        return (f"{len(self.results)} tasks in {self.seconds:.1f} s on {self.workers or 'no'} workers "
                f"({busy:.1f} s of work){f'; {len(self.failed)} failed' if self.failed else ''}")


def pin_triton_cache() -> str:
    """Fix ``TRITON_CACHE_DIR`` (to Triton's own default where unset) for this process and the
    workers it spawns, and return it.  Why: Inductor points the variable at its own folder the
    first time a process loads a compiled graph's kernels, unless it is set; Triton reads it at
    every compile, so a measuring process that ran ``torch.compile`` looks for mixstack's kernels
    in another folder than the one its workers filled, and compiles them again (BENCHMARKS.md,
    "The whole grid")."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        from triton import knobs
        os.environ["TRITON_CACHE_DIR"] = str(knobs.cache.dir)
    return os.environ["TRITON_CACHE_DIR"]


def worker_env() -> dict[str, str]:
    """The parent's variables that a worker must see (``ENV_PREFIXES``)."""
    return {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}


def _init_worker(env: dict[str, str], compile_threads: int) -> None:
    os.environ.update(env)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads))


def _call(task: Task) -> Result:
    t0 = time.perf_counter()
    try:
        task.fn(*task.args)
    except Exception as exc:                    # reported to the parent, never raised there
        tail = "".join(traceback.format_exception(exc)[-3:]).strip()
        return Result(task.name, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}\n{tail}")
    return Result(task.name, time.perf_counter() - t0)


class Pool:
    """``processes`` spawned workers, started at the first ``run`` and kept until ``close``
    (a context manager); ``processes=0`` runs the tasks in this process, one after another
    (tests, and a check of a task list without workers)."""

    def __init__(self, processes: int):
        if processes < 0:
            raise ValueError(f"processes must be >= 0, got {processes}")
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _start(self) -> ProcessPoolExecutor:
        if self._executor is None:
            pin_triton_cache()
            threads = max(1, (os.cpu_count() or 1) // self.processes)
            self._executor = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init_worker, initargs=(worker_env(), threads))
        return self._executor

    def run(self, tasks: Iterable[Task], on_done: Callable[[Result, int, int], None] | None = None) -> Summary:
        """Run every task; ``on_done(result, done, total)`` after each.  Never raises for a
        task: a failure (or a worker that died) becomes a ``Result`` with its ``error``."""
        return self.submit(tasks, on_done).wait()

    def submit(self, tasks: Iterable[Task], on_done: Callable[[Result, int, int], None] | None = None) -> Batch:
        """Hand ``tasks`` to the workers and return at once (``processes=0``: run them now);
        ``Batch.wait()`` collects them.  A caller may measure while a batch compiles (the grid
        measures one batch of keys while the workers compile the next)."""
        tasks = list(tasks)
        batch = Batch(self, tasks, on_done or (lambda *_a: None))
        if self.processes == 0:
            for task in tasks:
                batch.finish(_call(task))
        elif tasks:
            try:
                batch.futures = {self._start().submit(_call, task): task for task in tasks}
            except BrokenProcessPool:
                batch.futures = {}
        return batch


class Batch:
    """Tasks handed to a ``Pool``: ``wait()`` blocks until all are done and returns the ``Summary``
    (its ``seconds`` from the submission)."""

    def __init__(self, pool: Pool, tasks: list[Task], on_done: Callable[[Result, int, int], None]):
        self.pool, self.tasks, self.on_done = pool, tasks, on_done
        self.futures: dict = {}
        self.t0 = time.perf_counter()
        self.summary = Summary(workers=pool.processes)
        self.collected = False

    def finish(self, result: Result) -> None:
        self.summary.results.append(result)
        if result.error is not None:          # the first few in full; the count in the summary
            (log.warning if len(self.summary.failed) <= 3 else log.info)(
                "warm-up %s failed (the measuring process compiles it itself): %s", result.name, result.error)
        self.on_done(result, len(self.summary.results), len(self.tasks))

    def wait(self) -> Summary:
        summary = self.summary
        if self.collected:
            return summary
        if self.pool.processes and self.tasks:
            left = set(self.futures)
            while left:
                ready, left = wait(left, return_when=FIRST_COMPLETED)
                for fut in ready:
                    try:
                        self.finish(fut.result())
                    except BrokenProcessPool as exc:
                        self.finish(Result(self.futures[fut].name, 0.0, f"a worker died: {exc}"))
                    except Exception as exc:                # e.g. an argument that does not pickle
                        self.finish(Result(self.futures[fut].name, 0.0, f"{type(exc).__name__}: {exc}"))
            for task in self.tasks[len(self.futures):]:
                self.finish(Result(task.name, 0.0, "the worker pool could not start"))
            if any(r.error and r.error.startswith("a worker died") for r in summary.results):
                self.pool.close()                              # a fresh pool for the next batch
        summary.seconds = time.perf_counter() - self.t0
        (log.warning if summary.failed else log.info)("warm-up: %s", summary.describe())
        self.collected = True
        return summary


# ---------------------------------------------------------------- Triton kernel launches

@dataclass(frozen=True)
class TensorArg:
    """A pointer argument as Triton specialises it: dtype and address modulo 16."""

    dtype: torch.dtype
    offset: int = 0


def _pointer(arg: TensorArg):
    """What ``JITFunction.warmup`` reads of a tensor argument: Triton's ``MockTensor`` (a dtype
    and a ``data_ptr``) at the recorded alignment."""
    from triton.runtime.jit import MockTensor

    class Pointer(MockTensor):
        def data_ptr(self) -> int:
            return arg.offset

    return Pointer(arg.dtype)


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch, picklable: the kernel as ``module:name``, the positional arguments
    (ints, bools and floats as they were; tensors as ``TensorArg``), the keyword arguments
    (constexprs and options) and the CUDA device index (``None`` on a CPU)."""

    kernel: str
    args: tuple
    kwargs: tuple
    device: int | None = None

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def identity(self) -> tuple:
        """What selects the compiled binary: the kernel, its keyword arguments, each pointer's
        dtype and alignment, each int's class (1, divisible by 16, other; 32 or 64 bits)."""
        def cls(a):
            if isinstance(a, TensorArg):
                return ("p", str(a.dtype), a.offset % 16 == 0)
            if isinstance(a, bool):
                return ("b",)
            if isinstance(a, int):
                return ("i", "1" if a == 1 else "D" if a % 16 == 0 else "-", -2 ** 31 <= a < 2 ** 31)
            return (type(a).__name__,)
        return (self.kernel, tuple(cls(a) for a in self.args), self.kwargs, self.device)


def _kernel_path(kernel) -> str | None:
    fn = getattr(kernel, "fn", None)
    module, name = getattr(fn, "__module__", None), getattr(fn, "__name__", None)
    if module is None or name is None or getattr(importlib.import_module(module), name, None) is not kernel:
        return None
    return f"{module}:{name}"


def spec(launch) -> LaunchSpec | None:
    """``launch`` (a ``compiler_report.Launch``) as a ``LaunchSpec``; ``None`` where its kernel
    is not a module-level name a worker can import."""
    path = _kernel_path(launch.kernel)
    if path is None:
        return None
    device = None
    args = []
    for a in launch.args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                device = a.device.index
            args.append(TensorArg(a.dtype, a.data_ptr() % 16))
        elif isinstance(a, (bool, int, float)):
            args.append(a)
        else:
            return None
    return LaunchSpec(path, tuple(args), tuple(sorted(launch.kwargs.items())), device)


def record(fn: Callable, *args, **kwargs) -> list:
    """The kernel launches ``fn(*args, **kwargs)`` makes, recorded instead of run (the
    launchers allocate their outputs but launch nothing: outputs hold garbage)."""
    from .compiler_report import record_launches
    return record_launches(fn, *args, **kwargs)


def launch_tasks(launches: Iterable, seen: set | None = None) -> list[Task]:
    """One ``warm_launch`` task per distinct compile among ``launches`` (``compiler_report.Launch``
    or ``LaunchSpec``), leaving out those in ``seen`` (updated: a batch never repeats an
    earlier batch's compile)."""
    seen = set() if seen is None else seen
    tasks = []
    for launch in launches:
        s = launch if isinstance(launch, LaunchSpec) else spec(launch)
        if s is None:
            continue
        ident = s.identity()
        if ident in seen:
            continue
        seen.add(ident)
        opts = " ".join(f"{k}={v}" for k, v in s.kwargs if k.startswith("BLOCK") or k.startswith("num_"))
        tasks.append(Task(f"{s.name} {opts}".strip(), warm_launch, (s,)))
    return tasks


def warm_launch(s: LaunchSpec) -> None:
    """Compile ``s`` into Triton's caches without launching it (``JITFunction.warmup``),
    then build its host launcher.

    ``warmup`` compiles the kernel but leaves the launcher for the first run: Triton 3.6
    builds it as a C module with the host's compiler (on disk keyed on its source, which
    depends only on the kernel's signature), about half a second a signature, and the
    measuring process would pay that at every first call.  ``_init_handles`` builds it
    (and loads the binary on the worker's device); Triton versions with a generic launcher
    make that cheap, and a kernel object without the hook is left as ``warmup`` gave it."""
    module, name = s.kernel.split(":")
    kernel = getattr(importlib.import_module(module), name)
    if s.device is not None:
        torch.cuda.set_device(s.device)
    args = [_pointer(a) if isinstance(a, TensorArg) else a for a in s.args]
    compiled = kernel.warmup(*args, grid=(1,), **dict(s.kwargs))
    init_handles = getattr(compiled, "_init_handles", None)
    if s.device is not None and callable(init_handles):
        init_handles()
