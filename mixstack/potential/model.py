"""``SO2Potential``: a compact SO(2)-equivariant message-passing potential on the mixing stack.

Energy from positions, cell and atomic numbers; forces ``-dE/dx`` and stress
``(1/V) dE/d(strain)`` by autograd through the edge vectors.  The neighbour
list is an input (``neighbors.system_inputs``), computed outside autograd and
outside any exported graph; every edge vector is rebuilt here as
``x_j - x_i + S @ cell`` from the (strained) positions and cell, so both
derivatives reach all of the model's geometry.

Species are embedded by atomic number (``nn.Embedding`` over ``Z = 0..118``),
so any element works.  Initialisation is deterministic in ``seed`` and does
not touch the global random state; ``energy_scale`` multiplies the learned
per-atom energy (the species reference energies start at zero), which sets
the size of an untrained model's forces.  ``dtype=torch.float64`` builds a float64
model (the stack's reference path takes any float dtype; the Triton levels
take float32 and fall back to the reference otherwise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import torch
from torch import nn

from ..conv import functional as conv
from . import stages
from .blocks import InteractionBlock, mlp
from .frames import WignerRows, edge_frames
from .neighbors import MAX_Z, SystemInputs, atoms_inputs
from .radial import BesselBasis, PolynomialEnvelope


@dataclass(frozen=True)
class PotentialConfig:
    """The hyperparameters of an ``SO2Potential``, one field each.  ``SO2Potential.config`` holds
    them as a plain dict (``asdict``): what checkpoints and frozen models save."""

    lmax: int = 2                   # the stack's lmax
    focus_dim: int = 16             # the stack's channels per focus stream
    n_focus: int = 2                # the stack's focus streams
    cutoff: float = 5.0             # Å
    seed: int = 0                   # of the initialisation
    n_blocks: int = 2               # interaction blocks
    n_layers: int = 3               # stack layers in each block
    n_radial: int = 8               # Bessel functions into the radial network
    radial_hidden: int = 32         # the radial network's hidden units
    avg_neighbors: float = 12.0     # the neighbour count messages are averaged over
    envelope_p: int = 6             # the envelope's power
    energy_scale: float = 1.0       # multiplies the learned per-atom energy (see the module doc)

    def __post_init__(self):
        if self.n_blocks < 1:
            raise ValueError(f"n_blocks must be >= 1, got {self.n_blocks}")
        if self.avg_neighbors <= 0:
            raise ValueError(f"avg_neighbors must be > 0, got {self.avg_neighbors}")
        for name in ("cutoff", "avg_neighbors", "energy_scale"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def with_options(self, options: dict) -> PotentialConfig:
        """This config with the fields named in ``options`` replaced; any other name raises
        ``TypeError``, as an unknown keyword argument does."""
        unknown = sorted(set(options) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"SO2Potential got unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
        return replace(self, **options)


class SO2Potential(nn.Module):
    """An SO(2) convolution potential whose convolutions run ``mixstack.mixing_stack``.

    ``SO2Potential(config=None, *, device=None, dtype=None, **options)``: the hyperparameters
    are a ``PotentialConfig`` (default: its defaults), any of whose fields may also be given as
    a keyword (``SO2Potential(lmax=3, focus_dim=32)``), which then replaces the field.

    ``forward(positions, cell, numbers, edge_index, shifts, slots)`` returns
    ``(energy (), forces (N, 3), stress (3, 3), energies (N,))`` in eV, eV/Å and
    eV/Å^3 (stress is zero for a cell of zero volume).  See
    ``mixstack.potential.neighbors`` for the inputs.
    """

    def __init__(self, config: PotentialConfig | None = None, *, device=None, dtype=None, **options):
        super().__init__()
        cfg = (config or PotentialConfig()).with_options(options)
        self.config = asdict(cfg)
        self.lmax, self.focus_dim, self.cutoff = cfg.lmax, cfg.focus_dim, cfg.cutoff
        self.energy_scale = cfg.energy_scale
        kw = dict(dtype=dtype)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.embedding = nn.Embedding(MAX_Z + 1, cfg.focus_dim, **kw)
            self.species_energy = nn.Embedding(MAX_Z + 1, 1, **kw)
            nn.init.zeros_(self.species_energy.weight)
            self.radial_basis = BesselBasis(cfg.cutoff, cfg.n_radial, **kw)
            self.envelope = PolynomialEnvelope(cfg.cutoff, cfg.envelope_p)
            self.wigner = WignerRows(cfg.lmax, keep=1, **kw)
            # the constants of mixstack.edge_wigner's kernels (float32 whatever the model's dtype:
            # the kernels run float32 only), a buffer so that they follow .to(device)
            self.register_buffer("wigner_constants", conv.edge_wigner_constants(cfg.lmax), persistent=False)
            self.blocks = nn.ModuleList(
                InteractionBlock(lmax=cfg.lmax, focus_dim=cfg.focus_dim, n_focus=cfg.n_focus,
                                 n_layers=cfg.n_layers, n_radial=cfg.n_radial, radial_hidden=cfg.radial_hidden,
                                 avg_neighbors=cfg.avg_neighbors, **kw)
                for _ in range(cfg.n_blocks))
            self.readout = mlp([cfg.focus_dim, cfg.radial_hidden, 1], **kw)
        if device is not None:
            self.to(device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embedding.weight.device

    def inputs_of(self, atoms) -> SystemInputs:
        """The six input tensors of an ``ase.Atoms`` for this model (its cutoff, device, dtype)."""
        return atoms_inputs(atoms, self.cutoff, device=self.device, dtype=self.dtype)

    def stacks(self):
        """The mixing stacks of the model, in order."""
        return [b.stack for b in self.blocks]

    def energy(self, positions, cell, numbers, edge_index, shifts, slots, strain=None):
        """``(energy (), energies (N,))``; ``strain (3, 3)`` (symmetrised) deforms positions and cell."""
        if strain is not None:
            sym = 0.5 * (strain + strain.transpose(0, 1))
            positions = positions + positions @ sym
            cell = cell + cell @ sym
        src, dst = edge_index[0], edge_index[1]
        kernels = conv.kernels_active(positions, self.focus_dim)
        r, rows, packed = stages.run(stages.EDGE_FRAMES, self.edge_geometry, positions, cell, src, dst, shifts,
                                     kernels)
        rbf, env = stages.run(stages.RADIAL, self.radial_terms, r)
        n = positions.shape[0]
        x = self.embedding(numbers)
        x = torch.cat((x[:, None], x.new_zeros(n, (self.lmax + 1) ** 2 - 1, self.focus_dim)), 1)
        for block in self.blocks:
            x = block(x, src, dst, rows, rbf, env, slots, packed)
        energies = self.energy_scale * self.readout(x[:, 0]).squeeze(-1) + self.species_energy(numbers).squeeze(-1)
        return energies.sum(), energies

    def edge_geometry(self, positions, cell, src, dst, shifts, packed: bool = False):
        """``(r (E,), rows, wigner)``: edge lengths and the Wigner rows of the edge frames, either
        as ``wigner_rows``'s list (``wigner`` ``None``) or, with ``packed`` (the convolution's
        kernels are active), as one ``(E, 3, S)`` tensor from ``mixstack.edge_wigner``'s kernels
        (``rows`` ``None``)."""
        vec = positions[src] - positions[dst] + shifts @ cell
        r = torch.linalg.vector_norm(vec, dim=-1)
        if packed:
            return r, None, conv.edge_wigner(vec, self.lmax, constants=self.wigner_constants)
        return r, self.wigner(edge_frames(vec)), None

    def radial_terms(self, r):
        """The radial basis ``(E, n_radial)`` and the cutoff envelope ``(E,)`` of the edge lengths."""
        return self.radial_basis(r), self.envelope(r)

    def forward(self, positions, cell, numbers, edge_index, shifts, slots):
        """Energy, forces, stress and per-atom energies (see the class docstring).

        Derivatives are taken with ``create_graph`` in training mode (force
        losses), without it in eval mode.
        """
        return self.derivatives(self.energy, positions, cell, numbers, edge_index, shifts, slots)

    def derivatives(self, energy_fn, positions, cell, numbers, edge_index, shifts, slots):
        """``forward`` with the energy from ``energy_fn`` (``self.energy`` or, for instance, a
        compiled copy of it): energy, forces and stress by autograd through it."""
        with torch.enable_grad():
            pos = positions.detach().requires_grad_(True)
            strain = torch.zeros(3, 3, dtype=positions.dtype, device=positions.device, requires_grad=True)
            energy, energies = energy_fn(pos, cell, numbers, edge_index, shifts, slots, strain)
            grad_pos, grad_strain = torch.autograd.grad(energy, (pos, strain), create_graph=self.training)
        # |a . (b x c)|: the cell volume (torch.linalg.det has no AOTInductor C shim)
        volume = (cell[0] * torch.linalg.cross(cell[1], cell[2], dim=-1)).sum().abs()
        safe = torch.where(volume > 0, volume, torch.ones_like(volume))
        stress = torch.where(volume > 0, grad_strain / safe, torch.zeros_like(grad_strain))
        if not self.training:
            energy, energies = energy.detach(), energies.detach()
        return energy, -grad_pos, stress, energies

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items())

    # ------------------------------------------------------------ checkpoints

    def save(self, path) -> None:
        """Write ``{"config", "state_dict"}`` (``SO2Potential.load`` reads it back)."""
        torch.save({"kind": "mixstack.SO2Potential", "config": self.config,
                    "dtype": str(self.dtype).removeprefix("torch."),
                    "state_dict": self.state_dict()}, path)

    @classmethod
    def load(cls, path, *, device=None) -> "SO2Potential":
        """A model from ``save``'s file."""
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("kind") != "mixstack.SO2Potential":
            raise ValueError(f"{path} is not an SO2Potential checkpoint (written by SO2Potential.save)")
        model = cls(PotentialConfig(**blob["config"]), dtype=getattr(torch, blob["dtype"]))
        model.load_state_dict(blob["state_dict"])
        return model.to(device) if device is not None else model

