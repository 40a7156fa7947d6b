"""Edge frames and packed Wigner rows in one kernel, and their gradient in one more.

Per edge ``v (3,)``: ``r = v / |v|``; the helper axis ``h`` is the coordinate axis of the
smallest ``|r_c|`` (the first one on a tie, as ``torch.argmin``); ``x = u / |u|`` with
``u = h - (h . r) r``; ``y = r x x``; ``R`` has rows ``(x, y, r)`` and ``R1 = D^1(R)`` is
``R`` with rows and columns reordered ``(x, y, z) -> (y, z, x)``.  The recursion state
``M_l`` (the rows ``|m| <= k_l`` of ``D^l``, flattened row-major, ``state_size`` entries)
starts at ``M_1 = R1`` and steps as

    M_l = sum_{i,j} R1[i, j] * (M_{l-1} @ K^l[i, j])

with the constant matrices ``K^l`` of ``mixstack.conv.frames.step_matrices`` (the launcher packs
them, zero-padded to ``state_pad``, in the layout of ``step_offset``).  Each product is one
``tl.dot`` on a ``(BLOCK_E, pad)`` register tile, on tensor cores as three TF32 products
(``STEP_PRECISION``: each float32 operand split into a TF32 head and tail, the tail x tail
product dropped; about 2^-21 relative per product): with exact fp32 FMA products
(``"ieee"``) the backward took several times the forward (BENCHMARKS.md, "The glue on
kernels").
The rows ``m = -1, 0, +1`` of every degree go to the packed layout ``W (E, 3, S)``:
``W[e, k, l^2 + n] = D^l[k - 1, n]`` (degree 0: ``W[e, 1, 0] = 1``, its other rows zero);
with ``SEZM`` each stored entry takes SeZM's sign (``_degree_places``), and the backward gives
the incoming gradient the same signs as it reads it: no pass of its own.

The backward recomputes the chain, keeps ``M_2 .. M_{lmax-1}`` per edge in a scratch buffer
(``scratch_offset``; each program touches its own edges only), then walks back:

    Y = G_l @ K^l[i, j]^T,  G_{l-1} = dW_{l-1} + sum_{i,j} R1[i, j] * Y,
    dR1[i, j] += sum_p M_{l-1}[p] * Y[p]

and through the frame (two normalisations and a cross product; the helper axis is a constant)
to ``dv``.  No atomics: every sum is per edge, in a fixed order.  Edge offsets are int64.
"""

import triton
import triton.language as tl

STEP_PRECISION: tl.constexpr = tl.constexpr("tf32x3")


@triton.constexpr_function
def state_size(l, lmax):
    """Entries of the recursion state at degree ``l >= 1``: ``(2 k + 1) (2 l + 1)`` with
    ``k = min(l, 1 + lmax - l)`` (``mixstack.conv.frames._kept`` at ``keep = 1``)."""
    return (2 * min(l, 1 + lmax - l) + 1) * (2 * l + 1)


@triton.constexpr_function
def state_pad(l, lmax):
    """The register width of the degree-``l`` state: a power of two, at least 16 (``tl.dot``)."""
    return max(16, 1 << (state_size(l, lmax) - 1).bit_length())


@triton.constexpr_function
def step_offset(l, lmax):
    """Where step ``l``'s nine ``(state_pad(l-1), state_pad(l))`` matrices start in the packed
    constants (steps ``2 .. lmax`` in order, each ``[i, j]`` row-major)."""
    return sum(9 * state_pad(t - 1, lmax) * state_pad(t, lmax) for t in range(2, l))


@triton.constexpr_function
def scratch_offset(l, lmax):
    """Where ``M_l`` (``2 <= l < lmax``) starts in an edge's row of the backward's scratch."""
    return sum(state_size(t, lmax) for t in range(2, l))


@triton.constexpr_function
def kept_rows(l, lmax):
    """``k_l``: the recursion carries the rows ``|m| <= k_l`` of degree ``l``."""
    return min(l, 1 + lmax - l)


