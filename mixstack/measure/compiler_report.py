"""What the compiler makes of the stack's kernels, without a GPU: registers, spills, shared
memory and the instruction mix of each launch, for an NVIDIA architecture (sm_90 by default).

Why: whether a launch config spills, how many programs fit on an SM and what the inner
loops are made of decide the kernels' speed (BENCHMARKS.md, "What the compiler makes of it"),
and GPU time is scarce.
The launches reported are the real ones: the launchers of ``mixstack.stack.launchers`` run on
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
(BENCHMARKS.md, "Floors and ceilings").
"""

from __future__ import annotations

import collections
import glob
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import torch

from ..conv import launchers as conv_launchers
from ..stack import blas, gemm, launchers, training
from ..stack.values import Saved, StackSpec, Weights

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


# Every module that launches a kernel (through ``torch.library.wrap_triton``): what recording
# launches, here and in the tests, patches.
LAUNCHING_MODULES = (launchers, gemm, blas, training, conv_launchers)


def record_launches(run, *args, **kwargs) -> list[Launch]:
    """Run ``run(*args, **kwargs)`` (a launcher of ``mixstack.stack.launchers`` or
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

    modules = LAUNCHING_MODULES
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
    weights, spec = Weights(w0, w1, gw), StackSpec(layout, apply_alpha)
    out = []
    out += record_launches(launchers.stack_forward, u0, alpha, weights, spec,
                           launchers.LaunchPlan(gemm_cfg, compensated=compensated))
    grad_out = torch.empty((edges, n_focus, layout.row), **meta)
    y = torch.empty((edges, n_focus, layout.row) if apply_alpha else (0,), **meta)
    z = torch.empty((n_layers - 1, n_focus, edges, layout.row), **meta)
    out += record_launches(launchers.stack_backward, grad_out, Saved(z, y, alpha), weights, spec,
                           launchers.LaunchPlan(gemm_cfg, fused_cfg, compensated))
    return out


def conv_launches(layout, n_focus: int, *, edges: int = 409688, atoms: int = 4608) -> list[Launch]:
    """The launches of ``rotate_in`` (with the radial weights as a tensor and as a linear layer
    of 32 hidden features) and ``rotate_out_sum``, forward and backward with every gradient
    (``conv_launchers``), with the edge scalar and edge weights, on meta tensors."""
    meta = dict(device="meta", dtype=torch.float32)
    s, c = (layout.lmax + 1) ** 2, layout.focus_dim
    x = torch.empty((atoms, s, c), **meta)
    wigner = torch.empty((edges, 3, s), **meta)
    wide = torch.empty((edges, n_focus, 3 * layout.lmax + 2, c), **meta)
    radial, scalar_weight = wide[:, :, :2 * layout.lmax + 1], wide[:, :, 2 * layout.lmax + 1:]
    index = torch.empty((edges,), dtype=torch.int64, device="meta")
    h, ew = torch.empty((edges, c), **meta), torch.empty((edges,), **meta)
    grad_u = torch.empty((n_focus, edges, layout.row), **meta)
    out = record_launches(conv_launchers.rotate_in_forward, x, wigner, radial, index, h, scalar_weight, ew, layout,
                          n_focus)
    out += record_launches(conv_launchers.rotate_in_backward, grad_u, x, wigner, radial, index, h, scalar_weight, ew,
                           layout, (True,) * 6)
    hidden_dim = 32                            # the potential's radial network's hidden width
    linear = (torch.empty((edges, hidden_dim), **meta),
              torch.empty((n_focus, 3 * layout.lmax + 2, c, hidden_dim), **meta),
              torch.empty((n_focus, 3 * layout.lmax + 2, c), **meta))
    out += record_launches(conv_launchers.rotate_in_forward, x, wigner, None, index, h, None, ew, layout, n_focus,
                           linear=linear)
    out += record_launches(conv_launchers.rotate_in_backward, grad_u, x, wigner, None, index, h, None, ew, layout,
                           (True, True, True, True, False, True), linear=linear)
    y = torch.empty((edges, n_focus, layout.row), **meta)
    out += record_launches(conv_launchers.rotate_out_forward, y, wigner, index, ew, atoms, layout, True)
    out += record_launches(conv_launchers.rotate_out_backward, x, torch.empty((edges, 1, layout.row), **meta),
                           wigner, index, ew, layout, (True,) * 3)
    return out


def training_launches(layout, n_focus: int, apply_alpha: bool = True, *, n_layers: int = 4,
                      edges: int = 300003, gemm_cfg=None, wgrad_cfg=None, compensated: bool = False,
                      wgrad_compensated: bool = False) -> list[Launch]:
    """The launches a training step adds to ``stack_launches``: the first backward that keeps its
    chain, the double backward with its weight reductions, and the forward's backward with the
    weight reductions and the double backward's cotangents of z and y (``stack.training``),
    recorded on meta tensors."""
    meta = dict(device="meta", dtype=torch.float32)
    shape = (n_focus, edges, layout.row)
    w0 = torch.empty((n_layers, n_focus, layout.m0, layout.m0), **meta)
    w1 = torch.empty((n_layers, n_focus, layout.m1, layout.m1), **meta)
    gw = torch.empty((n_layers - 1, n_focus, layout.focus_dim, layout.gate_width), **meta)
    alpha = torch.empty((edges, n_focus), **meta)
    grad_out = torch.empty((edges, n_focus, layout.row), **meta)
    y = torch.empty((edges, n_focus, layout.row) if apply_alpha else (0,), **meta)
    z = torch.empty((n_layers - 1,) + shape, **meta)
    u0, v = torch.empty(shape, **meta), torch.empty(shape, **meta)
    w = torch.empty((edges, n_focus), **meta)
    weights, spec = Weights(w0, w1, gw), StackSpec(layout, apply_alpha)
    plan = launchers.LaunchPlan(gemm_cfg, compensated=compensated)
    wgrad = training.WgradPlan(wgrad_cfg, wgrad_compensated)
    out = record_launches(training.backward_chain, grad_out, Saved(z, y, alpha), weights, spec, plan)
    chain = torch.empty_like(z)
    out += record_launches(training.double_backward, v, w, grad_out, Saved(z, y, alpha), chain, weights, spec,
                           plan, wgrad)
    out += record_launches(training.backward_with_weights, grad_out, Saved(z, y, alpha, u0), weights, spec,
                           plan, wgrad, grad_z=torch.empty_like(z),
                           grad_y=torch.empty_like(grad_out) if apply_alpha else None)
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


def cubin_resources(compiled, sass: bool = False) -> dict:
    """A kernel compiled by ``triton.compile`` (Triton or Gluon), read from its cubin with the
    bundled ``cuobjdump`` (and ``nvdisasm`` with ``sass``): ``registers`` per thread,
    ``spill_bytes`` (stack and local), ``shared_bytes`` (the larger of the binary's static
    figure and Triton's dynamic one), ``warps`` (partitions included) and ``sass`` ("" without)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as fh:
            fh.write(compiled.asm["cubin"])
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                             check=True).stdout
        text = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout if sass else ""
    m = _RES.search(res)
    if m is None:
        raise RuntimeError(f"no resource line in cuobjdump's output:\n{res}")
    regs, stack, shared, local = map(int, m.groups())
    return {"registers": regs, "spill_bytes": stack + local, "shared_bytes": max(shared, compiled.metadata.shared),
            "warps": getattr(compiled.metadata, "num_warps", None), "sass": text}


