"""The layers of ``SO2Potential``: the equivariant mixing stack and one interaction block.

Node features are ``(N, (lmax+1)^2, C)``: for each degree ``l`` the ``2l+1``
real-harmonic coefficients ``m = -l..l`` (see ``wigner``), ``C = focus_dim``
channels.  One interaction block, per edge ``j -> i``:

1. rotate the neighbour's features into the edge frame and keep ``m in {0, ±1}``
   in the row layout (docs/contract.md §1) (``wigner_rows``);
2. scale them by learned radial functions (per focus stream, degree, |m| and
   channel, times the cutoff envelope) and add an edge scalar built from the
   two atoms' ``l = 0`` channels to the m = 0 subtiles;
3. run ``mixstack.mixing_stack`` with ``n_focus`` streams and per-edge
   ``alpha = softmax`` over the streams of a learned function of the ``l = 0``
   channels and the radial basis; sum the weighted streams;
4. rotate back to the global frame (``D^T``), multiply by the envelope, and sum
   at the centre atom with a fixed order (``slots``);
5. update the node: a per-degree channel mix of the sum (residual), then an
   MLP of the scalars and the squared norms of every degree (residual).

Everything after step 1 is a function of the edge-frame coefficients that
commutes with rotations about the edge, so the block is exactly
SO(3)-equivariant: the |m| = 1 weights of the stack are assembled as
``w1 = [[U, V], [-V, U]]`` (a complex-linear map on ``x_{-1} + i x_{+1}``),
gates and radial weights scale ``m = -1`` and ``m = +1`` alike.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import tuning
from ..functional import mixing_stack
from ..layout import LMAX_RANGE, StackLayout


class EquivariantMixingStack(nn.Module):
    """The gated SO(2) mixing stack with ``w1 = [[U, V], [-V, U]]``: rotation-commuting
    |m| = 1 weights, a free ``w0`` and gate projection ``gw``.

    Same initial scale as ``mixstack.MixingStack``: block weights normal with
    variance ``1 / (K * n_layers)`` (``K`` the block width), gates ``1 / focus_dim``.
    """

    def __init__(self, n_focus: int, focus_dim: int, lmax: int, n_layers: int,
                 apply_alpha: bool = True, *, device=None, dtype=None):
        super().__init__()
        if lmax not in LMAX_RANGE:
            raise ValueError(f"lmax must be in 1..6, got {lmax}")
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.layout = StackLayout(lmax, focus_dim)
        self.n_focus, self.focus_dim, self.lmax = n_focus, focus_dim, lmax
        self.n_layers, self.apply_alpha = n_layers, apply_alpha
        lay, kw = self.layout, dict(device=device, dtype=dtype)
        g = lay.gate_width                                  # = m1 / 2
        self.w0 = nn.Parameter(torch.randn(n_layers, n_focus, lay.m0, lay.m0, **kw)
                               / math.sqrt(lay.m0 * n_layers))
        self.u = nn.Parameter(torch.randn(n_layers, n_focus, g, g, **kw) / math.sqrt(lay.m1 * n_layers))
        self.v = nn.Parameter(torch.randn(n_layers, n_focus, g, g, **kw) / math.sqrt(lay.m1 * n_layers))
        self.gw = nn.Parameter(torch.randn(n_layers - 1, n_focus, focus_dim, g, **kw) / math.sqrt(focus_dim))

    def w1(self) -> torch.Tensor:
        """``(n_layers, F, m1, m1)`` = ``[[U, V], [-V, U]]``."""
        return torch.cat((torch.cat((self.u, self.v), -1), torch.cat((-self.v, self.u), -1)), -2)

    def forward(self, u0: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """``u0 (F, E, ROW)``, ``alpha (E, F)`` -> ``(E, F, ROW)``.

        In eval mode the weights enter detached: inference (energy and forces)
        never wants their gradients, so the force backward needs no word from the
        autograd engine to stay on the relay / fused kernels, and with
        ``keep_input=False`` no stack input is held for weight gradients.  In train
        mode the weights enter with grad: the forces (``create_graph``) run the
        relay and keep its chain, and a loss's backward runs the weight gradients
        and the double backward as kernels (docs/contract.md §4, "Training").
        """
        w0, w1, gw = self.w0, self.w1(), self.gw
        if not self.training:
            w0, w1, gw = w0.detach(), w1.detach(), gw.detach()
        return mixing_stack(u0, alpha, w0, w1, gw, lmax=self.lmax, focus_dim=self.focus_dim,
                            apply_alpha=self.apply_alpha, keep_input=self.training)

    def stack_shape_key(self) -> tuning.ShapeKey:
        """The tuning key of this stack (``mixstack.freeze`` collects these)."""
        return tuning.shape_key(focus_dim=self.focus_dim, lmax=self.lmax, n_focus=self.n_focus,
                                apply_alpha=self.apply_alpha)

    def extra_repr(self) -> str:
        return (f"n_focus={self.n_focus}, focus_dim={self.focus_dim}, lmax={self.lmax}, "
                f"n_layers={self.n_layers}, w1=[[U, V], [-V, U]]")


def mlp(sizes: list[int], **kw) -> nn.Sequential:
    """Linear layers with SiLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b, **kw), nn.SiLU()]
    return nn.Sequential(*layers[:-1])


def degree_index(lmax: int) -> torch.Tensor:
    """``(lmax+1)^2`` degrees: entry ``l^2 + l + m`` is ``l``."""
    return torch.cat([torch.full((2 * l + 1,), l, dtype=torch.long) for l in range(lmax + 1)])


