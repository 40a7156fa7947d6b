"""Which of mixstack's kernels an AOTInductor compile of an accelerated SeZM model refuses, and why.

deepmd-kit's ``dp --pt freeze`` traces the model on the CPU (``make_fx``), exports it with a
dynamic edge count, moves the exported graph to the GPU and compiles it with AOTInductor.  With
the convolution's operators recorded (``guards.kernel_target``), the compile stops in Inductor's
``decompose_triton_kernel_wrapper_functional`` (the node counts of the kernel's clones traced with
its eager and its Inductor metadata differ).  This probe makes the same steps on a small model,
prints, for each Triton kernel call that Inductor's decomposition rejects, the kernel, the
tensors it clones and their eager and Inductor shapes and strides, and says whether the compile
passed and which mixstack kernels the package holds; with ``--load`` it loads the package (its C++
runtime private) and compares its energy, forces and virial with the exported graph run on the GPU
and with the CPU trace.

    python repro/pt2_conv_kernels.py [--config water] [--skip rotate_out_sum,...] [--load]    # a CUDA GPU
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{tuple(v.shape)} strides {tuple(v.stride())} {v.dtype} {v.device}"
    return repr(v)[:80]


def watch_decompositions() -> list:
    """Wrap Inductor's ``Match.replace_by_example`` so a rejected triton-kernel decomposition is
    described before its error goes on."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._inductor import pattern_matcher

    seen = []
    original = pattern_matcher.Match.replace_by_example

    def replace_by_example(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except AssertionError:
            node = self.nodes[0]
            kw = node.kwargs
            kernel = kernel_side_table.get_kernel(kw["kernel_idx"])
            name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
            eager_args, eager_kwargs = node.meta.get("eager_input_vals", ((), {}))
            eager = eager_kwargs.get("kwargs", {})
            lines = [f"rejected: {name}, clones {kw['tensors_to_clone']}"]
            for key in kw["tensors_to_clone"]:
                arg = kw["kwargs"][key]
                val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
                lines.append(f"  {key}: inductor {_describe(val)}; eager {_describe(eager.get(key))}")
            print("\n".join(lines), flush=True)
            seen.append(name)
            raise
    pattern_matcher.Match.replace_by_example = replace_by_example
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="water")
    ap.add_argument("--rcut", type=float, default=3.0)
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--skip", default="", help="conv operators traced as their reference formulas: "
                    "rotate_in, rotate_out_sum, edge_wigner (comma-separated)")
    ap.add_argument("--load", action="store_true", help="compile with a private C++ runtime, load the "
                    "package and compare its outputs with the exported graph run on the GPU and on the CPU")
    args = ap.parse_args(argv)

    from deepmd.pt.entrypoints import freeze_pt2
    from torch._inductor import aoti_compile_and_package
    from torch._inductor import config as inductor_config
    from torch.export.passes import move_to_device_pass

    import mixstack
    from mixstack import cxx_runtime
    from mixstack.conv import functional
    from mixstack.deepmd import accelerate
    from mixstack.deepmd.configs import build_model, perturb
    from mixstack.dispatch import guards

    skip = {s for s in args.skip.split(",") if s}
    for name in skip:                 # that operator's public function at level 0: its reference formulas
        fn = getattr(functional, name)

        def at_level0(*a, _fn=fn, **k):
            with mixstack.use_level(0):
                return _fn(*a, **k)
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("mixstack") and getattr(module, name, None) is fn:
                setattr(module, name, at_level0)

    rejected = watch_decompositions()
    # on the CPU, as deepmd-kit's freeze traces it
    model = perturb(build_model(args.config, precision="float32", rcut=args.rcut, n_blocks=1), seed=0).eval().cpu()
    accelerate(model, level=args.level)
    for module in model.modules():         # deepmd-kit's freeze bakes the block-diagonal mixer for a GPU
        if hasattr(module, "_force_block_diag_matmul"):
            module._force_block_diag_matmul = True
    _, inputs = freeze_pt2._resolve_nframes(model, nloc=7, device=torch.device("cpu"), has_spin=False)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, config {args.config}, "
          f"level {args.level}, reference formulas for {sorted(skip) or 'none'}", flush=True)
    with mixstack.use_level(args.level), guards.kernel_target("cuda"):
        traced = model.forward_common_lower_exportable(*inputs)
    ops = sorted({str(n.target) for n in traced.graph.nodes if "mixstack" in str(n.target)})
    print("traced mixstack operators:", ops, flush=True)
    exported = torch.export.export(traced, inputs, dynamic_shapes=freeze_pt2._build_dynamic_shapes(inputs),
                                   strict=False, prefer_deferred_runtime_asserts_over_guards=True)
    freeze_pt2._strip_shape_assertions(exported.graph_module)
    exported = move_to_device_pass(exported, torch.device("cuda"))
    options = freeze_pt2.build_inductor_compile_options(inference=True)      # deepmd-kit's own
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/probe.pt2"
        try:
            with inductor_config.patch({**options, "triton.max_tiles": 1}), cxx_runtime.private_runtime(args.load):
                aoti_compile_and_package(exported, package_path=path)
            print("compile: passed; kernels:", package_kernels(path), flush=True)
        except Exception as exc:
            print(f"compile: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}; "
                  f"rejected kernels {rejected}", flush=True)
            return 0
        if args.load:
            compare(torch._inductor.aoti_load_package(path), exported, traced, inputs)
    return 0


def package_kernels(path: str) -> list:
    """The mixstack kernels a package holds (``mixstack info --package``'s reading)."""
    from mixstack.packages import package_kernels as listed
    return sorted(listed(path).mixstack)


def compare(package, exported, traced, inputs) -> None:
    """The package's outputs against the exported graph run eagerly on the GPU (mixstack's kernels)
    and the CPU trace run on the CPU (the operators' reference branch)."""
    cuda = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in inputs)
    got = package(*cuda)
    eager = exported.module()(*cuda)
    with torch.no_grad():
        cpu = traced(*inputs)
    for key in ("energy", "energy_derv_r", "energy_derv_c_redu"):
        if key not in cpu:
            continue
        ref = cpu[key].double()
        scale = ref.abs().max().item() or 1.0
        print(f"{key}: package vs GPU graph {(got[key].double().cpu() - eager[key].double().cpu()).abs().max().item() / scale:.2e}, "
              f"vs CPU reference {(got[key].double().cpu() - ref).abs().max().item() / scale:.2e} (relative to the largest)",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