def compile_report(launch: Launch, arch: int = 90, sass: bool = True, opcodes=COUNTED) -> Report:
    """Compile ``launch`` for ``sm_<arch>`` and read its resources and instruction mix
    (``sass=False``: resources only, without disassembling; ``opcodes``: the SASS opcodes counted)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature, constexprs, attrs = source_args(launch)
    src = ASTSource(launch.kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {k: launch.kwargs[k] for k in _OPTIONS if k in launch.kwargs}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    try:
        res = cubin_resources(compiled, sass=sass)
    except RuntimeError as err:
        raise RuntimeError(f"{launch.name}: {err}") from None
    regs, spills, shared, sass = res["registers"], res["spill_bytes"], res["shared_bytes"], res.pop("sass")
    ops = collections.Counter(op for op in _OP.findall(sass))
    config = {k: v for k, v in launch.kwargs.items() if k.startswith("BLOCK") or k in _OPTIONS}
    # The compiled warp count: warp specialisation adds its partitions' warps to num_warps.
    warps = getattr(compiled.metadata, "num_warps", None) or launch.kwargs.get("num_warps", 4)
    return Report(launch.name, config, regs, spills, shared,
                  warps, {k: ops.get(k, 0) for k in opcodes})


def distinct(launches: list[Launch]) -> list[Launch]:
    """One launch per distinct compile (kernel, constexprs, options), in first-seen order."""
    seen, out = set(), []
    for launch in launches:
        ident = (launch.name, tuple(sorted((k, repr(v)) for k, v in launch.kwargs.items())))
        if ident not in seen:
            seen.add(ident)
            out.append(launch)
    return out


# ---------------------------------------------------------------- the whole supported grid

# What "no collapse" means for one compiled launch (tests/test_compiler_grid.py; BENCHMARKS.md,
# "The register collapse over the whole grid (offline)"):
# - no register fallback: ptxas spilling while holding only 32 registers is not register
#   pressure but its allocator giving up (the old Cf 80-128 gate kernels at lmax 1);
# - spills of at most SPILL_BOUND bytes per thread: above the largest spill among the launches
#   the shipped H200 table's winners make, with room for another Triton version's allocator,
#   and far below the collapses.  (An 8-byte frame is a local slot, not a collapse.)
SPILL_BOUND = 128
FALLBACK_REGISTERS = 32
GRID_FOCUS_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
GRID_LMAX = (1, 2, 3, 4, 5, 6)
GRID_EDGES = 300003          # not a multiple of 16: the specialisation of most real edge counts
# The kernels whose every launch over the grid the committed snapshot holds: the gate
# kernels, where every collapse was (every kernel's launches, the GEMMs' too, are in a second
# snapshot that takes far longer to build: ``scripts/compiler_grid.py --all``).
GRID_KERNELS = ("gate_kernel", "gate_backward_kernel")


@dataclass(frozen=True)
class GridCase:
    """One (Cf, lmax, F) of the grid on one path with one GEMM launch config (``None``: the
    level-1 default); ``source`` says where the config comes from."""

    focus_dim: int
    lmax: int
    n_focus: int
    compensated: bool
    config: tuple = ()          # sorted (field, value) pairs; () = the default
    source: str = "default"

    @property
    def gemm_cfg(self) -> dict | None:
        return dict(self.config) or None

    def label(self) -> str:
        cfg = " ".join(f"{k.replace('BLOCK_', '').replace('num_', '')}{v}" for k, v in self.config) or "default"
        return (f"Cf{self.focus_dim} l{self.lmax} F{self.n_focus} "
                f"{'compensated' if self.compensated else 'exact'} {cfg}")


def case_launches(case: GridCase, edges: int = GRID_EDGES, kernels=None) -> list[Launch]:
    """The distinct launches of one forward and backward of ``case`` (``kernels``: only those
    kernels, by name)."""
    from ..core.layout import StackLayout
    out = distinct(stack_launches(StackLayout(case.lmax, case.focus_dim), case.n_focus, True, edges=edges,
                                  gemm_cfg=case.gemm_cfg, compensated=case.compensated))
    return [x for x in out if kernels is None or x.name in kernels]


def launch_identity(launch: Launch) -> str:
    """A short stable name of what Triton compiles for ``launch`` (kernel, argument types and
    specialisation, constexprs, options): two launches with the same identity are one compile."""
    import hashlib
    signature, constexprs, attrs = source_args(launch)
    options = {k: launch.kwargs[k] for k in _OPTIONS if k in launch.kwargs}
    text = repr((launch.name, sorted(signature.items()), sorted(constexprs.items()),
                 sorted((k, repr(v)) for k, v in attrs.items()), sorted(options.items())))
    return launch.name + ":" + hashlib.sha256(text.encode()).hexdigest()[:16]


def collapse_reason(report: dict, spill_bound: int = SPILL_BOUND) -> str | None:
    """Why a compiled launch (``Report`` fields as a dict) breaks the grid's rule, or ``None``."""
    regs, spill = report["registers"], report["spill_bytes"]
    if spill and regs <= FALLBACK_REGISTERS:
        return f"register fallback: {regs} registers with {spill} bytes spilled"
    if spill > spill_bound:
        return f"{spill} bytes spilled, above the bound of {spill_bound}"
    return None


