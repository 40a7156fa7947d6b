"""The real probe: runs ``mixstack.mixing_stack`` for the sweep with one candidate registered.

A probe holds two input sets for one shape key: a *timing* set, large enough to
fill the GPU (~2**18 edges at S1's row width, fewer for wider rows, capped at a
third of device memory), and a *partial-tile* set of 4099 edges, which no
power-of-two block size divides, so every kernel's last tile is masked.  Inputs
are seeded, random and non-zero, with weights drawn by ``MixingStack``'s
initialisation (``measure.shapes.make_inputs``: one definition of the data).

``run(cfg)`` (forward and backward on both sets, and on single-row and
129-edge sets for the float64-checked families; the sweep's acceptance check; for the
weight-reduction families the backward also returns the weight gradients),
``reference64()`` (the same outputs from the reference formulas in float64,
for the compensated family's contract, with ``scales64()`` and ``output_names()``, what
``families.contract_difference`` judges each output by and calls it) and ``task(cfg)`` (the timed pass:
the forward for ``stack_fwd``; forward and backward for
``stack_compensated``; for the backward families the backward alone, with
the forward in the untimed ``setup``, with the weight gradients for the
weight-reduction families) run
with ``cfg`` registered for the family under test (``None``: the baseline) and
``None`` registered for the families it must not meet (tuning the relay must not
run the fused backward), and restore the registrations afterwards, also on
errors.  The level is the sweep's business (it wraps every call in
``use_level(2)`` and checks the dispatch log); a probe sets none.
"""

from __future__ import annotations

import contextlib

import torch

from ..core import config
from ..dispatch.log import dispatch_log
from ..measure import timing
from ..measure.shapes import BenchShape, make_inputs
from ..stack import reference
from ..stack.functional import mixing_stack
from ..tuning import families, registry, validity
from ..tuning.keys import ShapeKey, as_key

N_LAYERS = 4                  # docs/contract.md §8 shapes; the key has no depth (every layer launches the same kernels)
PARTIAL_EDGES = 4099          # odd: no block size divides it
TIMING_EDGES = 2 ** 18        # at S1's width (F * ROW = 640): ~50 waves of 64-row tiles on 132 SMs
QUICK_TIMING_EDGES = 2 ** 17  # the quick sweep's: still ~25 waves, past launch overhead at every key
MIN_TIMING_EDGES = 2 ** 14
_S1_WIDTH = 640
# Live surfaces per edge while a backward runs, in F * ROW float32 rows: inputs,
# result, y, z (n_layers - 1), forward buffers, h, gz, gradients, and the two
# output sets the sweep holds for the bitwise check; rounded up.
_EXTRA_SURFACES = 16
# Under TRITON_INTERPRET (CPU), only the plumbing is exercised: small sets.
INTERPRETER_EDGES = (257, 129)
CONTRACT_EDGES = (1, 129)     # more edge counts for the float64 contract (compensated family)


def tuning_device(device=None) -> torch.device:
    """The device the sweep measures on: CUDA, or the CPU under ``TRITON_INTERPRET``."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"tuning on {device} was asked for, but torch sees no CUDA device")
            index = device.index if device.index is not None else torch.cuda.current_device()
            return torch.device("cuda", index)
        if not config.triton_interpret():
            raise ValueError(f"tuning measures Triton kernels; they cannot run on {device} "
                             "(set TRITON_INTERPRET=1 to exercise the sweep through the interpreter)")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if config.triton_interpret():
        return torch.device("cpu")
    raise ValueError("tuning measures Triton kernels on a CUDA GPU, and torch sees none here "
                     "(TRITON_INTERPRET=1 exercises the sweep on the CPU, without meaningful times)")


def timing_edges(key: ShapeKey, device: torch.device, n_layers: int = N_LAYERS, base: int = TIMING_EDGES) -> int:
    """Edges of the timing set: ~``base`` (2**18) at S1's row width, scaled down for wider rows
    and capped so the sweep's live surfaces stay under a third of device memory."""
    width = key.n_focus * key.layout.row
    edges = base * _S1_WIDTH // max(width, _S1_WIDTH)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        edges = min(edges, total // 3 // (width * 4 * (n_layers + _EXTRA_SURFACES)))
    return max(edges, MIN_TIMING_EDGES)


