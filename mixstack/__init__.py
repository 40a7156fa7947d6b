"""mixstack: the gated SO(2) mixing stack of equivariant interatomic potentials, exact and fast.

Public API (docs/contract.md §2): ``mixing_stack``, ``MixingStack``,
``reference``, ``set_level`` / ``get_level`` / ``use_level``, ``dispatch_log``;
``rotate_in`` and ``rotate_out_sum``, the convolution's rotations around the stack, and
``LinearRadial``, radial weights given as the layer that makes them, ``DegreeMix``, a per-edge
mix of degrees, ``edge_order`` / ``EdgeOrder``, the edges grouped by destination, and
``edge_wigner``, the packed Wigner rows they read (docs/contract.md §7, docs/convolution.md);
``tuning`` (the tables) and ``tune`` (the sweep, docs/contract.md §5);
``freeze`` and ``load`` (docs/contract.md §6).  The potential and its ASE
calculator (``mixstack.potential``, ``mixstack.potential.calculator``) are
imported on demand.

``import mixstack`` imports neither torch nor Triton: the first use of a public name loads the
operators (floors 1-4 of docs/architecture.md, which register the ``torch.ops.mixstack`` ops),
and ``tune``, ``freeze`` and ``load`` load their upper floors on first use, so that the
``mixstack`` command answers ``--help`` and ``--version`` without importing torch.
"""

from .core.version import __version__

# The operators' names: the first use of any of them imports all of these modules, as an
# eager ``import mixstack`` would (so the ``torch.ops.mixstack`` ops are registered after it).
_OPERATORS = {
    "reference": ("reference", None), "tuning": ("tuning", None),
    "edge_wigner": ("conv.functional", "edge_wigner"), "rotate_in": ("conv.functional", "rotate_in"),
    "rotate_out_sum": ("conv.functional", "rotate_out_sum"), "LinearRadial": ("conv.layout", "LinearRadial"),
    "edge_order": ("conv.functional", "edge_order"), "DegreeMix": ("conv.layout", "DegreeMix"),
    "EdgeOrder": ("conv.layout", "EdgeOrder"),
    "get_level": ("dispatch.levels", "get_level"), "set_level": ("dispatch.levels", "set_level"),
    "use_level": ("dispatch.levels", "use_level"), "dispatch_log": ("dispatch.log", "dispatch_log"),
    "mixing_stack": ("stack.functional", "mixing_stack"), "MixingStack": ("stack.nn", "MixingStack"),
}
# Upper floors (the sweep, the compiler), loaded alone on first use.
_UPPER = {"tune": ("tuner", "tune"), "freeze": ("export", "freeze"), "load": ("export", "load")}


def _load(module: str, attr: str | None):
    import importlib
    mod = importlib.import_module(f"{__name__}.{module}")
    return mod if attr is None else getattr(mod, attr)


def __getattr__(name):
    """A public name on first use (PEP 562): the operators all at once, or an upper floor."""
    if name in _OPERATORS:
        globals().update({n: _load(*where) for n, where in _OPERATORS.items()})
        return globals()[name]
    if name in _UPPER:
        return _load(*_UPPER[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DegreeMix", "EdgeOrder", "LinearRadial", "MixingStack", "dispatch_log", "edge_order", "edge_wigner", "freeze",
    "get_level", "load", "mixing_stack", "reference", "rotate_in",
    "rotate_out_sum", "set_level", "tune", "tuning", "use_level", "__version__",
]
