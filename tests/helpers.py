"""Shared test helpers: input factory, float64 oracle, error measure, one copy.

``tests/conftest.py`` puts this directory on ``sys.path``, so every test
module (``tests/``, ``tests/interpret/``, ``tests/gpu/``) does ``import helpers``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import mixstack
from mixstack.core.layout import StackLayout

# Tolerance of every float32-vs-float64 comparison: relative Frobenius error.
# For the shapes tested here (K <= ~600 per dot product, a few layers, O(1)
# activations) float32 rounding gives 1e-7 .. 4e-7 (measured through the
# interpreter: forward ~8e-8, gradients ~2e-7, double backward ~4e-7).
# 1e-5 leaves ~25x headroom for other (fixed) reduction orders, yet sits ~50x
# below the ~5e-4 that a 1e-3 relative perturbation of one weight tensor causes
# (test_tolerance_rejects_a_1e3_weight_perturbation), so a wrong layout, a
# missing term or a TF32 GEMM (~1e-3) cannot pass.
REL_TOL = 1e-5

INPUT_NAMES = ("u0", "alpha", "w0", "w1", "gw")


@dataclass(frozen=True)
class Case:
    """One operator shape: F focus streams, E edges, Cf channels, lmax, n_layers, alpha on/off."""

    F: int
    E: int
    Cf: int
    lmax: int
    n_layers: int
    apply_alpha: bool = True

    @property
    def layout(self) -> StackLayout:
        return StackLayout(self.lmax, self.Cf)

    @property
    def row(self) -> int:
        return self.layout.row

    @property
    def kw(self) -> dict:
        """Keyword arguments of ``mixing_stack`` for this case."""
        return dict(lmax=self.lmax, focus_dim=self.Cf, apply_alpha=self.apply_alpha)

    @property
    def op_args(self) -> tuple:
        """Trailing non-tensor arguments of ``torch.ops.mixstack.stack_forward`` (without level)."""
        return (self.lmax, self.Cf, self.apply_alpha)

    def op_spec(self, level: int) -> list:
        """The ``spec`` argument of ``stack_backward`` / ``stack_double_backward``."""
        return [self.lmax, self.Cf, int(self.apply_alpha), level]

    @property
    def spec(self):
        """The launchers' ``StackSpec``."""
        from mixstack.stack.values import StackSpec
        return StackSpec(self.layout, self.apply_alpha)

    def __str__(self) -> str:
        return (f"F{self.F}-E{self.E}-Cf{self.Cf}-l{self.lmax}-L{self.n_layers}-"
                f"{'alpha' if self.apply_alpha else 'noalpha'}")


def case_id(case: Case) -> str:
    return str(case)


def make_inputs(case: Case, seed: int = 0, *, dtype=torch.float32, device="cpu"):
    """Random inputs ``(u0, alpha, w0, w1, gw)`` scaled like a trained model.

    ``u0`` unit normal; block weights std ``1/sqrt(K * n_layers)`` (K the block
    width, so each residual layer adds ~1/n_layers of the variance); gate
    projection std ``1/sqrt(Cf)``; ``alpha = rand + 0.1`` (bounded away from 0).
    Generated in float64 on the CPU from a seeded generator, then cast and moved,
    so a case gives the same values on every device and dtype.
    """
    g = torch.Generator().manual_seed(seed)
    lay, nl = case.layout, case.n_layers
    f64 = torch.float64
    u0 = torch.randn(case.F, case.E, lay.row, generator=g, dtype=f64)
    alpha = torch.rand(case.E, case.F, generator=g, dtype=f64) + 0.1
    w0 = torch.randn(nl, case.F, lay.m0, lay.m0, generator=g, dtype=f64) / math.sqrt(lay.m0 * nl)
    w1 = torch.randn(nl, case.F, lay.m1, lay.m1, generator=g, dtype=f64) / math.sqrt(lay.m1 * nl)
    gw = torch.randn(nl - 1, case.F, case.Cf, lay.gate_width, generator=g, dtype=f64) / math.sqrt(case.Cf)
    return tuple(t.to(dtype=dtype, device=device) for t in (u0, alpha, w0, w1, gw))