class StackProbe:
    """Inputs and runs of ``mixing_stack`` for one family and shape key (see the module doc)."""

    def __init__(self, family: str, key, *, device=None, edges: int | None = None,
                 partial_edges: int | None = None, n_layers: int = N_LAYERS, seed: int = 0,
                 quick: bool = False):
        self.family = families.family(family)
        self.key = as_key(key)
        self.device = tuning_device(device)
        self.device_name = validity.device_name(self.device)
        on_gpu = self.device.type == "cuda"
        if edges is None:
            base = QUICK_TIMING_EDGES if quick else TIMING_EDGES
            edges = timing_edges(self.key, self.device, n_layers, base) if on_gpu else INTERPRETER_EDGES[0]
        self.edges = edges
        self.partial_edges = partial_edges or (PARTIAL_EDGES if on_gpu else INTERPRETER_EDGES[1])
        self._timing = self._inputs(self.edges, n_layers, seed)
        self._partial = self._inputs(self.partial_edges, n_layers, seed + 1)
        # The float64 contract is checked on more edge counts: single rows and a
        # second partial tile, where a pipelining bug or a masked tail shows.
        self._extra = ([self._inputs(e, n_layers, seed + 2 + i) for i, e in enumerate(CONTRACT_EDGES)]
                       if self.family.accept == "float64" else [])
        self._reference64 = self._scales64 = None

    def _inputs(self, edges, n_layers, seed):
        k = self.key
        shape = BenchShape("tune", edges, k.n_focus, k.focus_dim, k.lmax, n_layers, k.apply_alpha)
        return make_inputs(shape, self.device, seed=seed)

    @contextlib.contextmanager
    def configured(self, cfg):
        """``cfg`` registered for the family under test, ``None`` for the ones it must not meet."""
        with contextlib.ExitStack() as stack:
            for other in self.family.disable:
                stack.enter_context(registry.registration(other, self.key, None))
            stack.enter_context(registry.registration(self.family.name, self.key, cfg))
            yield

    def _forward(self, inp, u0=None, alpha=None):
        k = self.key
        return mixing_stack(inp.u0 if u0 is None else u0, inp.alpha if alpha is None else alpha,
                            inp.w0, inp.w1, inp.gw, lmax=k.lmax, focus_dim=k.focus_dim,
                            apply_alpha=k.apply_alpha)

    @property
    def _weights(self) -> bool:
        return self.family.timed == "wgrad"

    def _leaves(self, inp, dtype=None):
        """``(u0, alpha, w0, w1, gw)`` leaves; the weights require grad for the weight-reduction
        families."""
        cast = (lambda t: t.detach().to(dtype)) if dtype is not None else (lambda t: t.detach())
        u0 = cast(inp.u0).requires_grad_(True)
        alpha = cast(inp.alpha).requires_grad_(self.key.apply_alpha)
        weights = [cast(w).requires_grad_(self._weights) for w in (inp.w0, inp.w1, inp.gw)]
        return (u0, alpha, *weights)

    def _backward(self, out, leaves, grad_out):
        u0, alpha = leaves[:2]
        wrt = [u0] + ([alpha] if self.key.apply_alpha else []) + (list(leaves[2:]) if self._weights else [])
        grads = list(torch.autograd.grad(out, wrt, grad_out))
        if not self.key.apply_alpha:
            grads.insert(1, u0.new_empty((0,)))
        return tuple(grads)

    def _fwd_bwd(self, inp):
        leaves = self._leaves(inp)
        out = self._forward_leaves(leaves)
        return (out.detach(),) + self._backward(out, leaves, inp.grad_out)

    def _forward_leaves(self, leaves):
        k = self.key
        return mixing_stack(*leaves, lmax=k.lmax, focus_dim=k.focus_dim, apply_alpha=k.apply_alpha)

    def _sets(self):
        return [self._partial, *self._extra, self._timing]

    def run(self, cfg):
        """``((result, grad_u0, grad_alpha) on the partial-tile set [+ the contract's extra
        sets] + the same on the timing set, dispatch Counter)`` with ``cfg`` in force."""
        with self.configured(cfg), dispatch_log() as counts:
            outputs = sum((self._fwd_bwd(inp) for inp in self._sets()), ())
        return outputs, counts

    def reference64(self):
        """What ``run`` returns, computed by ``mixstack.stack.reference`` in float64 (computed once)."""
        if self._reference64 is None:
            self._reference64, self._scales64 = self._float64()
        return self._reference64

    def scales64(self):
        """Beside ``reference64``: the scale ``families.contract_difference`` judges each output by,
        ``families.dot_scale`` of the upstream gradient and the float64 unscaled result for
        grad_alpha, ``None`` (relative error) for every other output."""
        self.reference64()
        return self._scales64

    def output_names(self):
        """Beside ``run``'s outputs: each one's set and name, for the contract's messages."""
        names = ("result", "grad_u0", "grad_alpha") + (("grad_w0", "grad_w1", "grad_gw") if self._weights else ())
        return tuple(f"{inp.u0.shape[1]} edges: {n}" for inp in self._sets() for n in names)

    def _float64(self):
        """``(outputs, scales)`` of every set from the reference formulas in float64."""
        k = self.key
        outs, scales = (), ()
        for inp in self._sets():
            leaves = self._leaves(inp, torch.float64)
            out, _, y = reference.forward_state(*leaves, lmax=k.lmax, focus_dim=k.focus_dim,
                                                apply_alpha=k.apply_alpha)
            grads = self._backward(out, leaves, inp.grad_out.double())
            alpha_scale = families.dot_scale(inp.grad_out, y.detach()) if k.apply_alpha else None
            outs += (out.detach(),) + grads
            scales += (None, None, alpha_scale) + (None,) * (len(grads) - 2)
        return outs, scales

    def task(self, cfg) -> timing.Task:
        """The timed pass on the timing set with ``cfg`` in force."""
        inp = self._timing
        if self.family.timed == "both":
            def run_both():
                with self.configured(cfg):
                    leaves = self._leaves(inp)
                    return self._backward(self._forward_leaves(leaves), leaves, inp.grad_out)
            return timing.Task(run=run_both)
        if self.family.timed == "fwd":
            def run_forward():
                with self.configured(cfg), torch.no_grad():
                    return self._forward(inp)
            return timing.Task(run=run_forward)

        def setup():
            leaves = self._leaves(inp)
            with self.configured(cfg):
                return self._forward_leaves(leaves), leaves

        def run_backward(state):
            with self.configured(cfg):
                return self._backward(*state, inp.grad_out)
        return timing.Task(run=run_backward, setup=setup)
