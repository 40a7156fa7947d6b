"""What ``mixstack.deepmd.accelerate`` did: per SO(2) convolution, where it runs and why."""

from __future__ import annotations

from dataclasses import dataclass

MIXSTACK = "mixstack"
DEEPMD = "deepmd"


@dataclass(frozen=True)
class ConvolutionReport:
    """One SeZM ``SO2Convolution``: ``name`` its module path in the model, ``runs_on``
    ``"mixstack"`` or ``"deepmd"``, and ``reason``, the one option mixstack does not reproduce
    (``None`` on mixstack)."""

    name: str
    runs_on: str
    reason: str | None = None


@dataclass(frozen=True)
class AccelerationReport:
    """Every SO(2) convolution of the model, in module order; ``level`` the mixstack level they
    run at (``None``: the active level at each call); ``full_wigner_skipped`` the SeZM
    descriptors whose edge cache no longer builds deepmd-kit's ``(E, D, D)`` Wigner blocks,
    because none of their convolutions reads them any more."""

    level: int | None
    convolutions: tuple[ConvolutionReport, ...]
    full_wigner_skipped: tuple[str, ...] = ()

    def __iter__(self):
        return iter(self.convolutions)

    def __len__(self) -> int:
        return len(self.convolutions)

    @property
    def on_mixstack(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.convolutions if c.runs_on == MIXSTACK)

    @property
    def on_deepmd(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.convolutions if c.runs_on == DEEPMD)

    def __str__(self) -> str:
        level = "the active level" if self.level is None else f"level {self.level}"
        lines = [f"mixstack.deepmd: {len(self.on_mixstack)} of {len(self)} SO(2) convolutions "
                 f"on mixstack ({level})"]
        for conv in self.convolutions:
            why = "" if conv.reason is None else f": {conv.reason}"
            lines.append(f"  {conv.name}: {conv.runs_on}{why}")
        for name in self.full_wigner_skipped:
            lines.append(f"  {name}: deepmd's full Wigner blocks not built")
        return "\n".join(lines)
