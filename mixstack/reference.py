"""The mixing stack in plain PyTorch: level 0 and the oracle of every test.

``mixing_stack`` is the operator of docs/contract.md §1 written with ordinary tensor ops,
for any float dtype and device, differentiable to any order by autograd.
``forward`` also returns the gated pre-activations ``z`` that the accelerated
backward reads, and ``backward`` spells out the first-order gradients of
docs/contract.md §1 from those saved values.  ``backward`` is itself made of ordinary ops,
so autograd differentiates it again: it is the differentiable fallback the
custom operator uses for weight gradients and for double backward.

``rotate_in`` and ``rotate_out_sum`` (from ``conv_reference``) are the same for the
convolution's operators around the stack (docs/contract.md §7).
"""

from __future__ import annotations

import torch

from .conv_reference import rotate_in, rotate_out_sum  # noqa: F401  (mixstack.reference.rotate_in, ...)
from .layout import StackLayout, validate_inputs


def _gates(s: torch.Tensor, gw_k: torch.Tensor) -> torch.Tensor:
    """Gate sigmoids ``sigmoid(s @ gw_k)``, batched over focus streams."""
    return torch.sigmoid(torch.matmul(s, gw_k))


def _gated_activation(z: torch.Tensor, sg: torch.Tensor, lay: StackLayout) -> torch.Tensor:
    """``[silu(s) | z0[:, Cf:] * sg | z1 * [sg | sg]]`` for one gated layer."""
    cf, m0 = lay.focus_dim, lay.m0
    s = z[..., :cf]
    return torch.cat((s * torch.sigmoid(s), z[..., cf:m0] * sg, z[..., m0:] * torch.cat((sg, sg), -1)), -1)


def _block_linear(u: torch.Tensor, w0_k: torch.Tensor, w1_k: torch.Tensor, m0: int) -> torch.Tensor:
    """``[u[:, :m0] @ w0_k | u[:, m0:] @ w1_k]``, the block-diagonal SO(2) linear."""
    return torch.cat((torch.matmul(u[..., :m0], w0_k), torch.matmul(u[..., m0:], w1_k)), -1)


def _block_linear_t(g: torch.Tensor, w0_k: torch.Tensor, w1_k: torch.Tensor, m0: int) -> torch.Tensor:
    """The transpose of ``_block_linear``: ``[g0 @ w0_k^T | g1 @ w1_k^T]``."""
    return _block_linear(g, w0_k.transpose(-1, -2), w1_k.transpose(-1, -2), m0)


def forward_state(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """Run the stack; return ``(result, z, y)``.

    ``result (E, F, ROW)``, ``z (n_gated, F, E, ROW)`` the gated pre-activations
    and ``y (E, F, ROW)`` the result before the alpha weight (``result`` itself
    without alpha).  Inputs are assumed valid (see ``layout.validate_inputs``).
    """
    lay = StackLayout(lmax, focus_dim)
    m0, cf = lay.m0, focus_dim
    n_gated = w0.shape[0] - 1
    u = u0
    zs = []
    for k in range(n_gated):
        z = _block_linear(u, w0[k], w1[k], m0)
        sg = _gates(z[..., :cf], gw[k])
        u = u + _gated_activation(z, sg, lay)
        zs.append(z)
    y = u + _block_linear(u, w0[n_gated], w1[n_gated], m0)
    out = y * alpha.transpose(0, 1).unsqueeze(-1) if apply_alpha else y
    z_all = torch.stack(zs) if zs else u0.new_empty((0,) + tuple(u0.shape))
    return out.transpose(0, 1), z_all, y.transpose(0, 1)


def forward(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """Run the stack; return ``(result (E, F, ROW), z (n_gated, F, E, ROW))``."""
    return forward_state(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                         apply_alpha=apply_alpha)[:2]


def mixing_stack(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """The gated SO(2) mixing stack in plain PyTorch (level 0).

    Same signature and result as ``mixstack.mixing_stack``: ``u0 (F, E, ROW)``,
    ``alpha (E, F)``, ``w0 (n_layers, F, m0, m0)``, ``w1 (n_layers, F, m1, m1)``,
    ``gw (n_layers - 1, F, focus_dim, G)``; returns ``(E, F, ROW)``.
    """
    validate_inputs(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim)
    return forward(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha)[0]


def backward(grad_out, y, z_all, u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int,
             apply_alpha: bool, weights: bool = False):
    """First-order gradients of docs/contract.md §1 from the saved ``z`` and unscaled result ``y``.

    Returns ``(grad_u0, grad_alpha, grad_w0, grad_w1, grad_gw)``; ``grad_alpha``
    is ``None`` without alpha and the weight gradients are ``None`` unless
    ``weights``.  ``y (E, F, ROW)`` is the result before alpha (read only for
    ``grad_alpha``); ``u0`` is read only for weight gradients (the layer inputs
    are rebuilt from it and ``z``).
    """
    lay = StackLayout(lmax, focus_dim)
    m0, cf = lay.m0, focus_dim
    n_gated = w0.shape[0] - 1
    g = grad_out.transpose(0, 1)                      # focus-major (F, E, ROW)
    grad_alpha = None
    if apply_alpha:
        a = alpha.transpose(0, 1).unsqueeze(-1)
        grad_alpha = (grad_out * y).sum(-1)
        g = g * a

    sgs = [_gates(z_all[k][..., :cf], gw[k]) for k in range(n_gated)]
    inputs = []
    if weights:                                      # layer inputs u_k, rebuilt forwards
        u = u0
        for k in range(n_gated):
            inputs.append(u)
            u = u + _gated_activation(z_all[k], sgs[k], lay)
        inputs.append(u)
    dw0 = [None] * (n_gated + 1)
    dw1 = [None] * (n_gated + 1)
    dgw = [None] * n_gated

    def weight_grads(k, gz):
        u_k = inputs[k]
        dw0[k] = torch.matmul(u_k[..., :m0].transpose(-1, -2), gz[..., :m0])
        dw1[k] = torch.matmul(u_k[..., m0:].transpose(-1, -2), gz[..., m0:])

    if weights:
        weight_grads(n_gated, g)
    g = g + _block_linear_t(g, w0[n_gated], w1[n_gated], m0)
    for k in range(n_gated - 1, -1, -1):
        z, sg = z_all[k], sgs[k]
        s = z[..., :cf]
        s0 = torch.sigmoid(s)
        g_s, g_0, g_1 = g[..., :cf], g[..., cf:m0], g[..., m0:]
        gz_s = g_s * s0 * (1 + s * (1 - s0))
        gz_1 = g_1 * torch.cat((sg, sg), -1)
        prod1 = g_1 * z[..., m0:]
        gsg = g_0 * z[..., cf:m0] + (prod1[..., :lay.gate_width] + prod1[..., lay.gate_width:])
        gl = gsg * sg * (1 - sg)
        gz_s = gz_s + torch.matmul(gl, gw[k].transpose(-1, -2))
        gz = torch.cat((gz_s, g_0 * sg, gz_1), -1)
        if weights:
            weight_grads(k, gz)
            dgw[k] = torch.matmul(s.transpose(-1, -2), gl)
        g = g + _block_linear_t(gz, w0[k], w1[k], m0)
    if not weights:
        return g, grad_alpha, None, None, None
    grad_gw = torch.stack(dgw) if n_gated else gw.new_zeros(gw.shape)
    return g, grad_alpha, torch.stack(dw0), torch.stack(dw1), grad_gw
