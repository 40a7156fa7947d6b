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
from ..conv import functional as conv
from ..conv import reference as conv_reference
from ..conv.layout import LinearRadial
from ..core.layout import LMAX_RANGE, StackLayout
from ..stack.functional import mixing_stack
from . import stages


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

    def edge_weights(self, x, src, dst, rbf, env):
        """Radial weights ``(E, F, 3*lmax + 2, C)`` times the envelope, the edge scalar
        ``h (E, C)`` of the two atoms' ``l = 0`` channels, and ``alpha (E, F)`` (level 0; the
        convolution's kernels take ``edge_weights_split``)."""
        n_edges = src.shape[0]
        scal = torch.cat((x[src, 0], x[dst, 0]), -1)                       # (E, 2C) invariants
        radial = self.radial(rbf) * env[:, None]
        radial = radial.view(n_edges, self.n_focus, self.n_radial_out, self.c)
        alpha = torch.softmax(self.alpha_logits(torch.cat((scal, rbf), -1)), dim=-1)
        return radial, self.edge_scalar(scal), alpha

    def rotate_in(self, x, src, rows, radial, h):
        """The stack's input ``u0 (F, E, ROW)``: the neighbours' features in the edge frame, scaled
        by the radial weights, plus the edge scalar on the m = 0 subtiles.

        Built focus-major from the start (the radial weights permuted, the edge-frame features
        broadcast over the streams), so that the stack reads a contiguous ``u0`` and the
        backward of this stage never reads the stack's gradient transposed on its way into the
        gather's scatter-add: an accumulating ``index_put`` fed by a transposed read is what
        Inductor's C++ backend miscompiles (``repro/inductor_cpu_index_put_transpose.py``)."""
        lmax, c, f = self.lmax, self.c, self.n_focus
        n_edges = src.shape[0]
        m0, mneg, mpos = self.to_edge_frame(x[src], rows)
        rad = radial.permute(1, 0, 2, 3)                                    # (F, E, 3*lmax+2, C)
        a0, a1, b0 = rad[:, :, :lmax + 1], rad[:, :, lmax + 1:2 * lmax + 1], rad[:, :, 2 * lmax + 1:]
        u0 = torch.cat((a0 * m0 + b0 * h[:, None], a1 * mneg, a1 * mpos), 2)  # (F, E, 3*lmax+1, C)
        return u0.reshape(f, n_edges, (3 * lmax + 1) * c)

    def edge_inputs(self, x, src, dst, rows, rbf, env):
        """The stack's inputs on every edge: ``u0 (F, E, ROW)`` (a focus-major view) and ``alpha (E, F)``."""
        radial, h, alpha = self.edge_weights(x, src, dst, rbf, env)
        return self.rotate_in(x, src, rows, radial, h), alpha

    def edge_weights_split(self, x, src, dst, rbf):
        """``edge_weights`` as the convolution's kernels take it, the same functions computed
        with fewer edge-sized surfaces: ``(radial, h, alpha)``.

        - ``radial`` is the radial network's last layer, unapplied, as a ``mixstack.LinearRadial``
          (its last hidden layer ``(E, radial_hidden)`` and the layer's weight and bias): in
          eval mode the kernels make the weights of the m = 0 and |m| = 1 subtiles and of the
          edge scalar per tile, so the ``E x F x (3*lmax+2) x C`` weights never exist, forward
          or backward.  In train mode the weights' gradients are wanted: ``radial`` is the pair
          of tensors ``conv_reference.linear_radial_weights`` makes (two products, no slices).
        - The first layers of the edge scalar and of the alpha network act on the two atoms'
          ``l = 0`` channels, so they run at the atoms (``x0 @ W_src``, ``x0 @ W_dst``) and are
          gathered to the edges: no ``(E, 2C)`` or ``(E, 2C + n_radial)`` concatenation."""
        c = self.c
        hidden = self.radial[:-1](rbf)
        first = self.alpha_logits[0]
        w_scalar, w_alpha = self.edge_scalar.weight, first.weight
        at_src = torch.cat((w_scalar[:, :c], w_alpha[:, :c]), 0)                 # (C + H, C)
        at_dst = torch.cat((w_scalar[:, c:], w_alpha[:, c:2 * c]), 0)
        x0 = x[:, 0]
        pair = (x0 @ at_src.t())[src] + (x0 @ at_dst.t())[dst]                  # (E, C + H)
        h = pair[:, :c] + self.edge_scalar.bias
        logits = self.alpha_logits[1:](pair[:, c:] + nn.functional.linear(rbf, w_alpha[:, 2 * c:], first.bias))
        last = self.radial[-1]
        shape = (self.n_focus, self.n_radial_out, c)
        layer = LinearRadial(hidden, last.weight.view(*shape, -1), last.bias.view(shape))
        if self.training:
            radial = conv_reference.linear_radial_weights(layer, self.lmax, with_scalar=True)
        else:
            radial = layer._replace(weight=layer.weight.detach(), bias=layer.bias.detach())
        return radial, h, torch.softmax(logits, dim=-1)

    def rotate_in_kernels(self, x, src, wigner, radial, h, env):
        """``rotate_in``'s result through ``mixstack.rotate_in`` (the kernels): the radial weights
        unscaled (a ``LinearRadial`` in eval mode, the pair of products in train mode), the
        envelope as the edge weight (one pass less over the radial weights)."""
        kw = dict(edge_scalar=h, edge_weight=env)
        if isinstance(radial, LinearRadial):
            return conv.rotate_in(x, wigner, radial, src, **kw)
        radial, scalar_weight = radial
        return conv.rotate_in(x, wigner, radial, src, scalar_weight=scalar_weight, **kw)

    def rotate_out_kernels(self, out, wigner, dst, env, n_atoms: int):
        """Rotate back, sum the focus streams and each atom's messages (``mixstack.rotate_out_sum``)."""
        return conv.rotate_out_sum(out, wigner, dst, n_atoms, edge_weight=env / self.avg_neighbors,
                                   keep_input=self.training)

    def aggregate(self, msg, slots):
        """Sum each atom's incoming messages in a fixed order (gather by ``slots``, no atomics)."""
        padded = torch.cat((msg, msg.new_zeros((1,) + msg.shape[1:])), 0)
        return padded[slots].sum(1) / self.avg_neighbors                   # (N, (lmax+1)^2, C)

    def node_update(self, x, agg):
        """Mix the aggregated messages into ``x`` per degree; update the scalars from the norms."""
        x = x + torch.einsum("nsc,scd->nsd", agg, self.mix[self.degrees])
        sq = x[:, 1:] * x[:, 1:]                                            # (N, S-1, C)
        norms = [sq[:, l * l - 1:(l + 1) * (l + 1) - 1].sum(1) for l in range(1, self.lmax + 1)]
        upd = self.scalar_update(torch.cat([x[:, 0]] + norms, -1)) + self.mix_bias
        return torch.cat(((x[:, 0] + upd)[:, None], x[:, 1:]), 1)

    def forward(self, x, src, dst, rows, rbf, env, slots, wigner=None):
        """One block.  ``rows``: ``wigner_rows``'s list (level 0); ``wigner``: the packed rows
        ``(E, 3, S)`` where the convolution's kernels run (``SO2Potential.energy`` decides), in
        which case rotate-in and rotate-out + aggregation run as ``mixstack`` operators."""
        n_edges = src.shape[0]
        kernels = wigner is not None
        if kernels:
            radial, h, alpha = stages.run(stages.RADIAL, self.edge_weights_split, x, src, dst, rbf)
            u0 = stages.run(stages.ROTATE_IN, self.rotate_in_kernels, x, src, wigner, radial, h, env)
        else:
            radial, h, alpha = stages.run(stages.RADIAL, self.edge_weights, x, src, dst, rbf, env)
            u0 = stages.run(stages.ROTATE_IN, self.rotate_in, x, src, rows, radial, h)
        out = stages.run(stages.STACK, self.stack, u0, alpha)
        if kernels:
            agg = stages.run(stages.ROTATE_OUT, self.rotate_out_kernels, out, wigner, dst, env, x.shape[0])
        else:
            msg = stages.run(stages.ROTATE_BACK, self._rotate_back, out, rows, env, n_edges)
            agg = stages.run(stages.AGGREGATION, self.aggregate, msg, slots)
        return stages.run(stages.NODE_UPDATE, self.node_update, x, agg)

    def _rotate_back(self, out, rows, env, n_edges):
        """The alpha-weighted streams summed and rotated back to the global frame, times the envelope."""
        out = out.sum(1).view(n_edges, 3 * self.lmax + 1, self.c)
        return self.from_edge_frame(out, rows) * env[:, None, None]
