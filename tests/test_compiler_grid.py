"""No collapses over the whole supported grid: the committed compiler report of every gate-kernel
launch at every (Cf, lmax) (F 1, exact and compensated, the default configs and every config of the
shipped H200 table) holds for the current kernels and launch configs, keeps the bound, and is
honest (a few keys, the worst known among them, compiled again here).

Regenerate the report with ``PYTHONPATH=. python scripts/compiler_grid.py`` after a change to a
kernel or a launch config; this test says when it is needed."""

import json
import os

import pytest

from mixstack.core import config
from mixstack.measure import compiler_report as cr
from mixstack.tuning import validity

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SNAPSHOT = os.path.join(ROOT, "tests", "data", "compiler_grid_sm90.json")
REGENERATE = "regenerate it: PYTHONPATH=. python scripts/compiler_grid.py"


@pytest.fixture(scope="module")
def snapshot():
    with open(SNAPSHOT, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def cases():
    return cr.grid_cases(table_configs=cr.shipped_table_configs())


@pytest.fixture(scope="module")
def launches(cases):
    """Every case's launches, recorded once for both snapshots' launch hashes."""
    return [cr.case_launches(case) for case in cases]


def test_the_snapshot_is_of_the_current_kernels_and_launches(snapshot, cases, launches):
    roots = cr.launched_roots(cases, cr.GRID_KERNELS, launches=launches)
    assert roots == ["gate.gate_backward_kernel", "gate.gate_kernel"]
    assert snapshot["kernel_hash"] == validity.kernel_source_hash(roots=roots), f"a kernel changed since: {REGENERATE}"
    assert snapshot["launch_hash"] == cr.launch_set_hash(cases, cr.GRID_KERNELS, launches=launches), \
        f"a launch config or launcher changed since: {REGENERATE}"
    assert snapshot["kernels"] == sorted(cr.GRID_KERNELS)


def test_the_snapshot_covers_the_whole_grid(snapshot, cases):
    grid = {(c.focus_dim, c.lmax, c.compensated) for c in cases}
    assert len(grid) == len(cr.GRID_FOCUS_DIMS) * len(cr.GRID_LMAX) * 2
    listed = {(c["focus_dim"], c["lmax"], c["compensated"]) for c in snapshot["cases"]}
    assert listed == grid
    missing = {i for c in snapshot["cases"] for i in c["launches"]} - set(snapshot["reports"])
    assert not missing and len(snapshot["reports"]) > 200


def test_no_launch_in_the_grid_collapses_or_spills_past_the_bound(snapshot):
    bad = [(i, r["config"], r["flags"], cr.collapse_reason(r)) for i, r in snapshot["reports"].items()
           if cr.collapse_reason(r)]
    assert not bad, bad[:10]
    assert snapshot["spill_bound"] == cr.SPILL_BOUND


def test_the_rule_flags_what_the_old_kernels_did():
    assert "fallback" in cr.collapse_reason({"registers": 32, "spill_bytes": 4584})     # Cf 128 lmax 1, before
    assert "above the bound" in cr.collapse_reason({"registers": 255, "spill_bytes": 392})  # Cf 64 pointwise
    assert cr.collapse_reason({"registers": 255, "spill_bytes": 72}) is None            # a shipped winner's GEMM
    assert cr.collapse_reason({"registers": 48, "spill_bytes": 8}) is None              # a local slot


# The worst keys before the chunked gate products (BENCHMARKS.md, "No cliffs"): Cf 128 at lmax 1,
# where every gate kernel fell back to 32 registers, and the level-3 forward gate at Cf 96.
HONEST = [(128, 1, False), (128, 1, True), (96, 3, True), (64, 1, False)]


@pytest.mark.slow
@pytest.mark.skipif(not cr.tools_available(), reason="this Triton bundles no ptxas/cuobjdump/nvdisasm")
@pytest.mark.skipif(config.triton_interpret(), reason="compiles the kernels: run without TRITON_INTERPRET")
def test_the_snapshot_is_honest(snapshot, cases):
    import triton
    if triton.__version__ != snapshot["triton"]:
        pytest.skip(f"the snapshot was compiled by Triton {snapshot['triton']}, this is {triton.__version__}")
    picked = {}
    for c in cases:                                   # the gate launches do not depend on the GEMM config
        picked.setdefault((c.focus_dim, c.lmax, c.compensated), c)
    picked = [picked[h] for h in HONEST]
    seen = 0
    for case in picked:
        launches = cr.case_launches(case, kernels=cr.GRID_KERNELS)
        for launch in launches:
            if launch.name == "gate_kernel" and not launch.kwargs.get("WRITE_U") and case.focus_dim != 128:
                continue                                  # the recompute: keep the test short
            got = cr.compile_report(launch, 90, sass=False)
            want = snapshot["reports"][cr.launch_identity(launch)]
            assert (got.registers, got.spill_bytes) == (want["registers"], want["spill_bytes"]), case.label()
            seen += 1
    assert seen >= 8


# Every kernel's launches, not only the gate's (``scripts/compiler_grid.py --all``, ~7 minutes
# here with Triton's cache warm, about an hour cold on two cores).
ALL_SNAPSHOT = os.path.join(ROOT, "tests", "data", "compiler_grid_sm90_all.json")
REGENERATE_ALL = ("regenerate it: PYTHONPATH=. python scripts/compiler_grid.py --all "
                  "--out tests/data/compiler_grid_sm90_all.json")
# The two launches over the bound: the level-3 identity-layer GEMM at Cf 64, lmax 1 with a 128-wide
# N tile (136 bytes at 4 stages, 160 at 3). The policy's rule takes M64 N64 w4 s3 there (spill-free),
# and the quick sweep's one candidate is the rule's; only a full sweep could pick them.
KNOWN_OVER_THE_BOUND = {(64, 1, True, 128, 4), (64, 1, True, 128, 3)}


@pytest.fixture(scope="module")
def all_snapshot():
    with open(ALL_SNAPSHOT, encoding="utf-8") as fh:
        return json.load(fh)


def test_the_every_kernel_snapshot_is_of_the_current_kernels_and_launches(all_snapshot, cases, launches):
    roots = cr.launched_roots(cases, None, launches=launches)
    assert all_snapshot["kernel_hash"] == validity.kernel_source_hash(roots=roots), \
        f"a kernel changed since: {REGENERATE_ALL}"
    assert all_snapshot["launch_hash"] == cr.launch_set_hash(cases, None, launches=launches), \
        f"a launch config or launcher changed since: {REGENERATE_ALL}"
    assert all_snapshot["kernels"] == "all" and len(all_snapshot["reports"]) > 1500


def test_no_launch_of_any_kernel_breaks_the_bound_but_two_the_policy_never_runs(all_snapshot):
    from mixstack.tuning import shape_key
    from mixstack.tuning.policy import rule_config
    bad = {i for i, r in all_snapshot["reports"].items() if cr.collapse_reason(r)}
    where = {(c["focus_dim"], c["lmax"], c["compensated"], dict(c["config"] or {}).get("BLOCK_N"),
              dict(c["config"] or {}).get("num_stages")) for c in all_snapshot["cases"] if bad & set(c["launches"])}
    assert where == KNOWN_OVER_THE_BOUND, where
    rule = rule_config(shape_key(focus_dim=64, lmax=1, n_focus=1, apply_alpha=True))
    assert rule["BLOCK_N"] == 64
    assert not any(r["registers"] <= cr.FALLBACK_REGISTERS and r["spill_bytes"] > 64
                   for r in all_snapshot["reports"].values())                  # no register fallback anywhere
