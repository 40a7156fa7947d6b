"""Fixtures of the GPU tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def deterministic():
    """deepmd-kit's own scatters (``index_add_``, ``scatter_add``) add with atomics on a GPU; the
    bitwise comparisons need torch's deterministic versions of them (mixstack's operators are
    deterministic either way)."""
    saved = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
