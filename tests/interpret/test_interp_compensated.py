"""Level 3 through the interpreter: the compensated split-fp16 GEMMs meet the float64
contract (2e-6) on partial tiles and extreme scales, engage only with a validated
table entry, and the sweep's real probe validates them against float64.

The interpreter multiplies fp16 operands exactly in fp32 (``np.matmul`` with an
fp32 result), as tensor cores do, so errors measured here are the split's own.
"""

import helpers
import pytest
import torch
from helpers import Case

import mixstack
from mixstack import tuning
from mixstack.core.layout import StackLayout
from mixstack.stack import gemm, launchers
from mixstack.stack.values import Saved, Weights
from mixstack.tuner.probes import StackProbe
from mixstack.tuner.sweep import contract_difference
from mixstack.tuning.families import CONTRACT

COMP = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}


def _key(case: Case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F,
                            apply_alpha=case.apply_alpha)


def _run(case, level, inputs, grad_out, cfg=COMP):
    with tuning.registration("stack_compensated", _key(case), cfg):
        return helpers.run_stack(case, level, inputs, grad_out)


# Every launch is interpreted, and COMP's 16 x 32 tiles make a level-3 run the suite's dearest (one
# at E = 129 took about as long as the rest of this file): edge counts just past the tiles they cut.
CASES = [
    Case(F=2, E=37, Cf=32, lmax=3, n_layers=3),       # partial tiles of 16 (3 of them), 32 (2) and 64 rows
    Case(F=1, E=1, Cf=16, lmax=1, n_layers=2),
    Case(F=1, E=70, Cf=64, lmax=2, n_layers=2, apply_alpha=False),   # the 64-row tiles of Cf 64: 2, one partial
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=helpers.case_id)
def test_level3_with_a_validated_entry_runs_compensated_within_the_contract(case):
    inputs, grad_out = helpers.make_inputs(case, 0), helpers.make_grad_out(case, 1)
    got = _run(case, 3, inputs, grad_out)
    assert got["log"] == {"fwd:compensated": 1, "bwd:compensated": 1}
    out64, grads64 = helpers.reference64(case, inputs, grad_out)
    assert helpers.rel_err(got["out"], out64) <= CONTRACT
    for name, want in grads64.items():
        assert helpers.rel_err(got[f"grad_{name}"], want) <= CONTRACT, name


@pytest.mark.slow
def test_level3_without_an_entry_runs_level2_and_says_so():
    case = CASES[0]
    inputs, grad_out = helpers.make_inputs(case, 0), helpers.make_grad_out(case, 1)
    level2 = _run(case, 2, inputs, grad_out)                     # an entry does nothing below level 3
    level3 = _run(case, 3, inputs, grad_out, cfg=None)           # measured: level 2 wins
    assert level2["log"] == {"fwd:triton": 1, "bwd:relay": 1}
    assert level3["log"] == {"fwd:triton": 1, "bwd:relay": 1, "level3:level2": 2}   # says so
    assert all(torch.equal(level2[k], level3[k]) for k in level2 if k != "log")


def _block_gemm(a, w0, w1, layout, split):
    """``a @ blockdiag(w0[0], w1[0])`` through the stack's GEMM kernel, one focus stream."""
    out = torch.empty_like(a)
    gemm.block_gemm(gemm.Operand(a), gemm.BlockWeights(w0, w1, 0, layout, split=split), gemm.Epilogue(out=out),
                    {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1})
    return out


def _block_gemm64(a, w0, w1, layout):
    m0 = layout.m0
    a = a.double()
    return torch.cat((a[..., :m0] @ w0[0].double(), a[..., m0:] @ w1[0].double()), -1)


