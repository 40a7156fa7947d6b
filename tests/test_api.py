"""The public API of docs/contract.md §2 and §3 on CPU: levels, dispatch log, input validation,
empty inputs, the ``MixingStack`` module and the CPU fallback of the Triton levels."""

from __future__ import annotations

import collections
import re
import threading

import helpers
import pytest
import torch
from helpers import Case

import mixstack
from mixstack.core import config

# ---------------------------------------------------------------- levels


@pytest.fixture
def no_env_level(monkeypatch):
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)
    mixstack.set_level(None)


def test_default_level_is_0_without_cuda_and_2_with(no_env_level):
    assert mixstack.get_level() == (2 if torch.cuda.is_available() else 0)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_set_level_sets_the_process_default(no_env_level, level):
    mixstack.set_level(level)
    assert mixstack.get_level() == level
    seen = []
    t = threading.Thread(target=lambda: seen.append(mixstack.get_level()))
    t.start()
    t.join()
    assert seen == [level]                           # process-wide, not per thread
    mixstack.set_level(None)
    assert mixstack.get_level() == (2 if torch.cuda.is_available() else 0)


@pytest.mark.parametrize("bad, exc", [(4, ValueError), (-1, ValueError), ("1", TypeError),
                                      (1.0, TypeError), (True, TypeError)])
def test_set_level_and_use_level_reject_invalid_levels(no_env_level, bad, exc):
    with pytest.raises(exc, match="level"):
        mixstack.set_level(bad)
    with pytest.raises(exc, match="level"):
        with mixstack.use_level(bad):
            pass
    assert mixstack.get_level() == (2 if torch.cuda.is_available() else 0)


def test_use_level_is_scoped_nested_and_restored_on_exception(no_env_level):
    mixstack.set_level(1)
    with mixstack.use_level(3):
        assert mixstack.get_level() == 3
        with mixstack.use_level(0):
            assert mixstack.get_level() == 0
        assert mixstack.get_level() == 3
    assert mixstack.get_level() == 1
    with pytest.raises(RuntimeError, match="boom"):
        with mixstack.use_level(2):
            raise RuntimeError("boom")
    assert mixstack.get_level() == 1


def test_use_level_is_invisible_to_other_threads(no_env_level):
    mixstack.set_level(1)
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with mixstack.use_level(3):
            seen["other_inside"] = mixstack.get_level()
            entered.set()
            release.wait(10)

    with mixstack.use_level(2):
        t = threading.Thread(target=lambda: (seen.__setitem__("other_before", mixstack.get_level()),
                                             other()))
        t.start()
        assert entered.wait(10)
        seen["main_while_other_scoped"] = mixstack.get_level()
        release.set()
        t.join(10)
    assert seen == {"other_before": 1, "other_inside": 3, "main_while_other_scoped": 2}


@pytest.mark.parametrize("raw, level", [("0", 0), ("1", 1), ("2", 2), ("3", 3), (" 2 ", 2)])
def test_env_var_sets_the_default_level(monkeypatch, raw, level):
    mixstack.set_level(None)
    monkeypatch.setenv("MIXSTACK_LEVEL", raw)
    assert mixstack.get_level() == level
    mixstack.set_level(0 if level else 1)            # set_level beats the environment
    assert mixstack.get_level() == (0 if level else 1)


@pytest.mark.parametrize("raw", ["4", "-1", "two", "1.0"])
def test_invalid_env_var_level_is_a_clear_error(monkeypatch, raw):
    mixstack.set_level(None)
    monkeypatch.setenv("MIXSTACK_LEVEL", raw)
    with pytest.raises(ValueError, match="MIXSTACK_LEVEL") as info:
        mixstack.get_level()
    assert repr(raw) in str(info.value) or raw in str(info.value)


def test_empty_env_var_means_default_level(monkeypatch):
    mixstack.set_level(None)
    monkeypatch.setenv("MIXSTACK_LEVEL", "")
    assert mixstack.get_level() == (2 if torch.cuda.is_available() else 0)


