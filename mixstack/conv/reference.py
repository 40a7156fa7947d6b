"""The convolution operators around the stack in plain PyTorch: level 0 and the oracle of the tests.

``rotate_in`` gathers each edge's source-atom features, rotates them into the edge frame with
the packed Wigner rows and scales them by radial weights, in the stack's row layout;
``rotate_out_sum`` rotates the stack's result back, sums the focus streams and sums each
atom's incoming edges (docs/contract.md §7 writes both out).  Any float dtype and device;
differentiable to any order by autograd (the kernels' operators fall back to these for a
double backward).
"""

from __future__ import annotations

import math

import torch

from ..core.tracing import tracing
from .layout import DegreeMix, LinearRadial, validate_rotate_in, validate_rotate_out_sum


def contract(spec: str, a, b):
    """``torch.einsum(spec, a, b)`` of two operands; under a trace, the same sum spelled as a
    broadcast product summed over the contracted indices: Inductor fuses that into one
    reduction, where it lowers a per-edge einsum to a batched cuBLAS product of tiny matrices
    split into hundreds of launches (8x the whole frame in a frozen deepmd-kit model,
    BENCHMARKS.md, "The route on a GPU, one rank").  Eagerly the einsum, which makes no
    broadcast temporary; a traced program run without a compiler (a ``.pte``) makes it."""
    if not tracing(a):
        return torch.einsum(spec, a, b)
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    summed = "".join(dict.fromkeys(ch for ch in sa + sb if ch not in out))
    full = out + summed

    def spread(t, s):                       # t's indices in ``full``'s order, size 1 where t has none
        t = t.permute(*[s.index(ch) for ch in full if ch in s])
        shape = iter(t.shape)
        return t.reshape([next(shape) if ch in s else 1 for ch in full])
    prod = spread(a, sa) * spread(b, sb)
    return prod.sum(tuple(range(len(out), len(full)))) if summed else prod


def linear_radial_weights(radial: LinearRadial, lmax: int, with_scalar: bool):
    """``(radial (E, F, 2*lmax+1, C), scalar_weight (E, F, lmax+1, C) or None)``: the weights a
    ``LinearRadial`` stands for, made whole, one ``nn.functional.linear`` per row group (so
    their gradients arrive as two tensors: slices of one output would each be scattered into a
    zero-filled copy of all of it and added)."""
    hidden, weight, bias = radial
    f, rows, c, h = weight.shape
    cut = 2 * lmax + 1
    groups = ((0, cut), (cut, rows)) if with_scalar else ((0, cut),)
    parts = [torch.nn.functional.linear(hidden, weight[:, lo:hi].reshape(-1, h), bias[:, lo:hi].reshape(-1))
             .view(hidden.shape[0], f, hi - lo, c) for lo, hi in groups]
    return parts[0], (parts[1] if with_scalar else None)