def grid_cases(focus_dims=GRID_FOCUS_DIMS, lmaxes=GRID_LMAX, n_focus: int = 1,
               table_configs: dict | None = None) -> list[GridCase]:
    """Every case of the grid: each (Cf, lmax) exact with the level-1 configs and compensated
    with the level-3 policy's configs, and each config of ``table_configs``
    (``{"exact": [cfg, ...], "compensated": [cfg, ...]}``, e.g. ``shipped_table_configs()``)
    on its path at every (Cf, lmax)."""
    from ..tuning import policy
    table_configs = table_configs or {}
    out = []
    for cf in focus_dims:
        for lmax in lmaxes:
            seen = set()

            def add(compensated, cfg, source):
                item = (compensated, tuple(sorted((cfg or {}).items())))
                if item not in seen:
                    seen.add(item)
                    out.append(GridCase(cf, lmax, n_focus, compensated, item[1], source))
            add(False, None, "default")
            for cfg in table_configs.get("exact", ()):
                add(False, cfg, "table")
            for cfg in policy.POLICY_CONFIGS:
                add(True, cfg, "policy")
            for cfg in table_configs.get("compensated", ()):
                add(True, cfg, "table")
    return out


# The last H200 table measured, in the newest ``results/<date>-h200-tuning/`` of a checkout
# ("" where there is none): voided by the chunked gate products (``scripts/gpu_check.sh`` part
# ``retune`` sweeps its keys again), the grid report compiles its configs too.
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEASURED_TABLE = max(glob.glob(os.path.join(_REPO, "results", "*-h200-tuning", "NVIDIA_H200.json")), default="")