class InteractionBlock(nn.Module):
    """One SO(2) convolution with the mixing stack, aggregation and node update."""

    def __init__(self, *, lmax: int, focus_dim: int, n_focus: int, n_layers: int, n_radial: int,
                 radial_hidden: int, avg_neighbors: float, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        c = focus_dim
        self.lmax, self.c, self.n_focus = lmax, c, n_focus
        self.n_radial_out = 3 * lmax + 2               # m0 scales, |m|=1 scales, m0 edge-scalar weights
        self.avg_neighbors = float(avg_neighbors)
        self.radial = mlp([n_radial, radial_hidden, n_focus * self.n_radial_out * c], **kw)
        self.edge_scalar = nn.Linear(2 * c, c, **kw)
        self.alpha_logits = mlp([2 * c + n_radial, radial_hidden, n_focus], **kw)
        self.stack = EquivariantMixingStack(n_focus, c, lmax, n_layers, **kw)
        self.mix = nn.Parameter(torch.randn(lmax + 1, c, c, **kw) / math.sqrt(c))
        self.mix_bias = nn.Parameter(torch.zeros(c, **kw))
        self.scalar_update = mlp([(lmax + 1) * c, radial_hidden, c], **kw)
        self.register_buffer("degrees", degree_index(lmax), persistent=False)

    def to_edge_frame(self, xs: torch.Tensor, rows: list[torch.Tensor]):
        """Kept edge-frame coefficients: m = 0 ``(E, lmax+1, C)``, m = -1 and m = +1 ``(E, lmax, C)``."""
        m0, mneg, mpos = [xs[:, :1]], [], []
        for l in range(1, self.lmax + 1):
            r = torch.matmul(rows[l], xs[:, l * l:(l + 1) * (l + 1)])      # (E, 3, C): m = -1, 0, +1
            mneg.append(r[:, 0:1])
            m0.append(r[:, 1:2])
            mpos.append(r[:, 2:3])
        return torch.cat(m0, 1), torch.cat(mneg, 1), torch.cat(mpos, 1)

    def from_edge_frame(self, msg: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
        """``(E, 3*lmax+1, C)`` in the row layout -> global-frame ``(E, (lmax+1)^2, C)``."""
        lmax = self.lmax
        parts = [msg[:, :1]]
        for l in range(1, lmax + 1):
            kept = torch.stack((msg[:, lmax + l], msg[:, l], msg[:, 2 * lmax + l]), 1)   # m = -1, 0, +1
            parts.append(torch.matmul(rows[l].transpose(-1, -2), kept))
        return torch.cat(parts, 1)

    def edge_inputs(self, x, src, dst, rows, rbf, env):
        """The stack's inputs on every edge: ``u0 (F, E, ROW)`` (a focus-major view) and ``alpha (E, F)``."""
        lmax, c, f = self.lmax, self.c, self.n_focus
        n_edges = src.shape[0]
        xs = x[src]
        m0, mneg, mpos = self.to_edge_frame(xs, rows)
        scal = torch.cat((xs[:, 0], x[dst, 0]), -1)                        # (E, 2C) invariants
        radial = (self.radial(rbf) * env[:, None]).view(n_edges, f, self.n_radial_out, c)
        a0, a1, b0 = radial[:, :, :lmax + 1], radial[:, :, lmax + 1:2 * lmax + 1], radial[:, :, 2 * lmax + 1:]
        h = self.edge_scalar(scal)                                          # (E, C)
        u0 = torch.cat((a0 * m0[:, None] + b0 * h[:, None, None], a1 * mneg[:, None], a1 * mpos[:, None]), 2)
        u0 = u0.reshape(n_edges, f, (3 * lmax + 1) * c).transpose(0, 1)     # (F, E, ROW)
        alpha = torch.softmax(self.alpha_logits(torch.cat((scal, rbf), -1)), dim=-1)
        return u0, alpha

    def aggregate(self, msg, slots):
        """Sum each atom's incoming messages in a fixed order (gather by ``slots``, no atomics)."""
        padded = torch.cat((msg, msg.new_zeros((1,) + msg.shape[1:])), 0)
        return padded[slots].sum(1) / self.avg_neighbors                   # (N, (lmax+1)^2, C)

    def node_update(self, x, agg):
        """Mix the aggregated messages into ``x`` per degree; update the scalars from the norms."""
        x = x + torch.einsum("nsc,scd->nsd", agg, self.mix[self.degrees])
        sq = (x[:, 1:] * x[:, 1:]).transpose(0, 1)                          # (S-1, N, C)
        norms = [sq[l * l - 1:(l + 1) * (l + 1) - 1].sum(0) for l in range(1, self.lmax + 1)]
        upd = self.scalar_update(torch.cat([x[:, 0]] + norms, -1)) + self.mix_bias
        return torch.cat(((x[:, 0] + upd)[:, None], x[:, 1:]), 1)

    def forward(self, x, src, dst, rows, rbf, env, slots):
        u0, alpha = self.edge_inputs(x, src, dst, rows, rbf, env)
        n_edges = src.shape[0]
        out = self.stack(u0, alpha).sum(1).view(n_edges, 3 * self.lmax + 1, self.c)  # alpha-weighted streams
        msg = self.from_edge_frame(out, rows) * env[:, None, None]
        return self.node_update(x, self.aggregate(msg, slots))
