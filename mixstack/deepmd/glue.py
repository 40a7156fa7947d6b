"""The PyTorch glue around mixstack's operators that a SeZM value path needs today.

Each function here stands for one feature mixstack's operators do not have yet
(docs/deepmd.md, "Glue and the operator features that replace it"):

* ``sezm_wigner``: SeZM's real-harmonic signs on ``mixstack.edge_wigner``'s rows;
* ``edges_by_destination``: the edges sorted by destination for ``rotate_out_sum``;
* ``unit_radial`` / ``degree_radial``: SeZM's per-degree radial weights in ``rotate_in``'s
  ``(E, F, 2*lmax+1, C)`` form;
* ``mixer_kernel`` / ``degree_mix``: SeZM's dynamic radial degree mixer after ``rotate_in``
  (``DegreeKernel``);
* ``focus_major`` / ``channel_major``: per-stream channel blocks in and kept-apart streams out
  (``rotate_in`` and ``rotate_out_sum`` run once over all ``F * Cf`` channels, and the stack's
  focus-major rows are re-laid between them), with the per-head attention weights.

Everything is differentiable to any order (training differentiates it twice).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ..conv.functional import edge_wigner


@functools.lru_cache(maxsize=None)
def _sign_rows(lmax: int) -> tuple[float, ...]:
    """SeZM's packed Wigner rows are ``signs * mixstack's``, flattened ``(3, (lmax+1)^2)``.

    Column ``(l, m)``: ``(-1)^m`` for ``m > 0``, ``(-1)^(|m|+1)`` for ``m < 0``, ``1`` for
    ``m = 0`` (the two real-harmonic conventions differ by these signs).  Row ``m = +1`` flips
    as well: with it, SeZM's edge frame and mixstack's differ by a roll about the edge only,
    which the SO(2) stack commutes with."""
    cols = [1.0]
    for l in range(1, lmax + 1):
        for m in range(-l, l + 1):
            cols.append(float((-1) ** m) if m > 0 else float((-1) ** (-m + 1)) if m < 0 else 1.0)
    rows = (1.0, 1.0, -1.0)
    return tuple(r * c for r in rows for c in cols)


def sezm_signs(lmax: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The ``(3, (lmax+1)^2)`` signs that turn ``mixstack.edge_wigner``'s rows into SeZM's."""
    return torch.tensor(_sign_rows(lmax), dtype=dtype, device=device).view(3, (lmax + 1) ** 2)


def sezm_wigner(vec: torch.Tensor, lmax: int) -> torch.Tensor:
    """``(E, 3, (lmax+1)^2)``: the rows ``m = -1, 0, +1`` of each edge's Wigner matrices in SeZM's
    basis, for ``rotate_in`` and ``rotate_out_sum`` (glue: one elementwise product)."""
    return edge_wigner(vec, lmax) * sezm_signs(lmax, dtype=vec.dtype, device=vec.device)


class Edges(NamedTuple):
    """One convolution's edges, sorted by destination (stably: equal destinations keep their
    order).  ``env (E,)`` the cutoff envelope, ``gate (E,)`` SeZM's source gate or ``None``,
    ``radial (E, lmax+1, C)`` the block's radial features."""

    src: torch.Tensor
    dst: torch.Tensor
    vec: torch.Tensor
    env: torch.Tensor
    gate: torch.Tensor | None
    radial: torch.Tensor


def _tracing() -> bool:
    """True while a compiler or ``make_fx`` traces, or a CUDA graph captures: no data-dependent
    branch (no device synchronisation) is allowed then."""
    if torch.compiler.is_compiling():
        return True
    from torch.fx.experimental.proxy_tensor import get_proxy_mode
    if get_proxy_mode() is not None:
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def edges_by_destination(edge_cache, radial: torch.Tensor) -> Edges:
    """The edges of SeZM's ``edge_cache`` (with the block's ``radial`` features) in destination
    order, as ``rotate_out_sum`` needs them.  SeZM's standard neighbour-list path already lists
    them so (nothing is copied, after one check that synchronises); its sparse-edge path does not
    (one stable sort, then a gather of every edge tensor).  While tracing, always sorted."""
    src, dst = edge_cache.src, edge_cache.dst
    env = edge_cache.edge_env.reshape(-1)
    gate = None if edge_cache.edge_src_gate is None else edge_cache.edge_src_gate.reshape(-1)
    vec = edge_cache.edge_vec
    if not _tracing() and (dst.numel() < 2 or bool((dst[1:] >= dst[:-1]).all())):
        return Edges(src, dst, vec, env, gate, radial)
    order = torch.argsort(dst, stable=True)
    return Edges(src[order], dst[order], vec[order], env[order], None if gate is None else gate[order],
                 radial[order])


def unit_radial(n_edges: int, lmax: int, channels: int, like: torch.Tensor) -> torch.Tensor:
    """Radial weights of one for ``rotate_in`` (a stride-0 view: no memory), where SeZM's degree
    mixer does the radial part after the rotation."""
    return like.new_ones(()).expand(n_edges, 1, 2 * lmax + 1, channels)


