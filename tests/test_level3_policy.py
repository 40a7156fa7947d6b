"""Level 3 on untuned keys (``tuning.policy``, ``mixstack.stack.level3``) and the quick sweep: which keys
engage, which config, the first-use verdict kept and voided like a table entry, sweeps that still
measure such keys, and the quick sweep's pruned candidates and time budget.  No GPU: the
validation itself runs through the interpreter in tests/interpret/test_interp_level3.py."""

import json
import os

import pytest
from tuning_fakes import DEVICE, FakeProbe, entry_for, write_table

from mixstack import tuning
from mixstack.stack import level3
from mixstack.tuner import tune
from mixstack.tuning import families, policy, registry

pytestmark = pytest.mark.usefixtures("tuning_env")
COMP = "stack_compensated"
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results",
                       "2026-12-01-h200-tuning", "NVIDIA_H200.json")      # the last H200 table measured


def key(cf, lmax, f=1):
    return tuning.shape_key(focus_dim=cf, lmax=lmax, n_focus=f, apply_alpha=True)


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    policy.forget_verdicts()
    level3.forget()
    yield
    policy.forget_verdicts()
    level3.forget()


@pytest.mark.parametrize("cf, lmax, f, engages", [
    (32, 1, 1, False),      # the one swept key where level 3 lost (a 128-float row)
    (32, 1, 2, False),      # 1.04x: too close to call
    (32, 2, 1, True),       # 224 floats: 1.20x, the smallest clear win
    (64, 1, 2, True), (96, 3, 1, True), (128, 1, 4, True), (128, 6, 2, True),
    (16, 6, 1, False), (48, 4, 2, False), (80, 2, 1, False), (112, 6, 4, False),   # 16-wide K tiles: unsure
])
def test_the_rule_engages_inside_the_measured_region_only(cf, lmax, f, engages):
    d = policy.decide(key(cf, lmax, f), DEVICE)
    assert (d.config is not None) == engages, d
    assert d.source == ("rule" if engages else "unsure") and d.reason


def test_the_rule_names_the_winner_of_every_swept_key_up_to_ties():
    with open(SHIPPED) as fh:
        doc = json.load(fh)
    checked = 0
    for text, entry in doc["entries"][COMP].items():
        if entry["config"] is None:
            continue
        k = tuning.ShapeKey.parse(text)
        med = entry["medians_ms"]
        best = min(v for n, v in med.items() if n != "baseline")
        ours = med[families.label(policy.rule_config(k))]
        assert ours <= best * 1.004, (k, families.label(policy.rule_config(k)), ours, best)
        checked += 1
    assert checked == 16                   # the 17 swept keys less the one where level 3 lost


def test_a_grid_verdict_decides_instead_of_the_rule(tuning_env):
    path = policy.verdicts_path(DEVICE)
    verdicts = {str(key(16, 6)): {"speedup": 1.4}, str(key(64, 3)): {"speedup": 0.97}}
    with open(path, "w") as fh:
        json.dump({"device": DEVICE, "verdicts": verdicts}, fh)
    assert policy.decide(key(16, 6), DEVICE).config == policy.rule_config(key(16, 6))   # unsure by rule
    slow = policy.decide(key(64, 3), DEVICE)                                               # rule would engage
    assert slow.config is None and slow.source == "grid"
    assert policy.decide(key(32, 4), DEVICE).source == "rule"                              # not measured


def test_a_grid_verdict_engages_level3_only_at_2_percent_faster_than_level2(tuning_env):
    speedups = {key(32, 3): 1.019, key(32, 4): 1.021, key(16, 6): 1.0, key(112, 6): 1.03}
    with open(policy.verdicts_path(DEVICE), "w") as fh:
        json.dump({"device": DEVICE, "verdicts": {str(k): {"speedup": v} for k, v in speedups.items()}}, fh)
    engaged = {k for k in speedups if policy.decide(k, DEVICE).config is not None}
    assert engaged == {key(32, 4), key(112, 6)}
    assert all(policy.decide(k, DEVICE).source == "grid" for k in speedups)


