"""The offline resource report: the launches it records are the launchers' own, and the
level-1 launch configs compile for sm_90 (the H100/H200) without spills beyond an 8-byte slot
(``configs.gate_config``; the whole grid: tests/test_compiler_grid.py)."""

import pytest
import torch

from mixstack.core import config
from mixstack.core.layout import StackLayout
from mixstack.measure import compiler_report
from mixstack.stack import gemm, launchers

needs_tools = pytest.mark.skipif(not compiler_report.tools_available(),
                                 reason="this Triton bundles no ptxas/cuobjdump/nvdisasm")
not_interpreted = pytest.mark.skipif(config.triton_interpret(),
                                     reason="compiles the kernels: run without TRITON_INTERPRET")


def _names(launches):
    return [x.name for x in launches]


def test_the_relay_path_records_every_launch_without_computing_anything():
    lay = StackLayout(3, 32)
    launches = compiler_report.stack_launches(lay, 2, True, n_layers=4, edges=1000)
    names = _names(launches)
    # forward: per gated layer m0 GEMM, gate, m1 GEMM; then the identity layer
    assert names[:10] == ["block_gemm_kernel", "gate_kernel", "block_gemm_kernel"] * 3 + ["block_gemm_kernel"]
    # backward: alpha gradient, identity layer, then per gated layer (the gate recompute,
    # unless the pointwise kernel forms the sigmoids itself), pointwise, GEMM
    per_layer = ["gate_backward_kernel", "block_gemm_kernel"]
    if not launchers.pointwise_recomputes_gate(lay, compensated=False):
        per_layer.insert(0, "gate_kernel")
    assert names[10:] == ["alpha_grad_kernel", "block_gemm_kernel"] + per_layer * 3
    assert all(t.device.type == "meta" for x in launches for t in x.args if isinstance(t, torch.Tensor))
    assert launchers.wrap_triton is not None and launchers.wrap_triton.__module__.startswith("torch")   # restored


def test_the_fused_and_compensated_paths_record_their_kernels():
    lay = StackLayout(2, 16)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    fused = compiler_report.stack_launches(lay, 1, False, n_layers=3, edges=100, fused_cfg=cfg)
    segments = [x.kwargs["SEGMENT"] for x in fused if x.name == "fused_backward_kernel"]
    assert segments == [0, 1, 0, 1]
    assert "gate_backward_kernel" not in _names(fused)
    comp = compiler_report.stack_launches(lay, 1, False, n_layers=3, edges=100, gemm_cfg=cfg, compensated=True)
    # w0, w1 forward (the forward gate stays exact); w0^T, w1^T, gw backward
    assert _names(comp).count("split_weights_kernel") == 5
    assert all(x.kwargs["COMPENSATED"] for x in comp if x.name in ("block_gemm_kernel", "gate_backward_kernel"))
    gates = [x for x in comp if x.name == "gate_kernel"]
    assert gates and not any(x.kwargs["COMPENSATED"] for x in gates if x.kwargs["WRITE_U"])   # forward: exact
    assert all(x.kwargs["COMPENSATED"] for x in gates if not x.kwargs["WRITE_U"])    # backward recompute
    assert len(compiler_report.distinct(fused)) < len(fused)


