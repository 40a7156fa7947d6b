"""SeZM's SO(2) value path on mixstack's operators: Wigner rows, rotate-in with the radial
degree mixer, the mixing stack with the focus competition, rotate-out with the aggregation.

``aggregate`` returns what SeZM sums at each destination atom before its node-level gate or
degree normalisation: ``(N, (lmax+1)^2, F*Cf)``, streams kept apart in their channel blocks.
The math (docs/deepmd.md, "The value path"), one operator call each:

    W      = edge_wigner(vec, convention="sezm")                      (once a frame, glue.frame_edges)
    u      = rotate_in(x, W, radial, src, streams=F, degree_mix=...)  (per-degree radial, or SeZM's mixer)
    alpha  = SeZM's focus competition on u's l = 0 channels, times the attention weight (one head)
    y      = mixing_stack(u, alpha, w0, w1, gw)
    agg    = rotate_out_sum(y, W, dst, N, streams="blocks", edge_weight=attention (2+ heads) or
                            envelope * gate (none), order=edge_order(dst), degree_scale=rescale)

It runs with autocast off and in the convolution's compute dtype (float32 or float64): under
bf16 autocast deepmd-kit's own path would run these products in bf16.
"""

from __future__ import annotations

import torch

from ..conv.functional import rotate_in, rotate_out_sum
from ..stack.functional import mixing_stack
from . import glue
from .weights import stack_weights


def _alpha_and_weight(conv, u0, attention, edges: glue.Edges, dtype):
    """``(alpha (E, F) or None, edge_weight)``: SeZM's focus competition, times one attention
    head's weights; two or more heads' weights ``(E, F, H)``, or without heads the envelope
    (times the source gate) per edge, for rotate-out."""
    alpha = None
    if conv.focus_compete and conv.n_focus > 1:
        alpha = conv._focus_alpha(u0[:, :, :conv.so2_focus_dim].transpose(0, 1)).to(dtype)     # (E, F)
    if attention is None:
        return alpha, (edges.env if edges.gate is None else edges.env * edges.gate).to(dtype)
    if attention.shape[2] == 1:
        weight = attention[:, :, 0].to(dtype)
        return (weight if alpha is None else alpha * weight), None
    return alpha, attention.to(dtype)


def aggregate(conv, x: torch.Tensor, rad: torch.Tensor, edges: glue.Edges, n_node: int,
              attention: torch.Tensor | None, *, level: int | None = None) -> torch.Tensor:
    """The aggregated messages ``(N, (lmax+1)^2, F*Cf)`` of SeZM convolution ``conv``.

    ``x (N, (lmax+1)^2, F*Cf)`` the node features after ``pre_focus_mix``; ``rad (E, lmax+1,
    F*Cf)`` the per-degree radial features after ``radial_hidden_proj``; ``edges`` the frame's
    (``glue.frame_edges``); ``attention (E, F, H)`` SeZM's envelope-gated softmax weights, or
    ``None`` without attention heads (then each message is weighted by the envelope and the
    source gate).  ``level`` pins mixstack's level (``None``: the active one)."""
    lmax, n_focus, cf = conv.lmax, conv.n_focus, conv.so2_focus_dim
    n_edges = edges.src.shape[0]
    dtype = conv.compute_dtype
    with glue.scope(level, x.device.type):
        x, rad = x.to(dtype), rad.to(dtype)
        mixer = conv.radial_degree_mixer
        if mixer is not None:
            radial, mix = None, glue.degree_mix(mixer, rad, detach=not conv.training)
        else:                              # a strided view: stream f's channels of degree l
            radial, mix = rad.view(n_edges, lmax + 1, n_focus, cf).transpose(1, 2), None
        u0 = rotate_in(x, edges.wigner, radial, edges.src, streams=n_focus, degree_mix=mix)   # (F, E, ROW)
        alpha, edge_weight = _alpha_and_weight(conv, u0, attention, edges, dtype)
        w0, w1, gw = stack_weights(conv, detach=not conv.training)
        apply_alpha = alpha is not None
        if alpha is None:
            alpha = u0.new_ones(()).expand(n_edges, n_focus)
        y = mixing_stack(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=cf, apply_alpha=apply_alpha)
        return rotate_out_sum(y, edges.wigner, edges.dst, n_node, edge_weight=edge_weight, streams="blocks",
                              order=edges.order, degree_scale=conv.rotate_inv_rescale_full.to(dtype))
