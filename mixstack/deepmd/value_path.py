"""SeZM's SO(2) value path on mixstack's operators: Wigner rows, rotate-in with the radial
degree mixer, the mixing stack with the focus competition, rotate-out with the aggregation.

``aggregate`` returns what SeZM sums at each destination atom before its node-level gate or
degree normalisation: ``(N, (lmax+1)^2, F*Cf)``, streams kept apart in their channel blocks.
The math (docs/deepmd.md, "The value path"), one operator call each:

    W      = edge_wigner(vec, convention="sezm")                      (once a frame, glue.frame_edges)
    u      = rotate_in(x, W, radial, src, streams=F, degree_mix=...)  (per-degree radial, or SeZM's mixer)
    y      = mixing_stack(u, w0, w1, gw)                              (no alpha: it moves to rotate-out)
    a      = SeZM's focus competition on u's l = 0 channels (F > 1), times the attention weights
             or, without heads, the envelope (times the source gate)
    agg    = rotate_out_sum(y, W, dst, N, streams="blocks", edge_weight=a, order=edge_order(dst),
                            degree_scale=rescale)

SeZM scales each stream's stack result by its competition weight before the rotation back; the
rotation is linear per edge, so the weight moves to rotate-out's edge weight (one per edge, stream
and head) with the same value.  The stack then keeps no unscaled result for an alpha gradient
(rotate-out's backward forms the weight's gradient from the input it keeps anyway): one
``(E, F, ROW)`` surface fewer a block.

It runs with autocast off and in the convolution's compute dtype (float32 or float64): under
bf16 autocast deepmd-kit's own path would run these products in bf16.
"""

from __future__ import annotations

import torch

from ..conv.functional import rotate_in, rotate_out_sum
from ..stack.functional import mixing_stack
from . import glue
from .weights import stack_weights


def message_weight(conv, u0, attention, edges: glue.Edges, dtype):
    """Rotate-out's edge weight: the attention weights ``(E, F, H)`` or, without heads, the
    envelope (times the source gate) ``(E,)``, times SeZM's focus competition ``(E, F)`` where it
    applies (then ``(E, F)`` or ``(E, F, H)``)."""
    weight = (edges.env if edges.gate is None else edges.env * edges.gate) if attention is None else attention
    weight = weight.to(dtype)
    if not (conv.focus_compete and conv.n_focus > 1):
        return weight
    alpha = conv._focus_alpha(u0[:, :, :conv.so2_focus_dim].transpose(0, 1)).to(dtype)          # (E, F)
    return alpha * weight[:, None] if weight.dim() == 1 else alpha.unsqueeze(2) * weight


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
        edge_weight = message_weight(conv, u0, attention, edges, dtype)
        w0, w1, gw = stack_weights(conv, detach=not conv.training)
        unused = u0.new_ones(()).expand(n_edges, n_focus)                 # alpha: rotate-out applies it
        y = mixing_stack(u0, unused, w0, w1, gw, lmax=lmax, focus_dim=cf, apply_alpha=False)
        return rotate_out_sum(y, edges.wigner, edges.dst, n_node, edge_weight=edge_weight, streams="blocks",
                              order=edges.order, degree_scale=conv.rotate_inv_rescale_full.to(dtype))
