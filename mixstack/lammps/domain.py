"""One rank's share of the potential: the energy of its local atoms, forces on local and ghost atoms.

A LAMMPS rank owns ``nlocal`` atoms and holds ``nghost`` ghost atoms, images
of atoms within the ghost cutoff that carry their image positions, so every
edge vector is ``x_j - x_i`` (the model's shifts are zero, its cell unused).
With ``B`` interaction blocks, the energy of a local atom depends on the
atoms up to ``B`` edges away: an atom ``h`` edges from the local ones enters
through its features after block ``B - h``, which need its own incoming
edges only while ``h <= B - 1``.  ``local_graph`` keeps exactly that: the
atoms within ``B`` hops and the edges whose centre is within ``B - 1`` hops.
Everything it drops cannot change a local energy, so the result is exact, and
the outermost shell of ghosts (whose neighbour lists LAMMPS cuts short at the
edge of the ghost region) never enters.  Ghost forces are the gradient of the
local energy with respect to the ghost positions; LAMMPS adds them to their
owners (reverse communication) and ``sum_i x_i . f_i`` over all of them is
this rank's share of the virial.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ..potential.neighbors import centre_slots

PHASES = ("to_device", "graph", "model", "to_host")


class LocalGraph(NamedTuple):
    """The atoms and edges that the local energies need (see the module docstring)."""

    atoms: torch.Tensor        # (n,) int64: kept rank-atom indices, local atoms first (0..nlocal-1)
    edge_index: torch.Tensor   # (2, E) int64 into ``atoms``: row 0 source j, row 1 centre i
    slots: torch.Tensor        # (n, K) int64: each centre's edges, padded with E


def local_graph(nlocal: int, n_atoms: int, src: torch.Tensor, dst: torch.Tensor, n_blocks: int) -> LocalGraph:
    """Keep the atoms within ``n_blocks`` hops of atoms ``0..nlocal-1`` and the edges whose
    centre is within ``n_blocks - 1`` hops; edges sorted by centre, then source.

    Runs on the device of ``src``/``dst`` (the GPU, in LAMMPS runs on one: a
    few sorts and gathers over the edges that cost the host more than the copy).
    """
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be >= 1, got {n_blocks}")
    src, dst = src.long(), dst.long()
    hop = torch.full((n_atoms,), -1, dtype=torch.long, device=src.device)
    hop[:nlocal] = 0
    for h in range(1, n_blocks + 1):
        reached = src[hop[dst] == h - 1]
        hop[reached[hop[reached] < 0]] = h
    centre_hop = hop[dst]
    keep_edge = (centre_hop >= 0) & (centre_hop <= n_blocks - 1)
    atoms = torch.nonzero(hop >= 0).squeeze(1)
    new = torch.full((n_atoms,), -1, dtype=torch.long, device=src.device)
    new[atoms] = torch.arange(atoms.numel(), device=src.device)
    s, d = new[src[keep_edge]], new[dst[keep_edge]]
    order = torch.argsort(d * atoms.numel() + s, stable=True)     # one int64 key: centre, then source
    s, d = s[order], d[order]
    return LocalGraph(atoms, torch.stack((s, d)), centre_slots(d, atoms.numel()))


@dataclass
class CallStats:
    """What the evaluator did, summed over calls: atoms and edges, bytes and copies between
    host and device, seconds per phase (``PHASES``), and the device's peak memory."""

    calls: int = 0
    local_atoms: int = 0       # the rank's own atoms (LAMMPS's nlocal)
    lammps_atoms: int = 0      # local and ghost atoms LAMMPS handed over
    pairs: int = 0             # neighbour pairs within the cutoff LAMMPS handed over
    atoms: int = 0             # atoms the model evaluated (local_graph)
    edges: int = 0             # edges the model evaluated
    h2d_bytes: int = 0
    h2d_copies: int = 0
    d2h_bytes: int = 0
    d2h_copies: int = 0
    seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    slowest_call_seconds: float = 0.0
    peak_memory_bytes: int | None = None

    def to_dict(self) -> dict:
        n = max(self.calls, 1)
        return {"calls": self.calls, "local_atoms_per_call": self.local_atoms / n,
                "lammps_atoms_per_call": self.lammps_atoms / n, "pairs_per_call": self.pairs / n,
                "atoms_per_call": self.atoms / n, "edges_per_call": self.edges / n,
                "h2d_bytes_per_call": self.h2d_bytes / n, "h2d_copies_per_call": self.h2d_copies / n,
                "d2h_bytes_per_call": self.d2h_bytes / n, "d2h_copies_per_call": self.d2h_copies / n,
                "seconds_per_call": {k: v / n for k, v in self.seconds.items()},
                "slowest_call_seconds": self.slowest_call_seconds,
                "peak_memory_bytes": self.peak_memory_bytes}