@triton.jit
def edge_frame(vx, vy, vz):
    """The frame of a block of edges: ``(|v|, r, h, |u|, x, y)`` with every vector as three
    ``(BLOCK_E,)`` components (``h`` one-hot, float)."""
    nv = tl.sqrt(vx * vx + vy * vy + vz * vz)
    rx = vx / nv
    ry = vy / nv
    rz = vz / nv
    ax = tl.abs(rx)
    ay = tl.abs(ry)
    az = tl.abs(rz)
    pick_x = (ax <= ay) & (ax <= az)
    pick_y = (~pick_x) & (ay <= az)
    hx = tl.where(pick_x, 1.0, 0.0)
    hy = tl.where(pick_y, 1.0, 0.0)
    hz = 1.0 - hx - hy
    hr = hx * rx + hy * ry + hz * rz                  # h . r, exact: one term is nonzero
    ux = hx - hr * rx
    uy = hy - hr * ry
    uz = hz - hr * rz
    nu = tl.sqrt(ux * ux + uy * uy + uz * uz)
    xx = ux / nu
    xy = uy / nu
    xz = uz / nu
    yx = ry * xz - rz * xy
    yy = rz * xx - rx * xz
    yz = rx * xy - ry * xx
    return nv, rx, ry, rz, hx, hy, hz, nu, xx, xy, xz, yx, yy, yz


@triton.jit
def first_state(r00, r01, r02, r10, r11, r12, r20, r21, r22, PAD: tl.constexpr):
    """``M_1 = R1`` as a ``(BLOCK_E, PAD)`` tile, entry ``3 i + j`` (zeros beyond 9)."""
    p = tl.arange(0, PAD)[None, :]
    m = tl.where(p == 0, r00[:, None], 0.0)
    m = tl.where(p == 1, r01[:, None], m)
    m = tl.where(p == 2, r02[:, None], m)
    m = tl.where(p == 3, r10[:, None], m)
    m = tl.where(p == 4, r11[:, None], m)
    m = tl.where(p == 5, r12[:, None], m)
    m = tl.where(p == 6, r20[:, None], m)
    m = tl.where(p == 7, r21[:, None], m)
    m = tl.where(p == 8, r22[:, None], m)
    return m


@triton.jit
def _k_tile(k_ptr, IJ: tl.constexpr, PIN: tl.constexpr, POUT: tl.constexpr):
    """Matrix ``IJ = 3 i + j`` of a step (at ``k_ptr``): ``(PIN, POUT)``."""
    return tl.load(k_ptr + IJ * PIN * POUT + tl.arange(0, PIN)[:, None] * POUT + tl.arange(0, POUT)[None, :])


@triton.jit
def _k_tile_t(k_ptr, IJ: tl.constexpr, PIN: tl.constexpr, POUT: tl.constexpr):
    """The transpose of ``_k_tile``: ``(POUT, PIN)``."""
    return tl.load(k_ptr + IJ * PIN * POUT + tl.arange(0, POUT)[:, None] + tl.arange(0, PIN)[None, :] * POUT)


@triton.jit
def _scaled_dot(acc, m, r, k_ptr, IJ: tl.constexpr, PIN: tl.constexpr, POUT: tl.constexpr):
    return tl.dot(m * r[:, None], _k_tile(k_ptr, IJ, PIN, POUT), acc, input_precision=STEP_PRECISION)


@triton.jit
def _row_step(acc, m, ri0, ri1, ri2, k_ptr, I: tl.constexpr, PIN: tl.constexpr, POUT: tl.constexpr):
    """The three products ``j = 0, 1, 2`` of row ``i = I`` of ``recursion_step``, in order."""
    acc = _scaled_dot(acc, m, ri0, k_ptr, 3 * I, PIN, POUT)
    acc = _scaled_dot(acc, m, ri1, k_ptr, 3 * I + 1, PIN, POUT)
    return _scaled_dot(acc, m, ri2, k_ptr, 3 * I + 2, PIN, POUT)


@triton.jit
def recursion_step(m, r00, r01, r02, r10, r11, r12, r20, r21, r22, k_ptr,
                   PIN: tl.constexpr, POUT: tl.constexpr, BLOCK_E: tl.constexpr):
    """``M_l = sum_ij R1[i, j] * (M_{l-1} @ K[i, j])``: ``(BLOCK_E, PIN) -> (BLOCK_E, POUT)``,
    the nine products summed in the order ``ij = 0..8``."""
    acc = tl.zeros((BLOCK_E, POUT), dtype=tl.float32)
    acc = _row_step(acc, m, r00, r01, r02, k_ptr, 0, PIN, POUT)
    acc = _row_step(acc, m, r10, r11, r12, k_ptr, 1, PIN, POUT)
    return _row_step(acc, m, r20, r21, r22, k_ptr, 2, PIN, POUT)