def test_the_compensated_forward_zeroes_every_layers_row_maxima_in_one_launch():
    """Level 3's forward records each gated layer's row maxima into one zeroed buffer (one fill for
    the call, not one a layer), and each layer's GEMM gets its own slice of it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    lay = StackLayout(2, 16)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    meta = dict(device="meta", dtype=torch.float32)
    n_layers, edges = 4, 100
    u0, alpha = torch.empty((1, edges, lay.row), **meta), torch.empty((edges, 1), **meta)
    weights = launchers.Weights(torch.empty((n_layers, 1, lay.m0, lay.m0), **meta),
                                torch.empty((n_layers, 1, lay.m1, lay.m1), **meta),
                                torch.empty((n_layers - 1, 1, lay.focus_dim, lay.gate_width), **meta))
    with Ops() as ops:
        launches = compiler_report.record_launches(launchers.stack_forward, u0, alpha, weights,
                                                   launchers.StackSpec(lay, False),
                                                   launchers.LaunchPlan(cfg, compensated=True))
    fills = [n for n in ops.names if n.startswith(("zero", "fill", "zeros", "new_zeros"))]
    assert len(fills) == 1, ops.names
    maxima = [x.args[5] for x in launches if x.name == "gate_kernel"]           # each layer's amax pointer
    assert len(maxima) == n_layers - 1 and len({t.storage_offset() for t in maxima}) == n_layers - 1


@pytest.mark.slow
@needs_tools
@not_interpreted
@pytest.mark.parametrize("lmax, cf, n_focus", [(3, 32, 2), (3, 64, 1)], ids=["S1-key", "S4-key"])
def test_level_1_configs_compile_without_spills_for_sm90(lmax, cf, n_focus):
    launches = compiler_report.distinct(compiler_report.stack_launches(StackLayout(lmax, cf), n_focus, True))
    reports = [compiler_report.compile_report(x, 90) for x in launches]
    assert {r.name for r in reports} == {"block_gemm_kernel", "gate_kernel", "gate_backward_kernel",
                                         "alpha_grad_kernel"}
    for r in reports:
        assert 0 < r.registers <= 255 and r.programs_per_sm() >= 1, r
        # at most an 8-byte local slot (the forward gate at Cf 64); the Cf-64 pointwise kernel at
        # 64 rows x 4 warps spilled 392 B before its products were chunked (configs.gate_chunk)
        assert r.spill_bytes <= 8 and compiler_report.collapse_reason(vars(r)) is None, r
    gemm = [r for r in reports if r.name == "block_gemm_kernel"]
    # exact fp32: FMA dots, no tensor-core instruction anywhere
    assert all(r.sass["FFMA"] >= 1024 and r.sass["HMMA"] == 0 for r in gemm)


@pytest.mark.slow
@needs_tools
@not_interpreted
@pytest.mark.parametrize("compensated", [False, True], ids=["exact", "level-3"])
@pytest.mark.parametrize("lmax, cf", [(1, 64), (2, 64), (2, 48)])
def test_the_gate_kernels_at_lmax_1_and_2_compile_without_spills_for_sm90(lmax, cf, compensated):
    # with whole Cf-wide gate products, 64 rows x 4 warps (32 in the forward) made ptxas
    # (Triton 3.6 and 3.7) fall back to 32 registers and a 3.6-9.6 KB stack frame here; with
    # the products in gate_chunk columns the same configs compile (F 2 here; F 1 over the
    # whole grid: tests/test_compiler_grid.py)
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3} if compensated else None
    launches = compiler_report.stack_launches(StackLayout(lmax, cf), 2, True, edges=1000, gemm_cfg=cfg,
                                        compensated=compensated)
    gates = [x for x in compiler_report.distinct(launches) if x.name.startswith("gate")]
    assert {x.name for x in gates} == {"gate_kernel", "gate_backward_kernel"}
    for launch_ in gates:
        r = compiler_report.compile_report(launch_, 90)
        assert r.registers > 32 and r.spill_bytes <= 64, (launch_.kwargs, r)


@needs_tools
@not_interpreted
def test_the_compensated_gemm_runs_on_tensor_cores():
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    launches = compiler_report.stack_launches(StackLayout(1, 16), 1, False, n_layers=2, edges=100, gemm_cfg=cfg,
                                        compensated=True)
    gemm = next(x for x in launches if x.name == "block_gemm_kernel")
    r = compiler_report.compile_report(gemm, 90)
    assert r.sass["HGMMA"] + r.sass["HMMA"] >= 3       # head, and the two tail products
    assert r.sass["FFMA"] < 1024 and r.spill_bytes == 0


def test_the_signature_types_tensors_ints_and_floats_as_triton_does():
    def kernel(x_ptr, n, one, scale, BLOCK):
        pass
    kernel.fn = kernel
    x = torch.empty(8, device="meta")
    launch_ = compiler_report.Launch(kernel, (x, 48, 1, 0.5), {"BLOCK": 16, "num_warps": 4})
    signature, constexprs, attrs = compiler_report.source_args(launch_)
    assert signature == {"x_ptr": "*fp32", "n": "i32", "one": "constexpr", "scale": "fp32", "BLOCK": "constexpr"}
    assert constexprs == {(2,): 1, (4,): 16}
    assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}


def test_the_convolution_records_its_four_kernels_and_the_source_order_segment_sum():
    launches = compiler_report.conv_launches(StackLayout(2, 16), 2, edges=1000, atoms=50)
    rotate_in = ["rotate_in_kernel", "rotate_in_grad_kernel", "segment_rotate_back_kernel"]
    assert _names(launches) == rotate_in * 2 + ["segment_rotate_back_kernel", "rotate_out_grad_kernel"]
    # the radial weights read, then made from a linear layer (32 hidden features, padded tiles)
    ins = [x for x in launches if x.name.startswith("rotate_in")]
    assert [x.kwargs.get("LINEAR", False) for x in ins] == [False, False, True, True]
    assert all(x.kwargs["BLOCK_E"] >= 16 and x.kwargs["CP"] >= 16 and x.kwargs["HP"] == 32 for x in ins[2:])
    segments = [x for x in launches if x.name == "segment_rotate_back_kernel"]
    assert [x.kwargs["INDIRECT"] for x in segments] == [True, True, False]   # rotate-in's backwards, rotate-out
    assert all(t.device.type == "meta" for x in launches for t in x.args if isinstance(t, torch.Tensor))


@pytest.mark.slow
@needs_tools
@not_interpreted
@pytest.mark.parametrize("lmax, cf", [(3, 32), (3, 64)])
def test_the_convolution_kernels_compile_without_spills_for_sm90(lmax, cf):
    """``configs.conv_config``'s claim: no spills at the S1 and S4 keys, but for the backward of
    rotate-in with a linear radial layer at C <= 32 on two warps (a few bytes, measured faster)."""
    for launch in compiler_report.distinct(compiler_report.conv_launches(StackLayout(lmax, cf), 2)):
        report = compiler_report.compile_report(launch)
        two_warps_grad = launch.name == "rotate_in_grad_kernel" and launch.kwargs["LINEAR"] and cf <= 32
        assert report.spill_bytes <= (32 if two_warps_grad else 0), (launch.name, report)
        assert report.registers <= 255


TRAINING_KERNELS = {"wgrad_kernel", "gate_wgrad_kernel", "tangent_kernel", "chunk_sum_kernel",
                    "layer_input_kernel"}


def test_the_training_launches_are_recorded_without_computing_anything():
    launches = compiler_report.training_launches(StackLayout(2, 16), 1, True, n_layers=3, edges=100)
    names = _names(launches)
    assert TRAINING_KERNELS <= set(names)
    # the double backward: per gated layer z_dot's GEMM, gz, the reductions, the tangent step
    assert names.count("tangent_kernel") == 2 and names.count("layer_input_kernel") == 2
    assert names.count("wgrad_kernel") == 2 * 3                  # both passes, every layer
    assert all(t.device.type == "meta" for x in launches for t in x.args if isinstance(t, torch.Tensor))


@needs_tools
@not_interpreted
@pytest.mark.slow
@pytest.mark.parametrize("lmax, cf, n_focus", [(3, 32, 2), (3, 64, 1)], ids=["S1-key", "S4-key"])
def test_the_training_kernels_compile_without_spills_for_sm90(lmax, cf, n_focus):
    launches = compiler_report.distinct(compiler_report.training_launches(StackLayout(lmax, cf), n_focus, True))
    reports = [compiler_report.compile_report(x, 90) for x in launches if x.name in TRAINING_KERNELS]
    assert {r.name for r in reports} == TRAINING_KERNELS
    for r in reports:
        assert 0 < r.registers <= 255 and r.spill_bytes == 0 and r.programs_per_sm() >= 1, r
    wgrad = [r for r in reports if r.name == "wgrad_kernel"]
    assert all(r.sass["FFMA"] >= 1024 and r.sass["HMMA"] + r.sass["HGMMA"] == 0 for r in wgrad)   # exact


@needs_tools
@not_interpreted
@pytest.mark.slow
def test_the_compensated_weight_reduction_runs_on_tensor_cores():
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    launches = compiler_report.training_launches(StackLayout(3, 32), 2, True, edges=1000, wgrad_cfg=cfg,
                                                 wgrad_compensated=True)
    wgrad = next(x for x in launches if x.name == "wgrad_kernel")
    r = compiler_report.compile_report(wgrad, 90)
    assert r.sass["HGMMA"] + r.sass["HMMA"] >= 3 and r.sass["FFMA"] < 1024 and r.spill_bytes == 0


TMA_OPCODES = ("HGMMA", "UTMALDG", "USETMAXREG")


@pytest.mark.slow
@needs_tools
@not_interpreted
@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
def test_every_tma_gemm_launch_builds_with_tma_loads_and_specialised_warps(persistent):
    """Level 3's TMA-fed GEMMs at S1's key, tiled and persistent, every use the stack makes of
    them: for sm_90 each
    compiles with TMA loads (``UTMALDG``), warpgroup MMAs and the warp groups' register split
    of warp specialisation (``USETMAXREG``), without spills.  An atomic in the kernel, or both
    blocks in one launch, made Triton's Hopper pass fail or decline; the pointer kernel is the
    control (no TMA, no specialisation)."""
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    lay = StackLayout(3, 32)
    tma = compiler_report.distinct(compiler_report.stack_launches(
        lay, 2, edges=300003, gemm_cfg=dict(cfg, **{gemm.TMA_FIELD: True, gemm.PERSISTENT_FIELD: persistent}),
        compensated=True))
    gemms = [x for x in tma if x.name == "tma_block_gemm_kernel"]
    assert "block_gemm_kernel" not in _names(tma) and "fold_tile_amax_kernel" in _names(tma)
    assert len(gemms) >= 8 and all(x.kwargs["FIRST_BLOCK"] in (0, 1) and x.kwargs["PERSISTENT"] == persistent
                                   and x.kwargs["SPECIALISE"] for x in gemms)
    for launch in gemms:
        rep = compiler_report.compile_report(launch, 90, opcodes=TMA_OPCODES)
        assert all(rep.sass[op] for op in TMA_OPCODES) and rep.spill_bytes == 0, (launch.kwargs, rep)
        assert rep.num_warps > 4                        # the specialised partitions' warps
    plain = next(x for x in compiler_report.stack_launches(
        lay, 2, edges=300003, compensated=True,
        gemm_cfg=dict(cfg, **{gemm.TMA_FIELD: True, gemm.PERSISTENT_FIELD: persistent, gemm.SPECIALISED_FIELD: False}))
        if x.name == "tma_block_gemm_kernel")
    rep = compiler_report.compile_report(plain, 90, opcodes=TMA_OPCODES)   # TMA loads, warps not specialised
    assert rep.sass["UTMALDG"] and rep.sass["HGMMA"] and not rep.sass["USETMAXREG"] and rep.num_warps == 4
    pointer = next(x for x in compiler_report.stack_launches(lay, 2, edges=300003, gemm_cfg=cfg, compensated=True)
                   if x.name == "block_gemm_kernel")
    rep = compiler_report.compile_report(pointer, 90, opcodes=TMA_OPCODES)
    assert rep.sass["HGMMA"] and not rep.sass["UTMALDG"] and not rep.sass["USETMAXREG"] and rep.num_warps == 4
