"""The Triton twin of the Gluon probe's compensated block product (``scripts/gluon_gemm_probe.py``):
the arithmetic the GPU run holds the Gluon kernel to, here in the interpreter against float64."""

import pytest
from helpers import load_script


@pytest.mark.parametrize("k", [128, 192])
def test_the_twin_meets_the_level3_contract_at_a_partial_row_tile(k):
    """67 rows (a partial tile), every seventh row at 1e-3 of the others: within 2e-6 of float64,
    and a tail dropped from the products (the head alone) is far outside it."""
    probe = load_script("gluon_gemm_probe")
    a, w, amax, w_hi, w_lo, w_up = probe.operands(67, k, "cpu")
    assert probe.error(probe.run_twin(a, w_hi, w_lo, amax, w_up), a, w) < 2e-6
    assert probe.error(probe.run_twin(a, w_hi, w_lo.zero_(), amax, w_up), a, w) > 1e-5


@pytest.mark.parametrize("k", [128, 192])
def test_the_chain_twin_keeps_each_layer_within_the_level3_contract(k):
    """Design B's product probe (``scripts/gluon_chain_probe.py``): three layers on 67 rows, each
    layer's rows rescaled from the last one's output, within 2e-6 a layer of float64; a chain that
    dropped the tails is far outside."""
    chain = load_script("gluon_chain_probe")
    a, ws, w_hi, w_lo, w_up = chain.operands(67, k, 3, "cpu")
    assert chain.error(chain.run_twin(a, w_hi, w_lo, w_up, chain.CONFIGS[0]), a, ws) < 3 * 2e-6
    assert chain.error(chain.run_twin(a, w_hi, w_lo.zero_(), w_up, chain.CONFIGS[0]), a, ws) > 1e-5
    assert chain.fits(chain.CONFIGS[0], k) and not chain.fits((128, 64, 64, 3, 8), 192)   # 227 KB an SM


def test_design_b_forwards_twin_is_level_3s_forward_to_float32_rounding():
    """Design B's forward probe (``scripts/gluon_forward_probe.py``): its twin (both blocks' compensated
    products, the gate's sigmoids, SiLU and gated residuals, the identity layer's ``y`` and ``alpha * y``)
    against the float64 stack (``mixstack.stack.reference.forward_state``) at S1's row, two focus
    streams, 67 edges: every output within float32 rounding; the gate's columns in another order, or
    the weights' tails dropped, are far outside."""
    probe = load_script("gluon_forward_probe")
    ins = probe.operands(67, 3, 32, 2, 4, "cpu")
    ref = probe.reference(ins)
    err = probe.errors(probe.run_twin(ins, probe.CONFIGS[0]), ref)
    assert set(err) == {"result", "z", "y"} and max(err.values()) < 5e-7, err
    wrong_gate = dict(ins, gw=ins["gw"].flip(-1).contiguous())
    assert probe.errors(probe.run_twin(wrong_gate, probe.CONFIGS[0]), ref)["result"] > 1e-3
    no_tails = dict(ins, w0lo=ins["w0lo"].zero_(), w1lo=ins["w1lo"].clone().zero_())
    assert probe.errors(probe.run_twin(no_tails, probe.CONFIGS[0]), ref)["z"] > 1e-5
