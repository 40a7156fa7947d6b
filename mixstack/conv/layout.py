"""Shapes of the convolution operators around the stack, and validation of their inputs.

``rotate_in`` and ``rotate_out_sum`` (docs/contract.md §7) read node features ``(N, S, C)``
with ``S = (lmax+1)^2`` real-harmonic coefficients of ``C`` channels, and the packed Wigner
rows ``(E, 3, S)``: per edge, the rows ``m = -1, 0, +1`` of each degree's real Wigner matrix,
degree ``l`` at columns ``l^2 .. l^2 + 2l``.  Both derive ``lmax`` and ``C`` from their
inputs; the row they hand to or take from the stack is the stack's (``StackLayout``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..core.layout import LMAX_RANGE, StackLayout, _check_size, _check_tensor, _fmt


def n_coefficients(lmax: int) -> int:
    """``(lmax + 1)^2``: real-harmonic coefficients of the degrees ``0 .. lmax``."""
    return (lmax + 1) ** 2


def _lmax_of(name: str, s: int) -> int:
    lmax = math.isqrt(s) - 1
    if (lmax + 1) ** 2 != s or lmax not in LMAX_RANGE:
        raise ValueError(f"{name} must hold (lmax+1)^2 coefficients with lmax in 1..6 "
                         f"(4, 9, 16, 25, 36 or 49), got {s}")
    return lmax


def _check_index(name: str, t, n_edges: int, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must have dtype int64 or int32, got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != n_edges:
        raise ValueError(f"{name} must have shape (E,) = ({n_edges},), got {_fmt(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like the other inputs, got {t.device}")


def _check_same(ref_name: str, ref: torch.Tensor, named: dict) -> None:
    for name, t in named.items():
        if t is None:
            continue
        if t.dtype != ref.dtype:
            raise TypeError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}")
        if t.device != ref.device:
            raise ValueError(f"{name} must be on {ref.device} like {ref_name}, got {t.device}")


class LinearRadial(NamedTuple):
    """Radial weights given as the linear layer that makes them: ``hidden @ weight^T + bias``.

    ``hidden (E, H)`` the layer's input on every edge, ``weight (F, R, C, H)`` and ``bias
    (F, R, C)``: row ``r`` of focus stream ``f`` is ``radial[e, f, r] = weight[f, r] @ hidden[e]
    + bias[f, r]``.  ``R = 2*lmax + 1`` (the ``radial`` rows of ``rotate_in``), or ``3*lmax + 2``
    with an edge scalar, whose weights (``scalar_weight``) are then rows ``2*lmax + 1 ..``.  Given
    this, the kernels make each tile of the weights where they read it, and the ``(E, F, R, C)``
    tensor never exists (docs/contract.md §7).  ``nn.Linear(H, F*R*C)``'s parameters are
    ``weight.view(F, R, C, H)`` and ``bias.view(F, R, C)``."""

    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor


class DegreeMix(NamedTuple):
    """A per-edge mix of the degrees within each order block of the stack's row (SeZM's dynamic
    radial degree mixer), for ``rotate_in(degree_mix=...)``.

    ``kernel (E, K, R)`` with ``K = (lmax+1)^2 + lmax^2``: the m = 0 block's entries ``(l_in,
    l_out)`` row-major (degrees ``0..lmax``), then the |m| = 1 block's (degrees ``1..lmax``, one
    kernel for m = -1 and m = +1).  ``basis (R, F*C)`` or ``None``: channel ``q`` (stream ``q //
    C``) mixes with ``sum_r kernel[e, k, r] * basis[r, q]``; without a basis ``R = 1`` (one kernel
    for every channel) or ``R = F*C`` (one per channel)."""

    kernel: torch.Tensor
    basis: torch.Tensor | None = None


class EdgeOrder(NamedTuple):
    """The edges grouped by destination atom (``mixstack.edge_order``): ``perm (E,)`` a stable
    argsort of ``dst`` and ``offsets (N+1,)``: atom ``a``'s edges are ``perm[offsets[a]:offsets[a+1]]``."""

    perm: torch.Tensor
    offsets: torch.Tensor


