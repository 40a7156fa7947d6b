"""Inductor's C++ backend miscompiles an accumulating index_put whose value is read transposed.

    v = a + b.transpose(1, 2)
    out = aten.index_put(zeros(B, N, N), [None, None, idx], v, accumulate=True)

is the backward of ``R[..., p, :][..., :, p]`` (a permutation of both axes of a batch of 3x3
matrices).  Compiled for the CPU and run with more than one thread, the generated kernel stores
at ``3*x1 + 6*x1_inner`` instead of ``3*x1 + 3*x1_inner``: wrong values, then a write past the
buffer (glibc aborts in free()).  No mixstack import.  Run: python repro/inductor_cpu_index_put_transpose.py
"""
import torch

torch.manual_seed(0)
B, N = 64, 3
idx = torch.tensor([1, 2, 0])                  # a permutation


def f(a, b):
    v = a + b.transpose(1, 2)
    return torch.ops.aten.index_put(torch.zeros(B, N, N), [None, None, idx], v, True)


a, b = torch.randn(B, N, N), torch.randn(B, N, N)
want = f(a, b)
got = torch.compile(f)(a, b)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
print("max abs error:", (got - want).abs().max().item(), flush=True)     # 0.0 when right
