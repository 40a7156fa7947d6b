"""``scripts/deepmd_lammps.py``'s profile of a package's frames: wall and device-busy time a frame,
the kernels by name and the host's waits, written for any callable (here a CPU one)."""

from __future__ import annotations

import torch
from helpers import load_script


def test_the_profile_names_wall_busy_kernels_and_waits(tmp_path):
    lammps = load_script("deepmd_lammps")
    x = torch.randn(64, 64)
    path = tmp_path / "profile.txt"
    lammps._profile(lambda: x @ x, str(path), frames=2)
    head = path.read_text().splitlines()[0]
    assert head.startswith("2 frame(s) under the profiler: wall ")
    assert "kernels by name (ms a frame): wigner 0.00, value_path 0.00, products 0.00, other 0.00" in head
    assert "host waits 0.0 a frame" in head and "device-to-host copies 0.0 a frame" in head
