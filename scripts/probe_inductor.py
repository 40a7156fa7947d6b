"""Which compiled piece of the potential loses the forces on the GPU (a probe, not a test).

The compiled level-0 baseline's forces were wrong on the H200 (torch 2.11,
Triton 3.6) while its energy was right; compiling whole interaction blocks
reproduced it, compiling the stack alone did not.  This compiles
consecutive spans of each block's five stages (edge inputs, stack, rotation
back, aggregation, node update) as one graph each, then the whole model
through backends that stop short of Inductor's code generation
(``aot_eager``: AOTAutograd's joint graph and partition run eagerly) and
under a few Inductor options, and prints each run's force error against
the float64 model.

    PYTHONPATH=. python scripts/probe_inductor.py cu-bcc 500 [--index-put]

``--index-put``: only eager, the whole model under Inductor, and the whole
model with ``aten.index_put`` (the gathers' backward, a scatter-add) left to
ATen instead of Inductor's lowering; on the CPU that fallback removed both the
wrong forces and the heap corruption of the ``max_fusion_size=1`` build.
"""

from __future__ import annotations

import copy
import sys
import types

import torch

from mixstack.bench.model_bench import DEFAULT_MODEL, build_cell
from mixstack.potential import SO2Potential, atoms_inputs

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe_model import forces, report  # noqa: E402

STAGES = ("edge_inputs", "stack", "from_edge_frame", "aggregate", "node_update")


def _stage(block, name, st):
    """One stage of ``InteractionBlock.forward`` on the state dict ``st`` (returns the new entries)."""
    if name == "edge_inputs":
        u0, alpha = block.edge_inputs(st["x"], st["src"], st["dst"], st["rows"], st["rbf"], st["env"])
        return {"u0": u0, "alpha": alpha}
    if name == "stack":
        n_edges = st["src"].shape[0]
        return {"out": block.stack(st["u0"], st["alpha"]).sum(1).view(n_edges, 3 * block.lmax + 1, block.c)}
    if name == "from_edge_frame":
        return {"msg": block.from_edge_frame(st["out"], st["rows"]) * st["env"][:, None, None]}
    if name == "aggregate":
        return {"agg": block.aggregate(st["msg"], st["slots"])}
    return {"x_new": block.node_update(st["x"], st["agg"])}


def compile_span(block, first: int, last: int, **compile_kw):
    """Replace ``block.forward`` by the five stages with stages ``first..last`` as one compiled graph."""
    def span(st):
        new = {}
        for name in STAGES[first:last + 1]:
            new.update(_stage(block, name, {**st, **new}))
        return new
    compiled = torch.compile(span, dynamic=False, **compile_kw)

    def forward(self, x, src, dst, rows, rbf, env, slots):
        st = dict(x=x, src=src, dst=dst, rows=rows, rbf=rbf, env=env, slots=slots)
        for i, name in enumerate(STAGES):
            if i == first:
                st.update(compiled(st))
            elif not first <= i <= last:
                st.update(_stage(self, name, st))
        return st["x_new"]
    block.forward = types.MethodType(forward, block)


def fall_back_to_aten(*names):
    """Leave the ATen ops ``names`` (packets of ``torch.ops.aten``) to ATen in Inductor's
    graphs from now on, in this process."""
    from torch._inductor import lowering
    for name in names:
        packet = getattr(torch.ops.aten, name)
        for op in [packet] + [getattr(packet, o) for o in packet.overloads()]:
            lowering.lowerings.pop(op, None)
        lowering.make_fallback(packet, warn=False)


def main(cell="cu-bcc", atoms_n="500", *flags):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    atoms = build_cell(cell, int(atoms_n), seed=0)
    model = SO2Potential(**DEFAULT_MODEL, seed=0, device=dev).eval()
    model64 = copy.deepcopy(model).double()
    inp = atoms_inputs(atoms, model.cutoff, device=dev)
    e64, f64 = forces(model64, atoms_inputs(atoms, model.cutoff, device=dev, dtype=torch.float64), 0)
    n = len(atoms)
    print(f"{cell}-{n}, torch {torch.__version__}", flush=True)
    report("eager", forces(model, inp, 0), e64, f64, n)
    if "--index-put" in flags:
        torch._inductor.config.force_disable_caches = True     # the FX graph cache key misses the fallback
        report("all, inductor", forces(copy.deepcopy(model), inp, 0, True), e64, f64, n)
        torch._dynamo.reset()
        fall_back_to_aten("index_put", "_unsafe_index_put")
        report("all, inductor, index_put in ATen", forces(copy.deepcopy(model), inp, 0, True), e64, f64, n)
        return 0
    for backend in ("aot_eager", "aot_eager_decomp_partition"):
        torch._dynamo.reset()
        report(f"all, {backend}", forces(copy.deepcopy(model), inp, 0, True, backend=backend), e64, f64, n)
    report("all, inductor", forces(copy.deepcopy(model), inp, 0, True), e64, f64, n)
    torch._dynamo.reset()
    report("all, inductor, no parameter grads",
           forces(copy.deepcopy(model).requires_grad_(False), inp, 0, True), e64, f64, n)
    spans = [(i, i) for i in range(5)] + [(i, i + 1) for i in range(4)] + [(0, 2), (1, 3), (2, 4), (0, 4)]
    for first, last in spans:
        torch._dynamo.reset()
        m = copy.deepcopy(model)
        for block in m.blocks:
            compile_span(block, first, last)
        report("+".join(STAGES[first:last + 1]), forces(m, inp, 0), e64, f64, n)
    for label, opts in {"split_reductions=False": {"split_reductions": False},
                        "no fusion across nodes": {"max_fusion_size": 1}}.items():
        torch._dynamo.reset()
        report(f"all, {label}", forces(copy.deepcopy(model), inp, 0, True, options=opts), e64, f64, n)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