def make_grad_out(case: Case, seed: int = 1, *, dtype=torch.float32, device="cpu"):
    """A random upstream gradient of the ``(E, F, ROW)`` result."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(case.E, case.F, case.row, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)


def cancelling_grad_out(grad_out: torch.Tensor, y: torch.Tensor, ratio: float) -> torch.Tensor:
    """``grad_out`` moved so that every ``grad_alpha`` sum, ``sum_c grad_out * y`` over a row,
    cancels to ``ratio`` of its terms' absolute values (an ill-conditioned alpha gradient).
    ``y (E, F, ROW)`` the unscaled result; built in float64, returned in ``grad_out``'s dtype."""
    g, y = grad_out.double(), y.double()
    yy = (y * y).sum(-1, keepdim=True)
    g = g - (g * y).sum(-1, keepdim=True) / yy * y                  # orthogonal to y: the sum is 0
    g = g + ratio * (g * y).abs().sum(-1, keepdim=True) / yy * y    # then ratio of its scale
    return g.to(grad_out.dtype)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error ``||got - want|| / ||want||`` in float64 (absolute if want == 0)."""
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got.detach().double().cpu() - want.detach().double().cpu()).norm().item()
    scale = want.detach().double().cpu().norm().item()
    return diff / scale if scale > 0 else diff


def assert_close_rel(got, want, name: str, tol: float = REL_TOL) -> None:
    err = rel_err(got, want)
    assert err <= tol, f"{name}: relative Frobenius error {err:.3e} > {tol:.0e}"


def reference64(case: Case, inputs, grad_out=None, *, wrt=("u0", "alpha")):
    """Float64 oracle: ``mixstack.reference.mixing_stack`` and autograd gradients.

    Returns ``(out, grads)`` with ``grads`` a dict over ``wrt`` (empty without
    ``grad_out``).  Computed on the inputs' device, in float64.
    """
    x = {n: t.detach().double().requires_grad_(n in wrt and grad_out is not None)
         for n, t in zip(INPUT_NAMES, inputs)}
    out = mixstack.reference.mixing_stack(*(x[n] for n in INPUT_NAMES), **case.kw)
    grads = {}
    if grad_out is not None:
        names = [n for n in wrt if not (n == "alpha" and not case.apply_alpha)]
        gs = torch.autograd.grad(out, [x[n] for n in names], grad_out.double(), allow_unused=True)
        grads = {n: (torch.zeros_like(x[n]) if g is None else g) for n, g in zip(names, gs)}
    return out.detach(), grads


def double_backward64(case: Case, inputs, grad_out, v):
    """Float64 oracle of the force-training pattern (see ``double_backward``)."""
    x = [t.detach().double().requires_grad_() for t in inputs]
    return double_backward(mixstack.reference.mixing_stack, case, x, grad_out.double(), v.double())


def double_backward(fn, case: Case, x, grad_out, v):
    """``d/dx <v, d<grad_out, fn(x)>/du0>`` for every input x (create_graph=True).

    ``x`` are leaf tensors requiring grad; returns a dict over INPUT_NAMES
    (``alpha`` omitted without alpha).
    """
    out = fn(*x, **case.kw)
    (grad_u0,) = torch.autograd.grad(out, x[0], grad_out, create_graph=True)
    loss = (grad_u0 * v).sum()
    names = [n for n in INPUT_NAMES if not (n == "alpha" and not case.apply_alpha)]
    leaves = [t for n, t in zip(INPUT_NAMES, x) if n in names]
    gs = torch.autograd.grad(loss, leaves, allow_unused=True)
    return {n: (torch.zeros_like(t) if g is None else g) for n, t, g in zip(names, leaves, gs)}


def run_stack(case: Case, level: int, inputs, grad_out, *, weights: bool = False):
    """One ``mixstack.mixing_stack`` call at ``level`` and its backward.

    ``u0`` and ``alpha`` always require grad (the force path: relay backward);
    with ``weights`` the weights do too.  Returns a dict with ``out``, one
    ``grad_<name>`` per differentiated input, and ``log``, the ``dispatch_log``
    Counter of the call.  Inputs are cloned, so callers' tensors are never leaves.
    """
    names = ["u0"] + (["alpha"] if case.apply_alpha else []) + (["w0", "w1", "gw"] if weights else [])
    x = {n: t.detach().clone().requires_grad_(n in names) for n, t in zip(INPUT_NAMES, inputs)}
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        out = mixstack.mixing_stack(*(x[n] for n in INPUT_NAMES), **case.kw)
        grads = torch.autograd.grad(out, [x[n] for n in names], grad_out)
    res = {"out": out.detach(), "log": dict(log)}
    res.update({f"grad_{n}": g for n, g in zip(names, grads)})
    return res


TRAIN_NAMES = INPUT_NAMES + ("grad_out",)


def training_step(fn, case: Case, x, grad_out, v, w, r):
    """The force-training pattern in full, every cotangent used: ``out = fn(x)``;
    ``(g_u0, g_alpha) = d<grad_out, out>/d(u0, alpha)`` with ``create_graph``; the loss
    ``<g_u0, v> + <g_alpha, w> + <out, r>`` (an energy-like term too, so the forward's backward
    meets the double backward's cotangents of z and y beside its own); returns the loss's
    gradients to every input and to ``grad_out`` (a dict over ``TRAIN_NAMES``, ``alpha``
    omitted without alpha).  ``x`` and ``grad_out`` are leaves requiring grad.  ``r=None``: no
    energy-like term (the result itself gets no cotangent)."""
    out = fn(*x, **case.kw)
    wrt = [x[0]] + ([x[1]] if case.apply_alpha else [])
    firsts = torch.autograd.grad(out, wrt, grad_out, create_graph=True)
    loss = (firsts[0] * v).sum() + ((out * r).sum() if r is not None else 0)
    if case.apply_alpha:
        loss = loss + (firsts[1] * w).sum()
    names = [n for n in TRAIN_NAMES if not (n == "alpha" and not case.apply_alpha)]
    leaves = dict(zip(INPUT_NAMES, x), grad_out=grad_out)
    gs = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(leaves[n]) if g is None else g) for n, g in zip(names, gs)}


def training_cotangents(case: Case, seed: int = 5, *, dtype=torch.float32, device="cpu"):
    """``(v, w, r)`` for ``training_step``: like ``u0``, like ``alpha``, like the result."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    v = torch.randn(case.F, case.E, case.row, generator=g, dtype=f64)
    w = torch.randn(case.E, case.F, generator=g, dtype=f64)
    r = torch.randn(case.E, case.F, case.row, generator=g, dtype=f64)
    return tuple(t.to(dtype=dtype, device=device) for t in (v, w, r))


def training_step64(case: Case, inputs, grad_out, cotangents):
    """Float64 oracle of ``training_step``: autograd of ``mixstack.reference`` twice."""
    x = [t.detach().double().requires_grad_() for t in inputs]
    go = grad_out.detach().double().requires_grad_()
    return training_step(mixstack.reference.mixing_stack, case, x, go,
                         *(None if t is None else t.double() for t in cotangents))


def run_training_step(case: Case, level: int, inputs, grad_out, cotangents):
    """``training_step`` of ``mixstack.mixing_stack`` at ``level``: the gradients and the
    ``dispatch_log`` (key ``log``)."""
    x = [t.detach().clone().requires_grad_() for t in inputs]
    go = grad_out.detach().clone().requires_grad_()
    with mixstack.use_level(level), mixstack.dispatch_log() as log:
        got = training_step(mixstack.mixing_stack, case, x, go, *cotangents)
    got["log"] = dict(log)
    return got


# ---------------------------------------------------------------- the convolution's operators

@dataclass(frozen=True)
class ConvCase:
    """One shape of ``mixstack.rotate_in`` / ``rotate_out_sum``: N atoms, E edges, F focus streams,
    C channels, lmax; with the edge scalar and the edge weight or without."""

    N: int
    E: int
    F: int
    C: int
    lmax: int
    scalar: bool = True
    weight: bool = True

    @property
    def S(self) -> int:
        return (self.lmax + 1) ** 2

    @property
    def row(self) -> int:
        return (3 * self.lmax + 1) * self.C

    def __str__(self) -> str:
        return (f"N{self.N}-E{self.E}-F{self.F}-C{self.C}-l{self.lmax}"
                f"{'-scalar' if self.scalar else ''}{'-ew' if self.weight else ''}")


def make_conv_inputs(case: ConvCase, seed: int = 0, *, dtype=torch.float32, device="cpu"):
    """``dict`` of seeded inputs: ``x, wigner, radial, edge_scalar, scalar_weight, edge_weight, y``
    (floats; ``radial`` and ``scalar_weight`` are views of one wider tensor, as a radial network
    hands them over) and ``src``, ``dst`` (int64).  Half of the edges leave atom 1 and half
    arrive at atom 0 (runs longer than a segment block); the last atom receives none; ``dst``
    is sorted.  Generated in float64 on the CPU, then cast and moved."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    c, lmax, n, e = case.C, case.lmax, case.N, case.E
    wide = torch.randn(e, case.F, 3 * lmax + 2, c, generator=g, dtype=f64)
    src = torch.randint(0, n, (e,), generator=g)
    src[: e // 2] = 1
    dst = torch.randint(0, max(n - 1, 1), (e,), generator=g)
    dst[: e // 2] = 0
    out = {
        "x": torch.randn(n, case.S, c, generator=g, dtype=f64),
        "wigner": torch.randn(e, 3, case.S, generator=g, dtype=f64),
        "radial": wide[:, :, :2 * lmax + 1],
        "edge_scalar": torch.randn(e, c, generator=g, dtype=f64) if case.scalar else None,
        "scalar_weight": wide[:, :, 2 * lmax + 1:] if case.scalar else None,
        "edge_weight": torch.rand(e, generator=g, dtype=f64) + 0.1 if case.weight else None,
        "y": torch.randn(e, case.F, case.row, generator=g, dtype=f64),
    }
    out = {k: None if v is None else v.to(dtype=dtype, device=device) for k, v in out.items()}
    out["src"] = src[torch.randperm(e, generator=g)].to(device)
    out["dst"] = torch.sort(dst).values.to(device)
    return out


ROTATE_IN_FLOATS = ("x", "wigner", "radial", "edge_scalar", "scalar_weight", "edge_weight")
ROTATE_OUT_FLOATS = ("y", "wigner", "edge_weight")


def run_rotate_in(inp: dict, grad_seed: int = 1, *, create_graph: bool = False):
    """``mixstack.rotate_in`` at the active level and its backward with a seeded upstream gradient:
    ``(u, {name: grad})`` over every float input present.  Inputs are cloned into leaves."""
    leaves = {k: inp[k].detach().clone().requires_grad_() for k in ROTATE_IN_FLOATS if inp[k] is not None}
    kw = {k: leaves.get(k) for k in ("edge_scalar", "scalar_weight", "edge_weight")}
    u = mixstack.rotate_in(leaves["x"], leaves["wigner"], leaves["radial"], inp["src"], **kw)
    g = torch.Generator().manual_seed(grad_seed)
    gu = torch.randn(u.shape, generator=g, dtype=torch.float64).to(u)
    grads = torch.autograd.grad(u, list(leaves.values()), gu, create_graph=create_graph)
    return u, dict(zip(leaves, grads))


def run_rotate_out(inp: dict, grad_seed: int = 2, *, keep_input: bool = True):
    """``mixstack.rotate_out_sum`` at the active level and its backward: ``(out, {name: grad})``."""
    leaves = {k: inp[k].detach().clone().requires_grad_() for k in ROTATE_OUT_FLOATS if inp[k] is not None}
    n_atoms = inp["x"].shape[0]
    out = mixstack.rotate_out_sum(leaves["y"], leaves["wigner"], inp["dst"], n_atoms,
                                  edge_weight=leaves.get("edge_weight"), keep_input=keep_input)
    g = torch.Generator().manual_seed(grad_seed)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, list(leaves.values()), go)
    return out, dict(zip(leaves, grads))


# Edge vectors that stress the frame's helper axis: along each axis (either sign), ties of
# |r_hat| components (the first minimum wins), and near-axis directions.
SPECIAL_EDGES = ((1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (0.0, -2.0, 0.0), (0.0, 0.0, 3.0), (-1.0, -1.0, -1.0),
                 (0.5, 0.5, 0.0), (0.0, 1.5, -1.5), (1e-3, 0.0, 3.0), (2.0, 1e-4, -1e-4), (1.0, 1.0, 1e-3))


def edge_vectors(n: int, seed: int = 0, *, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """``n`` edge vectors ``(n, 3)``: ``SPECIAL_EDGES`` first, then Gaussian ones of lengths ~1-3
    (float64 on the CPU from a seeded generator, then cast and moved)."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, 3, generator=g, dtype=torch.float64)
    v = v * (1.0 + 2.0 * torch.rand(n, 1, generator=g, dtype=torch.float64)) / v.norm(dim=-1, keepdim=True)
    k = min(n, len(SPECIAL_EDGES))
    v[:k] = torch.tensor(SPECIAL_EDGES[:k], dtype=torch.float64)
    return v.to(dtype=dtype, device=device)


def edge_wigner_check(vec: torch.Tensor, lmax: int, seed: int = 1):
    """``(w, g, w64, g64)``: ``mixstack.edge_wigner`` at the active level on ``vec`` and the
    gradient of a random weighted sum of it, against the float64 tensor-op formulas (on the CPU)."""
    from mixstack.conv.frames import edge_wigner_reference
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(vec.shape[0], 3, (lmax + 1) ** 2, generator=gen, dtype=torch.float64)
    v = vec.detach().clone().requires_grad_(True)
    w = mixstack.edge_wigner(v, lmax)
    (g,) = torch.autograd.grad((w * weights.to(w)).sum(), v)
    v64 = vec.detach().double().cpu().requires_grad_(True)
    w64 = edge_wigner_reference(v64, lmax)
    (g64,) = torch.autograd.grad((w64 * weights).sum(), v64)
    return w.detach(), g, w64.detach(), g64


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (the scripts are no package): its parser,
    kernels and helpers for the tests of what it runs."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
