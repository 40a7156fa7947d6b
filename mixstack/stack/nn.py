"""``MixingStack``: an ``nn.Module`` owning the stack's weights."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.layout import LMAX_RANGE, StackLayout
from .functional import mixing_stack


class MixingStack(nn.Module):
    """The gated SO(2) mixing stack with its own ``w0``, ``w1`` and ``gw``.

    Initialisation keeps activations O(1) through the residual layers: each
    block weight is normal with variance ``1 / (K * n_layers)`` (K the block
    width), so every layer adds about ``1 / n_layers`` of the input's variance,
    and the gate projection has variance ``1 / focus_dim``.
    """

    def __init__(self, n_focus: int = 2, focus_dim: int = 32, lmax: int = 3, n_layers: int = 4,
                 apply_alpha: bool = True, *, device=None, dtype=None):
        super().__init__()
        if lmax not in LMAX_RANGE:
            raise ValueError(f"lmax must be in 1..6, got {lmax}")
        for name, v in (("n_focus", n_focus), ("focus_dim", focus_dim), ("n_layers", n_layers)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.layout = StackLayout(lmax, focus_dim)
        self.n_focus, self.focus_dim, self.lmax = n_focus, focus_dim, lmax
        self.n_layers, self.apply_alpha = n_layers, apply_alpha
        kw = dict(device=device, dtype=dtype)
        lay = self.layout
        self.w0 = nn.Parameter(torch.empty(n_layers, n_focus, lay.m0, lay.m0, **kw))
        self.w1 = nn.Parameter(torch.empty(n_layers, n_focus, lay.m1, lay.m1, **kw))
        self.gw = nn.Parameter(torch.empty(n_layers - 1, n_focus, focus_dim, lay.gate_width, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for w in (self.w0, self.w1):
                w.normal_(0.0, 1.0 / math.sqrt(w.shape[-1] * self.n_layers))
            self.gw.normal_(0.0, 1.0 / math.sqrt(self.focus_dim))

    def forward(self, u0: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``u0 (F, E, ROW)``, ``alpha (E, F)`` -> ``(E, F, ROW)``."""
        return mixing_stack(u0, alpha, self.w0, self.w1, self.gw, lmax=self.lmax,
                            focus_dim=self.focus_dim, apply_alpha=self.apply_alpha)

    def extra_repr(self) -> str:
        return (f"n_focus={self.n_focus}, focus_dim={self.focus_dim}, lmax={self.lmax}, "
                f"n_layers={self.n_layers}, apply_alpha={self.apply_alpha}")
