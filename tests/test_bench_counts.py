"""Counted FLOPs and minimum bytes, against hand calculations."""

import pytest

from mixstack.measure import counts
from mixstack.measure.shapes import STANDARD, BenchShape

# E=10 F=2 Cf=16 lmax=1 n_layers=2: m0 = 32, m1 = 32, ROW = 64, G = 16, one gated layer.
TINY = BenchShape("tiny", edges=10, focus=2, focus_dim=16, lmax=1, layers=2)


def test_flops_of_a_tiny_shape_match_a_hand_calculation():
    # layer GEMMs: 2 * (32^2 + 32^2) = 4096; gate product: 2 * 16 * 16 = 512
    assert counts.flops_per_row(TINY, "fwd") == 4096 + 512 + 4096           # 8704
    assert counts.flops_per_row(TINY, "bwd") == 4096 + 4096 + 2 * 512       # 9216
    assert counts.flops(TINY, "fwd") == 8704 * 20
    assert counts.flops(TINY, "bwd") == 9216 * 20
    assert counts.flops(TINY, "both") == (8704 + 9216) * 20


def test_bytes_of_a_tiny_shape_match_a_hand_calculation():
    weights = 4 * (2 * 2 * (32 * 32 + 32 * 32) + 1 * 2 * 16 * 16)            # 34816
    assert counts.weight_bytes(TINY) == weights
    # fwd per (edge, focus): u0 64 + alpha 1 + result 64 + z 64 = 193 floats
    assert counts.min_bytes(TINY, "fwd") == 4 * 20 * 193 + weights            # 50256
    # bwd: grad_result 64 + result 64 + alpha 1 + z 64 + grad_u0 64 + grad_alpha 1 = 258
    assert counts.min_bytes(TINY, "bwd") == 4 * 20 * 258 + weights
    assert counts.min_bytes(TINY, "both") == 4 * 20 * (193 + 258) + 2 * weights


def test_bytes_without_alpha_drop_alpha_result_read_and_grad_alpha():
    shape = BenchShape("tiny", 10, 2, 16, 1, 2, apply_alpha=False)
    weights = counts.weight_bytes(shape)
    assert counts.min_bytes(shape, "fwd") == 4 * 20 * (64 + 64 + 64) + weights
    assert counts.min_bytes(shape, "bwd") == 4 * 20 * (64 + 64 + 64) + weights   # grad_result, z, grad_u0


def test_s1_counts_per_row():
    s1 = STANDARD["S1"]   # m0 = 128, m1 = 192: layer 106496, gate 6144, three gated layers
    assert counts.flops_per_row(s1, "fwd") == 3 * (106496 + 6144) + 106496
    assert counts.flops_per_row(s1, "bwd") == 106496 + 3 * (106496 + 2 * 6144)
    assert counts.flops(s1, "fwd") == counts.flops_per_row(s1, "fwd") * 300003 * 2


def test_unknown_pass_is_rejected():
    with pytest.raises(ValueError, match="pass"):
        counts.flops(TINY, "sideways")
    with pytest.raises(ValueError, match="pass"):
        counts.min_bytes(TINY, "forward")


def test_bench_shape_rejects_bad_sizes():
    with pytest.raises(ValueError, match="lmax"):
        BenchShape("x", 10, 1, 16, 7)
    with pytest.raises(ValueError, match="edges"):
        BenchShape("x", 0, 1, 16, 1)
