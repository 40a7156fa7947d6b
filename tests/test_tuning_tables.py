"""Shape keys, families and candidates, registrations, and lookup precedence."""

import pytest
import torch
from tuning_fakes import DEVICE, entry_for, write_table

from mixstack import tuning
from mixstack.tuning import configs, registry, store
from mixstack.tuning.keys import ShapeKey

KEY = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
CFG_A = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
CFG_B = {"BLOCK_M": 32, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
CFG_C = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
FUSED = "stack_bwd_fused"


# Every test runs on empty, private tables (the ``tuning_env`` fixture, tests/conftest.py).
pytestmark = pytest.mark.usefixtures("tuning_env")


# ------------------------------------------------------------------ keys

def test_shape_keys_are_hashable_frozen_values_with_a_stable_string_form():
    same = tuning.shape_key(apply_alpha=True, n_focus=2, lmax=3, focus_dim=32)
    assert same == KEY and hash(same) == hash(KEY) and len({KEY, same}) == 1
    assert str(KEY) == "focus_dim=32;lmax=3;n_focus=2;apply_alpha=1"
    assert ShapeKey.parse(str(KEY)) == KEY
    with pytest.raises(AttributeError):
        KEY.lmax = 4


def test_a_field_added_later_defaults_to_the_old_key():
    assert tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True, edge_bucket=None) == KEY
    bucketed = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True, edge_bucket=18)
    assert bucketed != KEY and bucketed.get("edge_bucket") == 18 and KEY.get("edge_bucket") is None
    assert ShapeKey.parse(str(bucketed)) == bucketed
    flag = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=False, mode="x", big=True)
    assert ShapeKey.parse(str(flag)) == flag


@pytest.mark.parametrize("kwargs, error", [
    (dict(focus_dim=32, lmax=7, n_focus=2, apply_alpha=True), ValueError),
    (dict(focus_dim=0, lmax=3, n_focus=2, apply_alpha=True), ValueError),
    (dict(focus_dim=32, lmax=3, n_focus=2, apply_alpha=1), TypeError),
    (dict(focus_dim=32.0, lmax=3, n_focus=2, apply_alpha=True), TypeError),
    (dict(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True, bucket=[1]), TypeError),
])
def test_bad_shape_keys_are_refused(kwargs, error):
    with pytest.raises(error):
        tuning.shape_key(**kwargs)


@pytest.mark.parametrize("text", ["", "focus_dim=32", "focus_dim=32;lmax=3;n_focus=2;apply_alpha=2",
                                  "focus_dim=x;lmax=3;n_focus=2;apply_alpha=1"])
def test_malformed_key_strings_are_refused(text):
    with pytest.raises(ValueError):
        ShapeKey.parse(text)


# ------------------------------------------------------------------ candidates

@pytest.mark.parametrize("cf, lmax", [(32, 3), (32, 6), (64, 3), (16, 1)])
def test_gemm_candidates_are_a_pruned_set_without_the_level_1_config(cf, lmax):
    key = tuning.shape_key(focus_dim=cf, lmax=lmax, n_focus=2, apply_alpha=True)
    for fam in ("stack_fwd", "stack_bwd_relay"):
        cands = tuning.candidates(fam, key)
        assert 4 <= len(cands) <= 12
        assert all(set(c) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"} for c in cands)
        assert len({tuple(c.values()) for c in cands}) == len(cands)
        default = configs.default_gemm_config(key.layout)
        assert {f: default[f] for f in cands[0]} not in cands        # never the baseline itself


def test_fused_candidates_cover_rows_columns_warps_and_stages_inside_the_fused_regime():
    cands = tuning.candidates(FUSED, KEY)
    assert len(cands) == 16
    assert {c["BLOCK_M"] for c in cands} == {32, 64} and {c["BLOCK_N"] for c in cands} == {64, 128}
    assert {(c["num_warps"], c["num_stages"]) for c in cands} == {(4, 2), (4, 3), (8, 2), (8, 3)}
    for cf in (48, 128):
        assert tuning.candidates(FUSED, tuning.shape_key(focus_dim=cf, lmax=2, n_focus=1,
                                                         apply_alpha=True)) == []


def test_compensated_candidates_always_include_one_stage_and_fit_the_block():
    cands = tuning.candidates("stack_compensated", KEY)
    assert cands and {c["num_stages"] for c in cands} >= {1}
    for bm, bn in {(c["BLOCK_M"], c["BLOCK_N"]) for c in cands if c["num_stages"] > 1}:
        assert {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": 4 if bm <= 64 else 8, "num_stages": 1} in cands
    narrow = tuning.shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True)   # blocks 32 wide
    assert max(c["BLOCK_N"] for c in tuning.candidates("stack_compensated", narrow)) == 64


def test_candidates_are_fresh_dicts():
    tuning.candidates(FUSED, KEY)[0]["BLOCK_M"] = 999
    assert tuning.candidates(FUSED, KEY)[0]["BLOCK_M"] != 999


def test_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match="stack_bwd_fused"):
        tuning.lookup("stack_bwd_fast", KEY)