def mix_rows(lmax: int) -> int:
    """``K``: the degree mix's kernel entries, ``(lmax+1)^2 + lmax^2``."""
    return (lmax + 1) ** 2 + lmax ** 2


def validate_linear_radial(radial: LinearRadial, n_edges: int, lmax: int, c: int, has_scalar: bool) -> int:
    """Check a ``LinearRadial``; return ``F``.  Errors name the field."""
    hidden, weight, bias = radial
    _check_tensor("radial.hidden", hidden, 2, "(E, H)")
    _check_size("radial.hidden", hidden, (n_edges, hidden.shape[1]), "(E, H) with E from wigner")
    rows = 3 * lmax + 2 if has_scalar else 2 * lmax + 1
    what = "3*lmax+2 rows (the radial weights, then the edge scalar's)" if has_scalar else "2*lmax+1 rows"
    _check_tensor("radial.weight", weight, 4, "(F, R, C, H)")
    n_focus = weight.shape[0]
    _check_size("radial.weight", weight, (n_focus, rows, c, hidden.shape[1]), f"(F, R, C, H) with {what}")
    _check_tensor("radial.bias", bias, 3, "(F, R, C)")
    _check_size("radial.bias", bias, (n_focus, rows, c), "(F, R, C) matching radial.weight")
    return n_focus


def _stream_channels(x, streams) -> int:
    """``C``: the channels of one focus stream in ``x (N, S, CW)``."""
    if streams is None:
        return x.shape[2]
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise ValueError(f"streams must be None or a positive int (the focus streams F), got {streams!r}")
    if x.shape[2] % streams:
        raise ValueError(f"x must have F*C channels with F = streams = {streams} (one channel block per stream), "
                         f"got shape {_fmt(x.shape)}")
    return x.shape[2] // streams


def _check_radial(radial, n_edges: int, lmax: int, c: int, streams) -> int:
    """Check a radial tensor (or ``None``); return its ``F`` (``streams`` or 1 for ``None``)."""
    if radial is None:
        return streams or 1
    _check_tensor("radial", radial, 4, "(E, F, 2*lmax+1, C) or (E, F, lmax+1, C)")
    n_focus = radial.shape[1]
    rows = radial.shape[2] if radial.shape[2] in (lmax + 1, 2 * lmax + 1) else 2 * lmax + 1
    _check_size("radial", radial, (n_edges, n_focus, rows, c),
                "(E, F, 2*lmax+1, C), or (E, F, lmax+1, C) per degree, matching x and wigner")
    if streams is not None and n_focus != streams:
        raise ValueError(f"radial must have F = streams = {streams} focus streams, got shape {_fmt(radial.shape)}")
    return n_focus


def _check_degree_mix(degree_mix, n_edges: int, lmax: int, n_focus: int, c: int, streams) -> None:
    if not isinstance(degree_mix, DegreeMix):
        raise TypeError(f"degree_mix must be a mixstack.DegreeMix(kernel, basis), got {type(degree_mix).__name__}")
    if streams is None and n_focus > 1:
        raise ValueError("degree_mix needs streams=F (each focus stream its own channel block of x) or one focus "
                         f"stream, got F = {n_focus} streams that share x's channels")
    kernel, basis = degree_mix
    _check_tensor("degree_mix.kernel", kernel, 3, "(E, K, R)")
    _check_size("degree_mix.kernel", kernel, (n_edges, mix_rows(lmax), kernel.shape[2]),
                f"(E, K, R) with K = (lmax+1)^2 + lmax^2 = {mix_rows(lmax)}")
    wide = n_focus * c
    if basis is None:
        if kernel.shape[2] not in (1, wide):
            raise ValueError(f"degree_mix.kernel must have R = 1 or R = F*C = {wide} without a basis, "
                             f"got shape {_fmt(kernel.shape)}")
    else:
        _check_tensor("degree_mix.basis", basis, 2, "(R, F*C)")
        _check_size("degree_mix.basis", basis, (kernel.shape[2], wide), "(R, F*C) with R from degree_mix.kernel")