# ---------------------------------------------------------------- dispatch log

SMALL = Case(F=2, E=5, Cf=4, lmax=2, n_layers=3, apply_alpha=True)


def _call(case=SMALL, requires_grad=False, **kw):
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    u0.requires_grad_(requires_grad)
    return u0, mixstack.mixing_stack(u0, alpha, w0, w1, gw, **case.kw, **kw)


def test_dispatch_log_counts_each_path_that_ran():
    with mixstack.use_level(0), mixstack.dispatch_log() as log:
        _call()
        u0, out = _call(requires_grad=True)
        out.sum().backward()
        _call()
    assert isinstance(log, collections.Counter)
    assert dict(log) == {"fwd:reference": 3, "bwd:reference": 1}


def test_dispatch_logs_nest_and_stop_counting_when_closed():
    with mixstack.use_level(0), mixstack.dispatch_log() as outer:
        _call()
        with mixstack.dispatch_log() as inner:
            _call()
        _call()
    with mixstack.use_level(0):
        _call()
    assert outer["fwd:reference"] == 3
    assert inner["fwd:reference"] == 1


# ---------------------------------------------------------------- bad input

# SMALL: F=2, E=5, Cf=4, lmax=2, n_layers=3 -> m0=12, m1=16, ROW=28, G=8
def _mutate(**changes):
    def build():
        x = dict(zip(helpers.INPUT_NAMES, helpers.make_inputs(SMALL)))
        kw = dict(lmax=SMALL.lmax, focus_dim=SMALL.Cf)
        for key, fn in changes.items():
            if key in x:
                x[key] = fn(x[key])
            else:
                kw[key] = fn
        return x, kw
    return build


BAD_INPUTS = {
    # id: (builder, exception, argument named, expected shape text, received shape)
    "u0-rank2": (_mutate(u0=lambda t: t[0]), ValueError, "u0", "(F, E, ROW)", (5, 28)),
    "u0-rank4": (_mutate(u0=lambda t: t[None]), ValueError, "u0", "(F, E, ROW)", (1, 2, 5, 28)),
    "u0-row": (_mutate(u0=lambda t: t[..., :27]), ValueError, "u0", "28", (2, 5, 27)),
    "alpha-rank1": (_mutate(alpha=lambda t: t[:, 0]), ValueError, "alpha", "(E, F)", (5,)),
    "alpha-E": (_mutate(alpha=lambda t: t[:4]), ValueError, "alpha", "(5, 2)", (4, 2)),
    "alpha-F": (_mutate(alpha=lambda t: torch.cat((t, t[:, :1]), 1)), ValueError, "alpha", "(5, 2)",
                (5, 3)),
    "w0-rank3": (_mutate(w0=lambda t: t[0]), ValueError, "w0", "(n_layers, F, m0, m0)", (2, 12, 12)),
    "w0-m0": (_mutate(w0=lambda t: t[..., :11, :11]), ValueError, "w0", "12", (3, 2, 11, 11)),
    "w0-F": (_mutate(w0=lambda t: t[:, :1]), ValueError, "w0", "(3, 2, 12, 12)", (3, 1, 12, 12)),
    "w0-no-layers": (_mutate(w0=lambda t: t[:0]), ValueError, "w0", "n_layers", (0, 2, 12, 12)),
    "w1-rank5": (_mutate(w1=lambda t: t[None]), ValueError, "w1", "(n_layers, F, m1, m1)",
                 (1, 3, 2, 16, 16)),
    "w1-m1": (_mutate(w1=lambda t: t[..., :15]), ValueError, "w1", "16", (3, 2, 16, 15)),
    "w1-layers": (_mutate(w1=lambda t: t[:2]), ValueError, "w1", "(3, 2, 16, 16)", (2, 2, 16, 16)),
    "w1-F": (_mutate(w1=lambda t: torch.cat((t, t[:, :1]), 1)), ValueError, "w1", "(3, 2, 16, 16)",
             (3, 3, 16, 16)),
    "gw-rank3": (_mutate(gw=lambda t: t[0]), ValueError, "gw", "(n_layers - 1, F, focus_dim, G)",
                 (2, 4, 8)),
    "gw-Cf": (_mutate(gw=lambda t: t[:, :, :3]), ValueError, "gw", "(2, 2, 4, 8)", (2, 2, 3, 8)),
    "gw-G": (_mutate(gw=lambda t: t[..., :6]), ValueError, "gw", "(2, 2, 4, 8)", (2, 2, 4, 6)),
    "gw-layers": (_mutate(gw=lambda t: torch.cat((t, t[:1]), 0)), ValueError, "gw", "(2, 2, 4, 8)",
                  (3, 2, 4, 8)),
    "gw-F": (_mutate(gw=lambda t: t[:, :1]), ValueError, "gw", "(2, 2, 4, 8)", (2, 1, 4, 8)),
    # lmax / focus_dim that do not match the tensors: the first tensor that disagrees is named
    "lmax-mismatch": (_mutate(lmax=3), ValueError, "u0", "40", (2, 5, 28)),
    "focus_dim-mismatch": (_mutate(focus_dim=8), ValueError, "u0", "56", (2, 5, 28)),
}


