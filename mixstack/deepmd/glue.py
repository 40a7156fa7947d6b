"""What stands between SeZM's edge cache and mixstack's operators: the frame's shared edge
inputs, and SeZM's degree mixer as a ``mixstack.DegreeMix``.

The operators take everything else as SeZM hands it over (docs/deepmd.md, "What glue remains"):
SeZM's Wigner signs are ``edge_wigner(convention="sezm")``, its per-stream channel blocks
``rotate_in(streams=F)``, its degree mixer ``rotate_in(degree_mix=...)``, its per-degree radial
weights a strided view, its kept-apart streams and per-head attention weights
``rotate_out_sum(streams="blocks", edge_weight=(E, F, H))``, its unsorted destinations
``rotate_out_sum(order=edge_order(dst, N))`` and its inverse-rotation rescale
``rotate_out_sum(degree_scale=...)``.  Nothing here copies an edge tensor.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from ..conv.functional import edge_order, edge_wigner
from ..conv.layout import DegreeMix, EdgeOrder
from ..dispatch.levels import use_level


def scope(level: int | None, device_type: str) -> contextlib.ExitStack:
    """Autocast off (under bf16 autocast deepmd-kit's own path would run these products in bf16)
    and mixstack's level pinned to ``level`` (``None``: the active one)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
    if level is not None:
        stack.enter_context(use_level(level))
    return stack


class Edges(NamedTuple):
    """One frame's edges as SeZM's edge cache lists them (by source): ``env (E,)`` the cutoff
    envelope, ``gate (E,)`` SeZM's source gate or ``None``, ``wigner (E, 3, (lmax+1)^2)`` the
    packed Wigner rows in SeZM's signs, ``order`` the edges grouped by destination."""

    src: torch.Tensor
    dst: torch.Tensor
    env: torch.Tensor
    gate: torch.Tensor | None
    wigner: torch.Tensor
    order: EdgeOrder


def frame_edges(edge_cache, lmax: int, dtype: torch.dtype, n_node: int, level: int | None = None) -> Edges:
    """The edge inputs of every SO(2) convolution of a frame: the Wigner rows (one kernel, at
    mixstack level ``level``, ``None``: the active one) and the destination order (a sort, no
    device synchronisation).  Built by the frame's first convolution and kept, for the blocks
    after it, in the edge cache's per-frame dict (``D_to_m_cache``, which deepmd-kit makes anew
    for every forward) where it has one."""
    shared = edge_cache.D_to_m_cache if isinstance(edge_cache.D_to_m_cache, dict) else {}
    key = f"mixstack:wigner:{lmax}:{dtype}"
    if key not in shared:
        vec = edge_cache.edge_vec
        with scope(level, vec.device.type):
            shared[key] = edge_wigner(vec.to(dtype), lmax, convention="sezm")
    if "mixstack:perm" not in shared:
        shared["mixstack:perm"], shared["mixstack:offsets"] = edge_order(edge_cache.dst, n_node)
    gate = None if edge_cache.edge_src_gate is None else edge_cache.edge_src_gate.reshape(-1)
    return Edges(edge_cache.src, edge_cache.dst, edge_cache.edge_env.reshape(-1), gate, shared[key],
                 EdgeOrder(shared["mixstack:perm"], shared["mixstack:offsets"]))


def degree_mix(mixer, rad: torch.Tensor, *, detach: bool) -> DegreeMix:
    """SeZM's ``DynamicRadialDegreeMixer`` on the per-degree radial features ``rad (E, lmax+1, C)``
    as a ``DegreeMix``: its per-edge kernel ``rad @ mixer.weight`` (the mixer's own linear layer)
    ``(E, K, R)`` and its channel basis (``"degree_channel"`` with a rank; ``R = 1`` in ``"degree"``
    mode, ``R = C`` without a rank).  ``detach`` (inference) cuts the mixer's parameters from the
    graph, so no backward computes their gradients (the edges' still reach the forces)."""
    weight = mixer.weight.detach() if detach else mixer.weight
    kernel = (rad.reshape(rad.shape[0], -1) @ weight).view(rad.shape[0], mixer.degree_kernel_size, -1)
    basis = mixer.channel_basis if mixer.mode == "degree_channel" and mixer.rank > 0 else None
    if basis is not None and detach:
        basis = basis.detach()
    return DegreeMix(kernel, basis)