def rotate_in(x, wigner, radial, src, *, edge_scalar=None, scalar_weight=None, edge_weight=None, streams=None,
              degree_mix=None):
    """``u (F, E, ROW)``: ``u[f, e, sub(k, l), c] = ew[e] * (radial[e, f, r(k, l), c] *
    rot_k[e, l, q] + [k = 1] * sw[e, f, l, c] * h[e, c])``, ``rot_k[e, l] = W[e, k, l^2 .. l^2+2l]
    @ x[src[e], l^2 .. l^2+2l]`` (rows ``k = 0, 1, 2`` are m = -1, 0, +1; degree 0 has row 1 only;
    ``h = edge_scalar``, ``sw = scalar_weight``); ``q = c``, or ``q = f*C + c`` with ``streams``
    (``x`` holds a channel block per stream).  ``r(1, l) = l``, ``r(0, l) = r(2, l) = lmax + l``, or
    ``l`` for per-degree ``radial (E, F, lmax+1, C)``; ``radial=None``: no scaling.  ``radial``
    may be a ``LinearRadial`` (``linear_radial_weights`` makes the weights).  ``degree_mix``
    (``DegreeMix``) then mixes the degrees of each order block (``degree_mixed``)."""
    lay, n_focus, n_edges = validate_rotate_in(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight,
                                               streams, degree_mix)
    lmax, c = lay.lmax, lay.focus_dim
    if isinstance(radial, LinearRadial):
        radial, scalar_weight = linear_radial_weights(radial, lmax, edge_scalar is not None)
    rn, r0, rp = _rotated(x.index_select(0, src), wigner, lmax)
    if streams is not None:                     # (E, rows, F*C) -> (E, F, rows, C)
        rn, r0, rp = (t.unflatten(2, (n_focus, c)).transpose(1, 2) for t in (rn, r0, rp))
    else:
        rn, r0, rp = rn[:, None], r0[:, None], rp[:, None]
    first, mid, last = r0, rn, rp
    if radial is not None:
        a0 = radial[:, :, :lmax + 1]
        a1 = radial[:, :, 1:] if radial.shape[2] == lmax + 1 else radial[:, :, lmax + 1:]
        first, mid, last = a0 * r0, a1 * rn, a1 * rp
    if edge_scalar is not None:
        first = first + scalar_weight * edge_scalar[:, None, None]
    u = torch.cat([t.expand(n_edges, n_focus, t.shape[2], c) for t in (first, mid, last)], 2)
    if edge_weight is not None:
        u = u * edge_weight[:, None, None, None]
    if degree_mix is not None:
        u = degree_mixed(u, degree_mix, lmax)
    return u.reshape(n_edges, n_focus, lay.row).transpose(0, 1).contiguous()


def mix_weights(degree_mix: DegreeMix, wide: int):
    """``Wm (E, K, wide)``: the degree mix's per-channel kernel, ``kernel @ basis``, the one
    kernel of ``R = 1`` for every channel, or the per-channel kernel as it is."""
    kernel, basis = degree_mix
    if basis is not None:
        return torch.einsum("ekr,rq->ekq", kernel, basis)
    return kernel.expand(kernel.shape[0], kernel.shape[1], wide)


def degree_mixed(u, degree_mix: DegreeMix, lmax: int):
    """``u (E, F, 3*lmax+1, C)`` mixed within each order block: ``y[e, f, sub(b, o), c] = sum_i
    Wm[e, first(b) + i*n_b + o, f*C + c] * u[e, f, sub(b, i), c]`` (m = 0: ``n_b = lmax+1``
    degrees from 0, kernel rows from 0; m = -1 and m = +1: ``n_b = lmax`` from 1, rows from
    ``(lmax+1)^2``, one kernel for both)."""
    n_edges, n_focus, _, c = u.shape
    n0 = lmax + 1
    wm = mix_weights(degree_mix, n_focus * c).unflatten(2, (n_focus, c))            # (E, K, F, C)
    k0 = wm[:, :n0 * n0].unflatten(1, (n0, n0))                                     # (E, i, o, F, C)
    k1 = wm[:, n0 * n0:].unflatten(1, (lmax, lmax))
    y0 = contract("eiofc,efic->efoc", k0, u[:, :, :n0])
    yn = contract("eiofc,efic->efoc", k1, u[:, :, n0:n0 + lmax])
    yp = contract("eiofc,efic->efoc", k1, u[:, :, n0 + lmax:])
    return torch.cat((y0, yn, yp), 2)


