"""``potential.recompute.dropped``: saved tensors recomputed by the backward instead of kept."""

from __future__ import annotations

import pytest
import torch

from mixstack.potential import recompute


def _saved_sizes(fn):
    """Run ``fn`` under an outer saved-tensors hook; the shapes it saw being saved."""
    seen = []

    def pack(t):
        seen.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, seen


def _case():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 3, generator=g)
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    x = torch.randn(7, 5, generator=g, requires_grad=True)
    return hidden, w, x


def test_the_dropped_tensor_is_not_saved_and_the_gradient_is_unchanged():
    hidden, w, x = _case()
    weights = torch.nn.functional.linear(hidden, w)            # (7, 5): what the product saves

    def product(drop: bool, remake=None):
        def run():
            if not drop:
                return (x * weights).sum()
            with recompute.dropped((weights,), remake or (lambda: (torch.nn.functional.linear(hidden, w),))):
                return (x * weights).sum()
        return _saved_sizes(run)          # the outer hook, as a caller's would be

    kept, seen_kept = product(False)
    (g_kept,) = torch.autograd.grad(kept, x)
    assert (7, 5) in seen_kept
    out, seen = product(True)
    (g,) = torch.autograd.grad(out, x)
    assert torch.equal(g, g_kept)
    # inside the block the inner hooks pack every saved tensor: the caller's hook sees none
    assert seen == [] and seen_kept == [(7, 5), (7, 5)]
    # negative control: the backward really uses what ``remake`` returns
    out, _ = product(True, lambda: (2 * torch.nn.functional.linear(hidden, w),))
    (g_wrong,) = torch.autograd.grad(out, x)
    assert torch.equal(g_wrong, 2 * g_kept)


def test_remake_runs_once_per_backward_for_several_dropped_tensors():
    hidden, w, x = _case()
    a = torch.nn.functional.linear(hidden, w)
    b = torch.nn.functional.linear(hidden, 2 * w)
    calls = []

    def remake():
        calls.append(1)
        return torch.nn.functional.linear(hidden, w), torch.nn.functional.linear(hidden, 2 * w)

    with recompute.dropped((a, b), remake):
        out = (x * a * b).sum()
    (g,) = torch.autograd.grad(out, x)
    assert torch.allclose(g, a * b) and len(calls) == 1


def test_a_double_backward_through_a_dropped_tensor_says_why_it_cannot():
    hidden, w, x = _case()
    weights = torch.nn.functional.linear(hidden, w)
    with recompute.dropped((weights,), lambda: (torch.nn.functional.linear(hidden, w),)):
        out = (x * x * weights).sum()
    with pytest.raises(RuntimeError, match="train mode"):
        torch.autograd.grad(out, x, create_graph=True)
