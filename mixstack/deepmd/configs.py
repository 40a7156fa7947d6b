"""Model configs of deepmd-kit's DPA4 examples, and builders for tests and benchmarks.

* ``"water"``: ``examples/water/dpa4/input.json`` (lmax 2, 32 channels, one focus stream,
  3 mixing layers, 2 blocks, rcut 6, one attention head, the degree-channel radial mixer);
* ``"two_stream"``: the descriptor of ``examples/property/train/input_dpa4.json`` and of the
  spin examples (lmax 3, 32 channels per stream, 2 focus streams, 3 mixing layers, 2 blocks),
  here with an energy fitting;
* ``"default"``: deepmd-kit's schema defaults (lmax 3, 64 channels, 4 mixing layers, 3 blocks).

They are copied from deepmd-kit 3.2's examples (the training sections left out).
"""

from __future__ import annotations

import copy

WATER = {
    "type": "dpa4", "type_map": ["O", "H"],
    "descriptor": {
        "rcut": 6.0, "channels": 32, "n_radial": 16, "edge_norm": False, "use_env_seed": True,
        "lmax": 2, "mmax": 1, "n_blocks": 2, "mixing_layers": 3, "radial_so2_mode": "degree_channel",
        "radial_so2_rank": 1, "n_focus": 1, "focus_dim": 0, "n_atten_head": 1, "message_node_so3": True,
        "ffn_neurons": 0, "ffn_so3_grid": True, "grid_mlp": False, "grid_branch": [0, 0, 1],
        "ffn_blocks": 1, "so3_readout": "mlp", "use_amp": True, "precision": "float32", "seed": 42,
    },
    "fitting_net": {"neuron": [0], "precision": "float32", "seed": 42},
    "use_compile": False, "enable_tf32": True,
}

TWO_STREAM = {
    "type": "dpa4", "type_map": ["O", "H"],
    "descriptor": {
        "rcut": 6.0, "channels": 32, "n_radial": 16, "use_env_seed": True, "lmax": 3, "mmax": 1,
        "n_blocks": 2, "mixing_layers": 3, "radial_so2_mode": "degree_channel", "radial_so2_rank": 1,
        "n_focus": 2, "focus_dim": 0, "n_atten_head": 1, "ffn_neurons": 0, "ffn_so3_grid": True,
        "so3_readout": "mlp", "grid_mlp": [False, False, False], "grid_branch": [1, 1, 1], "ffn_blocks": 2,
        "sandwich_norm": [False, True, True, False], "message_node_so3": True, "use_amp": True,
        "precision": "float32", "seed": 42,
    },
    "fitting_net": {"neuron": [0], "precision": "float32", "seed": 42},
    "use_compile": False, "enable_tf32": True,
}

DEFAULT = {
    "type": "dpa4", "type_map": ["O", "H"],
    "descriptor": {"precision": "float32", "seed": 42},
    "fitting_net": {"precision": "float32", "seed": 42},
}

CONFIGS = {"water": WATER, "two_stream": TWO_STREAM, "default": DEFAULT}


def model_config(name: str, *, type_map=None, precision: str | None = None, **descriptor) -> dict:
    """The model config ``name`` (a key of ``CONFIGS``) with ``descriptor`` options overridden;
    ``precision`` sets the descriptor's and the fitting's; ``type_map`` replaces the elements."""
    if name not in CONFIGS:
        raise ValueError(f"name must be one of {sorted(CONFIGS)}, got {name!r}")
    config = copy.deepcopy(CONFIGS[name])
    if type_map is not None:
        config["type_map"] = list(type_map)
    if precision is not None:
        config["descriptor"]["precision"] = precision
        config["fitting_net"]["precision"] = precision
    config["descriptor"].update(descriptor)
    return config


BACKENDS = ("pt", "pt_expt")


def build_model(name_or_config, *, type_map=None, precision: str | None = None, backend: str = "pt",
                **descriptor):
    """A deepmd-kit model from a config name or dict, normalised by deepmd-kit's own schema;
    ``backend`` ``"pt"`` (``deepmd.pt.model.model.get_model``) or ``"pt_expt"``
    (``deepmd.pt_expt.model.get_model``); the keyword arguments as for ``model_config``."""
    from .compat import deepmd_pt

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    deepmd_pt()
    if backend == "pt":
        from deepmd.pt.model.model import get_model
    else:
        from deepmd.pt_expt.model.get_model import get_model
    from deepmd.utils.argcheck import model_args

    if isinstance(name_or_config, str):
        config = model_config(name_or_config, type_map=type_map, precision=precision, **descriptor)
    else:
        if type_map is not None or precision is not None or descriptor:
            raise ValueError("options go with a config name; pass a dict as it is")
        config = copy.deepcopy(name_or_config)
    return get_model(model_args().normalize_value(config, trim_pattern="_*"))


def perturb(model, *, seed: int = 0, scale: float = 0.05):
    """Add Gaussian noise of standard deviation ``scale`` to every floating parameter of
    ``model``, in place, and return it.  Untrained SeZM models start with ``post_focus_mix``
    (and other output layers) at zero, so their convolutions add nothing to energies or forces:
    tests and benchmarks perturb them first."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dtype.is_floating_point:
                p.add_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.device, p.dtype))
    return model