# ------------------------------------------------------------------ registrations

@pytest.mark.parametrize("cfg", [{"BLOCK_M": 32}, {**CFG_A, "num_stages": 0},
                                 {**CFG_A, "BLOCK_K": 64}, "32"])
def test_bad_configs_are_refused_by_register(cfg):
    with pytest.raises((ValueError, TypeError)):
        tuning.register(FUSED, KEY, cfg)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) is tuning.MISSING


def test_registration_scope_restores_what_was_there_also_on_errors():
    tuning.register(FUSED, KEY, CFG_A)
    with pytest.raises(RuntimeError):
        with tuning.registration(FUSED, KEY, None):
            assert tuning.lookup(FUSED, KEY, device_name=DEVICE) is None
            raise RuntimeError
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_A
    tuning.unregister(FUSED, KEY)
    with tuning.registration(FUSED, KEY, CFG_B):
        pass
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) is tuning.MISSING


def test_lookup_returns_a_copy():
    tuning.register(FUSED, KEY, CFG_A)
    tuning.lookup(FUSED, KEY, device_name=DEVICE)["BLOCK_M"] = 999
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_A


# ------------------------------------------------------------------ precedence

def test_register_beats_the_user_table_which_beats_the_builtin_table(tuning_env):
    write_table(tuning_env.builtin_file, {(FUSED, KEY): entry_for(CFG_A)})
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_A
    assert tuning.find(FUSED, KEY, device_name=DEVICE)[0] == "builtin"
    registry.record(FUSED, KEY, entry_for(CFG_B), device_name=DEVICE)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_B
    assert tuning.find(FUSED, KEY, device_name=DEVICE)[0] == "user"
    tuning.register(FUSED, KEY, CFG_C)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_C
    tuning.register(FUSED, KEY, None)                       # an explicit None beats tables too
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) is None
    tuning.unregister(FUSED, KEY)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_B
    tuning_env.user_file.unlink()
    tuning.reload()
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_A


def test_a_user_none_beats_a_builtin_config(tuning_env):
    write_table(tuning_env.builtin_file, {(FUSED, KEY): entry_for(CFG_A)})
    registry.record(FUSED, KEY, entry_for(None), device_name=DEVICE)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) is None
    assert tuning.covered(FUSED, KEY, device_name=DEVICE)


def test_tables_are_per_device_model(tuning_env):
    registry.record(FUSED, KEY, entry_for(CFG_A, device="NVIDIA H200"), device_name="NVIDIA H200")
    assert tuning.lookup(FUSED, KEY, device_name="NVIDIA H200") == CFG_A
    assert tuning.lookup(FUSED, KEY, device_name="NVIDIA H20") is tuning.MISSING
    assert store.file_name("NVIDIA H200") != store.file_name("NVIDIA H20")