class DomainEvaluator:
    """Runs an ``SO2Potential`` on one rank's local and ghost atoms.

    ``numbers``: the atomic number of each LAMMPS atom type, in type order
    (type 1 first).  ``device``: where the model runs (default: where its
    parameters are).  The model is put in eval mode.
    """

    def __init__(self, model: torch.nn.Module, numbers, *, device=None):
        for attr in ("energy", "cutoff", "blocks"):
            if not hasattr(model, attr):
                raise TypeError(f"model must be an SO2Potential (a module with energy(), cutoff and blocks); "
                                f"{type(model).__name__} has no {attr!r}")
        p = next(model.parameters())
        self.device = torch.device(device) if device is not None else p.device
        self.model = model.to(self.device).eval()
        self.dtype = p.dtype
        self.n_blocks = len(model.blocks)
        self.cutoff = float(model.cutoff)
        numbers = [int(z) for z in numbers]
        if not numbers or min(numbers) < 1:
            raise ValueError(f"numbers must be one atomic number >= 1 per atom type, got {numbers}")
        # atomic number by LAMMPS type (types start at 1), on the device once
        self.type_numbers = torch.tensor([0] + numbers, dtype=torch.long, device=self.device)
        self.stats = CallStats()

    @property
    def receptive_field(self) -> float:
        """How far a local atom's energy sees: ``n_blocks * cutoff`` (Å)."""
        return self.n_blocks * self.cutoff

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compute(self, nlocal: int, positions: np.ndarray, types: np.ndarray,
                pairs: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """``(energy of the local atoms, forces (N, 3), local energies (nlocal,))``, float64.

        ``positions (N, 3)`` and ``types (N,)`` cover local then ghost atoms;
        ``pairs (2, E)`` holds the neighbour pairs within the cutoff, sources
        then centres.  Forces cover every atom (zero where an atom cannot
        change a local energy).  Three arrays go to the device and two come
        back; the graph is built there.  A CUDA device is made current for the
        call (Triton launches on the current device).
        """
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):
                return self._compute(nlocal, positions, types, pairs)
        return self._compute(nlocal, positions, types, pairs)

    def _compute(self, nlocal, positions, types, pairs):
        st, clock = self.stats, time.perf_counter
        n = positions.shape[0]
        if nlocal == 0:                              # a rank may own no atom at all
            return 0.0, np.zeros((n, 3)), np.zeros(0)
        t0 = clock()
        host = (torch.from_numpy(positions), torch.from_numpy(types), torch.from_numpy(pairs))
        x_all, t_all, pair = (t.to(self.device) for t in host)
        self._sync()
        t1 = clock()
        graph = local_graph(nlocal, n, pair[0], pair[1], self.n_blocks)
        x = x_all[graph.atoms]
        # translation-invariant: centring keeps float32 positions as exact as the cell allows
        x = (x - x[:nlocal].mean(0)).to(self.dtype)
        z = self.type_numbers[t_all[graph.atoms].long()]
        cell = torch.zeros(3, 3, dtype=self.dtype, device=self.device)
        shifts = torch.zeros(graph.edge_index.shape[1], 3, dtype=self.dtype, device=self.device)
        self._sync()
        t2 = clock()
        with torch.enable_grad():
            x.requires_grad_(True)
            _, energies = self.model.energy(x, cell, z, graph.edge_index, shifts, graph.slots)
            local = energies[:nlocal]
            (grad,) = torch.autograd.grad(local.sum(), x)
        forces = torch.zeros(n, 3, dtype=torch.float64, device=self.device)
        forces[graph.atoms] = -grad.double()
        local = local.detach().double()
        self._sync()
        t3 = clock()
        out = (forces.cpu().numpy(), local.cpu().numpy())
        t4 = clock()
        st.calls += 1
        st.local_atoms += nlocal
        st.lammps_atoms += n
        st.pairs += pairs.shape[1]
        st.atoms += graph.atoms.numel()
        st.edges += graph.edge_index.shape[1]
        if self.device.type != "cpu":
            st.h2d_bytes += sum(t.numel() * t.element_size() for t in host)
            st.h2d_copies += len(host)
            st.d2h_bytes += sum(a.nbytes for a in out)
            st.d2h_copies += len(out)
            if self.device.type == "cuda":
                st.peak_memory_bytes = torch.cuda.max_memory_allocated(self.device)
        for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            st.seconds[name] += dt
        st.slowest_call_seconds = max(st.slowest_call_seconds, t4 - t0)
        return float(out[1].sum()), out[0], out[1]