def rotate_out_from_sum(ys, wigner, dst, n_atoms: int, *, lmax: int, edge_weight=None):
    """``rotate_out_sum`` of the focus sum ``ys (E, ROW)`` (inputs assumed valid)."""
    n_edges = ys.shape[0]
    y = ys.reshape(n_edges, 3 * lmax + 1, ys.shape[1] // (3 * lmax + 1))
    msg = _back_rotated(y[:, lmax + 1:2 * lmax + 1], y[:, :lmax + 1], y[:, 2 * lmax + 1:], wigner, lmax)
    if edge_weight is not None:
        msg = msg * edge_weight[:, None, None]
    return msg.new_zeros((n_atoms,) + tuple(msg.shape[1:])).index_add(0, dst, msg)


def rotate_out_sum(y, wigner, dst, n_atoms: int, *, edge_weight=None, streams: str = "sum", order=None,
                   degree_scale=None):
    """``out (n_atoms, S, C)``: ``out[i, l^2 + n] = sum_{e: dst[e] = i} ew[e] * sum_k W[e, k,
    l^2 + n] * ys_k[e, l]``, ``ys = y.sum(1)`` the focus streams' sum in the row layout; with
    ``streams="blocks"`` the streams kept apart, ``(n_atoms, S, F*C)`` with stream ``f`` in
    channels ``[f*C, (f+1)*C)`` and ``edge_weight`` ``(E,)``, ``(E, F)`` or ``(E, F, H)`` (head
    ``h`` of a stream scales its channels ``[h*C/H, (h+1)*C/H)``); times ``degree_scale[l^2 + n]``.
    ``order`` (``EdgeOrder``) is checked, not needed: the sum at each atom runs over ``dst``."""
    lay, _, _ = validate_rotate_out_sum(y, wigner, dst, n_atoms, edge_weight, streams, order, degree_scale)
    return rotate_out_formula(y, wigner, dst, n_atoms, lay.lmax, edge_weight, streams == "blocks", degree_scale)


def rotate_out_formula(y, wigner, dst, n_atoms: int, lmax: int, edge_weight, blocks: bool, degree_scale):
    """``rotate_out_sum`` on valid inputs (``edge_weight (E, F)`` given as ``(E, F, 1)`` or not)."""
    if not blocks:
        out = rotate_out_from_sum(y.sum(1), wigner, dst, n_atoms, lmax=lmax, edge_weight=edge_weight)
    else:
        n_edges, n_focus, row = y.shape
        rows, c = 3 * lmax + 1, row // (3 * lmax + 1)
        v = y.reshape(n_edges, n_focus, rows, c)
        if edge_weight is not None and edge_weight.dim() == 1:
            v = v * edge_weight[:, None, None, None]
        elif edge_weight is not None:
            weight = edge_weight.reshape(n_edges, n_focus, 1, -1, 1)
            v = (v.unflatten(3, (weight.shape[3], c // weight.shape[3])) * weight).flatten(3)
        out = rotate_out_from_sum(v.transpose(1, 2).reshape(n_edges, rows * n_focus * c), wigner, dst, n_atoms,
                                  lmax=lmax)
    return out if degree_scale is None else out * degree_scale[:, None]


def _rotated(x_rows, wigner, lmax: int):
    """``(rot_-1 (E, lmax, C), rot_0 (E, lmax+1, C), rot_+1 (E, lmax, C))``: gathered rows rotated
    into the edge frame."""
    m0, mneg, mpos = [wigner[:, 1, :1] * x_rows[:, 0]], [], []
    for l in range(1, lmax + 1):
        r = contract("ekn,enc->ekc", wigner[:, :, l * l:(l + 1) * (l + 1)], x_rows[:, l * l:(l + 1) * (l + 1)])
        mneg.append(r[:, 0])
        m0.append(r[:, 1])
        mpos.append(r[:, 2])
    return torch.stack(mneg, 1), torch.stack(m0, 1), torch.stack(mpos, 1)


def _back_rotated(gn, g0, gp, wigner, lmax: int):
    """``(E, S, C)``: the three rows' values rotated back, ``sum_k W[e, k, l^2 + n] * g_k[e, l]``."""
    parts = [wigner[:, 1, :1, None] * g0[:, :1]]
    for l in range(1, lmax + 1):
        kept = torch.stack((gn[:, l - 1], g0[:, l], gp[:, l - 1]), 1)
        parts.append(contract("ekn,ekc->enc", wigner[:, :, l * l:(l + 1) * (l + 1)], kept))
    return torch.cat(parts, 1)


def _wigner_grad(gn, g0, gp, x_rows, lmax: int):
    """``(E, 3, S)``: ``sum_c g_k[e, l, c] * X[e, l^2 + n, c]``; degree 0's rows ``k = 0, 2`` zero."""
    zero = g0.new_zeros(g0.shape[0], 1)
    cols = [torch.stack((zero, (g0[:, 0] * x_rows[:, 0]).sum(-1, keepdim=True), zero), 1)]
    for l in range(1, lmax + 1):
        g = torch.stack((gn[:, l - 1], g0[:, l], gp[:, l - 1]), 1)              # (E, 3, C)
        cols.append(contract("ekc,enc->ekn", g, x_rows[:, l * l:(l + 1) * (l + 1)]))
    return torch.cat(cols, 2)


def rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar=None, scalar_weight=None, edge_weight=None):
    """The gradients ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight)`` of
    ``rotate_in`` (``None`` for absent inputs), spelled out in tensor ops (autograd
    differentiates them again)."""
    n_focus, n_edges = grad_u.shape[0], grad_u.shape[1]
    lmax = radial.shape[2] // 2
    c = x.shape[2]
    g = grad_u.transpose(0, 1).reshape(n_edges, n_focus, 3 * lmax + 1, c)
    xs = x[src]
    rn, r0, rp = _rotated(xs, wigner, lmax)
    a0, a1 = radial[:, :, :lmax + 1], radial[:, :, lmax + 1:]
    g_ew = None
    if edge_weight is not None:
        first = a0 * r0[:, None]
        if edge_scalar is not None:
            first = first + scalar_weight * edge_scalar[:, None, None]
        pre = torch.cat((first, a1 * rn[:, None], a1 * rp[:, None]), 2)
        g_ew = (g * pre).sum((1, 2, 3))
        g = g * edge_weight[:, None, None, None]
    g0, gn, gp = g[:, :, :lmax + 1], g[:, :, lmax + 1:2 * lmax + 1], g[:, :, 2 * lmax + 1:]
    g_rad = torch.cat((g0 * r0[:, None], gn * rn[:, None] + gp * rp[:, None]), 2)
    g_h = g_sw = None
    if edge_scalar is not None:
        g_h = (g0 * scalar_weight).sum((1, 2))
        g_sw = g0 * edge_scalar[:, None, None]
    tn, t0, tp = (gn * a1).sum(1), (g0 * a0).sum(1), (gp * a1).sum(1)
    g_w = _wigner_grad(tn, t0, tp, xs, lmax)
    g_x = torch.zeros_like(x).index_add(0, src, _back_rotated(tn, t0, tp, wigner, lmax))
    return g_x, g_w, g_rad, g_h, g_sw, g_ew


def rotate_out_backward(grad_out, ys, wigner, dst, edge_weight=None):
    """The gradients ``(ys (E, ROW), wigner, edge_weight)`` of ``rotate_out_from_sum`` (the focus
    sum's gradient is every stream's), in tensor ops."""
    lmax = math.isqrt(wigner.shape[2]) - 1
    n_edges = wigner.shape[0]
    c = ys.shape[1] // (3 * lmax + 1)
    y = ys.reshape(n_edges, 3 * lmax + 1, c)
    ga = grad_out[dst]
    gn, g0, gp = _rotated(ga, wigner, lmax)
    yn, y0, yp = y[:, lmax + 1:2 * lmax + 1], y[:, :lmax + 1], y[:, 2 * lmax + 1:]
    g_ew = None
    scale = 1
    if edge_weight is not None:
        g_ew = (g0 * y0).sum((1, 2)) + (gn * yn).sum((1, 2)) + (gp * yp).sum((1, 2))
        scale = edge_weight[:, None, None]
    g_y = torch.cat((g0, gn, gp), 1) * scale
    g_w = _wigner_grad(yn * scale, y0 * scale, yp * scale, ga, lmax)
    return g_y.reshape(n_edges, -1), g_w, g_ew
