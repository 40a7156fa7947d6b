"""What a tuning entry is valid for: the device model, the Triton version, the kernel sources.

An entry measured on one GPU model, one Triton version or one version of the
kernels says nothing about another (a tile on the wrong side of the spill point
runs ~10x slower; BENCHMARKS.md, Floors and ceilings), so every entry carries all
three and is ignored where any differs.  The kernel-source hash of a family's entry
covers the kernel modules that family's runs launch (``Family.kernels``) and
every kernel module those import, found by reading their ``from .x import``
lines: editing a kernel body invalidates the entries that ran it, without
anyone having to remember to bump a version (FlagGems keys its cache the same
way), and leaves the other families' entries standing (an edit to the fused
backward does not void a measured level-3 GEMM config).  Comments, docstrings
and blank lines are left out of the hash (``code_of``), so a corrected comment
does not throw away measured entries; any change to the code does.
"""

from __future__ import annotations

import ast
import datetime as _dt
import functools
import hashlib
import io
import os
import re
import tokenize

import torch

from ..core import config
from ..core.version import __version__

KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")
INTERPRETER_DEVICE = "triton-interpreter"


_RELATIVE_IMPORT = re.compile(rb"^\s*from\s+\.(\w+)\s+import\b", re.MULTILINE)


def kernel_modules(roots, kernels_dir: str | None = None) -> list[str]:
    """File names of the kernel modules ``roots`` (module names) and of every kernel
    module they import, directly or not, in name order."""
    kernels_dir = kernels_dir or KERNELS_DIR
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = os.path.join(kernels_dir, name + ".py")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"kernel module {name!r} not found in {kernels_dir}")
        seen.add(name)
        with open(path, "rb") as fh:
            todo += [m.decode() for m in _RELATIVE_IMPORT.findall(fh.read())]
    return sorted(n + ".py" for n in seen)


def code_of(source: bytes) -> bytes:
    """What a kernel module compiles to, as text: its source without comments, docstrings,
    trailing blanks and empty lines.  A subset of the file's own text, so the same file
    gives the same bytes under every Python version (a dump of the syntax tree would not:
    its fields change between versions)."""
    text = source.decode("utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            doc = body[0]
            first = lines[doc.lineno - 1]
            if first.lstrip()[:1] in "\"'rRbBuU":              # the docstring starts its line
                for i in range(doc.lineno - 1, doc.end_lineno):
                    lines[i] = ""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            if lines[row - 1]:
                lines[row - 1] = lines[row - 1][:col]
    kept = [line.rstrip() for line in lines]
    return "\n".join(line for line in kept if line).encode("utf-8")


def kernel_source_hash(kernels_dir: str | None = None, family: str | None = None) -> str:
    """sha256 over the names and code (``code_of``) of the kernel sources, in name order:
    those of ``family`` (``kernel_modules`` of its ``Family.kernels``), or every ``*.py``
    of the kernels folder when ``family`` is ``None``."""
    kernels_dir = kernels_dir or KERNELS_DIR
    if family is None:
        names = sorted(n for n in os.listdir(kernels_dir) if n.endswith(".py"))
    else:
        from .families import family as family_named
        names = kernel_modules(family_named(family).kernels, kernels_dir)
    h = hashlib.sha256()
    for name in names:
        with open(os.path.join(kernels_dir, name), "rb") as fh:
            data = code_of(fh.read())
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def triton_version() -> str:
    import triton
    return str(getattr(triton, "__version__", "unknown"))


@functools.lru_cache(maxsize=None)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device=None) -> str:
    """The name tables are keyed by: the CUDA device model (``torch.cuda.get_device_name``),
    ``"triton-interpreter"`` for CPU tensors under ``TRITON_INTERPRET``, else ``"cpu"``.

    ``device`` defaults to the current CUDA device where there is one.
    """
    if device is None:
        if torch.cuda.is_available():
            return _cuda_name(torch.cuda.current_device())
        return INTERPRETER_DEVICE if config.triton_interpret() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())
    if config.triton_interpret():
        return INTERPRETER_DEVICE
    return device.type


def current(family: str) -> dict:
    """The validity fields of ``family``'s entries measured now (the device is added by the caller)."""
    return {"triton": triton_version(), "kernel_hash": kernel_source_hash(family=family)}


def stamp(device: str, family: str) -> dict:
    """Validity and provenance fields of a ``family`` entry measured now on ``device``."""
    return {
        "device": device, **current(family), "torch": torch.__version__, "mixstack": __version__,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def stale_reason(entry: dict, device: str, now: dict) -> str | None:
    """Why ``entry`` is not valid for ``device`` and the ``now`` fields of its family's
    ``current()``, or ``None``."""
    if entry.get("device") != device:
        return f"measured on {entry.get('device')!r}, not {device!r}"
    if entry.get("triton") != now["triton"]:
        return f"measured with Triton {entry.get('triton')}, this is Triton {now['triton']}"
    if entry.get("kernel_hash") != now["kernel_hash"]:
        return "measured on other kernel sources (a kernel module its runs launch changed since)"
    return None
