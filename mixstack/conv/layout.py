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


def validate_rotate_in(x, wigner, radial, src, edge_scalar=None, scalar_weight=None,
                       edge_weight=None) -> tuple[StackLayout, int, int]:
    """Check ``rotate_in``'s arguments (``radial`` a tensor or a ``LinearRadial``); return
    ``(layout, F, E)``.  Errors name the argument."""
    _check_tensor("x", x, 3, "(N, S=(lmax+1)^2, C)")
    lmax = _lmax_of("x's dimension 1", x.shape[1])
    c = x.shape[2]
    if c < 1:
        raise ValueError(f"x must have C >= 1 channels, got shape {_fmt(x.shape)}")
    s = n_coefficients(lmax)
    _check_tensor("wigner", wigner, 3, "(E, 3, S)")
    n_edges = wigner.shape[0]
    _check_size("wigner", wigner, (n_edges, 3, s), "(E, 3, S) with S from x")
    if isinstance(radial, LinearRadial):
        if scalar_weight is not None:
            raise ValueError("with a LinearRadial, the edge scalar's weights are rows of radial.weight: "
                             "pass scalar_weight=None")
        n_focus = validate_linear_radial(radial, n_edges, lmax, c, edge_scalar is not None)
        _check_same("x", x, dict(zip(("radial.hidden", "radial.weight", "radial.bias"), radial)))
        radial, matching = None, "x and wigner"
    else:
        _check_tensor("radial", radial, 4, "(E, F, 2*lmax+1, C)")
        n_focus = radial.shape[1]
        _check_size("radial", radial, (n_edges, n_focus, 2 * lmax + 1, c), "(E, F, 2*lmax+1, C) matching x and wigner")
        if (edge_scalar is None) != (scalar_weight is None):
            raise ValueError("edge_scalar and scalar_weight go together: pass both or neither")
        matching = "radial"
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
    _check_same("x", x, {"wigner": wigner, "radial": radial, "edge_scalar": edge_scalar,
                         "scalar_weight": scalar_weight, "edge_weight": edge_weight})
    _check_index("src", src, n_edges, x.device)
    return StackLayout(lmax, c), n_focus, n_edges


def validate_rotate_out_sum(y, wigner, dst, n_atoms, edge_weight=None) -> tuple[StackLayout, int, int]:
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
    if edge_weight is not None:
        _check_tensor("edge_weight", edge_weight, 1, "(E,)")
        _check_size("edge_weight", edge_weight, (n_edges,), "(E,) matching y")
    _check_same("y", y, {"wigner": wigner, "edge_weight": edge_weight})
    _check_index("dst", dst, n_edges, y.device)
    return StackLayout(lmax, y.shape[2] // (3 * lmax + 1)), y.shape[1], n_edges


def validate_edge_wigner(vec, lmax, convention: str = "mixstack") -> int:
    """Check ``edge_wigner``'s arguments; return the edge count.  Errors name the argument."""
    _check_tensor("vec", vec, 2, "(E, 3)")
    _check_size("vec", vec, (None, 3), "(E, 3)")
    if isinstance(lmax, bool) or not isinstance(lmax, int) or lmax not in LMAX_RANGE:
        raise ValueError(f"lmax must be an int in 1..6, got {lmax!r}")
    if convention not in ("mixstack", "sezm"):
        raise ValueError(f"convention must be 'mixstack' or 'sezm', got {convention!r}")
    return vec.shape[0]