def _shape_in(shape, message: str) -> bool:
    """The received shape appears in ``message`` as ``(a, b)`` / ``[a, b]`` (``(a,)`` for one dim)."""
    inner = r",\s*".join(str(s) for s in shape)
    return re.search(r"[\(\[]" + inner + r",?[\)\]]", message) is not None


@pytest.mark.parametrize("fn", [mixstack.mixing_stack, mixstack.reference.mixing_stack],
                         ids=["mixing_stack", "reference"])
@pytest.mark.parametrize("bad", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_shape_is_rejected_naming_argument_expected_and_received(bad, fn):
    build, exc, name, expected, received = BAD_INPUTS[bad]
    x, kw = build()
    with pytest.raises(exc) as info:
        fn(*x.values(), **kw)
    msg = str(info.value)
    assert re.search(rf"\b{name}\b", msg), msg
    assert expected in msg, msg
    assert _shape_in(received, msg), msg


@pytest.mark.parametrize("fn", [mixstack.mixing_stack, mixstack.reference.mixing_stack],
                         ids=["mixing_stack", "reference"])
def test_an_edge_major_u0_is_reported_as_u0s_fault(fn):
    """``u0`` given as ``(E, F, ROW)`` (the result's layout) is ``u0``'s error, not ``alpha``'s."""
    x, kw = _mutate(u0=lambda t: t.transpose(0, 1))()           # (5, 2, 28): E = 5, F = 2
    with pytest.raises(ValueError) as info:
        fn(*x.values(), **kw)
    msg = str(info.value)
    assert msg.startswith("u0 must be focus-major (F, E, ROW) = (2, 5, 28)"), msg
    assert "got the edge-major (E, F, ROW) shape (5, 2, 28)" in msg and "transpose(0, 1)" in msg


@pytest.mark.parametrize("lmax", [0, 7, -1])
def test_lmax_outside_1_to_6_is_rejected(lmax):
    x, kw = _mutate()()
    with pytest.raises(ValueError, match=rf"lmax.*1\.\.6.*{lmax}"):
        mixstack.mixing_stack(*x.values(), lmax=lmax, focus_dim=SMALL.Cf)


@pytest.mark.parametrize("name", helpers.INPUT_NAMES)
def test_mixed_devices_are_rejected_naming_the_devices(name):
    x, kw = _mutate(**{name: lambda t: t.to("meta")})()
    with pytest.raises(ValueError, match="device") as info:
        mixstack.mixing_stack(*x.values(), **kw)
    assert f"{name}=meta" in str(info.value) and "cpu" in str(info.value)


@pytest.mark.parametrize("name", helpers.INPUT_NAMES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_non_floating_dtype_is_a_type_error_naming_argument_and_dtype(name, dtype):
    x, kw = _mutate(**{name: lambda t: t.to(dtype)})()
    with pytest.raises(TypeError) as info:
        mixstack.mixing_stack(*x.values(), **kw)
    msg = str(info.value)
    assert re.search(rf"\b{name}\b", msg) and "float" in msg and str(dtype) in msg, msg


def test_mixed_floating_dtypes_are_a_clear_error_naming_argument():
    """docs/contract.md §2: bad input gets a clear error naming the argument and the dtype expected and
    received.  A float64 weight next to float32 activations must not surface as a matmul
    RuntimeError (level 0) or a Triton compile error (levels 1-3)."""
    name = "w0"
    x, kw = _mutate(**{name: lambda t: t.double()})()
    with pytest.raises((TypeError, ValueError)) as info:
        mixstack.mixing_stack(*x.values(), **kw)
    msg = str(info.value)
    assert re.search(rf"\b{name}\b", msg) and "float64" in msg and "float32" in msg, msg


def test_non_tensor_argument_is_a_type_error():
    x, kw = _mutate()()
    x["w1"] = x["w1"].tolist()
    with pytest.raises(TypeError, match=r"\bw1\b.*Tensor"):
        mixstack.mixing_stack(*x.values(), **kw)


@pytest.mark.parametrize("kw", [dict(lmax=2.0), dict(focus_dim=4.0), dict(lmax=True)])
def test_non_int_lmax_or_focus_dim_is_a_type_error(kw):
    x, base = _mutate()()
    base.update(kw)
    with pytest.raises(TypeError, match=next(iter(kw))):
        mixstack.mixing_stack(*x.values(), **base)


# ---------------------------------------------------------------- empty input


@pytest.mark.parametrize("level", [0, 1])
def test_zero_edges_return_an_empty_result_and_empty_gradients(level):
    case = Case(F=2, E=0, Cf=16, lmax=1, n_layers=2, apply_alpha=True)
    got = helpers.run_stack(case, level, helpers.make_inputs(case), helpers.make_grad_out(case))
    assert got["out"].shape == (0, 2, case.row)
    assert got["grad_u0"].shape == (2, 0, case.row)
    assert got["grad_alpha"].shape == (0, 2)


# ---------------------------------------------------------------- CPU fallback


@pytest.mark.skipif(config.triton_interpret(), reason="under TRITON_INTERPRET the Triton levels run on CPU")
@pytest.mark.parametrize("level", [1, 2, 3])
def test_triton_levels_fall_back_to_reference_on_cpu(level):
    case = Case(F=2, E=7, Cf=16, lmax=2, n_layers=3, apply_alpha=True)
    inputs, grad_out = helpers.make_inputs(case), helpers.make_grad_out(case)
    got = helpers.run_stack(case, level, inputs, grad_out)
    want = helpers.run_stack(case, 0, inputs, grad_out)
    assert got["log"] == {"fwd:reference": 1, "bwd:reference": 1}
    for key in ("out", "grad_u0", "grad_alpha"):
        assert torch.equal(got[key], want[key]), key


@pytest.mark.skipif(config.triton_interpret(), reason="under TRITON_INTERPRET the Triton levels run on CPU")
@pytest.mark.parametrize("level", [1, 3])
def test_a_triton_level_on_cpu_tensors_warns_once_saying_why(level, monkeypatch):
    from mixstack.dispatch import log
    monkeypatch.setattr(log, "_warned", set())
    case = Case(F=2, E=7, Cf=16, lmax=2, n_layers=3, apply_alpha=True)
    inputs, grad_out = helpers.make_inputs(case), helpers.make_grad_out(case)
    with pytest.warns(UserWarning, match=rf"level {level} runs the reference: the Triton kernels need CUDA "
                      r"tensors, got cpu tensors \(TRITON_INTERPRET=1"):
        helpers.run_stack(case, level, inputs, grad_out)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # once: the second call is silent
        helpers.run_stack(case, level, inputs, grad_out)


# ---------------------------------------------------------------- MixingStack


def test_module_owns_w0_w1_gw_with_spec_shapes():
    mod = mixstack.MixingStack(n_focus=2, focus_dim=16, lmax=3, n_layers=4)
    sd = mod.state_dict()
    assert set(sd) == {"w0", "w1", "gw"}
    assert sd["w0"].shape == (4, 2, 64, 64)
    assert sd["w1"].shape == (4, 2, 96, 96)
    assert sd["gw"].shape == (3, 2, 16, 48)
    assert {n for n, _ in mod.named_parameters()} == {"w0", "w1", "gw"}
    one = mixstack.MixingStack(n_focus=1, focus_dim=16, lmax=1, n_layers=1)
    assert one.gw.shape == (0, 1, 16, 16)


def test_module_initialisation_scales_weights_by_width_and_depth():
    torch.manual_seed(0)
    mod = mixstack.MixingStack(n_focus=2, focus_dim=32, lmax=3, n_layers=4)
    for w, k in ((mod.w0, 128), (mod.w1, 192)):
        assert abs(w.std().item() * (k * 4) ** 0.5 - 1) < 0.05
    assert abs(mod.gw.std().item() * 32 ** 0.5 - 1) < 0.05


@pytest.mark.parametrize("n_layers", [1, 2, 4, 8])
def test_module_output_std_stays_order_one_with_depth(n_layers):
    torch.manual_seed(n_layers)
    mod = mixstack.MixingStack(n_focus=2, focus_dim=16, lmax=3, n_layers=n_layers)
    u0 = torch.randn(2, 400, mod.layout.row)
    with torch.no_grad():
        out = mod(u0, torch.ones(400, 2))
    assert torch.isfinite(out).all()
    assert 0.2 < out.std().item() < 5, out.std().item()


def test_module_forward_equals_functional_call_and_trains_its_parameters():
    torch.manual_seed(0)
    mod = mixstack.MixingStack(n_focus=2, focus_dim=4, lmax=2, n_layers=3, apply_alpha=False)
    u0 = torch.randn(2, 6, mod.layout.row)
    alpha = torch.rand(6, 2) + 0.1
    out = mod(u0, alpha)
    want = mixstack.mixing_stack(u0, alpha, mod.w0, mod.w1, mod.gw, lmax=2, focus_dim=4,
                                 apply_alpha=False)
    assert torch.equal(out, want)
    out.square().sum().backward()
    for p in mod.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_module_rejects_bad_construction_and_bad_input():
    with pytest.raises(ValueError, match="lmax"):
        mixstack.MixingStack(lmax=7)
    with pytest.raises(ValueError, match="n_layers"):
        mixstack.MixingStack(n_layers=0)
    mod = mixstack.MixingStack(n_focus=2, focus_dim=4, lmax=2, n_layers=2)
    with pytest.raises(ValueError, match=r"\bu0\b"):
        mod(torch.randn(2, 3, 27), torch.rand(3, 2))


def test_without_triton_mixstack_imports_and_runs_level_0():
    """Triton ships for Linux only: elsewhere ``import mixstack`` must work and run level 0."""
    import subprocess
    import sys
    code = (
        "import sys\n"
        "sys.modules['triton'] = None          # what `import triton` meets without it\n"
        "import torch, mixstack\n"
        "m = mixstack.MixingStack(n_focus=1, focus_dim=16, lmax=1, n_layers=2)\n"
        "u0, alpha = torch.randn(1, 5, m.layout.row), torch.rand(5, 1)\n"
        "with mixstack.use_level(2), mixstack.dispatch_log() as log:\n"
        "    out = m(u0, alpha)\n"
        "assert dict(log) == {'fwd:reference': 1}, log\n"
        "print(tuple(out.shape))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(5, 1, 64)"
