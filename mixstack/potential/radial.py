"""Radial basis and cutoff envelope of the potential.

``BesselBasis``: ``sqrt(2/rc) * sin(n pi r / rc) / r`` for ``n = 1..n_radial``
(DimeNet), with trainable frequencies.  ``PolynomialEnvelope``: the DimeNet
polynomial of order ``p`` that is 1 at ``r = 0`` and reaches 0 at ``r = rc``
with vanishing first and second derivatives, so energies, forces and their
first derivatives are continuous as neighbours cross the cutoff (which keeps
NVE molecular dynamics free of energy jumps).  Both are smooth for
``0 < r < rc``; the neighbour list never produces ``r = 0``.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BesselBasis(nn.Module):
    """``(E,) distances -> (E, n_radial)`` sine-Bessel functions of order zero."""

    def __init__(self, cutoff: float, n_radial: int = 8, *, trainable: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if n_radial < 1:
            raise ValueError(f"n_radial must be >= 1, got {n_radial}")
        if cutoff <= 0:
            raise ValueError(f"cutoff must be > 0, got {cutoff}")
        self.cutoff = float(cutoff)
        freqs = torch.arange(1, n_radial + 1, device=device, dtype=dtype) * math.pi
        self.freqs = nn.Parameter(freqs, requires_grad=trainable)
        self.prefactor = math.sqrt(2.0 / self.cutoff)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        x = r.unsqueeze(-1) / self.cutoff
        return self.prefactor * torch.sin(self.freqs * x) / r.unsqueeze(-1)


class PolynomialEnvelope(nn.Module):
    """``u(x) = 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2)``, ``x = r / rc``,
    and 0 beyond the cutoff."""

    def __init__(self, cutoff: float, p: int = 6):
        super().__init__()
        if p < 2:
            raise ValueError(f"envelope order p must be >= 2, got {p}")
        self.cutoff, self.p = float(cutoff), p

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        p = self.p
        x = r / self.cutoff
        xp = x ** p
        u = 1.0 - 0.5 * (p + 1) * (p + 2) * xp + p * (p + 2) * xp * x - 0.5 * p * (p + 1) * xp * x * x
        return torch.where(x < 1.0, u, torch.zeros_like(u))
