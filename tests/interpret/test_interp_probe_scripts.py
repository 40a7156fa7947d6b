"""The GPU probe of level 3's K loop (``scripts/probe_compensated.py``) computes what its
modes claim: the probe's conclusions (BENCHMARKS.md) rest on the modes differing only
in where the row scales come from."""

import importlib.util
import pathlib

from mixstack.tuning.families import CONTRACT

_SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def _script(name: str):
    """``scripts/<name>.py`` loaded as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, _SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_modes_are_the_split_gemm_with_the_scales_from_different_places():
    probe = _script("probe_compensated")
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    result = probe.probe_block(37, 64, cfg, rounds=1)           # 37 rows: a partial tile
    errors = {mode: r["rel_err"] for mode, r in result.items()}
    # every split form meets the level-3 contract, as the exact dot does
    for mode in ("prepass", "row-scale", "unscaled", "row-scale+amax", "exact"):
        assert errors[mode] <= CONTRACT, (mode, errors)
    # scales found in the kernel or handed in: the same scales, the same result
    assert errors["row-scale"] == errors["prepass"]
    # the head-only product is the fp16 ceiling, not a compensated result
    assert errors["head-only"] > 100 * CONTRACT
    assert all(r["median_ms"] > 0 for r in result.values())
    # the persistent launch computes the same tiles: every one written (outputs start NaN), same bits
    for mode in ("row-scale", "head-only"):
        persistent = result[f"{mode} persistent"]
        assert persistent["same_bits_as_tiled"] is True, mode
        assert persistent["rel_err"] == errors[mode]
        assert persistent["programs"] == 3              # fewer programs than the 3 x 2 tiles: they stride



def test_the_exact_ceiling_probe_times_exact_products_on_partial_tiles():
    probe = _script("probe_exact_ceiling")
    # K = N = 96 with 64-wide N tiles and 37 rows: partial tiles in both directions
    block = probe.time_block(96, 37, [(16, 64, 32, 4, 1), (32, 32, 32, 4, 1)], rounds=1, device="cpu")
    names = set(block["variants"])
    assert names == {"cublas", "M16 N64 K32 w4 s1", "M32 N32 K32 w4 s1"}, names
    for name, r in block["variants"].items():
        assert r["rel_err"] < 1e-6, (name, r)             # exact fp32 products, every column written
        assert r["median_ms"] > 0
    best = block["best_triton"]
    assert best != "cublas"
    assert all(block["variants"][best]["tflops"] >= r["tflops"]
               for n, r in block["variants"].items() if n != "cublas")


def test_the_exact_ceiling_bound_is_the_layers_gemm_flops_at_the_best_rates():
    probe = _script("probe_exact_ceiling")
    s4 = probe.shape_by_name("S4")                        # m0 = 256, m1 = 384, rows = 300003
    rows = s4.edges * s4.focus

    def block(k, tflops, cublas):
        return {"K": k, "rows": rows, "best_triton": "t",
                "variants": {"t": {"tflops": tflops}, "slow": {"tflops": tflops / 2}, "cublas": {"tflops": cublas}}}
    bounds = probe.lower_bounds([block(256, 40.0, 50.0), block(384, 20.0, 25.0)], ["S4"],
                                probe.parse_compile("S4=20"))
    (b,) = bounds
    gemm = lambda k, rate: 4 * 2 * rows * k * k / (rate * 1e12) * 1e3
    assert abs(b["gemm_bound_ms_triton_ieee"] - (gemm(256, 40.0) + gemm(384, 20.0))) < 1e-9
    assert abs(b["gemm_bound_ms_cublas"] - (gemm(256, 50.0) + gemm(384, 25.0))) < 1e-9
    assert b["target_ms"] == 0.65 * 20
    assert probe.blocks_of(["S1", "S3", "S4"]) == {(128, 600006): ["S1"], (192, 600006): ["S1"],
                                                   (128, 1292000): ["S3"], (192, 1292000): ["S3"],
                                                   (256, 300003): ["S4"], (384, 300003): ["S4"]}
