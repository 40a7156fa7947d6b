"""The geometry of the SO(2) convolution: real Wigner-D rows, edge frames, and the
rotation-commuting |m| = 1 weights of ``EquivariantMixingStack``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mixstack.potential.blocks import EquivariantMixingStack
from mixstack.potential.frames import edge_frames, wigner_full, wigner_rows

special = pytest.importorskip("scipy.special")


def _random_rotations(n: int, seed: int) -> torch.Tensor:
    """Proper rotations from QR of Gaussian matrices (float64)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q * torch.det(q)[:, None, None]          # det +1


def _real_sh(l: int, v: np.ndarray) -> np.ndarray:
    """Real spherical harmonics of degree l, m = -l..l, without the Condon-Shortley phase
    (degree 1 is proportional to (y, z, x)), from scipy's complex ones."""
    v = v / np.linalg.norm(v, axis=-1, keepdims=True)
    theta, phi = np.arccos(np.clip(v[:, 2], -1, 1)), np.arctan2(v[:, 1], v[:, 0])
    cols = []
    for m in range(-l, l + 1):
        y = special.sph_harm_y(l, abs(m), theta, phi)
        cols.append(y.real if m == 0 else math.sqrt(2) * (-1) ** m * (y.real if m > 0 else y.imag))
    return np.stack(cols, -1)


@pytest.mark.parametrize("l", range(7))
def test_wigner_matrix_rotates_real_spherical_harmonics(l):
    R = _random_rotations(4, seed=l)
    D = wigner_full(R, l).numpy()
    r = np.random.default_rng(l).normal(size=(9, 3))
    for k in range(len(R)):
        want = _real_sh(l, r @ R[k].numpy().T)                 # Y(R r)
        got = _real_sh(l, r) @ D[k].T                          # D(R) Y(r)
        np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(D @ D.transpose(0, 2, 1), np.broadcast_to(np.eye(2 * l + 1), D.shape),
                               atol=1e-12)


def test_kept_rows_equal_the_rows_of_the_full_matrix_for_every_lmax():
    R = _random_rotations(5, seed=11)
    for lmax in range(1, 7):
        rows = wigner_rows(R, lmax, keep=1)
        for l in range(lmax + 1):
            c = min(l, 1)
            assert rows[l].shape == (5, 2 * c + 1, 2 * l + 1)
            torch.testing.assert_close(rows[l], wigner_full(R, l)[:, l - c:l + c + 1], rtol=0, atol=1e-13)


def test_wigner_is_a_homomorphism_in_float32_to_rounding():
    R1, R2 = _random_rotations(3, 1), _random_rotations(3, 2)
    for l in (2, 6):
        lhs = wigner_full((R1 @ R2).float(), l)
        rhs = wigner_full(R1.float(), l) @ wigner_full(R2.float(), l)
        assert (lhs - rhs).abs().max() < 2e-6


def test_edge_frames_are_rotations_taking_the_edge_to_z_even_along_the_axes():
    v = torch.cat((torch.randn(200, 3, dtype=torch.float64),
                   torch.tensor([[0, 0, 1.5], [0, 0, -2.0], [1e-3, 0, 3], [2, 0, 0], [0, -1, 0]],
                                dtype=torch.float64)))
    v.requires_grad_(True)
    R = edge_frames(v)
    eye = torch.eye(3, dtype=torch.float64).expand_as(R)
    torch.testing.assert_close(R @ R.transpose(-1, -2), eye, atol=1e-13, rtol=0)
    torch.testing.assert_close(torch.det(R), torch.ones(len(v), dtype=torch.float64), atol=1e-13, rtol=0)
    z = (R @ v.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(z[:, :2], torch.zeros_like(z[:, :2]), atol=1e-13, rtol=0)
    torch.testing.assert_close(z[:, 2], v.norm(dim=-1), atol=1e-13, rtol=0)
    (g,) = torch.autograd.grad(wigner_rows(R, 3)[3].sum(), v)
    assert torch.isfinite(g).all()


def _roll(u0: torch.Tensor, theta: float, lmax: int, cf: int) -> torch.Tensor:
    """Rotate the edge-frame coefficients of ``u0 (F, E, ROW)`` about z by ``theta``
    (the real Wigner matrix of a z rotation acting on m = -1, +1 of every degree)."""
    c, s = math.cos(theta), math.sin(theta)
    Rz = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=u0.dtype)
    x = u0.unflatten(-1, (3 * lmax + 1, cf))
    out = x.clone()
    for l in range(1, lmax + 1):
        D = wigner_full(Rz, l)                     # (2l+1, 2l+1); rows/cols l-1, l+1 are m = -1, +1
        pair = D[[l - 1, l + 1]][:, [l - 1, l + 1]]
        mm, mp = x[..., lmax + l, :], x[..., 2 * lmax + l, :]
        out[..., lmax + l, :] = pair[0, 0] * mm + pair[0, 1] * mp
        out[..., 2 * lmax + l, :] = pair[1, 0] * mm + pair[1, 1] * mp
    return out.flatten(-2)


@pytest.mark.parametrize("free_w1", [False, True], ids=["UV-structure", "free-w1-control"])
def test_stack_commutes_with_rotations_about_the_edge_only_with_the_complex_structure(free_w1):
    lmax, cf, f = 2, 16, 2
    torch.manual_seed(0)
    stack = EquivariantMixingStack(f, cf, lmax, 3, dtype=torch.float64)
    w1 = torch.randn_like(stack.w1()) * 0.1 if free_w1 else stack.w1()
    u0 = torch.randn(f, 7, (3 * lmax + 1) * cf, dtype=torch.float64)
    alpha = torch.softmax(torch.randn(7, f, dtype=torch.float64), -1)

    def run(u):
        from mixstack import mixing_stack
        return mixing_stack(u, alpha, stack.w0, w1, stack.gw, lmax=lmax, focus_dim=cf).transpose(0, 1)

    theta = 0.7
    err = (run(_roll(u0, theta, lmax, cf)) - _roll(run(u0), theta, lmax, cf)).abs().max().item()
    if free_w1:
        assert err > 1e-3                           # the check sees a non-equivariant stack
    else:
        assert err < 1e-12
