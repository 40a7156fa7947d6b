"""The compiled level-0 potential (the model bench's baseline) on the CPU: its forces against
float64 under Inductor's defaults, and the two patterns the level-0 convolution avoids because
Inductor's C++ backend miscompiles them (BENCHMARKS.md, "The compiled baseline's forces: the CPU
fault isolated"; ``repro/inductor_cpu_index_put_transpose.py``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.decomposition import select_decomp_table

from mixstack.core import config
from mixstack.potential import frames as wigner

pytestmark = pytest.mark.skipif(
    config.triton_interpret(), reason="tracing tests run without TRITON_INTERPRET (second process)")


def _backward_targets(fn, *shapes) -> set[str]:
    """The ATen operators of ``fn``'s backward graph as Inductor would receive it."""
    from functorch.compile import make_boxed_func
    seen: set[str] = set()

    def keep(gm, _):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=keep,
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    args = [torch.randn(s, requires_grad=True) for s in shapes]
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch.autograd.grad(out.square().sum(), args)
    return seen


def _index_permuted(R):
    p = [1, 2, 0]
    return R[..., p, :][..., :, p]


def test_d1_is_the_permutation_and_its_backward_has_no_scatter():
    R = torch.randn(7, 3, 3)
    assert torch.equal(wigner.wigner_d1(R), _index_permuted(R))
    targets = _backward_targets(wigner.wigner_d1, (64, 3, 3))
    assert not any(op in t for t in targets for op in ("index_put", "index_add", "scatter_add")), targets
    # negative control: the index-list form's backward is the accumulating index_put the
    # C++ backend miscompiles (and torch.roll lowers to the same)
    assert any("index_put" in t for t in _backward_targets(_index_permuted, (64, 3, 3)))


def test_the_level0_stack_input_is_built_focus_major_without_a_transposed_view():
    from mixstack.potential import SO2Potential
    model = SO2Potential(lmax=2, focus_dim=16, n_focus=2, n_blocks=1, n_layers=2)
    block = model.blocks[0]
    n, e = 5, 11
    x = torch.randn(n, 9, 16)
    src = torch.randint(0, n, (e,))
    rows = wigner.wigner_rows(wigner.edge_frames(torch.randn(e, 3)), 2)
    radial = torch.randn(e, 2, block.n_radial_out, 16)
    u0 = block.rotate_in(x, src, rows, radial, torch.randn(e, 16))
    assert u0.shape == (2, e, 7 * 16) and u0.is_contiguous()


@pytest.mark.slow
def test_the_compiled_level0_frame_gives_the_float64_forces():
    """Inductor's defaults; a small model (the bench model's compile takes minutes on this CPU; the
    fault-exposing options of BENCHMARKS.md need the bench model, so they are not run here)."""
    pytest.importorskip("ase")
    from ase.build import bulk

    from mixstack.bench.model_bench import frame_fn
    from mixstack.potential import SO2Potential, atoms_inputs
    model = SO2Potential(lmax=1, focus_dim=16, n_focus=2, n_blocks=1, n_layers=2, cutoff=3.5, seed=0,
                         energy_scale=10.0).eval().requires_grad_(False)
    atoms = bulk("Cu", "bcc", a=2.87, cubic=True).repeat((2, 2, 1))
    atoms.rattle(0.05, seed=0)
    _, f64 = frame_fn("0", copy.deepcopy(model).double())(atoms_inputs(atoms, model.cutoff, dtype=torch.float64))
    torch.compiler.reset()
    inputs = atoms_inputs(atoms, model.cutoff)
    _, f = frame_fn("0c", model)(inputs)
    _, f_eager = frame_fn("0", model)(inputs)
    err = ((f.double() - f64).norm() / f64.norm()).item()
    band = ((f_eager.double() - f64).norm() / f64.norm()).item()
    assert f64.norm() > 1e-3
    assert err <= max(10 * band, 1e-5), (err, band)