def validate_rotate_in(x, wigner, radial, src, edge_scalar=None, scalar_weight=None,
                       edge_weight=None, streams=None, degree_mix=None) -> tuple[StackLayout, int, int]:
    """Check ``rotate_in``'s arguments (``radial`` a tensor, a ``LinearRadial`` or ``None``); return
    ``(layout, F, E)`` (``layout.focus_dim`` the channels of one stream).  Errors name the argument."""
    _check_tensor("x", x, 3, "(N, S=(lmax+1)^2, C)")
    lmax = _lmax_of("x's dimension 1", x.shape[1])
    c = _stream_channels(x, streams)
    if c < 1:
        raise ValueError(f"x must have C >= 1 channels, got shape {_fmt(x.shape)}")
    s = n_coefficients(lmax)
    _check_tensor("wigner", wigner, 3, "(E, 3, S)")
    n_edges = wigner.shape[0]
    _check_size("wigner", wigner, (n_edges, 3, s), "(E, 3, S) with S from x")
    if isinstance(radial, LinearRadial):
        if streams not in (None, 1) or degree_mix is not None:
            raise ValueError("a LinearRadial radial goes without streams and degree_mix: pass the radial weights "
                             "as a tensor")
        if scalar_weight is not None:
            raise ValueError("with a LinearRadial, the edge scalar's weights are rows of radial.weight: "
                             "pass scalar_weight=None")
        n_focus = validate_linear_radial(radial, n_edges, lmax, c, edge_scalar is not None)
        _check_same("x", x, dict(zip(("radial.hidden", "radial.weight", "radial.bias"), radial)))
        radial, matching = None, "x and wigner"
    else:
        n_focus = _check_radial(radial, n_edges, lmax, c, streams)
        if (edge_scalar is None) != (scalar_weight is None):
            raise ValueError("edge_scalar and scalar_weight go together: pass both or neither")
        matching = "radial"
    if streams not in (None, 1) and edge_scalar is not None:
        raise ValueError("edge_scalar goes without streams (every stream would read the same scalar): "
                         "pass streams=None")
    if edge_scalar is not None:
        _check_tensor("edge_scalar", edge_scalar, 2, "(E, C)")
        _check_size("edge_scalar", edge_scalar, (n_edges, c), f"(E, C) matching {matching}")
    if scalar_weight is not None:
        _check_tensor("scalar_weight", scalar_weight, 4, "(E, F, lmax+1, C)")
        _check_size("scalar_weight", scalar_weight, (n_edges, n_focus, lmax + 1, c),
                    "(E, F, lmax+1, C) matching radial")
    if edge_weight is not None:
        _check_tensor("edge_weight", edge_weight, 1, "(E,)")
        _check_size("edge_weight", edge_weight, (n_edges,), "(E,) matching wigner")
    if degree_mix is not None:
        _check_degree_mix(degree_mix, n_edges, lmax, n_focus, c, streams)
    mix_kernel, mix_basis = (None, None) if degree_mix is None else degree_mix
    _check_same("x", x, {"wigner": wigner, "radial": radial, "edge_scalar": edge_scalar,
                         "scalar_weight": scalar_weight, "edge_weight": edge_weight,
                         "degree_mix.kernel": mix_kernel, "degree_mix.basis": mix_basis})
    _check_index("src", src, n_edges, x.device)
    return StackLayout(lmax, c), n_focus, n_edges


def _check_out_edge_weight(edge_weight, n_edges: int, n_focus: int, c: int, blocks: bool) -> None:
    if edge_weight is None:
        return
    if edge_weight.dim() == 1:
        _check_size("edge_weight", edge_weight, (n_edges,), "(E,) matching y")
        return
    if not blocks:
        raise ValueError("edge_weight per stream (E, F) or per stream and head (E, F, H) needs streams='blocks' "
                         "(with streams='sum', fold per-stream weights into the stack's alpha)")
    if edge_weight.dim() == 2:
        _check_size("edge_weight", edge_weight, (n_edges, n_focus), "(E, F) matching y")
        return
    _check_tensor("edge_weight", edge_weight, 3, "(E,), (E, F) or (E, F, H)")
    heads = edge_weight.shape[2]
    _check_size("edge_weight", edge_weight, (n_edges, n_focus, heads), "(E, F, H) matching y")
    if heads < 1 or c % heads:
        raise ValueError(f"edge_weight must have H heads dividing the C = {c} channels of a stream, "
                         f"got shape {_fmt(edge_weight.shape)}")


