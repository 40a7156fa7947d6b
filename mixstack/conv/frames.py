"""Edge frames and real Wigner-D rows: the rotations of an SO(2) convolution.

An SO(2) convolution rotates each edge onto the z axis, where a rotation
about the edge is a rotation about z: there the |m| = 1 coefficients of every
degree turn as one complex number and the m = 0 coefficients do not move, so
any map of the row layout (docs/contract.md §1) that commutes with that turn (block weights
``[[U, V], [-V, U]]``, per-degree gates, scalar functions of the m = 0 part)
is equivariant once the result is rotated back.

``edge_frames`` builds, per edge, a rotation ``R`` with ``R @ r_hat = z``.
``wigner_rows`` gives, for every degree ``l <= lmax``, the rows
``m in {-1, 0, +1}`` of the real Wigner matrix ``D^l(R)`` — the only rows the
convolution keeps — from ``R`` itself by the recursion of Ivanic and
Ruedenberg (J. Phys. Chem. 1996, 100, 6342; erratum 1998, 102, 9099).  The
recursion is a polynomial in the entries of ``R``: no Euler angles, no
``acos`` / ``atan2``, hence exact to rounding and differentiable everywhere
(forces and stress go through it).  A degree-``l`` step needs only the rows
``|m| <= k + 1`` of degree ``l - 1`` when degree ``l`` needs rows ``|m| <= k``,
so the recursion carries ``|m| <= 1 + lmax - l`` rows instead of all of them.

Conventions: real spherical harmonics ordered ``m = -l..l`` (degree 1 is
``(y, z, x)``), without the Condon-Shortley phase, and ``D(R)`` defined by
``Y^l(R r) = D^l(R) Y^l(r)``.  Features that transform like ``Y`` are taken to
the edge frame by ``D(R)`` and back by ``D(R)^T``.
"""

from __future__ import annotations

import functools
import math

import torch

# Degree-1 real harmonics are (y, z, x): D^1 = R permuted on both sides, (x, y, z) -> (y, z, x).


def edge_frames(vec: torch.Tensor) -> torch.Tensor:
    """Rotations ``(E, 3, 3)`` with rows ``(x', y', z')``, ``z' = vec / |vec|``.

    The helper axis for ``x'`` is the coordinate axis least aligned with the
    edge, chosen without gradient, so ``x'`` is never a normalised near-zero
    vector (|e . r_hat| <= 1/sqrt(3)).  The roll this choice fixes does not
    reach any output (see the module docstring), so the branch is invisible.
    """
    r_hat = vec / torch.linalg.vector_norm(vec, dim=-1, keepdim=True)
    with torch.no_grad():
        pick = r_hat.abs().argmin(dim=-1)             # an index: no gradient to stop
    helper = torch.nn.functional.one_hot(pick, 3).to(vec.dtype)
    x = helper - (helper * r_hat).sum(-1, keepdim=True) * r_hat
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    y = torch.linalg.cross(r_hat, x, dim=-1)
    return torch.stack((x, y, r_hat), dim=-2)


def _kept(l: int, lmax: int, keep: int) -> int:
    """How many ``|m|`` the recursion carries at degree ``l``: ``|m| <= this``."""
    return min(l, keep + lmax - l)


@functools.lru_cache(maxsize=None)
def _coefficients(l: int, rows_out: int, rows_in: int):
    """Constants of one recursion step ``l - 1 -> l`` (float64, CPU).

    Returns ``(C, s)``: ``C (3, 2*rows_out+1, 2*rows_in+1)`` mixes the rows of
    ``P_i`` (``i = -1, 0, +1``) into the rows ``|m| <= rows_out`` of ``D^l``,
    and ``s (2l+1,)`` is the column normalisation ``1 / sqrt(denominator)``.
    """
    C = torch.zeros(3, 2 * rows_out + 1, 2 * rows_in + 1, dtype=torch.float64, device="cpu")

    def add(i: int, m: int, a: int, value: float) -> None:
        if value != 0.0:
            assert abs(a) <= rows_in, (l, m, a)
            C[i + 1, m + rows_out, a + rows_in] += value

    for m in range(-rows_out, rows_out + 1):
        am, d0 = abs(m), float(m == 0)
        u = math.sqrt((l + m) * (l - m))
        v = 0.5 * math.sqrt((1 + d0) * (l + am - 1) * (l + am)) * (1 - 2 * d0)
        w = -0.5 * math.sqrt(max((l - am - 1) * (l - am), 0)) * (1 - d0)
        add(0, m, m, u)
        if m == 0:
            add(1, 0, 1, v)
            add(-1, 0, -1, v)
        elif m > 0:
            d1 = float(m == 1)
            add(1, m, m - 1, v * math.sqrt(1 + d1))
            add(-1, m, -m + 1, -v * (1 - d1))
            add(1, m, m + 1, w)
            add(-1, m, -m - 1, w)
        else:
            d1 = float(m == -1)
            add(1, m, m + 1, v * (1 - d1))
            add(-1, m, -m - 1, v * math.sqrt(1 + d1))
            add(1, m, m - 1, w)
            add(-1, m, -m + 1, -w)
    s = torch.tensor([1.0 / math.sqrt((l + n) * (l - n)) if abs(n) < l else 1.0 / math.sqrt(2 * l * (2 * l - 1))
                      for n in range(-l, l + 1)], dtype=torch.float64, device="cpu")
    return C, s


