"""Which keys' exact products run on the BLAS (``tuning.products``): the override and its
errors, the verdict file a grid run writes and the route reads, and TF32 kept off."""

from __future__ import annotations

import json
import types

import pytest
import torch

from mixstack.bench import grid
from mixstack.core.layout import StackLayout
from mixstack.tuning import products

WIDE = StackLayout(4, 112)
NARROW = StackLayout(2, 32)
ON_GPU = types.SimpleNamespace(device=torch.device("cuda"))      # a stand-in: only its device is read


@pytest.fixture
def h200_verdicts(tuning_env, monkeypatch):
    """The shipped verdict file of a stand-in GPU, in the empty built-in folder of ``tuning_env``."""
    path = tuning_env.builtin / "NVIDIA_H200.products.json"
    monkeypatch.setattr(products, "device_name", lambda device: "NVIDIA H200")
    monkeypatch.delenv(products.VARIABLE, raising=False)
    products.forget_keys()
    yield path
    products.forget_keys()


def test_auto_takes_the_measured_keys_on_a_gpu_and_triton_elsewhere(h200_verdicts):
    h200_verdicts.write_text(json.dumps({"device": "NVIDIA H200", "blas": [{"focus_dim": 112, "lmax": 4,
                                                                              "speedup": 1.06}]}))
    assert products.on_blas(WIDE, ON_GPU) and not products.on_blas(NARROW, ON_GPU)
    assert not products.on_blas(WIDE, torch.zeros(1))                 # CPU tensors: Triton (or the reference)
    with products.use_products("triton"):
        assert not products.on_blas(WIDE, ON_GPU)
    with products.use_products("blas"):
        assert products.on_blas(NARROW, torch.zeros(1))
        with products.use_products("auto"):                            # nested, then restored
            assert not products.on_blas(NARROW, ON_GPU)
        assert products.on_blas(NARROW, ON_GPU)
    assert products.route() == "auto"


def test_no_file_means_triton_everywhere_and_a_corrupt_one_is_reported_not_fatal(h200_verdicts):
    assert products.blas_keys("NVIDIA H200") == frozenset() and not products.on_blas(WIDE, ON_GPU)
    products.forget_keys()
    h200_verdicts.write_text("{not json")
    with pytest.warns(Warning, match="products.json: cannot be read"):
        assert products.blas_keys("NVIDIA H200") == frozenset()


def test_a_users_own_verdicts_replace_the_shipped_ones_and_one_that_cannot_stand_does_not(h200_verdicts, tuning_env):
    """The cache's file for the device first; unreadable, or measured on another GPU: reported,
    and the shipped file decides."""
    mine = tuning_env.user / "NVIDIA_H200.products.json"
    mine.parent.mkdir()
    assert products.user_verdicts_path("NVIDIA H200") == str(mine)
    h200_verdicts.write_text(json.dumps({"device": "NVIDIA H200", "blas": [{"focus_dim": 112, "lmax": 4}]}))
    mine.write_text(json.dumps({"device": "NVIDIA H200", "blas": [{"focus_dim": 32, "lmax": 2}]}))
    assert products.blas_keys("NVIDIA H200") == {(32, 2)}
    assert products.on_blas(NARROW, ON_GPU) and not products.on_blas(WIDE, ON_GPU)
    for text, why in ((json.dumps({"device": "NVIDIA A100-SXM4-80GB", "blas": []}),
                       "was measured on NVIDIA A100-SXM4-80GB, not on NVIDIA H200"),
                      ('{"blas": [{"lmax": 2}]}', "cannot be read")):
        products.forget_keys()
        mine.write_text(text)
        with pytest.warns(Warning, match=why):
            assert products.blas_keys("NVIDIA H200") == {(112, 4)}
    products.forget_keys()
    mine.unlink()
    assert products.blas_keys("NVIDIA H200") == {(112, 4)}


def test_the_users_verdict_file_sits_beside_their_tuning_table(monkeypatch, tmp_path):
    from mixstack.tuning import store

    monkeypatch.setenv("MIXSTACK_CACHE_DIR", str(tmp_path))
    assert products.user_verdicts_path("NVIDIA H200") == str(tmp_path / "NVIDIA_H200.products.json")
    assert store.user_path("NVIDIA H200") == str(tmp_path / "NVIDIA_H200.json")


def test_the_environment_variable_picks_the_route_and_a_bad_value_names_it(monkeypatch):
    monkeypatch.setenv(products.VARIABLE, "blas")
    assert products.route() == "blas" and products.on_blas(NARROW, torch.zeros(1))
    monkeypatch.setenv(products.VARIABLE, "cublas")
    with pytest.raises(ValueError, match="MIXSTACK_PRODUCTS must be one of auto, blas, triton, got 'cublas'"):
        products.route()
    with pytest.raises(ValueError, match=r"use_products\(which\) must be one of"):
        with products.use_products("fast"):
            pass