def test_a_users_own_grid_verdicts_replace_the_shipped_ones_and_one_that_cannot_stand_does_not(tuning_env):
    """The cache's level3.json for the device first (a grid run on the user's GPU); one measured on
    another GPU, or unreadable, is reported and the shipped file decides."""
    with open(policy.verdicts_path(DEVICE), "w") as fh:
        json.dump({"device": DEVICE, "verdicts": {str(key(16, 6)): {"speedup": 1.4}}}, fh)
    mine = policy.user_verdicts_path(DEVICE)
    assert mine == str(tuning_env.user / os.path.basename(policy.verdicts_path(DEVICE)))
    os.makedirs(tuning_env.user, exist_ok=True)
    with open(mine, "w") as fh:
        json.dump({"device": DEVICE, "verdicts": {str(key(16, 6)): {"speedup": 0.9}}}, fh)
    assert policy.decide(key(16, 6), DEVICE).config is None                 # the user's measurement
    for text, why in ((json.dumps({"device": "NVIDIA A100-SXM4-80GB", "verdicts": {}}),
                       "was measured on NVIDIA A100-SXM4-80GB"), ("{not json", "cannot be read")):
        policy.forget_verdicts()
        with open(mine, "w") as fh:
            fh.write(text)
        with pytest.warns(Warning, match=why):
            d = policy.decide(key(16, 6), DEVICE)
        assert d.config == policy.rule_config(key(16, 6)) and d.source == "grid"   # the shipped one


def test_a_policy_entry_does_not_cover_a_key_for_the_sweep(tuning_env):
    write_table(tuning_env.user_file, {(COMP, key(32, 3)): entry_for(policy.M64_N64, family=COMP, source="policy")})
    registry.reload()
    assert tuning.lookup(COMP, key(32, 3), device_name=DEVICE) == policy.M64_N64
    assert not tuning.covered(COMP, key(32, 3), device_name=DEVICE)
    write_table(tuning_env.user_file, {(COMP, key(32, 3)): entry_for(policy.M64_N64, family=COMP)})
    registry.reload()
    assert tuning.covered(COMP, key(32, 3), device_name=DEVICE)


def test_prepare_checks_once_keeps_the_verdict_in_the_process_and_writes_no_table(tuning_env, monkeypatch):
    import torch
    calls = []

    def fake_validate(k, cfg, device, edges=None):
        calls.append((k, cfg))
        return {"ok": k.lmax != 5, "why": None if k.lmax != 5 else "output 0: relative error 3e-5", "edges": [1]}
    monkeypatch.setattr(level3, "validate", fake_validate)
    monkeypatch.setattr(level3.validity, "device_name", lambda device=None: DEVICE)
    assert level3.resolve(key(32, 2), DEVICE).source == "unchecked"
    u0 = torch.empty(1, 4, 7 * 32)
    level3.prepare(u0, focus_dim=32, lmax=2, apply_alpha=True)
    level3.prepare(u0, focus_dim=32, lmax=2, apply_alpha=True)           # kept: no second check
    assert len(calls) == 1
    plan = level3.resolve(key(32, 2), DEVICE)
    assert plan.config == policy.M64_N64 and plan.source == "policy" and plan.pending is None
    assert tuning.find(COMP, key(32, 2), device_name=DEVICE) is None      # no table written
    assert not os.path.exists(tuning_env.user_file)
    level3.prepare(torch.empty(1, 4, 4 * 16), focus_dim=16, lmax=1, apply_alpha=True)   # unsure: nothing
    assert len(calls) == 1 and level3.resolve(key(16, 1), DEVICE).source == "level2"
    with pytest.warns(UserWarning, match="failed the float64 check"):
        level3.prepare(torch.empty(1, 4, 16 * 32), focus_dim=32, lmax=5, apply_alpha=True)
    failed = level3.resolve(key(32, 5), DEVICE)
    assert failed.config is None and "3e-5" in failed.reason
    level3.forget()                                                      # a new process checks again
    assert level3.resolve(key(32, 2), DEVICE).source == "unchecked"


