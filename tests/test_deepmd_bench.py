"""``mixstack bench deepmd`` runs on a CPU at a tiny size and writes its results."""

from __future__ import annotations

import json

import pytest
from deepmd_cases import one_torch_thread, require_deepmd  # noqa: F401

from mixstack.bench import deepmd_bench as bench
from mixstack.cli import main

require_deepmd()


def test_the_bench_writes_json_markdown_and_csv_with_two_variants(tmp_path):
    assert main(["bench", "deepmd", "--atoms", "6", "--configs", "water", "--systems", "water", "--variants",
                 "dp0,ms0", "--rcut", "3.0", "--rounds", "2", "--warmup", "1", "--breakdown", "--breakdown-rounds", "1",
                 "--md-steps", "2", "--md-warmup", "1", "--device", "cpu", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "deepmd_bench.json").read_text())
    (case,) = record["cases"]
    assert (case["config"], case["system"], case["atoms"]) == ("water", "water", 6)
    dp0, ms0 = case["variants"]["dp0"], case["variants"]["ms0"]
    assert dp0["accelerated"] is None and ms0["accelerated"] == ["mixstack", "mixstack"]
    for v in (dp0, ms0):
        assert len(v["time"]["samples_ms"]) == 2 and v["time"]["median_ms"] > 0
        assert v["accuracy"]["force_max_abs"] < 1e-4 and v["accuracy"]["force_rel"] < 1e-4
        stages = v["breakdown"]["stages"]
        assert stages["value_path"]["forward_ms"] > 0 and stages["value_path"]["backward_ms"] > 0
    for v, accelerated in ((dp0, None), (ms0, ["mixstack", "mixstack"])):           # NVE through deepmd's ASE calculator
        md = v["md"]
        assert md["steps"] == 2 and md["atoms"] == 6 and md["steps_per_s"] > 0 and md["accelerated"] == accelerated
        assert md["ns_per_day"] == pytest.approx(md["steps_per_s"] * 0.5 * 86400 / 1e6)
    assert dp0["breakdown"]["stages"]["wigner"]["forward_ms"] > 0                      # deepmd builds them
    assert ms0["breakdown"]["stages"]["wigner"] == {"forward_ms": 0.0, "backward_ms": 0.0}  # mixstack skips them
    assert record["env"]["deepmd_kit"] and record["command"].startswith("mixstack bench deepmd --atoms 6")
    markdown = (tmp_path / "deepmd_bench.md").read_text()
    assert "| water | water | 6 | ms0 |" in markdown and "| wigner | value path | rest of convolution |" in markdown
    assert markdown.count("| water | water | 6 | ms0 |") == 2                         # the frame row, the stage row
    assert (tmp_path / "deepmd_bench.csv").read_text().count("\n") == 3


@pytest.mark.parametrize("key, parsed", [("dp0", ("dp", 0, False)), ("ms3g", ("ms", 3, True))])
def test_variant_names(key, parsed):
    assert bench.parse_variant(key) == parsed


@pytest.mark.parametrize("key", ["ms4", "xx2", "dp", "ms2gg"])
def test_a_bad_variant_is_named(key):
    with pytest.raises(ValueError, match=repr(key)):
        bench.parse_variant(key)