def shipped_table_configs(path: str | None = None) -> dict:
    """The distinct GEMM launch configs of tuning table files, whatever their validity:
    ``{"exact": [...], "compensated": [...]}``; ``path``, or by default the shipped H200 table
    and the last one measured (``MEASURED_TABLE``, where this is a checkout)."""
    import json

    from ..tuning import store
    out = {"exact": [], "compensated": []}
    for p in [path] if path else [store.builtin_path("NVIDIA H200"), MEASURED_TABLE]:
        if not os.path.exists(p):
            continue
        with open(p, encoding="utf-8") as fh:
            doc = json.load(fh)
        for fam, entries in doc["entries"].items():
            path_ = {"stack_fwd": "exact", "stack_bwd_relay": "exact", "stack_compensated": "compensated"}.get(fam)
            for entry in entries.values():
                cfg = entry.get("config")
                if path_ and cfg and dict(sorted(cfg.items())) not in out[path_]:
                    out[path_].append(dict(sorted(cfg.items())))
    return out


def _compile_case_launch(job):
    case, ident, arch = job
    for launch in case_launches(case):
        if launch_identity(launch) == ident:
            r = compile_report(launch, arch, sass=False)
            flags = sorted(k for k, v in launch.kwargs.items() if v is True)
            return ident, {"name": r.name, "config": r.config, "flags": flags, "registers": r.registers,
                           "spill_bytes": r.spill_bytes, "shared": r.shared, "num_warps": r.num_warps}
    raise RuntimeError(f"{case.label()}: no launch {ident}")


def compile_grid(cases, *, arch: int = 90, workers: int | None = None, known: dict | None = None,
                 on_report=None, kernels=None) -> dict:
    """Compile every distinct launch of ``cases`` (of ``kernels`` only, by name, if given; those
    not in ``known``, ``{identity: report}``) in ``workers`` processes;
    ``{"cases": [...], "reports": {identity: report}}``.  ``on_report(identity, report)`` is
    called as each compile finishes (for checkpoints)."""
    from concurrent.futures import ProcessPoolExecutor
    reports = dict(known or {})
    case_rows, todo = [], {}
    for case in cases:
        idents = [launch_identity(x) for x in case_launches(case, kernels=kernels)]
        case_rows.append({"focus_dim": case.focus_dim, "lmax": case.lmax, "n_focus": case.n_focus,
                          "compensated": case.compensated, "config": dict(case.config) or None,
                          "source": case.source, "launches": idents})
        for ident in idents:
            if ident not in reports and ident not in todo:
                todo[ident] = (case, ident, arch)
    jobs = list(todo.values())
    if jobs:
        workers = workers or os.cpu_count() or 1
        if workers == 1:
            results = map(_compile_case_launch, jobs)
            pool = None
        else:
            pool = ProcessPoolExecutor(workers)
            results = pool.map(_compile_case_launch, jobs)
        try:
            for ident, rep in results:
                reports[ident] = rep
                if on_report is not None:
                    on_report(ident, rep)
        finally:
            if pool is not None:
                pool.shutdown()
    return {"cases": case_rows, "reports": {k: reports[k] for k in sorted(reports)
                                            if any(k in c["launches"] for c in case_rows)}}


def launched_roots(cases, kernels=None, *, launches=None) -> list[str]:
    """``"module.function"`` of every kernel ``cases`` launch (of ``kernels`` only, if given): what
    a snapshot's ``kernel_hash`` covers (``tuning.kernel_hash``)."""
    from ..tuning.kernel_hash import root_of
    if launches is None:
        launches = [case_launches(case) for case in cases]
    return sorted({root_of(x.kernel) for made in launches for x in made if kernels is None or x.name in kernels})


def launch_set_hash(cases, kernels=None, *, launches=None) -> str:
    """A hash of the launch identities ``cases`` make (of ``kernels`` only, if given): it changes
    when a launch config or launcher changes what is compiled, as the kernel-source hash does
    when a kernel does.  ``launches``: every case's ``case_launches``, recorded once already."""
    import hashlib
    if launches is None:
        launches = [case_launches(case) for case in cases]
    idents = sorted({launch_identity(x) for made in launches for x in made if kernels is None or x.name in kernels})
    return hashlib.sha256("\n".join(idents).encode()).hexdigest()
