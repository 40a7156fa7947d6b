"""SeZM's mixing-layer weights as ``mixstack.mixing_stack``'s ``w0``, ``w1`` and ``gw``.

``SO2Linear._build_so2_weight()`` assembles a layer's weight ``(D_m*Cf, F, D_m*Cf)`` in the
``(in, out)`` convention, block-diagonal over ``|m|``; permuted to ``(F, in, out)`` its m = 0
diagonal block is ``w0[k]`` and its |m| = 1 block (``[[U, V], [-V, U]]`` over the m = -1 and
m = +1 stripes) is ``w1[k]``: the same row layout as mixstack's (docs/contract.md §1).  The
gate of layer ``k`` is its ``GatedActivation``'s ``FocusLinear`` weight ``(Cf, F*G)``, viewed
``(Cf, F, G)`` and permuted to ``(F, Cf, G)``.  The weights are assembled from the live
parameters on every call (a loaded checkpoint or an optimizer step is seen at once); the
assembly is a few small copies of the parameters.
"""

from __future__ import annotations

import torch


def stack_weights(conv, *, detach: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w0 (n_layers, F, m0, m0), w1 (n_layers, F, m1, m1), gw (n_layers-1, F, Cf, G))`` of a
    SeZM ``SO2Convolution`` whose options ``options.unsupported_reason`` accepted.  ``detach``
    (inference) cuts them from the parameters, so no backward computes weight gradients."""
    lmax, n_focus, cf = conv.lmax, conv.n_focus, conv.so2_focus_dim
    m0 = (lmax + 1) * cf
    w0, w1, gw = [], [], []
    for linear in conv.so2_linears:
        weight = linear._build_so2_weight().permute(1, 0, 2)          # (F, D_m*Cf in, D_m*Cf out)
        w0.append(_block(weight, 0, m0, by_index=not detach))
        w1.append(_block(weight, m0, weight.shape[1], by_index=not detach))
    for activation in list(conv.non_linearities)[:-1]:
        gw.append(activation.gate_linear.weight.view(cf, n_focus, lmax * cf).permute(1, 0, 2))
    w0, w1 = torch.stack(w0), torch.stack(w1)
    gw = torch.stack(gw) if gw else w0.new_zeros(0, n_focus, cf, lmax * cf)
    if detach:
        return w0.detach(), w1.detach(), gw.detach()
    return w0, w1, gw


def _block(weight: torch.Tensor, lo: int, hi: int, *, by_index: bool) -> torch.Tensor:
    """The diagonal block ``[lo:hi, lo:hi]`` of ``weight (F, D, D)``.  With gradients it is taken
    by index, not by slice: a slice's gradient is a zero padding, which beside the assembly's own
    concatenations Inductor's CPU vectoriser (torch 2.11) miscompiles in a training compile; an
    index's gradient scatters each element onto zero (the same values).  Without, a view."""
    if not by_index:
        return weight[:, lo:hi, lo:hi]
    idx = torch.arange(lo, hi, device=weight.device)
    return weight.index_select(1, idx).index_select(2, idx)
