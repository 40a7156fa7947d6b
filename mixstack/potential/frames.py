"""Edge frames and real Wigner-D rows for the potential: the math lives in ``mixstack.conv.frames``
(edge frames, the Ivanic-Ruedenberg recursion, the packed rows); this module keeps its names
for the potential and adds ``WignerRows``, the recursion's constants as module buffers."""

from __future__ import annotations

import torch
from torch import nn

from ..conv.frames import edge_frames, pack_rows, step_constants, wigner_d1, wigner_full, wigner_rows  # noqa: F401


class WignerRows(nn.Module):
    """``wigner_rows(R, lmax, keep)`` with the recursion's constants as (non-persistent)
    buffers, so they follow the model's ``.to(device, dtype)`` and are never copied
    from the host during a forward."""

    def __init__(self, lmax: int, keep: int = 1, *, device=None, dtype=None):
        super().__init__()
        self.lmax, self.keep = lmax, keep
        for l, (C, s) in step_constants(lmax, keep).items():
            self.register_buffer(f"c{l}", C.to(device=device, dtype=dtype or torch.get_default_dtype()),
                                 persistent=False)
            self.register_buffer(f"s{l}", s.to(device=device, dtype=dtype or torch.get_default_dtype()),
                                 persistent=False)

    def forward(self, R: torch.Tensor) -> list[torch.Tensor]:
        constants = {l: (getattr(self, f"c{l}"), getattr(self, f"s{l}")) for l in range(2, self.lmax + 1)}
        return wigner_rows(R, self.lmax, self.keep, constants)

    def extra_repr(self) -> str:
        return f"lmax={self.lmax}, keep={self.keep}"
