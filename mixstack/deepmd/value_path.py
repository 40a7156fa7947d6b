"""SeZM's SO(2) value path on mixstack's operators: Wigner rows, rotate-in with the radial
degree mixer, the mixing stack with the focus competition, rotate-out with the aggregation.

``aggregate`` returns what SeZM sums at each destination atom before its node-level gate or
degree normalisation: ``(N, (lmax+1)^2, F*Cf)``, streams kept apart in their channel blocks.
The math (docs/deepmd.md, "The value path"):

    W      = SeZM's rows m = -1, 0, +1 of each edge's Wigner matrices      (glue.sezm_wigner)
    u      = rotate_in(x, W, radial, src)                                  (per-degree radial, or 1)
    u      = degree_mix(u, degree kernel(radial))                          (SeZM's degree mixer)
    alpha  = SeZM's focus competition on u's l = 0 channels, times the attention weight (one head)
    y      = mixing_stack(u, alpha, w0, w1, gw)
    agg    = rotate_out_sum(y * attention weights (2+ heads), W, dst, edge_weight) * rescale

It runs with autocast off and in the convolution's compute dtype (float32 or float64): under
bf16 autocast deepmd-kit's own path would run these products in bf16.
"""

from __future__ import annotations

import contextlib

import torch

from ..conv.functional import rotate_in, rotate_out_sum
from ..dispatch.levels import use_level
from ..stack.functional import mixing_stack
from . import glue
from .weights import stack_weights


def _scope(level, device_type: str):
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
    if level is not None:
        stack.enter_context(use_level(level))
    return stack


def aggregate(conv, x: torch.Tensor, rad: torch.Tensor, edges: glue.Edges, n_node: int,
              attention: torch.Tensor | None, *, level: int | None = None) -> torch.Tensor:
    """The aggregated messages ``(N, (lmax+1)^2, F*Cf)`` of SeZM convolution ``conv``.

    ``x (N, (lmax+1)^2, F*Cf)`` the node features after ``pre_focus_mix``; ``rad (E, lmax+1,
    F*Cf)`` the per-degree radial features after ``radial_hidden_proj``; ``edges`` in destination
    order; ``attention (E, F, H)`` SeZM's envelope-gated softmax weights, or ``None`` without
    attention heads (then each message is weighted by the envelope and the source gate).
    ``level`` pins mixstack's level (``None``: the active one)."""
    lmax, n_focus, cf = conv.lmax, conv.n_focus, conv.so2_focus_dim
    wide, rows = n_focus * cf, 3 * lmax + 1
    n_edges = edges.src.shape[0]
    dtype = conv.compute_dtype
    with _scope(level, x.device.type):
        x, rad = x.to(dtype), rad.to(dtype)
        wigner = glue.sezm_wigner(edges.vec.to(dtype), lmax)
        mixer = conv.radial_degree_mixer
        radial = glue.unit_radial(n_edges, lmax, wide, x) if mixer is not None else glue.degree_radial(rad, lmax)
        u = rotate_in(x, wigner, radial, edges.src).view(n_edges, rows, wide)
        if mixer is not None:
            u = glue.degree_mix(u, glue.mixer_kernel(mixer, rad), lmax)
        u0 = glue.focus_major(u, n_focus)                                # (F, E, ROW)

        alpha = None
        if conv.focus_compete and n_focus > 1:
            alpha = conv._focus_alpha(u0[:, :, :cf].transpose(0, 1)).to(dtype)   # (E, F)
        head_weight = None
        if attention is not None and attention.shape[2] == 1:
            weight = attention[:, :, 0].to(dtype)
            alpha = weight if alpha is None else alpha * weight
        elif attention is not None:
            head_weight = attention.to(dtype)

        w0, w1, gw = stack_weights(conv, detach=not conv.training)
        apply_alpha = alpha is not None
        if alpha is None:
            alpha = u0.new_ones(()).expand(n_edges, n_focus)
        y = mixing_stack(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=cf, apply_alpha=apply_alpha)
        y = glue.channel_major(y, rows, head_weight)                      # (E, 1, rows * F*Cf)

        edge_weight = None
        if attention is None:
            edge_weight = edges.env.to(dtype) if edges.gate is None else (edges.env * edges.gate).to(dtype)
        agg = rotate_out_sum(y, wigner, edges.dst, n_node, edge_weight=edge_weight)
        return agg * conv.rotate_inv_rescale_full.to(dtype).view(1, -1, 1)
