"""The Gluon probe of level 3's block product (``scripts/gluon_gemm_probe.py``) builds for Hopper
without a GPU: the compiler's own report of what it made (the GPU run measures it)."""

import pytest
from helpers import load_script

from mixstack.measure import compiler_report

pytestmark = pytest.mark.skipif(not compiler_report.tools_available(), reason="needs Triton's bundled ptxas")


def test_the_gluon_kernel_builds_for_sm90_with_its_partitions_tma_loads_and_warpgroup_mmas(monkeypatch):
    """One config (two MMA warpgroups, pipelined, persistent) at the |m| = 1 block: TMA loads, warpgroup
    MMAs, register reallocation between the partitions, the loader's warps added, no spills."""
    probe = load_script("gluon_gemm_probe")
    monkeypatch.setattr(probe, "BLOCKS", (192,))
    monkeypatch.setattr(probe, "CONFIGS", ((128, 64, 32, 4, 8, 1, 1),))
    (row,) = probe.offline(90)
    assert "error" not in row, row
    assert row["spill_bytes"] == 0 and row["warps"] > 8
    assert row["wgmma"] > 0 and row["tma_loads"] > 0 and row["setmaxnreg"] > 0
    assert row["shared_bytes"] >= 4 * (128 * 32 * 4 + 2 * 32 * 64 * 2)      # the ring of four slots