@pytest.mark.parametrize("a_scale, w_scale", [(1e-6, 1.0), (1e4, 1.0), (1.0, 1e-6), (1.0, 1e4), (1e-6, 1e4)])
def test_the_compensated_gemm_keeps_the_contract_at_extreme_scales(a_scale, w_scale):
    layout = StackLayout(2, 16)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(1, 37, layout.row, generator=g) * a_scale
    a[0, 5] *= 1e3                                              # rows of different sizes
    a[0, 6] *= 1e-3
    w0 = torch.randn(1, 1, layout.m0, layout.m0, generator=g) * w_scale
    w1 = torch.randn(1, 1, layout.m1, layout.m1, generator=g) * w_scale
    got = _block_gemm(a, w0, w1, layout, launchers.split_weights(w0, w1))
    want = _block_gemm64(a, w0, w1, layout)
    row_err = ((got.double() - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
    assert row_err <= CONTRACT, row_err
    assert helpers.rel_err(got, want) <= CONTRACT


def test_the_split_weights_are_a_scaled_head_and_tail():
    w = torch.tensor([[3.0e-7, -1.0e-7], [2.5e-7, 1.2345678e-7]]).view(1, 1, 2, 2)
    hi, lo, _, _, up = launchers.split_weights(w, w)
    assert hi.dtype == lo.dtype == torch.float16
    assert up[0, 0, 0].item() == 2.0 ** -22                     # 3e-7 lies in [2^-22, 2^-21)
    back = (hi.double() + lo.double() / 2048) * up[0, 0, 0].double()
    assert ((back - w.double()).abs() / w.double().abs()).max().item() < 2.0 ** -21
    assert lo.abs().max().item() > 0                            # the tail is kept


def test_nan_in_one_edge_stays_in_that_edge_at_level3():
    case = Case(F=1, E=40, Cf=16, lmax=1, n_layers=2)
    inputs, grad_out = helpers.make_inputs(case, 0), helpers.make_grad_out(case, 1)
    inputs = list(inputs)
    inputs[0] = inputs[0].clone()
    inputs[0][0, 7, 3] = float("nan")
    got = _run(case, 3, inputs, grad_out)
    bad = torch.isnan(got["out"]).any(dim=(1, 2))
    assert bad[7] and int(bad.sum()) == 1


@pytest.mark.slow
def test_the_probe_validates_compensated_candidates_against_float64():
    key = tuning.shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True)
    probe = StackProbe("stack_compensated", key, edges=65, partial_edges=33)    # small sets: interpreted
    ref = probe.reference64()
    assert all(t.dtype == torch.float64 for t in ref)
    assert len(ref) == 3 * 4                                    # partial, 1 edge, 129 edges, timing set
    with tuning.saved_registrations(), mixstack.use_level(3):
        cand, counts = probe.run(COMP)
    assert counts["fwd:compensated"] == 4 and counts["bwd:compensated"] == 4
    assert contract_difference(ref, cand, scales=probe.scales64(), names=probe.output_names()) is None
    broken = list(cand)
    broken[1] = broken[1] * (1 + 1e-5)
    assert "above the contract" in contract_difference(ref, tuple(broken))


@pytest.mark.parametrize("family, apply_alpha, per_set", [("stack_compensated", True, 3),
                                                        ("stack_compensated", False, 3),
                                                        ("stack_wgrad_compensated", True, 6)])
def test_the_probe_judges_each_grad_alpha_by_its_sum_s_scale(family, apply_alpha, per_set):
    key = tuning.shape_key(focus_dim=16, lmax=1, n_focus=2, apply_alpha=apply_alpha)
    probe = StackProbe(family, key, edges=65, partial_edges=33)       # no kernel runs: float64 only
    ref, scales, names = probe.reference64(), probe.scales64(), probe.output_names()
    assert len(ref) == len(scales) == len(names) == 4 * per_set     # partial, 1 edge, 129 edges, timing set
    assert names[per_set + 2] == "1 edges: grad_alpha"
    for i, (inp, scale) in enumerate(zip(probe._sets(), scales[2::per_set])):
        assert all(s is None for j, s in enumerate(scales[i * per_set:(i + 1) * per_set]) if j != 2)
        if not apply_alpha:
            assert scale is None
            continue
        out64, alpha64 = ref[i * per_set], inp.alpha.double()
        y64 = out64 / alpha64.unsqueeze(-1)                          # the result before alpha
        want = (inp.grad_out.double() * y64).abs().sum(-1)
        assert scale.dtype == torch.float64 and torch.allclose(scale, want, rtol=1e-12, atol=0)
        assert bool((ref[i * per_set + 2].abs() <= scale).all())       # a sum is at most its terms' sum


# partial tiles at every block size COMP and FUSED_CFG use; small, since every launch is interpreted
WRITER_CASES = [Case(F=2, E=37, Cf=32, lmax=2, n_layers=3), Case(F=1, E=1, Cf=48, lmax=1, n_layers=2)]


@pytest.mark.parametrize("case", WRITER_CASES, ids=helpers.case_id)
def test_the_writers_record_exactly_the_row_maxima_of_what_they_wrote(case):
    """The gate kernel (m = 0 columns of the next layer input), the |m| = 1 GEMM's
    epilogue (the rest, several N tiles per row through an atomic max) and the
    pointwise backward (both blocks of gz) each record, per row and block, the
    largest magnitude they stored."""
    lay, m0 = case.layout, case.layout.m0
    u0, alpha, w0, w1, gw = helpers.make_inputs(case, 0)
    _, z, _ = launchers.stack_forward(u0, alpha, Weights(w0, w1, gw), case.spec)
    sg = u0.new_empty((case.F, case.E, lay.gate_width))
    u_next = torch.full_like(u0, float("nan"))
    amax = torch.zeros(case.F, case.E, 2)
    launchers.gate(z, gw, 0, sg, case.E, case.F, lay, u=u0, u_next=u_next, amax=amax)
    gemm.block_gemm(gemm.Operand(u0), gemm.BlockWeights(w0, w1, 0, lay, (1,), launchers.split_weights(w0, w1)),
                    gemm.Epilogue(z=torch.empty_like(z), sg=sg, res=u0, out=u_next, amax_out=amax), COMP)
    assert torch.equal(amax[..., 0], u_next[..., :m0].abs().amax(-1))
    assert torch.equal(amax[..., 1], u_next[..., m0:].abs().amax(-1))

    h = torch.randn(case.F, case.E, lay.row)
    gz = torch.full_like(h, float("nan"))
    amax.fill_(-1.0)
    w0t, w1t = (w.transpose(-1, -2).contiguous() for w in (w0, w1))
    launchers.relay_gz(h, z, gw, 0, lay, sg, gz, amax=amax)
    assert torch.equal(amax[..., 0], gz[..., :m0].abs().amax(-1))
    assert torch.equal(amax[..., 1], gz[..., m0:].abs().amax(-1))


@pytest.mark.slow
def test_the_alpha_gradient_records_the_row_maxima_of_the_scaled_incoming_gradient():
    """The backward's first compensated GEMM reads ``g * alpha`` (edge-major, here a
    broadcast over the focus streams); the alpha-gradient kernel, which reads every
    row of ``g`` anyway, records its per-block maxima, focus-major."""
    case = Case(F=2, E=37, Cf=32, lmax=3, n_layers=2)     # partial tiles of the kernel's 32 rows and COMP's 16
    lay, m0 = case.layout, case.layout.m0
    inputs = helpers.make_inputs(case, 0)
    alpha = inputs[1]
    grad_out = torch.randn(case.E, lay.row)[:, None].expand(case.E, case.F, lay.row)
    seen = {}
    real_gemm = launchers.block_gemm

    def spy(a, weights, epilogue, config=None):
        if a.edge_major and a.amax is not None:
            seen["amax"] = a.amax.clone()
        return real_gemm(a, weights, epilogue, config)

    weights = Weights(*inputs[2:])
    _, z, y = launchers.stack_forward(inputs[0], alpha, weights, case.spec)
    try:
        launchers.block_gemm = spy
        launchers.stack_backward(grad_out, Saved(z, y, alpha), weights, case.spec, launchers.LaunchPlan(COMP, compensated=True))
    finally:
        launchers.block_gemm = real_gemm
    scaled = (grad_out * alpha[:, :, None]).transpose(0, 1)          # (F, E, ROW), as the GEMM reads it
    assert torch.equal(seen["amax"][..., 0], scaled[..., :m0].abs().amax(-1))
    assert torch.equal(seen["amax"][..., 1], scaled[..., m0:].abs().amax(-1))


_LAUNCHED: dict = {}


def _launched_level3(case, writer_amax=True):
    """Level 3 through the launchers on COMP's tiles, the case's seeded inputs: the forward and the
    relay backward, ``(out, z, y, h, grad_alpha)``.  The default run (the writers' maxima), which
    two tests read, is computed once per case; ``writer_amax=False`` runs anew."""
    if writer_amax and case in _LAUNCHED:
        return _LAUNCHED[case]
    inputs = helpers.make_inputs(case, 0)
    grad_out = helpers.make_grad_out(case, 1)
    weights = Weights(*inputs[2:])
    plan = launchers.LaunchPlan(COMP, compensated=True, writer_amax=writer_amax)
    out, z, y = launchers.stack_forward(inputs[0], inputs[1], weights, case.spec, plan)
    h, grad_alpha = launchers.stack_backward(grad_out, Saved(z, y, inputs[1]), weights, case.spec, plan)
    if writer_amax:
        _LAUNCHED[case] = (out, z, y, h, grad_alpha)
    return out, z, y, h, grad_alpha


@pytest.mark.slow
@pytest.mark.parametrize("case", WRITER_CASES, ids=helpers.case_id)
def test_recorded_row_maxima_give_the_bits_of_the_kernels_own_pre_pass(case):
    """Level 3 with the writers' maxima and with every compensated GEMM finding them
    itself: the same values, hence the same scales and the same bits.  (Scales are
    powers of two, so a maximum off within fp16's range would give the same bits
    too: this holds the recorded path's plumbing; the test above holds the values.)"""
    for recorded, found in zip(_launched_level3(case), _launched_level3(case, writer_amax=False)):
        assert torch.equal(recorded, found)


FUSED_CASES = [WRITER_CASES[0], Case(F=1, E=1, Cf=16, lmax=1, n_layers=2),
               Case(F=1, E=70, Cf=64, lmax=2, n_layers=2, apply_alpha=False)]
FUSED_CFG = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}


