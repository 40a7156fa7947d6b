"""What the compiler makes of the stack's kernels, without a GPU: registers, spills, shared
memory and the instruction mix of each launch, for an NVIDIA architecture (sm_90 by default).

Why: whether a launch config spills, how many programs fit on an SM and what the inner
loops are made of decide the kernels' speed (``BENCHMARKS.md``), and GPU time is scarce.
The launches reported are the real ones: the launchers of ``mixstack.ops.launchers`` run on
``meta`` tensors (nothing is allocated or computed) with every kernel launch recorded
instead of run; each distinct launch is then compiled for the target by Triton with the
``ptxas`` it bundles, and the bundled ``cuobjdump`` / ``nvdisasm`` read the binary.

Specialisation follows Triton's run-time rule for what the launchers pass: pointers are
16-byte aligned (whole tensors), an int argument divisible by 16 is marked so, and an int
equal to 1 is a constant.  The ``ptxas`` is the one of the Triton imported here, which
may differ from the GPU machine's (a report from Triton 3.7 is not the compile of 3.6):
to see what another version makes of the kernels, install its wheel into a folder
(``pip install --no-deps --target DIR triton==X``) and put DIR first on ``PYTHONPATH``.
With Triton 3.6.0 this way the figures matched what the H200 machine reported
(``BENCHMARKS.md``).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import torch

from .ops import conv_launchers, launchers

# SASS opcodes summed by the report (the first dotted part of each instruction).
COUNTED = ("FFMA", "HMMA", "HGMMA", "LDS", "STS", "LDSM", "LDG", "STG", "LDGSTS", "BAR", "SHFL", "MUFU")


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the kernel, its runtime arguments and its keyword arguments
    (constexprs, ``num_warps``, ``num_stages``)."""

    kernel: object
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


