"""What torch's compilers think the convolution's kernels write: only the outputs their launchers
allocate, never an input.

A compiled graph (``torch.compile``, AOTInductor) learns which tensors a Triton kernel writes from
torch's analysis of the kernel's TTIR, which counts every pointer argument of a ``@triton.jit``
call whose results address a store as written.  An input counted so is copied before each launch,
and AOTInductor's decomposition of such a kernel failed outright on the GPU (the edges' source
index, passed into the helper that also returned the edge block: ``repro/pt2_conv_kernels.py``).
Here the operators run on the CPU with their launches recorded instead of run, and torch's own
analysis is asked about each launch (TTIR made for an sm_90 target; no GPU needed)."""

from __future__ import annotations

import sys

import pytest
import torch
from conv_cases import InCase, OutCase, in_inputs, out_inputs

import mixstack
from mixstack import tuning
from mixstack.core import config

pytestmark = pytest.mark.skipif(config.triton_interpret(), reason="the analysis reads compiled kernels' TTIR")

LAUNCH_MODULES = ("mixstack.conv.launchers", "mixstack.conv.wigner_ops", "mixstack.stack.launchers",
                  "mixstack.stack.gemm", "mixstack.stack.training", "mixstack.deepmd.rest_products")


class _Recorder:
    """Stands in for ``wrap_triton``: ``recorder(kernel)[grid](*args, **kwargs)`` records the launch."""

    def __init__(self):
        self.launches = []

    def __call__(self, kernel):
        def launch(*args, **kwargs):
            self.launches.append((kernel, {**dict(zip(kernel.arg_names, args)), **kwargs}))
        return _Grid(launch)


class _Grid:
    def __init__(self, launch):
        self.launch = launch

    def __getitem__(self, grid):
        return self.launch


@pytest.fixture
def recorded(monkeypatch):
    """The convolution's and the stack's operators taking their kernel branch on CPU tensors, each
    launch recorded."""
    import importlib

    import triton

    from mixstack.dispatch import guards

    try:
        triton.runtime.driver.active.get_current_target()
    except RuntimeError:                       # no GPU driver here: TTIR for an H100's target
        from triton.backends.compiler import GPUTarget

        class _Target:
            def get_current_target(self):
                return GPUTarget("cuda", 90, 32)
        monkeypatch.setattr(triton.runtime.driver, "_active", _Target())
    recorder = _Recorder()
    for name in LAUNCH_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "wrap_triton", recorder)
    importlib.import_module("mixstack.stack.ops")                # holds kernels_can_run by name
    original = guards.kernels_can_run
    for module in list(sys.modules.values()):              # wherever a module holds it by name
        if getattr(module, "__name__", "").startswith("mixstack") and \
                getattr(module, "kernels_can_run", None) is original:
            monkeypatch.setattr(module, "kernels_can_run", lambda t: True)
    return recorder


def _written(kernel, kwargs) -> set:
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    if hasattr(tkw, "identify_accessed_tensors"):
        accesses = tkw.identify_accessed_tensors(kernel, dict(kwargs), {})
        names = {dep.name for dep in accesses.read_writes.writes}
    else:
        names = set(tkw.identify_mutated_tensors(kernel, dict(kwargs), {}))
    return {n for n in names if n in tensors}


# Known, and small: the gate kernels (and the double backward's tangent kernel) pass the layer's
# gate weights (Cf x lmax*Cf, a few KiB) into ``gate_operands``, whose results address their
# stores, so a compiled graph copies them before each launch.  Moving them out changes the kernels' code and so voids every shipped tuning entry
# of the stack's families (``tuning.kernel_hash``): it waits for the tables' next tuning.
KNOWN = {"gate_kernel": {"gw_ptr", "gwlo_ptr", "gwup_ptr"}, "gate_backward_kernel": {"gw_ptr", "gwlo_ptr", "gwup_ptr"},
         "tangent_kernel": {"gw_ptr"}}


def _check(recorder, inputs):
    """Every recorded launch writes no tensor that shares memory with ``inputs`` (but ``KNOWN``)."""
    assert recorder.launches
    held = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    for kernel, kwargs in recorder.launches:
        written = _written(kernel, kwargs)
        assert written, kernel.fn.__name__                         # the analysis sees the outputs
        bad = sorted(n for n in written if kwargs[n].numel() and kwargs[n].untyped_storage().data_ptr() in held
                     and n not in KNOWN.get(kernel.fn.__name__, ()))
        assert not bad, f"{kernel.fn.__name__} counted as writing its inputs {bad}"


@pytest.mark.parametrize("case", [InCase(N=5, E=9, F=2, C=16, lmax=2, radial="full", mix=None, streams=False),
                                  InCase(N=5, E=9, F=2, C=16, lmax=3, radial="degree", mix="shared")], ids=str)
