"""``mixstack::edge_wigner`` and ``mixstack::edge_wigner_backward``: edge vectors to packed Wigner
rows in one kernel, and back in one more (``kernels.wigner``); their constants, launchers and
autograd.

``edge_wigner(vec, steps, lmax, level, sezm=False) -> wigner (E, 3, (lmax+1)^2)`` is
``mixstack.conv.frames.edge_wigner_reference`` (in SeZM's signs with ``sezm``: the kernels fold
them into their stores and loads); ``edge_wigner_backward(grad_wigner, vec, steps, lmax, level,
sezm=False) -> grad_vec (E, 3)`` its vector-Jacobian product.  ``steps`` is ``packed_steps(lmax)``
on ``vec``'s device: the recursion's constant matrices (``mixstack.conv.frames.step_matrices``) in
float32, zero-padded to the kernels' register widths.  It is an argument, not a global, so a
module keeps it as a buffer and a traced or exported graph sees it as an input.  A body runs the
kernels where they can run (CUDA, or any device under ``TRITON_INTERPRET=1``, float32, level
1-3) and the tensor-op formulas elsewhere, and records which (``wigner:triton`` /
``wigner:reference``, ``wigner_bwd:*``).  The launch config is fixed per ``lmax``: levels 1-3
give the same bits.  A backward that builds a graph (``create_graph``: a force loss) runs the
tensor-op formulas under autograd, which differentiates them again.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.library import triton_op, wrap_triton

from ..core.tracing import shapes_only
from ..dispatch.guards import kernels_can_run
from ..dispatch.log import record
from ..kernels import wigner as kw
from .frames import edge_wigner_reference, step_matrices

# Edges per program, fixed (never tuned: one config at every level keeps levels 1-3 identical).
# From the sm_90 compile (Triton 3.7), not timed yet: at lmax 3, 16 edges and 4 warps take 127
# registers forward and 190 backward without spills, where 32 edges took 253 / 255 with 440 bytes
# spilled (the FMA ``tl.dot`` holds whole operand rows per thread); lmax 6 spills at 4 warps.
BLOCK_E = 16
WIDE_WARPS = 8


def num_warps(lmax: int) -> int:
    """Warps of both kernels: 4, or 8 above lmax 3 (wider tiles)."""
    return 4 if lmax <= 3 else WIDE_WARPS


@functools.lru_cache(maxsize=None)
def packed_steps(lmax: int) -> Tensor:
    """The steps ``l = 2..lmax`` of ``step_matrices`` as the kernels read them: float32 (CPU),
    each ``(3, 3, state_pad(l-1), state_pad(l))`` zero-padded, at ``step_offset(l)``; one zero
    where there is no step (``lmax = 1``)."""
    parts = []
    for l in range(2, lmax + 1):
        K = step_matrices(l, lmax)
        p_in, p_out = kw.state_size(l - 1, lmax), kw.state_size(l, lmax)
        if K.shape != (3, 3, p_in, p_out):
            raise AssertionError(f"step {l} of lmax {lmax}: matrices {tuple(K.shape)}, kernels expect "
                                 f"(3, 3, {p_in}, {p_out})")
        pad = torch.zeros(3, 3, kw.state_pad(l - 1, lmax), kw.state_pad(l, lmax), dtype=torch.float64)
        pad[:, :, :p_in, :p_out] = K
        if sum(p.numel() for p in parts) != kw.step_offset(l, lmax):
            raise AssertionError(f"step {l} of lmax {lmax} does not start where the kernels read it")
        parts.append(pad.flatten())
    if not parts:
        return torch.zeros(1, dtype=torch.float32)
    return torch.cat(parts).to(torch.float32)


_ON_DEVICE: dict = {}


def steps_on(lmax: int, device) -> Tensor:
    """``packed_steps(lmax)`` on ``device``, copied there once."""
    key = (lmax, str(device))
    if key not in _ON_DEVICE:
        _ON_DEVICE[key] = packed_steps(lmax).to(device)
    return _ON_DEVICE[key]


def scratch_row(lmax: int) -> int:
    """Floats per edge of the backward's scratch: ``M_2 .. M_{lmax-1}`` (at least one)."""
    return max(1, kw.scratch_offset(lmax, lmax))


# ------------------------------------------------------------------ launchers