def test_prepare_runs_no_check_while_make_fx_or_fake_tensors_trace(tuning_env, monkeypatch):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def refuse(*args, **kwargs):
        raise AssertionError("a float64 check ran inside a trace")
    monkeypatch.setattr(level3, "validate", refuse)
    monkeypatch.setattr(level3.validity, "device_name", lambda device=None: DEVICE)
    kw = dict(focus_dim=32, lmax=2, apply_alpha=True)

    def traced(u0):
        level3.prepare(u0, **kw)
        return u0 * 2
    assert level3.resolve(key(32, 2), DEVICE).source == "unchecked"      # an eager call would check
    with FakeTensorMode():
        u0 = torch.empty(1, 4, 7 * 32)
        level3.prepare(u0, **kw)                                         # a fake mode active
    level3.prepare(u0, **kw)                                             # a fake tensor, no mode
    make_fx(traced, tracing_mode="fake")(torch.empty(1, 4, 7 * 32))
    make_fx(traced, tracing_mode="real")(torch.empty(1, 4, 7 * 32))      # real tensors, a proxy mode
    assert level3.resolve(key(32, 2), DEVICE).source == "unchecked"      # no verdict either
    with pytest.raises(AssertionError, match="inside a trace"):
        level3.prepare(torch.empty(1, 4, 7 * 32), **kw)                  # eager: the check runs


def test_a_table_entry_decides_before_any_verdict(tuning_env, monkeypatch):
    import torch
    monkeypatch.setattr(level3, "validate", lambda k, cfg, device, edges=None: {"ok": True, "why": None, "edges": [1]})
    monkeypatch.setattr(level3.validity, "device_name", lambda device=None: DEVICE)
    level3.prepare(torch.empty(2, 4, 10 * 64), focus_dim=64, lmax=3, apply_alpha=True)
    assert level3.resolve(key(64, 3, 2), DEVICE).config is not None
    write_table(tuning_env.user_file, {(COMP, key(64, 3, 2)): entry_for(None, family=COMP)})
    registry.reload()
    plan = level3.resolve(key(64, 3, 2), DEVICE)
    assert plan.config is None and plan.source == "table"
    tma = dict(policy.M64_N64, persistent=False, specialised=False)
    write_table(tuning_env.user_file, {(COMP, key(64, 3, 2)): entry_for(policy.M64_N64, family=COMP),
                                       ("stack_compensated_tma", key(64, 3, 2)):
                                           entry_for(tma, family="stack_compensated_tma")})
    registry.reload()
    plan = level3.resolve(key(64, 3, 2), DEVICE)
    assert plan.config == policy.M64_N64 and plan.tma == tma


# ----------------------------------------------------------------- the quick sweep