@dataclass
class Report:
    """Resources of one compiled launch.  ``spill_bytes``: per-thread stack frame and local
    memory (where ptxas spills registers; the kernels call no functions that keep a frame);
    ``shared``: bytes per program; ``sass``: instruction counts by opcode over
    the whole kernel (every loop body counted once)."""

    name: str
    config: dict
    registers: int
    spill_bytes: int
    shared: int
    num_warps: int
    sass: dict = field(default_factory=dict)

    def programs_per_sm(self, registers_per_sm: int = 65536, max_threads: int = 2048,
                        shared_per_sm: int = 228 * 1024) -> int:
        """Programs an SM holds by registers, threads and shared memory (H100/H200 limits by
        default; register allocation granularity ignored)."""
        threads = 32 * self.num_warps
        by_regs = registers_per_sm // max(1, self.registers * threads)
        by_shared = shared_per_sm // self.shared if self.shared else by_regs
        return max(0, min(by_regs, max_threads // threads, by_shared))


def record_launches(run, *args, **kwargs) -> list[Launch]:
    """Run ``run(*args, **kwargs)`` (a launcher of ``mixstack.ops.launchers`` or
    ``conv_launchers``, on meta tensors) with
    every kernel launch recorded instead of run; the launches, in order."""
    launches: list[Launch] = []

    def recorder(kernel):
        class _Grid:
            def __getitem__(self, grid):
                def call(*a, **kw):
                    launches.append(Launch(kernel, a, kw))
                return call
        return _Grid()

    modules = (launchers, conv_launchers)
    real = [m.wrap_triton for m in modules]
    for m in modules:
        m.wrap_triton = recorder
    try:
        run(*args, **kwargs)
    finally:
        for m, r in zip(modules, real):
            m.wrap_triton = r
    return launches


def stack_launches(layout, n_focus: int, apply_alpha: bool = True, *, n_layers: int = 4,
                   edges: int = 300003, gemm_cfg=None, fused_cfg=None,
                   compensated: bool = False) -> list[Launch]:
    """The launches of one forward and one backward of the stack (``launchers.stack_forward`` /
    ``stack_backward``) for this layout and configs, recorded on meta tensors."""
    meta = dict(device="meta", dtype=torch.float32)
    u0 = torch.empty((n_focus, edges, layout.row), **meta)
    alpha = torch.empty((edges, n_focus), **meta)
    w0 = torch.empty((n_layers, n_focus, layout.m0, layout.m0), **meta)
    w1 = torch.empty((n_layers, n_focus, layout.m1, layout.m1), **meta)
    gw = torch.empty((n_layers - 1, n_focus, layout.focus_dim, layout.gate_width), **meta)
    out = []
    out += record_launches(launchers.stack_forward, u0, alpha, w0, w1, gw, layout, apply_alpha,
                           gemm_cfg, compensated=compensated)
    grad_out = torch.empty((edges, n_focus, layout.row), **meta)
    y = torch.empty((edges, n_focus, layout.row) if apply_alpha else (0,), **meta)
    z = torch.empty((n_layers - 1, n_focus, edges, layout.row), **meta)
    out += record_launches(launchers.stack_backward, grad_out, y, z, alpha, w0, w1, gw, layout,
                           apply_alpha, gemm_cfg, fused_cfg, compensated=compensated)
    return out


def conv_launches(layout, n_focus: int, *, edges: int = 409688, atoms: int = 4608) -> list[Launch]:
    """The launches of ``rotate_in`` and ``rotate_out_sum``, forward and backward with every
    gradient (``conv_launchers``), with the edge scalar and edge weights, on meta tensors."""
    meta = dict(device="meta", dtype=torch.float32)
    s, c = (layout.lmax + 1) ** 2, layout.focus_dim
    x = torch.empty((atoms, s, c), **meta)
    wigner = torch.empty((edges, 3, s), **meta)
    wide = torch.empty((edges, n_focus, 3 * layout.lmax + 2, c), **meta)
    radial, scalar_weight = wide[:, :, :2 * layout.lmax + 1], wide[:, :, 2 * layout.lmax + 1:]
    index = torch.empty((edges,), dtype=torch.int64, device="meta")
    h, ew = torch.empty((edges, c), **meta), torch.empty((edges,), **meta)
    out = record_launches(conv_launchers.rotate_in_forward, x, wigner, radial, index, h, scalar_weight, ew, layout)
    out += record_launches(conv_launchers.rotate_in_backward, torch.empty((n_focus, edges, layout.row), **meta), x,
                           wigner, radial, index, h, scalar_weight, ew, layout, (True,) * 6)
    y = torch.empty((edges, n_focus, layout.row), **meta)
    out += record_launches(conv_launchers.rotate_out_forward, y, wigner, index, ew, atoms, layout, True)
    out += record_launches(conv_launchers.rotate_out_backward, x, torch.empty((edges, 1, layout.row), **meta),
                           wigner, index, ew, layout, (True,) * 3)
    return out


_OPTIONS = ("num_warps", "num_stages")
_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float64: "*fp64",
          torch.int64: "*i64", torch.int32: "*i32"}


def source_args(launch: Launch):
    """Triton's ``ASTSource`` pieces for ``launch``: signature, constexprs, attrs."""
    import inspect
    names = list(inspect.signature(launch.kernel.fn).parameters)
    values = dict(zip(names, launch.args))
    values.update({k: v for k, v in launch.kwargs.items() if k not in _OPTIONS})
    missing = [n for n in names if n not in values]
    if missing:
        raise ValueError(f"{launch.name}: no value recorded for {', '.join(missing)}")
    constexpr_names = {n for n in names if n in launch.kwargs}
    signature, constexprs, attrs = {}, {}, {}
    for i, n in enumerate(names):
        v = values[n]
        if n in constexpr_names:
            signature[n] = "constexpr"
            constexprs[(i,)] = v
        elif isinstance(v, torch.Tensor):
            signature[n] = _TYPES[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            signature[n] = "i1"
        elif isinstance(v, int):
            if v == 1 and n not in getattr(launch.kernel, "do_not_specialize", ()):
                signature[n] = "constexpr"
                constexprs[(i,)] = 1
                continue
            signature[n] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            signature[n] = "fp32"                   # Triton's run-time type of a Python float
        else:
            raise TypeError(f"{launch.name}: cannot type argument {n}={v!r}")
    return signature, constexprs, attrs


def _tool(name: str) -> str:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name} is not bundled with this Triton ({path})")
    return path


def tools_available() -> bool:
    """Whether this Triton bundles ptxas, cuobjdump and nvdisasm (Linux x86-64 wheels do)."""
    try:
        for t in ("ptxas", "cuobjdump", "nvdisasm"):
            _tool(t)
    except FileNotFoundError:
        return False
    return True


_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_OP = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", re.MULTILINE)


def compile_report(launch: Launch, arch: int = 90) -> Report:
    """Compile ``launch`` for ``sm_<arch>`` and read its resources and instruction mix."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature, constexprs, attrs = source_args(launch)
    src = ASTSource(launch.kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {k: launch.kwargs[k] for k in _OPTIONS if k in launch.kwargs}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    m = _RES.search(res)
    if m is None:
        raise RuntimeError(f"{launch.name}: no resource line in cuobjdump's output:\n{res}")
    regs, stack, shared, local = map(int, m.groups())
    ops = collections.Counter(op for op in _OP.findall(sass))
    config = {k: v for k, v in launch.kwargs.items() if k.startswith("BLOCK") or k in _OPTIONS}
    return Report(launch.name, config, regs, stack + local, max(shared, compiled.metadata.shared),
                  launch.kwargs.get("num_warps", 4), {k: ops.get(k, 0) for k in COUNTED})


def distinct(launches: list[Launch]) -> list[Launch]:
    """One launch per distinct compile (kernel, constexprs, options), in first-seen order."""
    seen, out = set(), []
    for launch in launches:
        ident = (launch.name, tuple(sorted((k, repr(v)) for k, v in launch.kwargs.items())))
        if ident not in seen:
            seen.add(ident)
            out.append(launch)
    return out
