"""Shape keys: what a tuning-table entry is measured for.

A key holds the sizes that change which launch config wins (docs/contract.md §5):
``focus_dim``, ``lmax``, ``n_focus`` and ``apply_alpha``.  The edge count and
the depth are not in it: winners are stable above ~2e5 edges (upstream sweeps, BENCHMARKS.md,
"Lessons from an earlier implementation that the code relies on") and every layer launches the
same kernels.

Keys may grow fields later (an edge-count bucket, say).  Such a field arrives
through ``shape_key(**extra)`` and is stored in ``extra``; a field left at its
default (``None``) is not stored at all, so a key written before the field
existed and a key that leaves it at its default are the same key, with the same
string form.  The string form (``str(key)``, ``ShapeKey.parse``) is what the
JSON tables hold: ``focus_dim=32;lmax=3;n_focus=2;apply_alpha=1``, then any
extra fields sorted by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.layout import LMAX_RANGE, StackLayout

# The fields every key has, in the order of its string form (an ``extra`` field may not reuse a name).
_BASE = ("focus_dim", "lmax", "n_focus", "apply_alpha")


def _check_int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"shape key: {name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"shape key: {name} must be >= {low}, got {value}")
    return value


def _check_extra_value(name: str, value):
    if not isinstance(value, (bool, int, str)):
        raise TypeError(f"shape key: extra field {name} must be a bool, int or str, "
                        f"got {type(value).__name__}")
    if isinstance(value, str) and any(c in value for c in ";="):
        raise ValueError(f"shape key: extra field {name} may not contain ';' or '=', got {value!r}")
    return value


@dataclass(frozen=True)
class ShapeKey:
    """A hashable, immutable tuning key.  Build it with ``shape_key(...)``."""

    focus_dim: int
    lmax: int
    n_focus: int
    apply_alpha: bool
    extra: tuple[tuple[str, bool | int | str], ...] = ()

    def __post_init__(self):
        _check_int("focus_dim", self.focus_dim)
        _check_int("lmax", self.lmax)
        if self.lmax not in LMAX_RANGE:
            raise ValueError(f"shape key: lmax must be in 1..6, got {self.lmax}")
        _check_int("n_focus", self.n_focus)
        if not isinstance(self.apply_alpha, bool):
            raise TypeError(f"shape key: apply_alpha must be a bool, got {type(self.apply_alpha).__name__}")
        names = [n for n, _ in self.extra]
        if names != sorted(set(names)):
            raise ValueError(f"shape key: extra fields must be unique and sorted, got {names}")

    @property
    def layout(self) -> StackLayout:
        return StackLayout(self.lmax, self.focus_dim)

    def get(self, name: str, default=None):
        """An extra field's value, or ``default`` where the key leaves it unset."""
        return dict(self.extra).get(name, default)

    def __str__(self) -> str:
        parts = [f"{name}={int(getattr(self, name))}" for name in _BASE]
        for name, value in self.extra:
            text = ("b:" + str(int(value))) if isinstance(value, bool) else (
                str(value) if isinstance(value, int) else "s:" + value)
            parts.append(f"{name}={text}")
        return ";".join(parts)

    def short(self) -> str:
        """A compact label for tables and progress bars: ``Cf32 l3 F2 alpha``."""
        alpha = "alpha" if self.apply_alpha else "no-alpha"
        text = f"Cf{self.focus_dim} l{self.lmax} F{self.n_focus} {alpha}"
        return text + "".join(f" {n}={v}" for n, v in self.extra)

    @classmethod
    def parse(cls, text: str) -> "ShapeKey":
        """The key whose ``str`` is ``text``; ``ValueError`` for anything else."""
        if not isinstance(text, str):
            raise TypeError(f"shape key text must be a str, got {type(text).__name__}")
        fields = {}
        for part in text.split(";"):
            name, sep, value = part.partition("=")
            if not sep or not name or name in fields:
                raise ValueError(f"not a shape key: {text!r}")
            fields[name] = value
        missing = [n for n in _BASE if n not in fields]
        if missing:
            raise ValueError(f"not a shape key: {text!r} (missing {', '.join(missing)})")
        try:
            base = {n: int(fields.pop(n)) for n in _BASE}
            if base["apply_alpha"] not in (0, 1):
                raise ValueError
            base["apply_alpha"] = bool(base["apply_alpha"])
            extra = {}
            for name, value in fields.items():
                if value.startswith("b:"):
                    extra[name] = bool(int(value[2:]))
                elif value.startswith("s:"):
                    extra[name] = value[2:]
                else:
                    extra[name] = int(value)
        except ValueError:
            raise ValueError(f"not a shape key: {text!r}") from None
        return shape_key(**base, **extra)


def shape_key(*, focus_dim: int, lmax: int, n_focus: int, apply_alpha: bool, **extra) -> ShapeKey:
    """The tuning key of a mixing-stack shape.

    ``extra`` fields (bool, int or str) are for sizes added later; a field set
    to ``None`` means "the default" and is left out of the key.
    """
    for name in extra:
        if name in _BASE or name == "extra" or not name.isidentifier():
            raise ValueError(f"shape key: bad extra field name {name!r}")
    items = tuple(sorted((n, _check_extra_value(n, v)) for n, v in extra.items() if v is not None))
    return ShapeKey(focus_dim, lmax, n_focus, apply_alpha, items)


def as_key(key) -> ShapeKey:
    """Accept a ``ShapeKey`` or its string form."""
    if isinstance(key, ShapeKey):
        return key
    if isinstance(key, str):
        return ShapeKey.parse(key)
    raise TypeError(f"expected a tuning.ShapeKey (from tuning.shape_key(...)), got {type(key).__name__}")