def test_quick_candidates_are_the_pruned_sets():
    k = key(32, 3, 2)
    assert tuning.candidates("stack_bwd_relay", k, quick=True) == [
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}]
    assert tuning.candidates(COMP, k, quick=True) == [policy.M64_N64]
    assert tuning.candidates(COMP, key(64, 3), quick=True) == [policy.M64_N128]
    assert tuning.candidates(COMP, key(64, 1), quick=True) == [policy.M64_N64]     # 128-wide blocks
    assert tuning.candidates("stack_fwd", k, quick=True) == []
    assert tuning.candidates("stack_bwd_fused", k, quick=True) == []
    wide = tuning.candidates("stack_bwd_relay", key(128, 4, 1), quick=True)     # a 1024-wide block
    assert wide == [{"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}]
    assert all(c in tuning.candidates("stack_bwd_relay", key(128, 4, 1)) for c in wide)
    assert len(tuning.candidates("stack_bwd_relay", key(32, 6, 2), quick=True)) == 1   # 384 wide
    full = tuning.candidates(COMP, k)
    assert all(c in full for c in tuning.candidates(COMP, k, quick=True))      # a subset of the full set


def test_a_quick_sweep_measures_the_quick_families_by_the_same_rules(tuning_env):
    made = []

    def make_probe(name, k, device=None):
        made.append(name)
        return FakeProbe(name, k)
    def clock(fn):
        fn()
        return 1.0
    results = tune([key(32, 3, 2)], quick=True, make_probe=make_probe, device_name=DEVICE, clock=clock,
                   rounds=3, warmup=1)
    assert made == ["stack_bwd_relay", COMP]
    assert [r.status for r in results] == ["tuned", "tuned"]
    assert all(r.config is None for r in results)                     # equal times: no margin, baseline wins
    doc = json.loads(tuning_env.user_file.read_text())
    assert all(e["sweep"] == "quick" for fam in doc["entries"].values() for e in fam.values())


def test_seconds_stops_cleanly_between_families_and_keys(tuning_env):
    t = [0.0]

    def now():
        return t[0]

    def make_probe(name, k, device=None):
        t[0] += 10.0                                  # each family's sweep costs 10 fake seconds
        return FakeProbe(name, k)
    keys = [key(32, 3, 2), key(32, 4, 2)]
    results = tune(keys, quick=True, make_probe=make_probe, device_name=DEVICE, seconds=15, now=now,
                   clock=lambda fn: (fn(), 1.0)[1], rounds=1, warmup=0)
    assert [r.status for r in results] == ["tuned", "tuned", "out-of-time", "out-of-time"]
    assert not tuning.covered("stack_bwd_relay", keys[1], device_name=DEVICE)
    again = tune(keys, quick=True, make_probe=make_probe, device_name=DEVICE, clock=lambda fn: (fn(), 1.0)[1],
                 rounds=1, warmup=0)
    assert [r.status for r in again] == ["covered", "covered", "tuned", "tuned"]


GRID = os.path.join(os.path.dirname(SHIPPED), os.pardir, "2026-12-02-h200-grid")
BUILTIN_VERDICTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mixstack", "tables",
                                "NVIDIA_H200.level3.json")


def test_the_shipped_h200_verdicts_are_the_committed_grids_and_engage_level3_where_it_measured_faster(monkeypatch):
    """The built-in verdicts are the committed H200 grids' (each named folder's verdicts in turn, a
    later one's replacing an earlier one's); with them, level 3 runs compensated kernels at every
    measured key where they beat level 2 by the margin, and nowhere they did not; and no level of
    the first grid was more than 5% slower than the compiled reference or slower than eager level 0."""
    from mixstack.bench import grid
    records = grid.load_records(GRID)
    assert len(records) >= 24
    with open(BUILTIN_VERDICTS, encoding="utf-8") as fh:
        shipped = json.load(fh)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = shipped["sources"]
    assert sources[0] == "results/2026-12-02-h200-grid" and all(s.startswith("results/") for s in sources)
    measured = grid.overlaid_verdicts([os.path.join(root, s) for s in sources])["verdicts"]
    assert shipped["device"] == "NVIDIA H200" and len(measured) > len(grid.level3_verdicts(records))
    assert {k: round(v["speedup"], 6) for k, v in shipped["verdicts"].items()} == \
        {k: round(v["speedup"], 6) for k, v in measured.items()}
    monkeypatch.setattr(policy, "verdicts_path", lambda device: BUILTIN_VERDICTS)
    policy.forget_verdicts()
    faster = [k for k, v in measured.items() if v["speedup"] >= 1 + policy.VERDICT_MARGIN]
    assert faster, "the grid measured no compensated win: nothing to check"
    for k, v in measured.items():
        cf, lmax, f = (int(part.split("=")[1]) for part in k.split(";")[:3])
        decision = policy.decide(key(cf, lmax, f), "NVIDIA H200")
        assert (decision.config is not None) == (k in faster), (k, v["speedup"], decision)
    for rec in records:
        s = grid.summary(rec)
        for level in grid.LEVEL_VARIANTS:
            assert s[f"{level}_vs_compiled"] >= 1 - grid.SLOWER_THAN_COMPILED, (s["key"], level)
            assert s[f"{level}_vs_eager"] >= 1.0, (s["key"], level)
