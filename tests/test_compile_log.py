"""``measure.compile_log``: what Triton compiles and what it loads from its cache inside a block,
seen through Triton's compilation listener on an offline sm_90 compile (no GPU needed)."""

import pytest

from mixstack import tuning
from mixstack.measure import compiler_report
from mixstack.measure.compile_log import compile_log

pytestmark = pytest.mark.skipif(not compiler_report.tools_available(), reason="needs Triton's bundled ptxas")


def test_a_compile_then_a_cache_hit_are_told_apart_and_the_previous_listener_still_hears_both(
        tmp_path, monkeypatch):
    from triton import knobs
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    heard = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: heard.append(kw["cache_hit"]))
    layout = tuning.shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True).layout
    launch = next(la for la in compiler_report.distinct(compiler_report.stack_launches(layout, 1))
                  if la.name == "gate_kernel")
    with compile_log() as log:
        compiler_report.compile_report(launch, sass=False)
        compiler_report.compile_report(launch, sass=False)
    assert [n for n, _ in log.compiled] == ["gate_kernel"] and log.loaded == ["gate_kernel"]
    assert log.compiled[0][1] > 0 and log.to_dict()["loaded"] == 1
    assert heard == [False, True]
    assert knobs.compilation.listener is not None and knobs.compilation.listener.__name__ == "<lambda>"