def test_rotate_in_and_its_backward_write_only_their_outputs(recorded, case):
    inp = in_inputs(case)
    x, wigner, radial = (inp[k].requires_grad_() for k in ("x", "wigner", "radial"))
    ew = inp["edge_weight"].requires_grad_()
    mix = None if inp["kernel"] is None else mixstack.DegreeMix(inp["kernel"].requires_grad_(), inp.get("basis"))
    with mixstack.use_level(2):
        u = mixstack.rotate_in(x, wigner, radial, inp["src"], edge_weight=ew,
                               streams=case.F if case.streams else None, degree_mix=mix)
        cot = torch.randn(u.shape)
        torch.autograd.grad(u, [x, wigner, radial, ew], cot, allow_unused=True)
    _check(recorded, [x, wigner, radial, ew, inp["src"], cot, inp["kernel"]])
    names = {k.fn.__name__ for k, _ in recorded.launches}
    assert {"rotate_in_kernel", "rotate_in_grad_kernel"} <= names, names


def test_rotate_out_sum_and_its_backward_write_only_their_outputs(recorded):
    case = OutCase(N=5, E=9, F=2, C=16, lmax=2, weight="edge", blocks=False, order=False, scale=False)
    inp = out_inputs(case)
    y, wigner, ew = (inp[k].requires_grad_() for k in ("y", "wigner", "edge_weight"))
    with mixstack.use_level(2):
        out = mixstack.rotate_out_sum(y, wigner, inp["dst"], case.N, edge_weight=ew, streams="sum")
        cot = torch.randn(out.shape)
        torch.autograd.grad(out, [y, wigner, ew], cot)
    _check(recorded, [y, wigner, ew, inp["dst"], cot])
    names = {k.fn.__name__ for k, _ in recorded.launches}
    assert {"rotate_out_grad_kernel", "segment_rotate_back_kernel"} <= names, names


def test_the_edge_wigner_rows_and_their_backward_write_only_their_outputs(recorded):
    vec = torch.randn(9, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()
    with mixstack.use_level(2):
        w = mixstack.edge_wigner(vec, 3)
        cot = torch.randn(w.shape)
        torch.autograd.grad(w, [vec], cot)
    _check(recorded, [vec, cot])
    names = {k.fn.__name__ for k, _ in recorded.launches}
    assert {"edge_wigner_kernel", "edge_wigner_grad_kernel"} <= names, names


@pytest.mark.parametrize("level, twice", [(2, False), (3, False), (2, True)])
def test_the_stacks_kernels_write_only_their_outputs(recorded, level, twice):
    """The stack's forward, backward and weight gradients at levels 2 and 3, and (``twice``) the
    double backward of force training."""
    import helpers

    case = helpers.Case(F=2, E=40, Cf=16, lmax=2, n_layers=2, apply_alpha=True)
    u0, alpha, w0, w1, gw = helpers.make_inputs(case)
    leaves = [t.requires_grad_() for t in (u0, alpha, w0, w1, gw)]
    key = tuning.shape_key(focus_dim=case.Cf, lmax=case.lmax, n_focus=case.F, apply_alpha=case.apply_alpha)
    comp = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}     # level 3's entry: compensated
    with mixstack.use_level(level), tuning.registration("stack_compensated", key, comp):
        out = mixstack.mixing_stack(u0, alpha, w0, w1, gw, lmax=case.lmax, focus_dim=case.Cf)
        cot = torch.randn(out.shape)
        if twice:
            (g,) = torch.autograd.grad(out, [u0], cot, create_graph=True)
            torch.autograd.grad(g.square().sum(), leaves, allow_unused=True)
        else:
            torch.autograd.grad(out, leaves, cot)
    _check(recorded, [u0, alpha, w0, w1, gw, cot])
    names = {k.fn.__name__ for k, _ in recorded.launches}
    assert {"gate_kernel", "gate_backward_kernel", "wgrad_kernel"} <= names, names
    assert not twice or "tangent_kernel" in names, names
    assert level < 3 or {"split_weights_kernel", "row_amax_kernel"} & names, names      # the compensated path


def test_rotate_in_with_a_linear_radial_layer_writes_only_its_outputs(recorded):
    case = InCase(N=5, E=20, F=2, C=16, lmax=2, radial=None, mix=None, streams=False)
    inp = in_inputs(case)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(case.E, 16, generator=g).requires_grad_()
    weight = torch.randn(case.F, 2 * case.lmax + 1, case.C, 16, generator=g)
    bias = torch.randn(case.F, 2 * case.lmax + 1, case.C, generator=g)
    x, wigner = (inp[k].requires_grad_() for k in ("x", "wigner"))
    with mixstack.use_level(2):
        u = mixstack.rotate_in(x, wigner, mixstack.LinearRadial(hidden, weight, bias), inp["src"])
        cot = torch.randn(u.shape)
        torch.autograd.grad(u, [x, wigner, hidden], cot)
    _check(recorded, [x, wigner, hidden, weight, bias, inp["src"], cot])
    linear = {k.fn.__name__ for k, kw in recorded.launches if kw.get("LINEAR")}
    assert linear == {"rotate_in_kernel", "rotate_in_grad_kernel"}, linear


@pytest.mark.parametrize("shapes", [((40, 27), (27, 24)), ((2, 24, 32), (2, 32, 90))], ids=["plain", "wider-b"])
def test_the_compensated_product_writes_only_its_output(recorded, shapes):
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    torch.ops.mixstack.compensated_product(a, b)
    _check(recorded, [a, b])
    assert {k.fn.__name__ for k, _ in recorded.launches} == {"compensated_product_kernel"}
