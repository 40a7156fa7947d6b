"""Shared pieces of the mixstack.deepmd tests: deepmd-kit or a clean skip, SeZM convolutions on
a synthetic edge cache (deepmd-kit's own Wigner blocks), whole models on small frames, and the
comparisons.

The tolerances: float64 against deepmd-kit's float64 path, ``FLOAT64_RTOL`` of the largest
value; float32, ``fp32_tolerance``: four times the unaccelerated float32 model's own distance
from its float64 twin (the same weights), and at least 32 float32 ulps of the largest value
(256 for training gradients, a chain twice as long through a double backward).
"""

from __future__ import annotations

import copy

import pytest
import torch

FLOAT64_RTOL = 1e-12
KEYS = ("energy", "force", "virial")
# the water example cut to one block of two mixing layers: the traced and compiled tests' graphs grow
# with the blocks
SMALL = {"n_blocks": 1, "mixing_layers": 2}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The deepmd-kit tests run tiny tensors: one intra-op thread (two processes share two cores
    in the suite, where torch's thread pools would spin against each other)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def on_device(frame, dtype, device):
    """``frame`` cast to ``dtype`` and moved to ``device``."""
    return tuple(None if t is None else t.to(device) for t in cast_frame(frame, dtype))


def require_deepmd():
    """Skip the calling module when deepmd-kit (with its PyTorch backend) is not installed."""
    pytest.importorskip("deepmd", reason="deepmd-kit is not installed (from a clone of mixstack: pip install -e '.[deepmd]')")
    pytest.importorskip("e3nn", reason="e3nn is not installed (from a clone of mixstack: pip install -e '.[deepmd]')")
    from mixstack.deepmd.compat import deepmd_pt

    try:
        deepmd_pt()
    except ImportError as err:                       # pragma: no cover - only without deepmd-kit
        pytest.skip(str(err), allow_module_level=True)


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b|`` over ``max |b|`` (in float64)."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def model_outputs(model, frame) -> dict:
    """Energy, forces and virial of ``model`` on ``frame = (coord, atype, box)``, detached."""
    coord, atype, box = frame
    out = model(coord.clone(), atype, None if box is None else box.clone())
    return {k: out[k].detach() for k in KEYS if k in out}


def cast_frame(frame, dtype):
    coord, atype, box = frame
    return coord.to(dtype), atype, None if box is None else box.to(dtype)


def fp32_tolerance(ref32: torch.Tensor, ref64: torch.Tensor, ulps: int = 32) -> float:
    """The float32 bar for one output: see the module docstring (``ulps`` the floor)."""
    scale = ref64.abs().max().item()
    return max(4 * (ref32.double() - ref64).abs().max().item(), ulps * torch.finfo(torch.float32).eps * scale)


def make_model(name: str, precision: str, *, rcut: float = 3.0, seed: int = 0, backend: str = "pt", **descriptor):
    """A perturbed model of config ``name`` (mixstack.deepmd.configs) in eval mode, of deepmd-kit's
    ``backend`` (``"pt"`` or ``"pt_expt"``)."""
    from mixstack.deepmd.configs import build_model, perturb

    model = perturb(build_model(name, precision=precision, rcut=rcut, backend=backend, **descriptor), seed=seed)
    return model.eval()


def float64_twin(model, name: str, *, rcut: float = 3.0, backend: str = "pt", **descriptor):
    """``model``'s weights in a float64 model of the same config."""
    from mixstack.deepmd.configs import build_model

    twin = build_model(name, precision="float64", rcut=rcut, backend=backend, **descriptor)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


def accelerated_copy(model, level=None):
    """A deep copy of ``model`` with ``mixstack.deepmd.accelerate`` applied, and its report."""
    from mixstack.deepmd import accelerate

    fast = copy.deepcopy(model)
    return fast, accelerate(fast, level=level)


# --- a single convolution on a synthetic edge cache -------------------------------------------------

def make_conv(*, lmax=2, channels=32, dtype=torch.float64, seed=0, scale=0.05, **options):
    """A SeZM ``SO2Convolution`` with ``options`` and every parameter perturbed (its
    ``post_focus_mix`` starts at zero)."""
    from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution

    from mixstack.deepmd.configs import perturb

    kw = dict(lmax=lmax, mmax=1, channels=channels, mixing_layers=3, n_atten_head=1,
              radial_so2_mode="degree_channel", radial_so2_rank=1, dtype=dtype, seed=seed, trainable=True)
    kw.update(options)
    return perturb(SO2Convolution(**kw), seed=seed, scale=scale)


def conv_inputs(conv, *, n_nodes=7, n_edges=23, seed=0, sorted_dst=False, source_gate=False,
                requires_grad=False):
    """``(x (N, D, C), edge_cache, radial_feat (E, lmax+1, C))`` for ``conv``: random edge vectors
    and features, deepmd-kit's own Wigner blocks, envelope weights with an exact zero, an atom
    with no incoming edge; destinations shuffled unless ``sorted_dst``."""
    from deepmd.pt.model.descriptor.sezm_nn.edge_cache import EdgeFeatureCache
    from deepmd.pt.model.descriptor.sezm_nn.wignerd import WignerDCalculator, build_edge_quaternion

    dtype = conv.dtype
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n_nodes - 1, (n_edges,), generator=gen)       # atom n_nodes-1: no edges
    src = torch.randint(0, n_nodes, (n_edges,), generator=gen)
    if sorted_dst:
        dst = dst.sort().values
    vec = torch.randn(n_edges, 3, generator=gen, dtype=torch.float64).to(dtype)
    vec.requires_grad_(requires_grad)
    env = torch.rand(n_edges, 1, generator=gen, dtype=torch.float64).to(dtype)
    env[0] = 0.0
    gate = torch.rand(n_edges, 1, generator=gen, dtype=torch.float64).to(dtype) if source_gate else None
    quat = build_edge_quaternion(vec, eps=1e-7)
    d_full, dt_full = WignerDCalculator(conv.lmax, dtype=dtype)(quat)
    deg = torch.zeros(n_nodes, dtype=dtype).index_add(0, dst, env.squeeze(-1).square())
    cache = EdgeFeatureCache(src=src, dst=dst, edge_type_feat=torch.zeros(n_edges, conv.channels, dtype=dtype),
                             edge_vec=vec, edge_rbf=torch.zeros(n_edges, 1, dtype=dtype), edge_env=env, deg=deg,
                             inv_sqrt_deg=torch.rsqrt(deg + 1.0).view(-1, 1, 1), D_full=d_full, Dt_full=dt_full,
                             D_to_m_cache={}, Dt_from_m_cache={}, edge_src_gate=gate, edge_quat=quat)
    d = (conv.lmax + 1) ** 2
    x = torch.randn(n_nodes, d, conv.channels, generator=gen, dtype=torch.float64).to(dtype)
    radial = torch.randn(n_edges, conv.lmax + 1, conv.channels, generator=gen, dtype=torch.float64).to(dtype)
    return x.requires_grad_(requires_grad), cache, radial.requires_grad_(requires_grad)


def accelerated_conv(conv, level=None):
    """A deep copy of ``conv`` switched to ``MixstackSO2Convolution``."""
    from mixstack.deepmd import accelerate

    fast = copy.deepcopy(conv)
    report = accelerate(fast, level=level)
    assert report.on_mixstack == (type(conv).__name__,), str(report)
    return fast
