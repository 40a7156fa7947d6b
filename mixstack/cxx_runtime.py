"""A frozen package's own C++ runtime: AOTInductor's ``.so`` linked with a private copy of
libstdc++ whose symbols stay inside it.

A package's ``.so`` normally uses the process's ``libstdc++.so.6``.  Where the process holds two
disagreeing copies of libstdc++'s locale machinery (or one older than the compiler's headers),
the model's constructor dies in the ``std::regex`` that ``parse_device_str`` compiles
(docs/deployment.md, "Known issue"; ``repro/aoti_loader_crash.py``).  ``private_runtime_compiler``
writes a wrapper of the C++ compiler that links every shared library with
``-static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL`` (a library without ``-shared`` is
compiled as before): the package then runs the runtime its headers belong to, and none of its
symbols binds to another copy.  ``freeze(..., private_cxx_runtime=True)``,
``mixstack freeze --private-cxx-runtime`` and ``MIXSTACK_PRIVATE_CXX_RUNTIME=1`` (which deepmd-kit's
freeze, hooked by ``mixstack.deepmd.freeze``, follows too) compile through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
from pathlib import Path

from .core import config

MARK = "-private-runtime-"
WRAPPER = """#!/bin/sh
# {cxx}; a shared library it links gets a private copy of libstdc++ whose symbols stay inside it
case " $* " in
  *" -shared "*) exec {cxx} "$@" -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL ;;
  *) exec {cxx} "$@" ;;
esac
"""


def private_runtime_compiler(cxx: str | None = None) -> str:
    """The path of a wrapper of ``cxx`` (default: the compiler Inductor would call) that links
    shared libraries with a private, hidden libstdc++; written once into mixstack's cache folder."""
    if cxx is None:
        from torch._inductor.cpp_builder import get_cpp_compiler
        cxx = get_cpp_compiler()
    found = shutil.which(cxx)
    if found is None:
        raise FileNotFoundError(f"the C++ compiler {cxx!r} is not on PATH")
    if MARK in os.path.basename(found):              # already one (Inductor's compiler inside private_runtime)
        return found
    text = WRAPPER.format(cxx=shlex.quote(found))
    folder = os.path.join(config.cache_dir(), "cxx")
    # the name keeps the compiler's (Inductor tells g++ from clang++ by it) and the script's hash
    name = f"{os.path.basename(found)}{MARK}{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    path = os.path.join(folder, name)
    if not os.path.isfile(path) or Path(path).read_text() != text:
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return path


def inductor_configs(private: bool) -> dict:
    """Inductor options that compile a package with a private C++ runtime (``{}`` for none)."""
    return {"cpp.cxx": (private_runtime_compiler(),)} if private else {}


@contextlib.contextmanager
def private_runtime(private: bool | None = None):
    """Within it, Inductor compiles C++ through ``private_runtime_compiler`` when ``private`` (or,
    for ``None``, ``MIXSTACK_PRIVATE_CXX_RUNTIME=1``) says so; else nothing changes."""
    if private is None:
        private = config.private_cxx_runtime()
    if not private:
        yield
        return
    import torch._inductor.config as inductor

    with inductor.patch(inductor_configs(True)):
        yield
