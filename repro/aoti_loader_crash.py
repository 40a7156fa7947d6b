"""AOTInductor's loader on one machine: package a ``torch.nn.Linear`` and load it every way torch offers.

On the lent H200 machine (torch 2.11.0+cu130) ``torch._inductor.aoti_load_package`` killed the
process with no Python traceback.  This reproducer packages the smallest model there is and then
tries each loading path in a subprocess of its own, with ``faulthandler`` on, so that a crash in
one is reported (exit status, signal, the Python stack faulthandler prints, the last lines of
stderr) and the others still run:

* ``load``: ``torch._inductor.aoti_load_package`` (what ``mixstack.load`` and deepmd-kit call);
* ``loader``: ``torch._C._aoti.AOTIModelPackageLoader`` directly;
* ``dlopen``: the package's compiled ``.so`` opened with ``ctypes`` alone (its static
  initialisers and the libraries it links, nothing of torch's loader);
* ``runner``: that ``.so`` through ``torch._C._aoti.AOTIModelContainerRunnerCuda`` (or ``Cpu``);
* ``cpu``: the same model packaged and loaded for the CPU;
* ``load`` again with ``LD_PRELOAD`` set to the C++ compiler's own ``libstdc++.so.6`` (the one
  the package was built against), in case the process loads another first;
* ``load`` of the package linked with a private copy of libstdc++ whose symbols stay inside it
  (``-static-libstdc++ -Wl,--exclude-libs,ALL`` through a wrapper of the compiler as Inductor's
  ``cpp.cxx``): the package then runs the C++ runtime it was compiled against;
* ``load`` of the CUDA package built by each other C++ compiler on PATH (``clang++``, another
  ``g++``), through Inductor's ``cpp.cxx``;
* ``regex``: no AOTInductor at all: a ten-line shared library built by the same compiler that
  compiles the ``std::regex`` the model's constructor compiles (``parse_device_str``), opened
  after ``import torch`` and called; ``regex-static`` the same library linked with
  ``-static-libstdc++`` (its own copy of libstdc++, symbols visible), ``regex-private`` with them
  hidden as well (``-Wl,--exclude-libs,ALL``).  If ``regex`` crashes too, the fault is the
  process's C++ runtime against the compiler's, not the package.

Before loading it prints what the package was built with and what the process runs with: the
C++ compiler Inductor called, the ``libstdc++`` that compiler links, the ``libstdc++`` a Python
process holds after ``import torch``, the newest ``GLIBCXX`` version each provides, and ``ldd``
of the package's ``.so``, and how many of libstdc++'s locale symbols that ``.so`` defines itself.

    python repro/aoti_loader_crash.py [--out DIR]          # every path, a summary at the end
    python repro/aoti_loader_crash.py --step load --package DIR/linear-cuda.pt2   # one path, in-process

A backtrace below Python: ``cuda-gdb -batch -ex run -ex bt --args python3 repro/aoti_loader_crash.py
--step load --package DIR/linear-cuda.pt2`` (cuda-gdb debugs host code too; the machine has no gdb).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import glob
import os
import signal
import subprocess
import sys
import tempfile
import zipfile

STEPS = ("load", "loader", "dlopen", "runner", "regex", "regex-static", "regex-private")

REGEX_SOURCE = r"""
#include <regex>
#include <string>
extern "C" int device_index(const char* s) {
  std::regex re("(cpu|cuda|xpu|mps)(:([0-9]+))?");
  std::smatch sm;
  std::string str(s);
  if (!std::regex_match(str, sm, re)) return -2;
  return sm[3].matched ? std::stoi(sm[3].str()) : -1;
}
"""


def package(out: str, device: str, cxx: str | None = None) -> str:
    """The ``nn.Linear`` packaged for ``device`` (``cxx``: built by that C++ compiler instead of
    Inductor's default)."""
    import torch

    model = torch.nn.Linear(16, 16).to(device)
    example = (torch.randn(4, 16, device=device),)
    program = torch.export.export(model, example)
    tag = "" if cxx is None else "-" + os.path.basename(cxx).replace("+", "x")
    path = os.path.join(out, f"linear-{device}{tag}.pt2")
    if cxx is None:
        torch._inductor.aoti_compile_and_package(program, package_path=path)
    else:
        with torch._inductor.config.patch({"cpp.cxx": (cxx,)}):
            torch._inductor.aoti_compile_and_package(program, package_path=path)
    return path


PRIVATE_LIBSTDCXX = """#!/bin/sh
# {cxx}, but a shared library it links gets a private copy of libstdc++ whose symbols stay inside it
case " $* " in
  *" -shared "*) exec {cxx} "$@" -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL ;;
  *) exec {cxx} "$@" ;;
esac
"""


def private_libstdcxx_compiler(folder: str, cxx: str) -> str:
    """A wrapper of ``cxx`` (for Inductor's ``cpp.cxx``) that links each shared library with its
    own copy of libstdc++, its symbols hidden (``--exclude-libs``): the package's C++ runtime is
    then the one it was compiled against, whatever ``libstdc++`` the process loaded first.  (A
    private copy whose symbols stay visible is what ``regex-static`` shows crashing.)"""
    path = os.path.join(folder, "g++-private-libstdc++")
    with open(path, "w") as f:
        f.write(PRIVATE_LIBSTDCXX.format(cxx=cxx))
    os.chmod(path, 0o755)
    return path


def other_compilers(default: str) -> list[str]:
    """The C++ compilers on PATH other than Inductor's default (by the file they resolve to)."""
    import shutil

    seen, found = {os.path.realpath(shutil.which(default) or default)}, []
    for name in ("clang++", "g++-14", "g++-13", "g++-12", "g++-11", "g++", "c++"):
        where = shutil.which(name)
        if where and os.path.realpath(where) not in seen:
            seen.add(os.path.realpath(where))
            found.append(where)
    return found


def _extract(path: str) -> tuple[str, str]:
    """The package unpacked next to it: ``(folder, the model's .so)``."""
    folder = path + ".unpacked"
    with zipfile.ZipFile(path) as z:
        z.extractall(folder)
    (so,) = glob.glob(os.path.join(folder, "**", "*.so"), recursive=True)
    return folder, so


def step(name: str, path: str) -> None:
    """One loading path, in this process; prints ``OK <what>`` when it ran a forward."""
    faulthandler.enable()
    import torch

    device = "cuda" if "cuda" in os.path.basename(path) else "cpu"
    x = torch.randn(4, 16, device=device)
    if name == "load":
        out = torch._inductor.aoti_load_package(path)(x)
    elif name == "loader":
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        out = loader.run([x])[0]
    elif name == "dlopen":
        _, so = _extract(path)
        ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
        print(f"OK dlopen {so}", flush=True)
        return
    elif name.startswith("regex"):
        lib = ctypes.CDLL(_regex_library(os.path.dirname(path), static=name.partition("-")[2]))
        print(f"OK {name}: device_index('cuda:3') = {lib.device_index(b'cuda:3')}", flush=True)
        return
    elif name == "runner":
        folder, so = _extract(path)
        if device == "cuda":
            runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, device, os.path.dirname(so))
        else:
            runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
        out = runner.run([x])[0]
    else:
        raise ValueError(f"--step must be one of {', '.join(STEPS)}, got {name!r}")
    torch.cuda.synchronize() if device == "cuda" else None
    print(f"OK {name}: output {tuple(out.shape)} finite={bool(torch.isfinite(out).all())}", flush=True)


