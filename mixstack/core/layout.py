"""Column layout of one mixing-stack row, and validation of the operator's inputs.

A row holds ``3*lmax + 1`` subtiles of ``focus_dim`` channels, m-major: the
m = 0 degrees ``l = 0..lmax`` (the ``m0`` block), then m = -1 and m = +1 for
``l = 1..lmax`` (the ``m1`` block).  Every size the kernels and the reference
derive from ``(lmax, focus_dim)`` lives here, so there is one definition of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LMAX_RANGE = range(1, 7)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (>= 1): the register width of a Cf-wide tile."""
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class StackLayout:
    """Sizes of a mixing-stack row for one ``(lmax, focus_dim)`` pair."""

    lmax: int
    focus_dim: int

    @property
    def m0(self) -> int:
        """Width of the m = 0 block: degrees 0..lmax."""
        return (self.lmax + 1) * self.focus_dim

    @property
    def m1(self) -> int:
        """Width of the |m| = 1 block: m = -1 then m = +1, degrees 1..lmax."""
        return 2 * self.lmax * self.focus_dim

    @property
    def row(self) -> int:
        return self.m0 + self.m1

    @property
    def gate_width(self) -> int:
        """One focus_dim-wide gate group per degree l >= 1."""
        return self.lmax * self.focus_dim


@dataclass(frozen=True)
class StackShape:
    """The sizes of one call, read off validated inputs."""

    layout: StackLayout
    n_focus: int
    n_edges: int
    n_layers: int

    @property
    def n_gated(self) -> int:
        return self.n_layers - 1


def _fmt(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _check_tensor(name: str, t, rank: int, expected: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(
            f"{name} must have rank {rank} with shape {expected}, "
            f"got rank {t.dim()} with shape {_fmt(t.shape)}"
        )


def _check_size(name: str, t: torch.Tensor, expected: tuple, expected_text: str) -> None:
    for got, want in zip(t.shape, expected):
        if want is not None and got != want:
            raise ValueError(
                f"{name} must have shape {expected_text} = {_fmt(['?' if w is None else w for w in expected])}, "
                f"got {_fmt(t.shape)}"
            )


def _check_focus_major(u0: torch.Tensor, alpha: torch.Tensor) -> None:
    """Where ``alpha`` does not match ``u0``: a ``u0`` laid out edge-major, ``(E, F, ROW)`` (the
    layout of the result), is reported as ``u0``'s fault (``alpha (E, F)`` gives E and F), not
    as a wrong ``alpha``."""
    n_edges, n_focus = alpha.shape
    if n_edges != n_focus and tuple(u0.shape[:2]) == (n_edges, n_focus):
        raise ValueError(
            f"u0 must be focus-major (F, E, ROW) = {_fmt((n_focus, n_edges, u0.shape[2]))} for alpha (E, F) = "
            f"{_fmt(alpha.shape)}, got the edge-major (E, F, ROW) shape {_fmt(u0.shape)}; "
            f"pass u0.transpose(0, 1)")


def validate_inputs(u0, alpha, w0, w1, gw, *, lmax, focus_dim) -> StackShape:
    """Check every argument of the operator and return the call's sizes.

    Raises ``TypeError`` for non-tensors and non-floating dtypes and
    ``ValueError`` for wrong ranks, sizes, mismatches and mixed devices; each
    message names the argument, what was expected and what was received.
    """
    if isinstance(lmax, bool) or not isinstance(lmax, (int, torch.SymInt)):
        raise TypeError(f"lmax must be an int, got {type(lmax).__name__}")
    if not LMAX_RANGE.start <= lmax < LMAX_RANGE.stop:
        raise ValueError(f"lmax must be in 1..6, got {lmax}")
    if isinstance(focus_dim, bool) or not isinstance(focus_dim, (int, torch.SymInt)):
        raise TypeError(f"focus_dim must be an int, got {type(focus_dim).__name__}")
    if focus_dim < 1:
        raise ValueError(f"focus_dim must be positive, got {focus_dim}")
    lay = StackLayout(lmax, focus_dim)

    _check_tensor("u0", u0, 3, "(F, E, ROW)")
    n_focus, n_edges = u0.shape[0], u0.shape[1]
    _check_size("u0", u0, (None, None, lay.row), "(F, E, ROW=(3*lmax+1)*focus_dim)")
    _check_tensor("alpha", alpha, 2, "(E, F)")
    try:
        _check_size("alpha", alpha, (n_edges, n_focus), "(E, F) matching u0")
    except ValueError:
        _check_focus_major(u0, alpha)           # only here: no guard on symbolic sizes when all is well
        raise
    _check_tensor("w0", w0, 4, "(n_layers, F, m0, m0)")
    n_layers = w0.shape[0]
    if n_layers < 1:
        raise ValueError(f"w0 must hold n_layers >= 1 layers, got shape {_fmt(w0.shape)}")
    _check_size("w0", w0, (n_layers, n_focus, lay.m0, lay.m0), "(n_layers, F, m0=(lmax+1)*focus_dim, m0)")
    _check_tensor("w1", w1, 4, "(n_layers, F, m1, m1)")
    _check_size("w1", w1, (n_layers, n_focus, lay.m1, lay.m1), "(n_layers, F, m1=2*lmax*focus_dim, m1)")
    _check_tensor("gw", gw, 4, "(n_layers - 1, F, focus_dim, G)")
    _check_size("gw", gw, (n_layers - 1, n_focus, focus_dim, lay.gate_width),
                "(n_layers - 1, F, focus_dim, G=lmax*focus_dim)")

    for name, t in (("alpha", alpha), ("w0", w0), ("w1", w1), ("gw", gw)):
        if t.dtype != u0.dtype:
            raise TypeError(f"{name} must have the dtype of u0 ({u0.dtype}), got {t.dtype}")
    devices = {t.device for t in (u0, alpha, w0, w1, gw)}
    if len(devices) > 1:
        names = ", ".join(f"{n}={t.device}" for n, t in
                          zip(("u0", "alpha", "w0", "w1", "gw"), (u0, alpha, w0, w1, gw)))
        raise ValueError(f"all inputs must be on one device, got {names}")
    return StackShape(lay, n_focus, n_edges, n_layers)