def test_lookups_read_the_files_once_until_a_write(tuning_env, monkeypatch):
    write_table(tuning_env.builtin_file, {(FUSED, KEY): entry_for(CFG_A)})
    reads = []
    real = store.load_table
    monkeypatch.setattr(store, "load_table", lambda path, device: reads.append(path) or real(path, device))
    for _ in range(5):
        assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_A
    assert len(reads) == 2                                  # built-in + user, once
    registry.record(FUSED, KEY, entry_for(CFG_B), device_name=DEVICE)
    assert tuning.lookup(FUSED, KEY, device_name=DEVICE) == CFG_B
    assert len(reads) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the device name without CUDA")
def test_the_default_device_name_is_cpu_or_the_interpreter(monkeypatch):
    assert tuning.device_name() == "cpu"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tuning.device_name() == "triton-interpreter"
    tuning.register(FUSED, KEY, CFG_A)                      # registrations hold on any device
    assert tuning.lookup(FUSED, KEY) == CFG_A


def test_tuned_config_is_none_for_missing_and_for_none_entries():
    kw = dict(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
    assert tuning.tuned_config(FUSED, **kw) is None
    tuning.register(FUSED, KEY, None)
    assert tuning.tuned_config(FUSED, **kw) is None
    tuning.register(FUSED, KEY, CFG_B)
    assert tuning.tuned_config(FUSED, **kw) == CFG_B


def test_a_key_without_alpha_borrows_its_alpha_twins_launch_config_but_never_a_compensated_one():
    no_alpha = dict(focus_dim=32, lmax=3, n_focus=2, apply_alpha=False)
    tuning.register("stack_bwd_relay", KEY, CFG_A)
    tuning.register("stack_wgrad_compensated", KEY, CFG_B)
    assert tuning.tuned_config("stack_bwd_relay", **no_alpha) == CFG_A
    assert tuning.tuned_config("stack_wgrad_compensated", **no_alpha) is None      # validated on its key only
    own = tuning.shape_key(**no_alpha)
    tuning.register("stack_bwd_relay", own, None)                                   # its own entry wins, None too
    assert tuning.tuned_config("stack_bwd_relay", **no_alpha) is None
    tuning.register("stack_bwd_relay", own, CFG_C)
    assert tuning.tuned_config("stack_bwd_relay", **no_alpha) == CFG_C
    tuning.register("stack_fwd", own, CFG_C)                                        # never the other way round
    assert tuning.tuned_config("stack_fwd", **{**no_alpha, "apply_alpha": True}) is None


def test_every_shipped_entry_was_measured_on_the_current_kernel_sources():
    """A kernel edit makes the shipped entries stale (they would be ignored at run time):
    re-measure them, or withdraw them, in the same change."""
    import glob
    import json
    import os

    import mixstack
    from mixstack.tuning import validity
    stale = []
    shipped = [p for p in glob.glob(os.path.join(os.path.dirname(mixstack.__file__), "tables", "*.json"))
               if not p.endswith((".level3.json", ".products.json"))]   # the grid's verdicts: no entries
                                                                            # (test_level3_policy, test_products)
    assert shipped                      # the package's own tables, not a test's stand-in
    for path in shipped:
        with open(path) as fh:
            doc = json.load(fh)
        for family, entries in doc["entries"].items():
            for key, entry in entries.items():
                if entry.get("kernel_hash") != validity.kernel_source_hash(family=family):
                    stale.append(f"{os.path.basename(path)} {family} {key}")
    assert not stale, stale


def test_the_fused_candidates_at_cf64_start_with_spill_free_16_row_tiles():
    wide = tuning.candidates("stack_bwd_fused", tuning.shape_key(focus_dim=64, lmax=3, n_focus=1,
                                                                 apply_alpha=True))
    narrow = tuning.candidates("stack_bwd_fused", tuning.shape_key(focus_dim=32, lmax=3, n_focus=2,
                                                                   apply_alpha=True))
    assert [c["BLOCK_M"] for c in wide[:4]] == [16] * 4 and len(wide) == len(narrow) + 4
    assert all(c["BLOCK_M"] >= 32 for c in narrow)

