"""Shared by the LAMMPS tests: skip without LAMMPS/MPICH, build the plugin once, launch ``mpirun``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, "tests", "lammps_driver.py")


def require_lammps() -> None:
    """Skip the calling module, saying what to install, without LAMMPS, MPICH or mpirun."""
    pytest.importorskip("ase")
    try:
        from mixstack.lammps import runtime
        runtime.import_lammps()
    except ImportError as exc:
        pytest.skip(f"LAMMPS is not usable here ({exc})", allow_module_level=True)
    if runtime.mpi_tool("mpirun") is None:
        pytest.skip(f"no mpirun: install MPICH with {runtime.PIP_FIX}", allow_module_level=True)


def mpirun(n: int, args: list[str], *, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``n`` ranks with the pip MPICH's ``mpirun`` (one torch thread per rank);
    fail with the output when it fails."""
    from mixstack.lammps import runtime
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    cmd = [runtime.mpi_tool("mpirun"), "-np", str(n), sys.executable, *args]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc
