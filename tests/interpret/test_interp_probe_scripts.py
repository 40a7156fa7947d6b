"""The GPU probe of level 3's K loop (``scripts/probe_compensated.py``) computes what its
modes claim: the probe's conclusions (BENCHMARKS.md) rest on the modes differing only
in where the row scales come from."""

import importlib.util
import pathlib

from mixstack.tuning.families import CONTRACT

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "probe_compensated.py"


def _probe():
    spec = importlib.util.spec_from_file_location("probe_compensated", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_probe_modes_are_the_split_gemm_with_the_scales_from_different_places():
    probe = _probe()
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