def _yzx(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``t`` reordered ``(x, y, z) -> (y, z, x)`` along ``dim``, from two slices."""
    return torch.cat((t.narrow(dim, 1, 2), t.narrow(dim, 0, 1)), dim)


def wigner_d1(R: torch.Tensor) -> torch.Tensor:
    """``D^1(R)`` in the real-harmonic order ``(y, z, x)``: ``(..., 3, 3)``, rows and columns of ``R``
    reordered.

    Built from slices and a concatenation, whose backward is slices again, not from an index
    list: the backward of ``R[..., p, :][..., :, p]`` (and of ``torch.roll``, which Inductor
    lowers to an index) is an accumulating ``index_put`` whose value is read transposed, and
    Inductor's C++ backend compiles that into stores at wrong offsets
    (``repro/inductor_cpu_index_put_transpose.py``)."""
    return _yzx(_yzx(R, -2), -1)


def _step(R1: torch.Tensor, M: torch.Tensor, C: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Rows ``|m| <= rows_out`` of ``D^l`` from the carried rows ``M`` of ``D^{l-1}``
    (``C``, ``s``: the step's constants from ``_coefficients``)."""
    C, s = C.to(M.dtype), s.to(M.dtype)
    first, last = M[..., :1], M[..., -1:]               # columns n' = -(l-1) and n' = l-1
    # P_i[a, n] for i = -1, 0, +1 (Ivanic-Ruedenberg's P with the degree-1 row i).
    ps = []
    for i in (0, 1, 2):                                 # rows y, z, x of D^1: i = -1, 0, +1
        r_m, r_0, r_p = (R1[..., i, j, None, None] for j in range(3))
        inner = r_0 * M
        col_lo = r_p * first + r_m * last              # n = -l
        col_hi = r_p * last - r_m * first              # n = +l
        ps.append(torch.cat((col_lo, inner, col_hi), dim=-1))
    P = torch.stack(ps, dim=-3)                         # (..., 3, 2*rows_in+1, 2l+1)
    return torch.einsum("ima,...ian->...mn", C, P) * s


def step_constants(lmax: int, keep: int = 1) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{l: (C, s)}`` for the recursion steps ``l = 2..lmax`` (float64, CPU)."""
    return {l: _coefficients(l, _kept(l, lmax, keep), _kept(l - 1, lmax, keep)) for l in range(2, lmax + 1)}


def _numbers(lmax: int, keep: int) -> dict:
    return {l: (C.tolist(), s.tolist()) for l, (C, s) in step_constants(lmax, keep).items()}


# ``step_constants`` as nested Python lists for every lmax at keep = 1, computed at import: an
# operator body traced on fake tensors, or a compiler tracing ``wigner_rows``, builds its
# constants from these numbers (a real tensor there is an error; a dict lookup traces cleanly).
_CONSTANT_NUMBERS = {(lmax, 1): _numbers(lmax, 1) for lmax in range(1, 7)}


def wigner_rows(R: torch.Tensor, lmax: int, keep: int = 1, constants=None) -> list[torch.Tensor]:
    """Rows ``|m| <= keep`` of the real Wigner matrices ``D^l(R)``, ``l = 0..lmax``.

    ``R (..., 3, 3)`` rotations.  Returns a list whose entry ``l`` has shape
    ``(..., 2*min(l, keep)+1, 2l+1)`` (rows ``m = -min(l,keep)..min(l,keep)``).
    ``constants``: ``step_constants(lmax, keep)`` already on ``R``'s device
    (``WignerRows`` keeps them as buffers); by default they are built here, from the numbers
    (so that an operator body traced on fake tensors can call this).
    """
    if lmax < 0:
        raise ValueError(f"lmax must be >= 0, got {lmax}")
    if constants is None:       # new tensors from the numbers, which fake tensors (tracing) allow
        constants = {l: (R.new_tensor(C), R.new_tensor(s)) for l, (C, s) in
                     (_CONSTANT_NUMBERS.get((lmax, keep)) or _numbers(lmax, keep)).items()}
    out = [torch.ones(R.shape[:-2] + (1, 1), dtype=R.dtype, device=R.device)]
    if lmax == 0:
        return out
    R1 = wigner_d1(R)
    k1 = _kept(1, lmax, keep)
    M = R1[..., 1 - k1:2 + k1, :]
    out.append(M[..., k1 - min(1, keep):k1 + min(1, keep) + 1, :])
    for l in range(2, lmax + 1):
        k = _kept(l, lmax, keep)
        M = _step(R1, M, *constants[l])
        c = min(l, keep)
        out.append(M[..., k - c:k + c + 1, :])
    return out


def pack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """``wigner_rows(R, lmax, keep=1)`` as one ``(..., 3, (lmax+1)^2)`` tensor, the layout of
    ``mixstack.rotate_in`` / ``rotate_out_sum``: column ``l^2 + l + n`` of row ``k`` holds
    ``D^l[m = k - 1, n]``; degree 0's rows ``m = -1, +1`` (which do not exist) are zero."""
    zero = torch.zeros_like(rows[0])
    return torch.cat([torch.cat((zero, rows[0], zero), -2)] + list(rows[1:]), -1)


def wigner_full(R: torch.Tensor, l: int) -> torch.Tensor:
    """The whole real Wigner matrix ``D^l(R)``, ``(..., 2l+1, 2l+1)`` (tests, checks)."""
    return wigner_rows(R, l, keep=l)[l]


CONVENTIONS = ("mixstack", "sezm")


@functools.lru_cache(maxsize=None)
def _sign_numbers(lmax: int) -> tuple[float, ...]:
    cols = [1.0]
    for l in range(1, lmax + 1):
        cols += [float((-1) ** m) if m > 0 else float((-1) ** (-m + 1)) if m < 0 else 1.0 for m in range(-l, l + 1)]
    return tuple(r * c for r in (1.0, 1.0, -1.0) for c in cols)


def convention_signs(lmax: int, *, dtype=torch.float64, device=None) -> torch.Tensor:
    """``(3, (lmax+1)^2)``: the packed rows in SeZM's (deepmd-kit's DPA4) convention are these
    signs times mixstack's.  Column ``(l, m)``: ``(-1)^m`` for ``m > 0``, ``(-1)^(|m|+1)`` for
    ``m < 0``, 1 for ``m = 0`` (the two real-harmonic conventions differ by these signs); the row
    ``m = +1`` flips as well, so that SeZM's edge frame and mixstack's differ by a roll about the
    edge only, which an SO(2) convolution's stack commutes with (docs/deepmd.md)."""
    return torch.tensor(_sign_numbers(lmax), dtype=dtype, device=device).view(3, (lmax + 1) ** 2)


def edge_wigner_reference(vec: torch.Tensor, lmax: int, constants=None, convention: str = "mixstack") -> torch.Tensor:
    """The packed rows ``(E, 3, (lmax+1)^2)`` of the edges ``vec (E, 3)`` in tensor ops:
    ``pack_rows(wigner_rows(edge_frames(vec), lmax, keep=1))`` (level 0 of
    ``mixstack.edge_wigner``, and the oracle of its kernels), times ``convention_signs`` in
    SeZM's convention."""
    rows = pack_rows(wigner_rows(edge_frames(vec), lmax, keep=1, constants=constants))
    if convention == "sezm":
        rows = rows * vec.new_tensor(_sign_numbers(lmax)).view(3, (lmax + 1) ** 2)   # traces on fake tensors
    return rows


@functools.lru_cache(maxsize=None)
def step_matrices(l: int, lmax: int) -> torch.Tensor:
    """The recursion step ``l - 1 -> l`` (``keep = 1``) as nine constant matrices (float64, CPU).

    ``_step`` is linear in the carried rows ``M`` (the rows ``|m| <= _kept(l - 1, lmax, 1)`` of
    ``D^{l-1}``) and in the entries of ``R1 = D^1``, so, with ``M`` flattened row-major to
    ``P_{l-1}`` entries and the result to ``P_l``,

        _step(R1, M).flatten() = sum_{i,j} R1[i, j] * M.flatten() @ K[i, j]

    with ``K (3, 3, P_{l-1}, P_l)``.  Built by running ``_step`` itself on unit ``R1`` and unit
    ``M`` (the constants ``C`` and ``s`` folded in), so the recursion's math stays in one place;
    this is what the Triton kernels of ``mixstack.edge_wigner`` multiply by.
    """
    if not 2 <= l <= lmax:
        raise ValueError(f"a recursion step needs 2 <= l <= lmax, got l={l}, lmax={lmax}")
    rows_in, rows_out = _kept(l - 1, lmax, 1), _kept(l, lmax, 1)
    p_in = (2 * rows_in + 1) * (2 * l - 1)
    C, s = _coefficients(l, rows_out, rows_in)
    units_r = torch.eye(9, dtype=torch.float64).reshape(9, 1, 3, 3)                 # R1 = e_ij
    units_m = torch.eye(p_in, dtype=torch.float64).reshape(1, p_in, 2 * rows_in + 1, 2 * l - 1)
    out = _step(units_r, units_m, C, s)                                             # (9, p_in, rows, cols)
    return out.reshape(3, 3, p_in, (2 * rows_out + 1) * (2 * l + 1)).contiguous()