@triton.jit
def _degree_places(L: tl.constexpr, LMAX: tl.constexpr, PAD: tl.constexpr, S: tl.constexpr):
    """``(dest, keep, sign)``: where entry ``p`` of ``M_L`` goes in an edge's packed rows
    (``k * S + L^2 + n`` for the row ``m = k - 1``), whether it goes at all, and its sign in
    SeZM's convention (``mixstack.conv.frames.convention_signs``: ``(-1)^m`` for ``m > 0``,
    ``(-1)^(|m|+1)`` for ``m < 0``, and the row ``m = +1`` negated)."""
    N: tl.constexpr = 2 * L + 1
    K: tl.constexpr = kept_rows(L, LMAX)
    p = tl.arange(0, PAD)
    row = p // N
    k = row - (K - 1)
    m = p % N - L
    odd = (m % 2) != 0
    col = tl.where(m > 0, tl.where(odd, -1.0, 1.0), tl.where(m < 0, tl.where(odd, 1.0, -1.0), 1.0))
    keep = (row >= K - 1) & (row <= K + 1) & (p < (2 * K + 1) * N)
    return k * S + L * L + p % N, keep, tl.where(k == 2, -col, col)


@triton.jit
def store_degree(w_ptr, w_rows, e_mask, m, L: tl.constexpr, LMAX: tl.constexpr, PAD: tl.constexpr,
                 S: tl.constexpr, SEZM: tl.constexpr):
    """Store degree ``L``'s kept rows of ``M_L``, in SeZM's signs with ``SEZM``."""
    dest, keep, sign = _degree_places(L, LMAX, PAD, S)
    if SEZM:
        m = m * sign[None, :]
    tl.store(w_ptr + w_rows[:, None] + dest[None, :], m, mask=e_mask[:, None] & keep[None, :])


@triton.jit
def load_degree(w_ptr, w_rows, e_mask, L: tl.constexpr, LMAX: tl.constexpr, PAD: tl.constexpr,
                S: tl.constexpr, SEZM: tl.constexpr):
    """The rows ``store_degree`` writes, read back into ``M_L``'s places (a gradient: the same
    signs undone with ``SEZM``)."""
    dest, keep, sign = _degree_places(L, LMAX, PAD, S)
    g = tl.load(w_ptr + w_rows[:, None] + dest[None, :], mask=e_mask[:, None] & keep[None, :], other=0.0)
    if SEZM:
        g = g * sign[None, :]
    return g


@triton.jit
def _load_vec(vec_ptr, e, e_mask):
    vx = tl.load(vec_ptr + e * 3, mask=e_mask, other=1.0)
    vy = tl.load(vec_ptr + e * 3 + 1, mask=e_mask, other=1.0)
    vz = tl.load(vec_ptr + e * 3 + 2, mask=e_mask, other=1.0)
    return vx, vy, vz


@triton.jit
def edge_wigner_kernel(vec_ptr, k_ptr, w_ptr, E, LMAX: tl.constexpr, BLOCK_E: tl.constexpr, SEZM: tl.constexpr):
    """``vec (E, 3)`` contiguous -> ``W (E, 3, (LMAX+1)^2)`` contiguous (module docstring), in SeZM's signs
    with ``SEZM``."""
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    w_rows = e * (3 * S)
    vx, vy, vz = _load_vec(vec_ptr, e, e_mask)
    _nv, rx, ry, rz, _hx, _hy, _hz, _nu, xx, xy, xz, yx, yy, yz = edge_frame(vx, vy, vz)
    one = tl.full((BLOCK_E,), 1.0, tl.float32)
    zero = tl.zeros((BLOCK_E,), tl.float32)
    tl.store(w_ptr + w_rows, zero, mask=e_mask)
    tl.store(w_ptr + w_rows + S, one, mask=e_mask)
    tl.store(w_ptr + w_rows + 2 * S, zero, mask=e_mask)
    # R1 = D^1: rows and columns (y, z, x) of R = (x; y; r)
    m = first_state(yy, yz, yx, ry, rz, rx, xy, xz, xx, state_pad(1, LMAX))
    store_degree(w_ptr, w_rows, e_mask, m, 1, LMAX, state_pad(1, LMAX), S, SEZM)
    for l in tl.static_range(2, LMAX + 1):
        m = recursion_step(m, yy, yz, yx, ry, rz, rx, xy, xz, xx, k_ptr + step_offset(l, LMAX),
                           state_pad(l - 1, LMAX), state_pad(l, LMAX), BLOCK_E)
        store_degree(w_ptr, w_rows, e_mask, m, l, LMAX, state_pad(l, LMAX), S, SEZM)


