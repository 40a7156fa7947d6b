"""The values that travel together through the stack's references, launchers and operators.

- ``StackSpec``: the stack's static description, its row layout and whether alpha scales the
  result;
- ``Weights``: the stack's weights ``(w0, w1, gw)``;
- ``Saved``: what the forward keeps for the backward, ``(z, y, alpha, u0)``
  (docs/contract.md §1, "What the forward keeps for the backward").

Plain PyTorch (no Triton), so the references use them as the launchers do.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..core.layout import StackLayout


@dataclass(frozen=True)
class StackSpec:
    """The stack's static description: its row layout and whether alpha scales the result."""

    layout: StackLayout
    apply_alpha: bool

    @classmethod
    def of(cls, lmax: int, focus_dim: int, apply_alpha: bool) -> StackSpec:
        return cls(StackLayout(lmax, focus_dim), bool(apply_alpha))


@dataclass(frozen=True)
class Weights:
    """The stack's weights: ``w0 (n_layers, F, m0, m0)``, ``w1 (n_layers, F, m1, m1)`` and the gate
    projections ``gw (n_layers - 1, F, focus_dim, G)`` (or their gradients, in the same shapes)."""

    w0: Tensor
    w1: Tensor
    gw: Tensor

    @property
    def n_gated(self) -> int:
        """The gated layers (the last layer is the identity layer, with no gate)."""
        return self.w0.shape[0] - 1

    def as_list(self) -> list[Tensor]:
        """``[w0, w1, gw]``, as the operators take them."""
        return [self.w0, self.w1, self.gw]

    def zeros(self) -> Weights:
        """Zero-filled tensors of the weights' shapes: weight gradients to be summed into."""
        return Weights(self.w0.new_zeros(self.w0.shape), self.w1.new_zeros(self.w1.shape),
                       self.gw.new_zeros(self.gw.shape))

    def transposed(self) -> Weights:
        """The block weights transposed (each ``W^T`` contiguous, as the backward's GEMMs read
        them) and ``gw`` as it is."""
        return Weights(self.w0.transpose(-1, -2).contiguous(), self.w1.transpose(-1, -2).contiguous(), self.gw)


@dataclass(frozen=True)
class Saved:
    """What the forward keeps for the backward: the gated pre-activations ``z (n_gated, F, E,
    ROW)``, the result before alpha ``y (E, F, ROW)`` (empty without alpha), ``alpha (E, F)``, and
    the input ``u0 (F, E, ROW)`` where weight gradients can be asked for (else ``None``)."""

    z: Tensor
    y: Tensor
    alpha: Tensor
    u0: Tensor | None = None

    @property
    def n_focus(self):
        return self.z.shape[1]

    @property
    def n_edges(self):
        return self.z.shape[2]

    @property
    def row(self):
        return self.z.shape[3]

    def focus_major(self) -> tuple:
        """``(F, E, ROW)``: the shape of ``u0`` and of its gradient."""
        return (self.n_focus, self.n_edges, self.row)

    def edge_major(self) -> tuple:
        """``(E, F, ROW)``: the shape of the result and of its gradient."""
        return (self.n_edges, self.n_focus, self.row)