def _grid(n: int) -> tuple:
    return ((n + BLOCK_E - 1) // BLOCK_E,)


def launch_forward(vec: Tensor, steps: Tensor, lmax: int, sezm: bool = False) -> Tensor:
    """``wigner (E, 3, S)`` from ``vec (E, 3)`` (float32, contiguous), in SeZM's signs with ``sezm``."""
    n_edges = vec.shape[0]
    w = vec.new_empty((n_edges, 3, (lmax + 1) ** 2))
    if n_edges > 0:
        wrap_triton(kw.edge_wigner_kernel)[_grid(n_edges)](vec, steps, w, n_edges, LMAX=lmax, BLOCK_E=BLOCK_E,
                                                           SEZM=sezm, num_warps=num_warps(lmax))
    return w


def launch_backward(grad_w: Tensor, vec: Tensor, steps: Tensor, lmax: int, sezm: bool = False) -> Tensor:
    """``grad_vec (E, 3)`` from ``grad_wigner (E, 3, S)`` and ``vec`` (float32, contiguous)."""
    n_edges = vec.shape[0]
    gv = vec.new_empty((n_edges, 3))
    if n_edges > 0:
        row = scratch_row(lmax)
        scratch = vec.new_empty((n_edges, row))
        wrap_triton(kw.edge_wigner_grad_kernel)[_grid(n_edges)](
            grad_w, vec, steps, scratch, gv, n_edges, row, LMAX=lmax, BLOCK_E=BLOCK_E, SEZM=sezm,
            num_warps=num_warps(lmax))
    return gv


# ------------------------------------------------------------------ operators

def _kernels_for(vec: Tensor, level: int) -> bool:
    return level > 0 and kernels_can_run(vec) and vec.dtype == torch.float32


def _convention(sezm: bool) -> str:
    return "sezm" if sezm else "mixstack"


def reference_grad(grad_w: Tensor, vec: Tensor, lmax: int, create_graph: bool = False, sezm: bool = False) -> Tensor:
    """``grad_vec`` by autograd through the tensor-op formulas; with ``create_graph`` through
    ``vec`` itself, so the result is differentiable again (in ``vec`` and ``grad_w``)."""
    convention = _convention(sezm)
    if create_graph:
        with torch.enable_grad():
            (g,) = torch.autograd.grad(edge_wigner_reference(vec, lmax, convention=convention), vec, grad_w,
                                       create_graph=True)
        return g
    if shapes_only(grad_w):      # the shape alone: functorch's vjp fails on symbolic fake tensors
        return torch.empty_like(vec)
    # torch.func.vjp, not torch.autograd.grad: an operator's body runs below autograd, where
    # requires_grad builds no graph; functorch's transform brings its own
    _, vjp = torch.func.vjp(lambda v: edge_wigner_reference(v, lmax, convention=convention), vec)
    return vjp(grad_w)[0]


@triton_op("mixstack::edge_wigner", mutates_args=())
def edge_wigner(vec: Tensor, steps: Tensor, lmax: int, level: int, sezm: bool = False) -> Tensor:
    """The packed rows ``(E, 3, (lmax+1)^2)`` of the edges ``vec (E, 3)`` (SeZM's signs with ``sezm``)."""
    if _kernels_for(vec, level):
        record("wigner:triton")
        return launch_forward(vec.contiguous(), steps.to(torch.float32).contiguous(), lmax, sezm)
    record("wigner:reference")
    return edge_wigner_reference(vec, lmax, convention=_convention(sezm))


@triton_op("mixstack::edge_wigner_backward", mutates_args=())
def edge_wigner_backward(grad_wigner: Tensor, vec: Tensor, steps: Tensor, lmax: int, level: int,
                         sezm: bool = False) -> Tensor:
    """``grad_vec (E, 3)`` of ``edge_wigner``."""
    if _kernels_for(vec, level):
        record("wigner_bwd:triton")
        return launch_backward(grad_wigner.contiguous(), vec.contiguous(), steps.to(torch.float32).contiguous(), lmax,
                               sezm)
    record("wigner_bwd:reference")
    return reference_grad(grad_wigner, vec, lmax, sezm=sezm).contiguous()


def _setup(ctx, inputs, output):
    vec, steps, lmax, level, sezm = tuple(inputs) + (False,) * (5 - len(inputs))   # a call may leave sezm out
    ctx.save_for_backward(vec, steps)
    ctx.lmax, ctx.level, ctx.sezm = lmax, level, sezm


def _backward(ctx, grad_w):
    vec, steps = ctx.saved_tensors
    if torch.is_grad_enabled():                 # a double backward: tensor ops autograd can follow
        record("wigner_bwd:reference")
        g = reference_grad(grad_w, vec, ctx.lmax, create_graph=True, sezm=ctx.sezm)
    else:
        g = torch.ops.mixstack.edge_wigner_backward(grad_w, vec, steps, ctx.lmax, ctx.level, ctx.sezm)
    return (g, None, None, None, None)[:len(ctx.needs_input_grad)]


edge_wigner.register_autograd(_backward, setup_context=_setup)