@triton.jit
def _step_back(gm, g, m_prev, r, gr, k_ptr, IJ: tl.constexpr, PIN: tl.constexpr, POUT: tl.constexpr):
    """One ``[i, j]`` of a step's backward: ``gm`` plus its gradient of ``M_{l-1}``, and ``gr``
    plus its ``dR1[i, j]``."""
    y = tl.dot(g, _k_tile_t(k_ptr, IJ, PIN, POUT), input_precision=STEP_PRECISION)
    return gm + r[:, None] * y, gr + tl.sum(m_prev * y, axis=1)


@triton.jit
def _row_back(gm, g, m_prev, ri0, ri1, ri2, gi0, gi1, gi2, k_ptr, I: tl.constexpr, PIN: tl.constexpr,
              POUT: tl.constexpr):
    """Row ``i = I`` of ``step_backward``: its three ``[i, j]`` in the order ``j = 0, 1, 2``."""
    gm, gi0 = _step_back(gm, g, m_prev, ri0, gi0, k_ptr, 3 * I, PIN, POUT)
    gm, gi1 = _step_back(gm, g, m_prev, ri1, gi1, k_ptr, 3 * I + 1, PIN, POUT)
    gm, gi2 = _step_back(gm, g, m_prev, ri2, gi2, k_ptr, 3 * I + 2, PIN, POUT)
    return gm, gi0, gi1, gi2


@triton.jit
def step_backward(g, m_prev, r00, r01, r02, r10, r11, r12, r20, r21, r22,
                  g00, g01, g02, g10, g11, g12, g20, g21, g22, k_ptr, PIN: tl.constexpr, POUT: tl.constexpr):
    """Back through ``recursion_step``: ``g (BLOCK_E, POUT)`` the gradient of ``M_l``, ``m_prev``
    ``M_{l-1}``; returns the gradient of ``M_{l-1}`` through the step and the nine ``dR1``
    accumulators, each ``[i, j]`` added in the order ``ij = 0..8``."""
    gm = tl.zeros(m_prev.shape, dtype=tl.float32)
    gm, g00, g01, g02 = _row_back(gm, g, m_prev, r00, r01, r02, g00, g01, g02, k_ptr, 0, PIN, POUT)
    gm, g10, g11, g12 = _row_back(gm, g, m_prev, r10, r11, r12, g10, g11, g12, k_ptr, 1, PIN, POUT)
    gm, g20, g21, g22 = _row_back(gm, g, m_prev, r20, r21, r22, g20, g21, g22, k_ptr, 2, PIN, POUT)
    return gm, g00, g01, g02, g10, g11, g12, g20, g21, g22


@triton.jit
def _first_row_back(g, gi0, gi1, gi2, I: tl.constexpr, PAD: tl.constexpr):
    """``M_1 = R1``: row ``i = I``'s entries ``3 i + j`` of ``M_1``'s gradient added to ``dR1[i, j]``."""
    p1 = tl.arange(0, PAD)[None, :]
    gi0 += tl.sum(tl.where(p1 == 3 * I, g, 0.0), axis=1)
    gi1 += tl.sum(tl.where(p1 == 3 * I + 1, g, 0.0), axis=1)
    gi2 += tl.sum(tl.where(p1 == 3 * I + 2, g, 0.0), axis=1)
    return gi0, gi1, gi2


@triton.jit
def _cross(ax, ay, az, bx, by, bz):
    return ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx


