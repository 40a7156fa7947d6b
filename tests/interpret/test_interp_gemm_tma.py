"""Level 3's TMA-fed block GEMM (``kernels.gemm_tma``), tiled and persistent, through the
interpreter: the same bits as the pointer kernel it replaces, through the whole stack (forward and backward, every
GEMM use) and for one GEMM's row maxima, on partial tiles; engaged only by a
``stack_compensated_tma`` entry, with the dispatch log saying so.

The interpreter runs the descriptors' loads (zero-filled outside their shape, as the pointer
kernel's masks load) but not the warp specialisation, which changes only the schedule on a
GPU; the GPU tests hold the compiled kernel to these bits."""

import helpers
import pytest
import torch
from helpers import Case

from mixstack import tuning
from mixstack.core.layout import StackLayout
from mixstack.stack import gemm, launchers

TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}

CASES = [
    Case(F=2, E=37, Cf=16, lmax=1, n_layers=3),                   # every E tile count partial
    Case(F=1, E=37, Cf=16, lmax=2, n_layers=3),                   # block 0 (48 columns): a partial N tile
    Case(F=1, E=33, Cf=32, lmax=1, n_layers=2, apply_alpha=False),
]


def _key(case: Case):
    return tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)


def _launched(monkeypatch) -> list[str]:
    """The names of the kernels the launchers launch from now on (they still run)."""
    names = []
    for module in (launchers, gemm):
        real = module.wrap_triton

        def recording(kernel, real=real):
            names.append(kernel.fn.__name__)
            return real(kernel)
        monkeypatch.setattr(module, "wrap_triton", recording)
    return names


_POINTER: dict = {}


def _pointer_run(case, inputs, grad_out):
    """Level 3 on the pointer kernel (TILE registered), once per case: the tiled and the persistent
    TMA runs are each held to it."""
    if case not in _POINTER:
        _POINTER[case] = helpers.run_stack(case, 3, inputs, grad_out)
    return _POINTER[case]


@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
@pytest.mark.parametrize("case", [*CASES[:2], pytest.param(CASES[2], marks=pytest.mark.slow)],   # noalpha: full suite
                         ids=helpers.case_id)
def test_the_tma_gemms_give_the_pointer_kernels_bits_through_the_stack(case, persistent, monkeypatch):
    inputs, grad_out = helpers.make_inputs(case, 0), helpers.make_grad_out(case, 1)
    with tuning.registration("stack_compensated", _key(case), TILE):
        pointer = _pointer_run(case, inputs, grad_out)
        launched = _launched(monkeypatch)
        with tuning.registration("stack_compensated_tma", _key(case), dict(TILE, persistent=persistent, specialised=True)):
            tma = helpers.run_stack(case, 3, inputs, grad_out)
    assert pointer["log"] == {"fwd:compensated": 1, "bwd:compensated": 1}
    assert tma["log"] == {"fwd:compensated": 1, "bwd:compensated": 1, "level3:tma": 2}
    assert "tma_block_gemm_kernel" in launched and "block_gemm_kernel" not in launched
    assert "fold_tile_amax_kernel" in launched             # the forward's gated GEMMs record row maxima
    for name in pointer:
        if name != "log":
            assert torch.equal(pointer[name], tma[name]), name


@pytest.mark.parametrize("persistent", [False, True], ids=["tiled", "persistent"])
@pytest.mark.parametrize("blocks", [(0,), (1,), (0, 1)])
def test_the_folded_row_maxima_are_the_atomic_ones(blocks, persistent):
    """One GEMM with ``amax_out``: the TMA kernel's per-tile maxima, folded, equal the pointer
    kernel's atomic maxima, on top of maxima already there (the gate records block 0's)."""
    layout = StackLayout(2, 16)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(2, 41, layout.row, generator=g)
    w0 = torch.randn(1, 2, layout.m0, layout.m0, generator=g)
    w1 = torch.randn(1, 2, layout.m1, layout.m1, generator=g)
    split = launchers.split_weights(w0, w1)
    start = torch.rand(2, 41, 2, generator=g) * 4.0          # some rows' maxima already larger
    got = {}
    for tma in (False, True):
        out, amax = torch.zeros_like(a), start.clone()
        cfg = dict(TILE, **({gemm.TMA_FIELD: True, gemm.PERSISTENT_FIELD: persistent} if tma else {}))
        gemm.block_gemm(gemm.Operand(a), gemm.BlockWeights(w0, w1, 0, layout, blocks, split),
                        gemm.Epilogue(out=out, amax_out=amax), cfg)
        got[tma] = (out, amax)
    assert torch.equal(got[False][0], got[True][0]) and torch.equal(got[False][1], got[True][1])
    assert not torch.equal(got[True][1], start)                # the fold wrote something


def test_an_operand_a_descriptor_cannot_read_falls_back_to_pointer_loads(monkeypatch):
    """A caller's view that starts off a 16-byte boundary: the pointer kernel runs, same bits."""
    layout = StackLayout(1, 16)
    g = torch.Generator().manual_seed(7)
    base = torch.randn(1 * 9 * layout.row + 1, generator=g)
    a = base[1:].view(1, 9, layout.row)                        # starts 4 bytes in
    assert not gemm.tma_fits(gemm.Operand(a)) and gemm.tma_fits(gemm.Operand(a.clone()))
    w0 = torch.randn(1, 1, layout.m0, layout.m0, generator=g)
    w1 = torch.randn(1, 1, layout.m1, layout.m1, generator=g)
    split = launchers.split_weights(w0, w1)
    launched = _launched(monkeypatch)
    outs = []
    for cfg in (TILE, dict(TILE, **{gemm.TMA_FIELD: True})):
        out = torch.empty_like(a)
        gemm.block_gemm(gemm.Operand(a), gemm.BlockWeights(w0, w1, 0, layout, split=split), gemm.Epilogue(out=out),
                        cfg)
        outs.append(out)
    assert "tma_block_gemm_kernel" not in launched and torch.equal(outs[0], outs[1])


def test_the_stack_probe_finds_the_tma_bits_equal_and_names_a_planted_fault():
    """``scripts/tma_stack_probe.py``: every output equal for the tiled TMA form here (the
    interpreter neither pipelines nor specialises), and a planted non-finite value named with its
    edge row and E tile."""
    probe = helpers.load_script("tma_stack_probe")
    shape = probe.BenchShape("probe", 37, 2, 16, 1, 3, True)
    (entry,) = probe.probe(shape, torch.device("cpu"), quick=True, only="M64 N64 w4 s2")
    assert entry["tma_launches"] > 0 and entry["swept"]
    for name in probe.OUTPUTS:
        assert entry[name]["bits_equal"] and entry[name]["wrong_edges"] == 0, name
    ref = {"out": torch.zeros(100, 2, 8), "grad_u0": torch.zeros(2, 100, 8), "grad_alpha": torch.zeros(100, 2)}
    got = {k: v.clone() for k, v in ref.items()}
    got["grad_u0"][1, 70, 3] = float("nan")
    report = probe.compare(ref, got, 64, 6)
    assert report["grad_u0"] == {"nonfinite": 1, "max_abs": 0.0, "bits_equal": False, "wrong_edges": 1,
                                 "first": [(70, 1)]}
    assert report["out"]["bits_equal"] and report["grad_alpha"]["wrong_edges"] == 0
