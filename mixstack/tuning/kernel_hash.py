"""The kernel-source hash: which code a tuning entry was measured on, function by function.

A family's entries were measured by running its root kernels (``Family.kernels``, as
``"module.function"`` of ``mixstack/kernels``).  What those runs compiled is the code of each
root and of every ``@triton.jit`` helper and module constant it reaches, read statically from
the kernel files: the names a function's body uses, resolved through its module's own
definitions and its ``from .x import y`` lines.  The hash covers the name and the code
(``code_of``: no comments, docstrings or blank lines) of each function and constant reached,
and nothing else.  So editing a kernel voids the entries that ran it, while moving a helper to
another module, factoring a shared helper out of a kernel that does not call it, or editing a
kernel no root reaches leaves the entries standing.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import os
import tokenize

KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")


def code_of(source: bytes) -> bytes:
    """What a piece of kernel source compiles to, as text: the source without comments,
    docstrings, trailing blanks and empty lines.  A subset of the file's own text, so the same
    file gives the same bytes under every Python version (a dump of the syntax tree would not:
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


class KernelModule:
    """One kernel file read statically: its top-level functions and constants (name -> code,
    and the names each one's body uses) and what its ``from .x import y`` lines bring in."""

    def __init__(self, path: str):
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
        lines = text.splitlines(keepends=True)
        self.defs: dict[str, tuple[bytes, set[str]]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}     # local name -> (module, name or None)
        for node in ast.parse(text).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                for a in node.names:
                    if node.module:
                        self.imports[a.asname or a.name] = (node.module, a.name)
                    else:
                        self.imports[a.asname or a.name] = (a.name, None)       # from . import mod
            elif isinstance(node, (ast.FunctionDef, ast.Assign, ast.AnnAssign)):
                start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                code = code_of("".join(lines[start - 1: node.end_lineno]).encode("utf-8"))
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                used |= {f"{n.value.id}.{n.attr}" for n in ast.walk(node)
                         if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
                for name in _targets(node):
                    self.defs[name] = (code, used - {name})


def _targets(node) -> list[str]:
    if isinstance(node, ast.FunctionDef):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t.id for t in targets if isinstance(t, ast.Name)]


@functools.lru_cache(maxsize=None)
def _read(kernels_dir: str, module: str, stamp: float) -> KernelModule:
    return KernelModule(os.path.join(kernels_dir, module + ".py"))


def _module(kernels_dir: str, module: str) -> KernelModule:
    path = os.path.join(kernels_dir, module + ".py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"kernel module {module!r} not found in {kernels_dir}")
    return _read(kernels_dir, module, os.stat(path).st_mtime_ns)


def _resolve(kernels_dir: str, module: str, name: str) -> tuple[str, str] | None:
    """Where ``name``, as used in ``module``, is defined: ``(module, name)``, or ``None`` for a
    name that is not a kernel file's (``tl``, ``triton``, a builtin, a local variable)."""
    mod = _module(kernels_dir, module)
    head, _, attr = name.partition(".")
    if attr:                                   # mod.fn where ``from . import mod``
        src = mod.imports.get(head)
        return _resolve(kernels_dir, src[0], attr) if src and src[1] is None else None
    if name in mod.defs:
        return module, name
    if name in mod.imports and mod.imports[name][1] is not None:
        return _resolve(kernels_dir, *mod.imports[name])
    return None


def closure(roots, kernels_dir: str | None = None) -> dict[str, bytes]:
    """``"module.name"`` -> code of every function and constant ``roots`` (``"module.name"``)
    reach through the names their bodies use, the roots included."""
    kernels_dir = kernels_dir or KERNELS_DIR
    found: dict[str, bytes] = {}
    todo = []
    for root in roots:
        module, _, name = root.rpartition(".")
        where = _resolve(kernels_dir, module, name)
        if where is None:
            raise LookupError(f"kernel {root!r}: no {name!r} defined in {module}.py or imported there")
        todo.append(where)
    while todo:
        module, name = todo.pop()
        key = f"{module}.{name}"
        if key in found:
            continue
        code, used = _module(kernels_dir, module).defs[name]
        found[key] = code
        todo += [w for w in (_resolve(kernels_dir, module, u) for u in used) if w is not None]
    return found


def every_function(kernels_dir: str | None = None) -> list[str]:
    """``"module.name"`` of every top-level definition of every kernel file."""
    kernels_dir = kernels_dir or KERNELS_DIR
    names = sorted(n[:-3] for n in os.listdir(kernels_dir) if n.endswith(".py") and n != "__init__.py")
    return [f"{m}.{d}" for m in names for d in _module(kernels_dir, m).defs]


def kernel_hash(roots, kernels_dir: str | None = None) -> str:
    """sha256 over the name and code of everything ``roots`` reach, in name order.  The module
    a definition lives in is not hashed: moving a helper between files keeps the hash."""
    h = hashlib.sha256()
    for name, code in sorted((k.rpartition(".")[2], v) for k, v in closure(roots, kernels_dir).items()):
        h.update(name.encode() + b"\0" + str(len(code)).encode() + b"\0" + code)
    return h.hexdigest()


def root_of(kernel) -> str:
    """``"module.name"`` of a kernel object (``@triton.jit`` or interpreted) of mixstack/kernels."""
    fn = getattr(kernel, "fn", kernel)
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