def _regex_library(folder: str, static: str = "") -> str:
    """``REGEX_SOURCE`` built by Inductor's C++ compiler into ``folder`` (``static``: with its
    own copy of libstdc++, its symbols visible ("static") or hidden ("private"))."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    src = os.path.join(folder, "regex_probe.cpp")
    lib = os.path.join(folder, f"regex_probe{'_' + static if static else ''}.so")
    with open(src, "w") as f:
        f.write(REGEX_SOURCE)
    flags = {"": "", "static": "-static-libstdc++ -static-libgcc",
             "private": "-static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL"}[static]
    built = subprocess.run(f"{get_cpp_compiler()} -std=c++17 -O2 -shared -fPIC {flags} {src} -o {lib}",
                           shell=True, capture_output=True, text=True)
    if built.returncode:
        raise RuntimeError(f"building {lib} failed: {built.stderr.strip()}")
    return lib


def _locale_exporters() -> str:
    """The libraries of a process after ``import torch`` that export libstdc++'s locale facet
    ids (``std::collate<char>::id``, ``std::ctype<char>::id``): more than one means two copies
    of the locale machinery, and which one a lookup binds to depends on load order."""
    script = ("import torch, re, subprocess\n"
              "libs = sorted({m for m in re.findall(r'(/\\S+\\.so[.0-9]*)', open('/proc/self/maps').read())})\n"
              "for lib in libs:\n"
              "    out = subprocess.run(['nm', '-D', '--defined-only', lib], capture_output=True, text=True).stdout\n"
              "    n = sum(s in out for s in ('_ZNSt7collateIcE2idE', '_ZNSt5ctypeIcE2idE'))\n"
              "    print(f'  {lib}: {n}') if n else None\n")
    return _sh(f"{sys.executable} -c \"{script}\"") or "  none found"


def _sh(cmd: str) -> str:
    proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return (proc.stdout + proc.stderr).strip()


def _newest_glibcxx(lib: str) -> str:
    found = _sh(f"strings {lib} 2>/dev/null | grep -E '^GLIBCXX_[0-9.]+$' | sort -V | tail -n 1")
    return found or "?"


def diagnose(so: str) -> str:
    """The C++ toolchain the package was built with, against the one a torch process runs with."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = get_cpp_compiler()
    built = os.path.realpath(_sh(f"{cxx} -print-file-name=libstdc++.so.6"))
    loaded = _sh(f"{sys.executable} -c \"import torch, re; print(*sorted(set(re.findall(r'\\S*libstdc\\+\\+\\S*', "
                 f"open('/proc/self/maps').read()))))\"")
    lines = [f"C++ compiler Inductor calls: {cxx}: {_sh(f'{cxx} --version').splitlines()[0]}",
             f"its libstdc++: {built} (newest {_newest_glibcxx(built)})",
             f"libstdc++ in a torch process: {loaded} (newest "
             f"{', '.join(_newest_glibcxx(os.path.realpath(x)) for x in loaded.split()) or '?'})",
             "ldd of the package's .so:\n  " + _sh(f"ldd {so}").replace("\n", "\n  "),
             "libstdc++ locale symbols the package's .so defines itself (a static copy, if many): "
             + _sh("nm -DC --defined-only " + so + " | grep -c -E 'std::(locale|codecvt|collate|ctype)'"),
             "libraries of a torch process that export libstdc++'s locale facet ids (more than one: two "
             "copies):\n" + _locale_exporters()]
    return "\n".join(lines)