@pytest.mark.slow
@pytest.mark.parametrize("case", FUSED_CASES, ids=helpers.case_id)
def test_the_compensated_fused_backward_meets_the_contract(case):
    """The fused backward's GEMM phase on split fp16 products, scaled by the row maxima
    its gate phase keeps in registers: within the float64 contract on partial tiles,
    like the compensated relay."""
    inputs = helpers.make_inputs(case, 0)
    grad_out = helpers.make_grad_out(case, 1)
    weights = Weights(*inputs[2:])
    _, z, y, relay, _ = _launched_level3(case)          # the compensated forward and relay backward
    plan = launchers.LaunchPlan(COMP, FUSED_CFG, compensated=True)
    got = {"relay": relay, "fused": launchers.stack_backward(grad_out, Saved(z, y, inputs[1]), weights, case.spec,
                                                             plan)[0]}
    _, grads64 = helpers.reference64(case, inputs, grad_out)
    want = grads64["u0"]
    assert helpers.rel_err(got["fused"], want) <= CONTRACT
    # the same gz and the same maxima as the compensated relay: results agree to the split's rounding
    assert helpers.rel_err(got["fused"], got["relay"].double()) <= CONTRACT


@pytest.mark.parametrize("s_scale, gw_scale, h_scale", [(1e4, 1e-4, 1.0), (1e-4, 1e4, 1e-6), (1.0, 1.0, 1e4)])
def test_the_gates_products_at_level3_keep_the_contract_at_extreme_scales(s_scale, gw_scale, h_scale):
    """The gate's logits ``s @ gw`` (forward gate and backward recompute) and the pointwise
    kernel's contraction ``gl @ gw^T`` run as split fp16 products at level 3: the sigmoids
    and the scalar columns of ``gz`` stay within the contract against float64, with ``s``
    and ``gw`` far outside fp16's range (logits of order one) and a tiny or huge ``h``."""
    lay, n_focus, n_edges = StackLayout(2, 16), 1, 37
    cf, m0, g = lay.focus_dim, lay.m0, lay.gate_width
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(1, n_focus, n_edges, lay.row, generator=gen)
    z[..., :cf] *= s_scale
    z[0, 0, 5, :cf] *= 8.0                                      # rows of different sizes
    gw = torch.randn(1, n_focus, cf, g, generator=gen) * gw_scale / cf ** 0.5
    h = torch.randn(n_focus, n_edges, lay.row, generator=gen) * h_scale
    sg = torch.empty(n_focus, n_edges, g)
    launchers.gate(z, gw, 0, sg, n_edges, n_focus, lay, gate_split=launchers.split_matrices(gw))
    s64, gw64 = z[0, ..., :cf].double(), gw[0].double()
    sg64 = torch.sigmoid(s64 @ gw64)
    assert helpers.rel_err(sg, sg64) <= CONTRACT

    gz = torch.full_like(h, float("nan"))
    launchers.relay_gz(h, z, gw, 0, lay, sg, gz, gate_split=launchers.split_matrices(gw))
    h64, z64, sgk = h.double(), z[0].double(), sg.double()    # the kernel's sigmoids: the contraction alone
    gsg = (h64[..., cf:m0] * z64[..., cf:m0] + h64[..., m0:m0 + g] * z64[..., m0:m0 + g]
           + h64[..., m0 + g:] * z64[..., m0 + g:])
    gl = gsg * sgk * (1 - sgk)
    s0 = torch.sigmoid(s64)
    want = h64[..., :cf] * s0 * (1 + s64 * (1 - s0)) + gl @ gw64.transpose(-1, -2)
    assert helpers.rel_err(gz[..., :cf], want) <= CONTRACT
    assert torch.equal(gz[..., cf:m0], h[..., cf:m0] * sg)     # the gated columns: one fp32 product