def degree_radial(rad: torch.Tensor, lmax: int) -> torch.Tensor:
    """SeZM's per-degree radial weights ``rad (E, lmax+1, C)`` as ``rotate_in``'s
    ``(E, 1, 2*lmax+1, C)``: the m = 0 subtiles take degrees ``0..lmax``, the |m| = 1 pairs
    degrees ``1..lmax`` (glue: one copy of the ``lmax`` repeated rows)."""
    return torch.cat((rad, rad[:, 1:]), 1).unsqueeze(1)


class DegreeKernel(NamedTuple):
    """SeZM's per-edge degree kernel: channel ``c`` mixes with ``sum_r compact[e, k, r] *
    basis[r, c]``; ``basis`` ``None`` means ``R = 1`` (one kernel for every channel) or ``R = C``
    (one per channel, ``compact[e, k, c]``).  ``K = (lmax+1)^2 + lmax^2``: the m = 0 block's
    entries ``(l_in, l_out)`` row-major, then the |m| = 1 block's (shared by m = -1 and m = +1)."""

    compact: torch.Tensor
    basis: torch.Tensor | None


def mixer_kernel(mixer, rad: torch.Tensor) -> DegreeKernel:
    """The degree kernel of SeZM's ``DynamicRadialDegreeMixer`` on the per-degree radial features
    ``rad (E, lmax+1, C)``: ``"degree"`` mode (``R = 1``), ``"degree_channel"`` with a rank
    (``R = rank``, the mixer's channel basis) or without (``R = C``)."""
    n_edges = rad.shape[0]
    compact = (rad.reshape(n_edges, -1) @ mixer.weight).view(n_edges, mixer.degree_kernel_size, -1)
    basis = mixer.channel_basis if mixer.mode == "degree_channel" and mixer.rank > 0 else None
    return DegreeKernel(compact, basis)


def degree_mix(u: torch.Tensor, kernel: DegreeKernel, lmax: int) -> torch.Tensor:
    """``y[e, l_out, c] = sum_l_in W[e, (l_in, l_out), c] * u[e, l_in, c]`` within each order
    block of the m-major rows ``u (E, 3*lmax+1, C)`` (m = 0: degrees ``0..lmax``; m = -1 and
    m = +1: degrees ``1..lmax``, one kernel for both), ``W`` from ``kernel``, as SeZM's degree
    mixer.  A shared or low-rank kernel runs as ``R`` batched products of ``(l_out, l_in)``
    matrices per edge (the ``(E, K, C)`` per-channel kernel is never made); a full per-channel
    kernel as elementwise products."""
    n_edges, _, channels = u.shape
    n0 = lmax + 1
    compact, basis = kernel
    k0 = compact[:, :n0 * n0].unflatten(1, (n0, n0))                   # (E, l_in, l_out, R)
    k1 = compact[:, n0 * n0:].unflatten(1, (lmax, lmax))
    x0 = u[:, :n0]
    x1 = u[:, n0:].unflatten(1, (2, lmax))                              # (E, m = -1 | +1, l, C)
    if basis is None and compact.shape[2] == channels and channels > 1:
        def mixed(k, x):                                                # k (E, l_in, l_out, C), x (E, l_in, C)
            out = k[:, 0] * x[:, :1]
            for i in range(1, x.shape[1]):
                out = out + k[:, i] * x[:, i:i + 1]
            return out
        y0, y1 = mixed(k0, x0), torch.stack((mixed(k1, x1[:, 0]), mixed(k1, x1[:, 1])), 1)
    else:
        y0 = y1 = None
        for r in range(compact.shape[2]):
            t0 = torch.matmul(k0[..., r].transpose(1, 2), x0)
            t1 = torch.matmul(k1[..., r].transpose(1, 2).unsqueeze(1), x1)
            if basis is not None:
                t0, t1 = t0 * basis[r], t1 * basis[r]
            y0 = t0 if y0 is None else y0 + t0
            y1 = t1 if y1 is None else y1 + t1
    return torch.cat((y0, y1.reshape(n_edges, 2 * lmax, channels)), 1)


def focus_major(u: torch.Tensor, n_focus: int) -> torch.Tensor:
    """``(E, 3*lmax+1, F*Cf)`` rows, each stream's channels a block, to the stack's
    ``(F, E, ROW)`` (glue: one copy when ``F > 1``)."""
    n_edges, rows, wide = u.shape
    return u.view(n_edges, rows, n_focus, wide // n_focus).permute(2, 0, 1, 3).reshape(n_focus, n_edges, -1)


def channel_major(y: torch.Tensor, n_rows: int, head_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The stack's ``(E, F, ROW)`` result as one stream of ``F*Cf`` channels, ``(E, 1,
    n_rows*F*Cf)``, each stream's channels a block (glue: one copy when ``F > 1``), times
    ``head_weight (E, F, H)`` on each head's ``Cf/H`` channels when given (glue: one product)."""
    n_edges, n_focus, row = y.shape
    cf = row // n_rows
    y = y.view(n_edges, n_focus, n_rows, cf)
    if head_weight is not None:
        heads = head_weight.shape[2]
        y = (y.view(n_edges, n_focus, n_rows, heads, cf // heads)
             * head_weight.view(n_edges, n_focus, 1, heads, 1)).view(n_edges, n_focus, n_rows, cf)
    return y.transpose(1, 2).reshape(n_edges, 1, n_rows * n_focus * cf)