@triton.jit
def edge_wigner_grad_kernel(gw_ptr, vec_ptr, k_ptr, scratch_ptr, gv_ptr, E, SCRATCH_ROW,
                            LMAX: tl.constexpr, BLOCK_E: tl.constexpr, SEZM: tl.constexpr):
    """``dW (E, 3, S)``, ``vec (E, 3)`` contiguous -> ``dv (E, 3)``; ``scratch (E, SCRATCH_ROW)``
    holds ``M_2 .. M_{LMAX-1}`` of this program's edges (module docstring); ``dW`` of rows in
    SeZM's signs with ``SEZM``."""
    S: tl.constexpr = (LMAX + 1) * (LMAX + 1)
    pid = tl.program_id(0).to(tl.int64)
    e = pid * BLOCK_E + tl.arange(0, BLOCK_E).to(tl.int64)
    e_mask = e < E
    w_rows = e * (3 * S)
    s_rows = e * SCRATCH_ROW
    vx, vy, vz = _load_vec(vec_ptr, e, e_mask)
    nv, rx, ry, rz, hx, hy, hz, nu, xx, xy, xz, yx, yy, yz = edge_frame(vx, vy, vz)
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = yy, yz, yx, ry, rz, rx, xy, xz, xx
    m1 = first_state(r00, r01, r02, r10, r11, r12, r20, r21, r22, state_pad(1, LMAX))
    # forward again, keeping M_2 .. M_{LMAX-1}
    m = m1
    for l in tl.static_range(2, LMAX):
        m = recursion_step(m, r00, r01, r02, r10, r11, r12, r20, r21, r22, k_ptr + step_offset(l, LMAX),
                           state_pad(l - 1, LMAX), state_pad(l, LMAX), BLOCK_E)
        p = tl.arange(0, state_pad(l, LMAX))
        tl.store(scratch_ptr + s_rows[:, None] + scratch_offset(l, LMAX) + p[None, :], m,
                 mask=e_mask[:, None] & (p < state_size(l, LMAX))[None, :])
    # the scratch rows were written by other threads than those that read them back
    tl.debug_barrier()
    # back through the recursion
    zero = tl.zeros((BLOCK_E,), tl.float32)
    g00, g01, g02, g10, g11, g12, g20, g21, g22 = zero, zero, zero, zero, zero, zero, zero, zero, zero
    g = load_degree(gw_ptr, w_rows, e_mask, LMAX, LMAX, state_pad(LMAX, LMAX), S, SEZM)
    for L in tl.static_range(LMAX, 1, -1):           # the step L - 1 -> L, L = LMAX .. 2
        if L - 1 == 1:
            mp = m1
        else:
            p = tl.arange(0, state_pad(L - 1, LMAX))
            mp = tl.load(scratch_ptr + s_rows[:, None] + scratch_offset(L - 1, LMAX) + p[None, :],
                         mask=e_mask[:, None] & (p < state_size(L - 1, LMAX))[None, :], other=0.0)
        gm, g00, g01, g02, g10, g11, g12, g20, g21, g22 = step_backward(
            g, mp, r00, r01, r02, r10, r11, r12, r20, r21, r22, g00, g01, g02, g10, g11, g12, g20, g21, g22,
            k_ptr + step_offset(L, LMAX), state_pad(L - 1, LMAX), state_pad(L, LMAX))
        g = gm + load_degree(gw_ptr, w_rows, e_mask, L - 1, LMAX, state_pad(L - 1, LMAX), S, SEZM)
    # M_1 = R1: entry 3 i + j
    g00, g01, g02 = _first_row_back(g, g00, g01, g02, 0, state_pad(1, LMAX))
    g10, g11, g12 = _first_row_back(g, g10, g11, g12, 1, state_pad(1, LMAX))
    g20, g21, g22 = _first_row_back(g, g20, g21, g22, 2, state_pad(1, LMAX))
    # R1[i, j] = R[(i+1)%3, (j+1)%3] with R = (x; y; r): the gradients of the rows y, r, x
    gyx, gyy, gyz = g02, g00, g01
    grx, gry, grz = g12, g10, g11
    gxx, gxy, gxz = g22, g20, g21
    # y = r x x
    c0, c1, c2 = _cross(xx, xy, xz, gyx, gyy, gyz)
    grx += c0
    gry += c1
    grz += c2
    c0, c1, c2 = _cross(gyx, gyy, gyz, rx, ry, rz)
    gxx += c0
    gxy += c1
    gxz += c2
    # x = u / |u|
    gx_x = gxx * xx + gxy * xy + gxz * xz
    gux = (gxx - gx_x * xx) / nu
    guy = (gxy - gx_x * xy) / nu
    guz = (gxz - gx_x * xz) / nu
    # u = h - (h . r) r, the helper h a constant
    hr = hx * rx + hy * ry + hz * rz
    gu_r = gux * rx + guy * ry + guz * rz
    grx += -gu_r * hx - hr * gux
    gry += -gu_r * hy - hr * guy
    grz += -gu_r * hz - hr * guz
    # r = v / |v|
    gr_r = grx * rx + gry * ry + grz * rz
    tl.store(gv_ptr + e * 3, (grx - gr_r * rx) / nv, mask=e_mask)
    tl.store(gv_ptr + e * 3 + 1, (gry - gr_r * ry) / nv, mask=e_mask)
    tl.store(gv_ptr + e * 3 + 2, (grz - gr_r * rz) / nv, mask=e_mask)