def _run_step(name: str, path: str, preload: str | None = None) -> str:
    env = dict(os.environ, LD_PRELOAD=preload) if preload else None
    proc = subprocess.run([sys.executable, __file__, "--step", name, "--package", path],
                          capture_output=True, text=True, timeout=600, env=env)
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
    tail = "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
    label = f"{name} ({os.path.basename(path)}{', LD_PRELOAD=' + preload if preload else ''})"
    return f"{label}: {how}\n    {tail}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the packages (default: a new temporary one)")
    p.add_argument("--step", choices=STEPS, help="run one loading path in this process")
    p.add_argument("--package", help="the .pt2 of --step")
    p.add_argument("--devices", default="cuda,cpu", help="packages to build (default cuda,cpu)")
    args = p.parse_args(argv)
    if args.step:
        step(args.step, args.package)
        return 0
    import torch

    out = args.out or tempfile.mkdtemp(prefix="aoti-")
    os.makedirs(out, exist_ok=True)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}", flush=True)
    results = []
    for device in args.devices.split(","):
        if device == "cuda" and not torch.cuda.is_available():
            results.append("cuda: skipped, no GPU")
            continue
        path = package(out, device)
        with zipfile.ZipFile(path) as z:
            print(f"packaged {path}:\n  " + "\n  ".join(f"{i.filename} {i.file_size}" for i in z.infolist()),
                  flush=True)
        so = _extract(path)[1]
        print(diagnose(so), flush=True)
        for name in STEPS:
            results.append(_run_step(name, path))
            print(results[-1], flush=True)
        from torch._inductor.cpp_builder import get_cpp_compiler
        own = os.path.realpath(_sh(f"{get_cpp_compiler()} -print-file-name=libstdc++.so.6"))
        results.append(_run_step("load", path, preload=own))
        print(results[-1], flush=True)
        try:                                          # the package with a private, hidden libstdc++
            private = package(out, device, private_libstdcxx_compiler(out, get_cpp_compiler()))
        except Exception as exc:
            results.append(f"package with a private libstdc++: failed ({type(exc).__name__}: {str(exc)[:300]})")
        else:
            results.append(_run_step("load", private))
        print(results[-1], flush=True)
        if device == "cuda":                          # the same package from each other compiler
            for cxx in other_compilers(get_cpp_compiler()):
                try:
                    other = package(out, device, cxx)
                except Exception as exc:             # a compiler Inductor cannot drive: say so, go on
                    results.append(f"package with {cxx}: failed ({type(exc).__name__}: {str(exc)[:200]})")
                else:
                    results.append(_run_step("load", other))
                print(results[-1], flush=True)
    print("\nsummary:\n" + "\n".join(r.splitlines()[0] for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
