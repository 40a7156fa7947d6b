"""Which GPU an MPI rank uses, and the environment of the programs mixstack launches.

With ``--device cuda`` (no index) every rank of a LAMMPS run takes
``cuda:{local_rank % torch.cuda.device_count()}``: one rank per GPU when there
are as many ranks on a node as GPUs, several ranks sharing each GPU when there
are more (round robin).  ``cuda:N`` is taken as given.  The node-local rank
comes from the launcher's environment: MPICH's Hydra (``MPI_LOCALRANKID``),
Open MPI (``OMPI_COMM_WORLD_LOCAL_RANK``) or Slurm (``SLURM_LOCALID``), and
otherwise from MPI itself (the rank in the shared-memory communicator that
mpi4py splits off ``COMM_WORLD``).  Each record names the device and the
source of the local rank, per rank.

``MULTICAST_OFF``: the variables that keep NVLink multicast (NVLS) off in
NCCL, PyTorch's symmetric memory and NVSHMEM.  mixstack itself never uses a
collective library (LAMMPS talks MPI), but a program started in the same job
could, and on a shared multi-GPU host a multicast object can take the GPUs
out of service for others; ``mixstack md`` sets them in its ranks and the
scaling driver in every run it launches.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import asdict, dataclass

import torch

from ..measure.env import parse_device

log = logging.getLogger(__name__)

# (variable, launcher) in the order they are asked
LOCAL_RANK_VARIABLES = (("MPI_LOCALRANKID", "MPICH"), ("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
                        ("SLURM_LOCALID", "Slurm"))
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Placement:
    """Where this rank's model runs and how that was decided."""

    device: str                 # "cuda:1", "cpu"
    local_rank: int
    local_rank_source: str      # the variable, "mpi4py", or "none" (a single process)
    host: str

    def to_dict(self) -> dict:
        return asdict(self)


def _mpi_local_rank() -> int | None:
    """The rank in MPI's shared-memory split of ``COMM_WORLD`` (``None`` without mpi4py)."""
    try:
        from .runtime import load_mpi
        load_mpi()
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as exc:
        log.debug("no local rank from mpi4py: %s", exc)
        return None
    world = MPI.COMM_WORLD
    if world.Get_size() == 1:
        return 0
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def local_rank(environ=None, *, mpi_fallback=_mpi_local_rank) -> tuple[int, str]:
    """``(this process's rank on its node, where it came from)``.

    ``environ`` defaults to ``os.environ``; ``mpi_fallback`` is asked when no
    launcher variable is set (``None`` from it: a single process, rank 0).
    """
    env = os.environ if environ is None else environ
    for name, launcher in LOCAL_RANK_VARIABLES:
        value = env.get(name)
        if value is None or value.strip() == "":
            continue
        try:
            rank = int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} (set by {launcher}) is not a local rank: expected an "
                             f"integer >= 0") from None
        if rank < 0:
            raise ValueError(f"{name}={value!r} (set by {launcher}) is negative")
        return rank, name
    rank = mpi_fallback() if mpi_fallback is not None else None
    if rank is None:
        return 0, "none"
    return rank, "mpi4py"


def rank_device(requested=None, *, environ=None, device_count=None, mpi_fallback=_mpi_local_rank) -> Placement:
    """The device of this rank for ``requested`` (``None``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``).

    ``None`` means CUDA when torch sees a GPU, else the CPU.  ``"cuda"``
    without an index becomes ``cuda:{local_rank % device_count}``;
    ``"cuda:N"`` is kept (and must exist).  ``device_count`` defaults to
    ``torch.cuda.device_count()`` (tests pass a number).
    """
    count = torch.cuda.device_count() if device_count is None else int(device_count)
    if requested is None:
        requested = "cuda" if count > 0 else "cpu"
    try:
        dev = parse_device(requested)
    except ValueError as exc:
        raise ValueError(f"device: {exc}") from None
    rank, source = local_rank(environ, mpi_fallback=mpi_fallback)
    host = socket.gethostname()
    if dev.type == "cpu":
        return Placement("cpu", rank, source, host)
    if count < 1:
        raise ValueError(f"device: {requested} was asked for, but torch sees no CUDA device")
    if dev.index is None:
        dev = torch.device("cuda", rank % count)
    elif dev.index >= count:
        raise ValueError(f"device: {dev} was asked for, but torch sees {count} CUDA device(s)")
    log.debug("local rank %d (%s) on %s: %s", rank, source, host, dev)
    return Placement(str(dev), rank, source, host)


def multicast_off(environ=None) -> dict:
    """``environ`` (default ``os.environ``) with ``MULTICAST_OFF`` set in it (in place); returns it.

    A different value that was set is replaced, with a log message: these
    variables guard a shared machine, not this program's speed.
    """
    env = os.environ if environ is None else environ
    for name, value in MULTICAST_OFF.items():
        old = env.get(name)
        if old is not None and old != value:
            log.warning("%s=%s replaced by %s: NVLink multicast stays off in runs of mixstack", name, old, value)
        env[name] = value
    return env


def launch_env(base=None) -> dict:
    """A copy of ``base`` (default ``os.environ``) for a program mixstack launches: multicast off."""
    return multicast_off(dict(os.environ if base is None else base))