def _check_order(order, n_edges: int, n_atoms, device) -> None:
    if not isinstance(order, EdgeOrder):
        raise TypeError(f"order must be a mixstack.EdgeOrder (mixstack.edge_order(dst, n_atoms)), "
                        f"got {type(order).__name__}")
    _check_index("order.perm", order.perm, n_edges, device)
    offsets = order.offsets
    if not isinstance(offsets, torch.Tensor) or offsets.dtype not in (torch.int64, torch.int32):
        raise TypeError("order.offsets must be an int64 or int32 tensor")
    if offsets.dim() != 1 or offsets.shape[0] != n_atoms + 1:
        raise ValueError(f"order.offsets must have shape (n_atoms+1,) = ({n_atoms + 1},), got {_fmt(offsets.shape)}")
    if offsets.device != device:
        raise ValueError(f"order.offsets must be on {device} like the other inputs, got {offsets.device}")


def validate_rotate_out_sum(y, wigner, dst, n_atoms, edge_weight=None, streams: str = "sum", order=None,
                            degree_scale=None) -> tuple[StackLayout, int, int]:
    """Check ``rotate_out_sum``'s arguments; return ``(layout, F, E)``.  Errors name the argument."""
    _check_tensor("wigner", wigner, 3, "(E, 3, S=(lmax+1)^2)")
    if wigner.shape[1] != 3:
        raise ValueError(f"wigner must have shape (E, 3, S), got {_fmt(wigner.shape)}")
    lmax = _lmax_of("wigner's dimension 2", wigner.shape[2])
    n_edges = wigner.shape[0]
    _check_tensor("y", y, 3, "(E, F, ROW=(3*lmax+1)*C)")
    if y.shape[0] != n_edges or y.shape[2] % (3 * lmax + 1) or y.shape[2] == 0:
        raise ValueError(f"y must have shape (E, F, ROW) with E = {n_edges} and ROW a positive multiple of "
                         f"3*lmax+1 = {3 * lmax + 1}, got {_fmt(y.shape)}")
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, torch.SymInt)):
        raise TypeError(f"n_atoms must be an int, got {type(n_atoms).__name__}")
    if n_atoms < 0:
        raise ValueError(f"n_atoms must be >= 0, got {n_atoms}")
    if streams not in ("sum", "blocks"):
        raise ValueError(f"streams must be 'sum' (the focus streams summed) or 'blocks' (kept apart, each in its "
                         f"channel block), got {streams!r}")
    c = y.shape[2] // (3 * lmax + 1)
    _check_out_edge_weight(edge_weight, n_edges, y.shape[1], c, streams == "blocks")
    if degree_scale is not None:
        _check_tensor("degree_scale", degree_scale, 1, "(S,)")
        _check_size("degree_scale", degree_scale, ((lmax + 1) ** 2,), "(S,) = ((lmax+1)^2,)")
        if degree_scale.requires_grad:
            raise ValueError("degree_scale is a constant factor per row and gets no gradient: pass one that does "
                             "not require grad (detach it)")
    _check_same("y", y, {"wigner": wigner, "edge_weight": edge_weight, "degree_scale": degree_scale})
    _check_index("dst", dst, n_edges, y.device)
    if order is not None:
        _check_order(order, n_edges, n_atoms, y.device)
    return StackLayout(lmax, c), y.shape[1], n_edges


def validate_edge_wigner(vec, lmax, convention: str = "mixstack") -> int:
    """Check ``edge_wigner``'s arguments; return the edge count.  Errors name the argument."""
    _check_tensor("vec", vec, 2, "(E, 3)")
    _check_size("vec", vec, (None, 3), "(E, 3)")
    if isinstance(lmax, bool) or not isinstance(lmax, int) or lmax not in LMAX_RANGE:
        raise ValueError(f"lmax must be an int in 1..6, got {lmax!r}")
    if convention not in ("mixstack", "sezm"):
        raise ValueError(f"convention must be 'mixstack' or 'sezm', got {convention!r}")
    return vec.shape[0]
