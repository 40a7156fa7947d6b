"""What an AOTInductor package (``.pt2``) holds: its compiled GPU kernels by name, mixstack's
among them.

A package is a zip archive.  Every Triton kernel compiled into it is a GPU binary (a ``.cubin``
member, or embedded in the model's ``.so``) whose symbol is the kernel's Python name, so
mixstack's kernels are found by their names (``mixstack.kernels``: every launched kernel's name
ends in ``_kernel``) and Inductor's own generated ones by their prefixes (``triton_poi_``,
``triton_red_``, ``triton_per_``, ...).  Reading the archive loads nothing: it works where the
package cannot be loaded, on any machine.  A package nested in the archive (deepmd-kit puts its
multi-rank LAMMPS graph there as a second ``.pt2``) is read the same way and reported beside.
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import os
import pkgutil
import re
import zipfile
from collections import Counter
from dataclasses import dataclass, field

_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{5,}")
_INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem|for|mm|bmm|unk)_\w+$")
_BINARY_SUFFIXES = (".cubin", ".so", ".hsaco", ".spv", ".bin")
_SOURCE_SUFFIXES = (".cpp", ".h", ".py", ".ptx")


def jit_function_names(module) -> set[str]:
    """The names of the Triton functions (``@triton.jit``) defined or imported in ``module``."""
    import triton

    return {v.__name__ for v in vars(module).values() if isinstance(v, triton.runtime.jit.JITFunction)}


@functools.cache
def mixstack_kernel_names() -> frozenset[str]:
    """The names of mixstack's launched Triton kernels (``mixstack.kernels``)."""
    from . import kernels

    names = set()
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        names.update(name for name in jit_function_names(module) if name.endswith("_kernel"))
    return frozenset(names)


@dataclass
class PackageKernels:
    """The GPU kernels of one package: ``mixstack`` (name -> members whose binary holds it),
    ``inductor`` (Inductor's generated Triton kernels, name -> members), ``sources`` (mixstack
    kernel names that appear only in the generated C++, not in any binary: launched by name
    but compiled elsewhere), ``named`` (the caller's ``names`` found in a binary or the C++, name
    -> members), ``members`` (files in the archive), ``metadata`` (the package's AOTInductor
    metadata, where it has one), ``nested`` (member name -> the ``PackageKernels`` of a package
    inside this one)."""

    path: str
    mixstack: Counter = field(default_factory=Counter)
    inductor: Counter = field(default_factory=Counter)
    sources: Counter = field(default_factory=Counter)
    named: Counter = field(default_factory=Counter)
    members: int = 0
    metadata: dict = field(default_factory=dict)
    nested: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        """A short human-readable account."""
        device = self.metadata.get("AOTI_DEVICE_KEY", "?")
        out = [f"{self.path}: {self.members} files, built for {device}",
               f"  mixstack kernels compiled in: {len(self.mixstack)}"
               + (f" ({', '.join(sorted(self.mixstack))})" if self.mixstack else ""),
               f"  Inductor's generated Triton kernels: {len(self.inductor)}"]
        if self.sources:
            out.append(f"  mixstack kernels named in the C++ but in no binary: {', '.join(sorted(self.sources))}")
        if self.named:
            out.append(f"  the other names asked for: {', '.join(sorted(self.named))}")
        for name, inner in self.nested.items():
            out += ["  " + line for line in inner.lines()]
        return out


def _identifiers(data: bytes) -> set[str]:
    return {m.decode() for m in _IDENTIFIER.findall(data)}


def package_kernels(path, names: frozenset[str] = frozenset()) -> PackageKernels:
    """Read the GPU kernels compiled into the AOTInductor package at ``path`` (nothing is loaded);
    ``names``: other kernel names to look for (another library's), reported in ``named``."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no file at {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not an AOTInductor package (not a zip archive)")
    with zipfile.ZipFile(path) as archive:
        return _read(archive, path, frozenset(names))


def _read(archive: zipfile.ZipFile, path: str, names: frozenset[str]) -> PackageKernels:
    ours = mixstack_kernel_names()
    found = PackageKernels(path)
    in_sources: set[str] = set()
    for info in archive.infolist():
        if info.is_dir():
            continue
        found.members += 1
        name = info.filename
        if name.endswith(".pt2"):
            data = archive.read(info)
            if zipfile.is_zipfile(io.BytesIO(data)):
                with zipfile.ZipFile(io.BytesIO(data)) as inner:
                    found.nested[name] = _read(inner, f"{path}:{name}", names)
        elif name.endswith(_BINARY_SUFFIXES):
            words = _identifiers(archive.read(info))
            found.mixstack.update(words & ours)
            found.inductor.update(w for w in words if _INDUCTOR_KERNEL.match(w))
            found.named.update(words & names)
        elif name.endswith(_SOURCE_SUFFIXES):
            words = _identifiers(archive.read(info))
            in_sources |= words & ours
            found.named.update(words & names)
        elif name.endswith("metadata.json"):
            try:
                found.metadata.update(json.loads(archive.read(info)))
            except ValueError:
                pass
    found.sources.update(in_sources - set(found.mixstack))
    return found
