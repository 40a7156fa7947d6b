"""Molecular dynamics through deepmd-kit's own ASE calculator (``deepmd.calculator.DP``), for
``deepmd_bench``: deepmd-kit's levels against the accelerated model, the way MD users run them.

A model is written as a deepmd-kit checkpoint (``save_checkpoint``: the ``.pt`` that ``dp --pt
train`` writes, its model parameters in the state's extra state) and loaded by ``DP`` as users
load it (``deepmd_calculator``: the neighbour list, the host-device copies and the frame all
deepmd-kit's), its model replaced by the variant's own (accelerated, compiled and warm as it was
timed).  ``md_bench.nve`` runs NVE through ASE's velocity Verlet and reports steps per second,
ns per day and the energy drift.
"""

from __future__ import annotations

import copy

import torch

from .md_bench import nve


def save_checkpoint(model, config: dict, path) -> None:
    """``model``'s weights and ``config`` (normalised by deepmd-kit's schema) as a ``.pt``
    checkpoint that ``deepmd.calculator.DP`` loads."""
    from deepmd.pt.train.wrapper import ModelWrapper
    from deepmd.utils.argcheck import model_args

    params = model_args().normalize_value(copy.deepcopy(config), trim_pattern="_*")
    torch.save({"model": ModelWrapper(model, model_params=params).state_dict()}, str(path))


def deepmd_calculator(path, model=None):
    """``deepmd.calculator.DP`` on the checkpoint ``path``, as users load it (deepmd-kit's levels
    as ``DP_TRITON_INFER`` says when it loads); with ``model`` (a model of the same config) that
    model runs its frames instead of the one it loaded: a variant's own, already accelerated,
    compiled and warm."""
    from deepmd.calculator import DP

    calc = DP(model=str(path))
    if model is not None:
        calc.dp.deep_eval.dp.model["Default"] = model
    return calc


def atoms_of(frame, type_map):
    """An ASE ``Atoms`` of one frame ``(coord (1, N, 3), atype (1, N), box (1, 9) or None)``
    (``mixstack.deepmd.systems``)."""
    from ase import Atoms

    coord, atype, box = frame
    symbols = [type_map[int(t)] for t in atype.reshape(-1)]
    positions = coord.detach().double().reshape(-1, 3).numpy()
    if box is None:
        return Atoms(symbols, positions=positions, pbc=False)
    return Atoms(symbols, positions=positions, cell=box.detach().double().reshape(3, 3).numpy(), pbc=True)


def md_throughput(calc, atoms, *, steps: int, warmup: int, dt_fs: float, device, before=None) -> dict:
    """NVE of a copy of ``atoms`` through ``calc`` (``md_bench.nve``'s record), the device
    synchronised around the timed steps; ``before()`` runs after the warm-up."""
    atoms = atoms.copy()
    atoms.calc = calc
    cuda = torch.device(device).type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def start():
        sync()
        if before is not None:
            before()
    record = nve(atoms, steps=steps, warmup=warmup, dt_fs=dt_fs, before=start)
    sync()
    return record
