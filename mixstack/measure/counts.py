"""Counted FLOPs and minimum bytes of the stack, for achieved TFLOP/s and GB/s.

FLOPs count the matrix products only (2 per multiply-add); the pointwise work
(sigmoids, gating products, residual adds, the alpha scale) is a few FLOPs per
element against hundreds per element in the products, and is left out.  Per
edge and focus stream, with ``L = 2 * (m0^2 + m1^2)`` (the two block GEMMs of
one layer) and ``Q = 2 * Cf * G`` (the gate product ``s @ gw``, ``G = lmax*Cf``):

    forward  = n_gated * (L + Q) + L
    backward = L + n_gated * (L + 2 * Q)
    both     = forward + backward

The forward runs each gated layer's block GEMMs and gate product, then the
identity layer's GEMMs.  The backward (gradients of ``u0`` and ``alpha``
only, the force path) runs the transposed GEMMs of every layer, and per gated
layer the gate product twice: once to recompute the sigmoids from the saved
``s`` (they are never saved, docs/contract.md §1) and once for the gate-logit term
``gl @ gw^T``.  (The backward floors in BENCHMARKS.md, "Floors and ceilings" count one
gate product per gated layer; this count charges the recompute too, since
every implementation of the contract must do it.)

Minimum bytes are the compulsory DRAM traffic of the contract in float32:
every tensor the operator must read is read once, every tensor it must
write is written once, and nothing else moves — an ideal fused kernel that
keeps all intermediates (layer activations ``u_k``, gate sigmoids, ``gz``)
on chip.  The saved pre-activations ``z`` are counted because docs/contract.md §1 makes
the forward write them and the backward read them.  Per pass:

    forward  reads u0, alpha, the weights;     writes the result, z
    backward reads grad_result, result, alpha, z, the weights;
             writes grad_u0, grad_alpha
    both     = forward + backward

(without ``apply_alpha`` neither pass touches alpha, and the backward needs
neither the result nor grad_alpha).  Real implementations move more; the
ratio of minimum bytes to time is therefore a lower bound on the bandwidth a
run achieved, and its fraction of the copy roof says how close it is to
being memory-bound.
"""

from __future__ import annotations

from .shapes import BenchShape

PASSES = ("fwd", "bwd", "both")
FLOAT_BYTES = 4


def _check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {', '.join(PASSES)}, got {pass_!r}")


def flops_per_row(shape: BenchShape, pass_: str) -> int:
    """FLOPs of ``pass_`` for one edge of one focus stream (see the module docstring)."""
    _check_pass(pass_)
    lay = shape.layout
    layer = 2 * (lay.m0 ** 2 + lay.m1 ** 2)
    gate = 2 * lay.focus_dim * lay.gate_width
    fwd = shape.n_gated * (layer + gate) + layer
    bwd = layer + shape.n_gated * (layer + 2 * gate)
    return {"fwd": fwd, "bwd": bwd, "both": fwd + bwd}[pass_]


def flops(shape: BenchShape, pass_: str) -> int:
    """FLOPs of ``pass_`` over the whole shape: ``flops_per_row * E * F``."""
    return flops_per_row(shape, pass_) * shape.edges * shape.focus


def weight_bytes(shape: BenchShape) -> int:
    """Bytes of ``w0``, ``w1`` and ``gw``."""
    lay = shape.layout
    elems = shape.layers * shape.focus * (lay.m0 ** 2 + lay.m1 ** 2)
    elems += shape.n_gated * shape.focus * lay.focus_dim * lay.gate_width
    return FLOAT_BYTES * elems


def min_bytes(shape: BenchShape, pass_: str) -> int:
    """Compulsory bytes moved by ``pass_`` (see the module docstring)."""
    _check_pass(pass_)
    row = shape.layout.row
    rows = shape.edges * shape.focus              # (edge, focus) pairs
    a = 1 if shape.apply_alpha else 0
    fwd = rows * (row + a + row + shape.n_gated * row)            # u0, alpha | result, z
    bwd = rows * (row + a * (row + 1) + shape.n_gated * row       # grad_result, result, alpha, z
                  + row + a)                                      # | grad_u0, grad_alpha
    fwd = FLOAT_BYTES * fwd + weight_bytes(shape)
    bwd = FLOAT_BYTES * bwd + weight_bytes(shape)
    return {"fwd": fwd, "bwd": bwd, "both": fwd + bwd}[pass_]
