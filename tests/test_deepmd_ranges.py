"""``deepmd_ranges.kernel_split``: a frame's device kernels charged to stages by name, so that a
compiled frame, whose module ranges hold nothing, still shows its value path."""

from __future__ import annotations

from types import SimpleNamespace

from torch.autograd import DeviceType

from mixstack.bench import deepmd_bench, deepmd_ranges
from mixstack.packages import jit_function_names


def _kernel(name, us):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_time=us)


def test_mixstack_kernels_are_charged_by_their_module():
    named = deepmd_ranges.kernel_stages()
    assert named["block_gemm_kernel"] == "value_path"              # the stack's
    assert named["rotate_in_kernel"] == "value_path"               # the convolution's
    assert named["compensated_product_kernel"] == "products"       # deepmd-kit's own products, split
    assert not any(name.startswith("triton_") for name in named)   # Inductor's kernels are never named


def test_deepmd_kits_sezm_kernels_are_charged_where_it_is_installed():
    from deepmd_cases import require_deepmd
    require_deepmd()
    import importlib
    named = deepmd_ranges.kernel_stages()
    for module, stage in (("so2_block_gemm", "value_path"), ("wigner_monomials", "wigner")):
        kernels = jit_function_names(importlib.import_module(f"deepmd.kernels.triton.sezm.{module}"))
        assert kernels and {named[k] for k in kernels} == {stage}


def test_the_split_sums_to_the_device_time_and_leaves_the_ranges_out():
    host = SimpleNamespace(name="aten::mm", device_type=DeviceType.CPU, device_time=0.0)
    events = [_kernel("block_gemm_kernel", 30.0), _kernel("gate_kernel", 5.0),
              _kernel("compensated_product_kernel", 7.0), _kernel("triton_poi_fused_mul_0", 11.0),
              _kernel("Memset (Device)", 2.0), _kernel("stage::value_path", 35.0), host]
    split = deepmd_ranges.kernel_split(events)
    assert split == {"wigner": 0.0, "value_path": 35.0, "products": 7.0, "other": 13.0}


def test_a_compiled_variant_shows_its_value_path_by_kernel_names():
    zero = {"forward_ms": 0.0, "backward_ms": 0.0}
    stages = {s: dict(zero) for s in (*deepmd_ranges.STAGES, "other")}
    stages["edges"]["forward_ms"] = 0.25
    stages["other"]["forward_ms"] = 26.0                       # everything ran inside the compiled graph
    variant = {"time": {"median_ms": 27.5, "p20_ms": 27.4, "p80_ms": 27.6},
               "breakdown": {"busy_ms": 26.25, "stages": stages,
                             "kernels": {"wigner_ms": 0.0, "value_path_ms": 8.0, "products_ms": 1.0,
                                         "other_ms": 17.25}}}
    env = {"device": {"name": "cpu", "type": "cpu", "threads": 1}, "mixstack": "0", "torch": "0", "triton": "0",
           "cuda": None, "driver": None, "python": "3", "date": "today", "git_revision": None}
    record = {"env": env, "command": "", "cases": [{"config": "water", "system": "water", "atoms": 3999,
                                                   "variants": {"ms3cg": variant}}]}
    text = deepmd_bench.markdown(record)
    row = next(line for line in text.splitlines() if line.startswith("| water | water | 3999 | ms3cg | 27.50"))
    header = next(line for line in text.splitlines() if line.startswith("| config |"))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert [cells["edges, fwd ms"], cells["Wigner to aggregation, fwd+bwd ms"], cells["rest, fwd+bwd ms"]] == \
        ["0.25", "8.00", "18.00"]                               # edges, value path by kernels, the rest
    stage_row = [line for line in text.splitlines() if line.startswith("| water | water | 3999 | ms3cg |")][1]
    assert stage_row.rstrip(" |").endswith("| 0.00 | 8.00 | 1.00 | 17.25")
