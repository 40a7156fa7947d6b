"""Saved tensors that autograd recomputes instead of keeping: a frame's memory for one product.

``dropped(tensors, remake)`` is a ``torch.autograd.graph.saved_tensors_hooks`` context: while it
is open, an operator that saves one of ``tensors`` for its backward keeps a note of ``remake``
(a function that returns them again) in its place, and the backward calls it when it unpacks
its saved tensors.  The potential uses it for the radial weights that ``rotate_in`` saves:
products of a small hidden layer, far cheaper to recompute than to hold across the stack.

Eager autograd only: a compiler plans its own saved tensors (callers skip this while
compiling).  The recomputed tensors must equal the dropped ones bit for bit, which holds for a
deterministic ``remake`` of unchanged inputs (the potential's is ``nn.functional.linear``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch


class _Remade:
    """``remake``'s results, made once for the unpacking of one backward and handed out by
    index (each dropped tensor is unpacked once per backward; the results are let go once all
    were taken, and made again if a second backward asks)."""

    def __init__(self, remake: Callable[[], Sequence[torch.Tensor]], count: int):
        self.remake, self.count = remake, count
        self.results: list | None = None
        self.taken = 0

    def take(self, index: int) -> torch.Tensor:
        if self.results is None:
            with torch.no_grad():
                self.results = list(self.remake())
            self.taken = 0
        t = self.results[index]
        self.taken += 1
        if self.taken >= self.count:
            self.results = None
        return t


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device


@contextlib.contextmanager
def dropped(tensors: Sequence[torch.Tensor], remake: Callable[[], Sequence[torch.Tensor]]):
    """Within the block, saving any of ``tensors`` for a backward keeps a note instead;
    ``remake()`` must return tensors equal to ``tensors``, in order."""
    keys = [_key(t) for t in tensors]
    remade = _Remade(remake, len(keys))

    def pack(t: torch.Tensor):
        key = _key(t)
        return ("mixstack.recompute", keys.index(key)) if key in keys else t

    def unpack(saved):
        if isinstance(saved, tuple) and saved[0] == "mixstack.recompute":
            if torch.is_grad_enabled():
                raise RuntimeError(
                    "a double backward (create_graph=True) reached tensors this forward did not keep "
                    "(a mixstack potential in eval mode recomputes its radial weights for a first-order "
                    "backward only): put the module in train mode for force losses")
            return remade.take(saved[1])
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
