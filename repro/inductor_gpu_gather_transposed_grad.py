"""Candidate GPU reproducer (not isolated on a GPU yet): the level-0 potential's "edge inputs +
stack" fusion, whose compiled backward lost the forces on an H200 (torch 2.11, 4.6e-2 relative).

A gather of node features, a rotation into the edge frame (a batched 3x3 product), a product
with per-stream weights, a focus-major transposed view read by a gated linear layer: in the
backward the gradient reaches the gather's scatter-add (an accumulating index_put) through a
transposed read, the pattern Inductor's C++ backend miscompiles on the CPU
(inductor_cpu_index_put_transpose.py).  Compares Inductor (defaults) with eager, both float32;
right: a relative gradient error near 1e-7.  No mixstack import.  ``--cpu``: the same on the CPU.
"""
import sys

import torch

dev = "cpu" if "--cpu" in sys.argv else "cuda"
if dev == "cuda" and not torch.cuda.is_available():
    sys.exit("needs a CUDA GPU (or --cpu)")
torch.manual_seed(0)
N, E, F, C = 504, 27798, 2, 32                              # cu-bcc-504's atoms and edges
src = torch.randint(0, N, (E,), device=dev)
rows = torch.randn(E, 3, 3, device=dev)
rad = torch.randn(E, F, 4, C, device=dev)
w = torch.randn(F, 4 * C, 4 * C, device=dev) / (4 * C) ** 0.5


def f(x):
    xs = x[src]                                                 # (E, 4, C): degree 0, then 1
    r = torch.matmul(rows, xs[:, 1:])                           # degree 1 into the edge frame
    u0 = (torch.cat((xs[:, :1], r), 1)[:, None] * rad).reshape(E, F, 4 * C).transpose(0, 1)
    z = torch.matmul(u0, w)                                     # (F, E, 4C), one linear per stream
    return (u0 + z * torch.sigmoid(z)).square().sum()


x = torch.randn(N, 4, C, device=dev, requires_grad=True)
want, = torch.autograd.grad(f(x), x)
for attempt in range(3):
    torch.compiler.reset()
    got, = torch.autograd.grad(torch.compile(f)(x), x)
    err = ((got - want).norm() / want.norm()).item()
    print(f"torch {torch.__version__}, attempt {attempt}: relative gradient error {err:.2e}", flush=True)