@pytest.mark.parametrize("how", ["legacy flag", "float32 matmul precision", "new setting"])
def test_exact_products_turn_tf32_off_inside_and_restore_the_callers_setting(how):
    """Whichever of torch's three ways the caller turned TF32 on (reading the legacy flag after the
    new setting raises in torch >= 2.9, so the context must not)."""
    matmul = torch.backends.cuda.matmul
    new_api = hasattr(matmul, "fp32_precision")
    before = matmul.fp32_precision if new_api else matmul.allow_tf32
    try:
        if how == "legacy flag":
            matmul.allow_tf32 = True
        elif how == "float32 matmul precision":
            torch.set_float32_matmul_precision("high")
        elif new_api:
            matmul.fp32_precision = "tf32"
        else:
            pytest.skip("this torch has no fp32_precision setting")
        on = matmul.fp32_precision if new_api else matmul.allow_tf32
        with products.exact_products():
            assert (matmul.fp32_precision == "ieee") if new_api else (matmul.allow_tf32 is False)
        assert (matmul.fp32_precision if new_api else matmul.allow_tf32) == on
    finally:
        if new_api:
            matmul.fp32_precision = before
        else:
            matmul.allow_tf32 = before
        torch.set_float32_matmul_precision("highest")


def _record(cf, lmax, f, l1, l2, l1b, l2b):
    timings = [{"variant": v, "pass": "both", "median_ms": t}
               for v, t in (("L1", l1), ("L2", l2), ("L1-blas", l1b), ("L2-blas", l2b), ("L0-compile", 10.0))
               if t is not None]
    from mixstack.measure import env
    return {"key": {"focus_dim": cf, "lmax": lmax, "focus": f, "edges": 1}, "shape": {"variants": []},
            "timings": timings, "env": env.collect(torch.device("cpu")), "compile": {"graphs": 0, "first_call_s": None}}


def test_a_group_takes_the_blas_only_where_it_won_at_both_levels_and_every_f():
    recs = [_record(112, 4, 1, 10.0, 10.0, 9.0, 9.2), _record(112, 4, 2, 10.0, 10.0, 9.5, 9.4),   # wins: 1.053
            _record(128, 5, 1, 10.0, 10.0, 9.0, 9.0), _record(128, 5, 2, 10.0, 10.0, 9.9, 9.0),   # F 2, L1: 1.01
            _record(80, 4, 1, 10.0, 10.0, 9.0, 10.0),                                             # L2 no faster
            _record(96, 4, 1, 10.0, 10.0, 9.0, None)]                                             # not measured
    verdicts = products.verdicts(recs)
    assert [(v["focus_dim"], v["lmax"]) for v in verdicts] == [(112, 4)]
    assert verdicts[0]["speedup"] == round(10.0 / 9.5, 4)
    text = grid.markdown(recs)
    assert "Triton's at both levels and every F: 1 (Cf, lmax) groups (Cf112-l4)" in text


def test_a_sweep_measures_tritons_products_whatever_route_the_process_asked_for(monkeypatch):
    """``tuner.sweep.tune_key`` forces the Triton route around its runs: a table entry always
    describes Triton's kernels, also where the device's verdicts send a key to the BLAS."""
    from mixstack.tuner import sweep
    from mixstack.tuning import shape_key

    seen = []

    class Probe:                                   # stops the sweep at its first run, having looked
        device_name = "cpu"

        def run(self, cfg):
            seen.append(products.route())
            raise RuntimeError("probe stops here")

    monkeypatch.setenv(products.VARIABLE, "blas")
    key = shape_key(focus_dim=16, lmax=1, n_focus=1, apply_alpha=True)
    with pytest.raises(Exception, match="probe stops here"):
        sweep.tune_key("stack_fwd", key, probe=Probe(), force=True, rounds=1)
    assert seen == ["triton"] and products.route() == "blas"


def test_a_trace_of_the_operators_takes_tritons_products_whatever_was_asked():
    """A compiler tracing the stack's bodies sees fake tensors: the BLAS route stays out of compiled
    programs (docs/contract.md §3)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode, products.use_products("blas"):
        fake = mode.from_tensor(torch.zeros(2, 3))
        assert not products.on_blas(NARROW, fake)
    with products.use_products("blas"):
        assert products.on_blas(NARROW, torch.zeros(2, 3))


def test_every_shipped_verdict_file_names_its_device_and_holds_only_winning_groups():
    """``mixstack/tables/*.products.json``: the file sits where ``verdicts_path`` looks for its own
    device, and every group in it won by the verdict's margin (a hand-edited or misplaced file fails)."""
    from pathlib import Path

    shipped = sorted((Path(products.__file__).parent.parent / "tables").glob("*.products.json"))
    assert shipped
    for path in shipped:
        doc = json.loads(path.read_text())
        assert Path(products.verdicts_path(doc["device"])).resolve() == path.resolve(), path.name
        assert doc["blas"] and all(g["speedup"] >= 1 + products.VERDICT_MARGIN for g in doc["blas"]), path.name
        products.forget_keys()
        assert products.blas_keys(doc["device"]) == {(g["focus_dim"], g["lmax"]) for g in doc["blas"]}
    products.forget_keys()
