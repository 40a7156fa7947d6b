"""Fakes for the tuning tests: a probe with outputs and paths the test controls, a fake
clock, an isolated table environment, and a writer of valid table files.

The fake probe stands in for ``mixstack.tuner.probes.StackProbe``: ``run``
answers fixed outputs and a dispatch ``Counter``; ``task`` returns a
``timing.Task`` whose run records its candidate's label (the call order) and
the dispatch paths it claims.  ``FakeClock`` runs the function and answers a
time chosen per label, so decisions are exact and need no GPU.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import mixstack
from mixstack.core import config
from mixstack.dispatch import log as dispatch
from mixstack.measure.timing import Task
from mixstack.tuning import families, registry, store, validity
from mixstack.tuning.families import label

DEVICE = "fake-gpu"


def base_outputs():
    """Result, grad_u0, grad_alpha of the 'baseline' (with a zero and odd values)."""
    return (torch.tensor([1.0, -2.5, 0.0, 3.25e-3]), torch.linspace(-1.0, 1.0, 7),
            torch.tensor([0.5, 2.0 / 3.0]))


def flip_last_bit(t: torch.Tensor, index: int = 1) -> torch.Tensor:
    """``t`` with the last mantissa bit of one element flipped (a one-ulp change)."""
    out = t.clone()
    bits = out.view(torch.int32)
    bits[index] ^= 1
    return out


class FakeProbe:
    """A probe whose outputs, dispatch paths and errors the test chooses, per candidate label.

    ``outputs``: label -> outputs tuple (default ``base_outputs()``);
    ``errors``: label -> exception ``run`` raises; ``off_path``: labels whose
    ``run`` logs the baseline's paths instead of the candidate's;
    ``off_path_timed``: the same, only in the timed ``task``; ``reference`` and ``scales``:
    the float64 outputs and the scales the contract judges them by.
    """

    device = None
    device_name = DEVICE

    def __init__(self, family, key=None, *, outputs=None, errors=None, off_path=(),
                 off_path_timed=(), baseline_paths=None, flaky_baseline=False, device=None,
                 reference=None, scales=None):
        self.fam = families.family(family)
        self.key = key
        self.outputs = outputs or {}
        self.errors = errors or {}
        self.off_path, self.off_path_timed = set(off_path), set(off_path_timed)
        self.baseline_paths = baseline_paths
        self.flaky_baseline = flaky_baseline
        self.reference = reference       # float64 outputs for the contract (default: the baseline's)
        self.scales = scales             # the contract's scale per output (default: relative error for all)
        self.runs: list[str] = []        # labels run() was called with
        self.order: list[str] = []       # labels of timed task runs, in call order
        self.levels: list[int] = []      # mixstack.get_level() seen in every run

    def _paths(self, cfg, lab, timed):
        if cfg is None:
            return self.fam.baseline_paths if self.baseline_paths is None else self.baseline_paths
        if lab in self.off_path or (timed and lab in self.off_path_timed):
            return self.fam.baseline_paths
        return self.fam.candidate_paths

    def run(self, cfg):
        lab = label(cfg)
        self.runs.append(lab)
        self.levels.append(mixstack.get_level())
        if lab in self.errors:
            raise self.errors[lab]
        outs = self.outputs.get(lab, base_outputs())
        if cfg is None and self.flaky_baseline and self.runs.count(lab) > 1:
            outs = (flip_last_bit(outs[0]),) + tuple(outs[1:])
        return tuple(t.clone() for t in outs), Counter({p: 1 for p in self._paths(cfg, lab, False)})

    def reference64(self):
        ref = self.reference if self.reference is not None else base_outputs()
        return tuple(t.double() for t in ref)

    def scales64(self):
        return self.scales

    def output_names(self):
        return ("result", "grad_u0", "grad_alpha")

    def task(self, cfg):
        lab = label(cfg)

        def run():
            self.order.append(lab)
            self.levels.append(mixstack.get_level())
            for p in self._paths(cfg, lab, True):
                dispatch.record(p)
        return Task(run=run)


class FakeClock:
    """``clock(fn)``: runs ``fn``, answers the next time of the label that just ran (cycled)."""

    def __init__(self, probe: FakeProbe, times=None, default=1.0):
        self.probe, self.times, self.default = probe, dict(times or {}), default
        self.count: Counter = Counter()

    def __call__(self, fn):
        fn()
        lab = self.probe.order[-1]
        seq = self.times.get(lab, [self.default])
        t = seq[self.count[lab] % len(seq)]
        self.count[lab] += 1
        return t


def entry_for(cfg, device=DEVICE, family="stack_bwd_fused", **overrides) -> dict:
    """A valid ``family`` table entry for ``cfg`` measured now on ``device``."""
    return {"config": cfg, **validity.stamp(device, family), "medians_ms": {}, **overrides}


def write_table(path, entries, device=DEVICE) -> None:
    """Write a table file: ``entries`` maps ``(family, key)`` to an entry."""
    doc = {"format": store.FORMAT, "device": device, "entries": {}}
    for (fam, key), entry in entries.items():
        doc["entries"].setdefault(fam, {})[str(key)] = entry
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh)


@pytest.fixture
def tuning_env(tmp_path, monkeypatch):
    """Empty user and built-in table folders, no registrations, fresh caches and warnings."""
    user = tmp_path / "cache"
    builtin = tmp_path / "builtin"
    builtin.mkdir()
    monkeypatch.setenv("MIXSTACK_CACHE_DIR", str(user))
    monkeypatch.setattr(config, "_cache_dir_override", None)
    monkeypatch.setattr(store, "BUILTIN_DIR", str(builtin))
    monkeypatch.setattr(store, "_reported", set())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("MIXSTACK_LEVEL", raising=False)
    registry.reload()
    with registry.saved_registrations():
        registry.clear_registrations()
        yield SimpleNamespace(user=user, builtin=builtin,
                              user_file=user / store.file_name(DEVICE),
                              builtin_file=builtin / store.file_name(DEVICE))
    registry.reload()
