"""Every SeZM option mixstack does not reproduce has its one named reason, and leaves the
convolution on deepmd-kit's path; the glue's pieces against deepmd-kit's own modules."""

from __future__ import annotations

import pytest
import torch
from deepmd_cases import FLOAT64_RTOL, make_conv, max_rel, one_torch_thread, require_deepmd  # noqa: F401

import mixstack
from mixstack.conv.reference import degree_mixed
from mixstack.deepmd import accelerate, glue
from mixstack.deepmd.options import unsupported_reason

require_deepmd()

UNSUPPORTED = [
    ({"edge_cartesian": True}, "edge_cartesian"),
    ({"mixing_layers": 0}, "mixing_layers 0"),
    ({"mmax": 2}, "mmax 2"),
    ({"lmax": 0, "mmax": 0}, "lmax 0: a block of scalar"),
    ({"so2_norm": True}, "so2_norm"),
    ({"so2_attn_res": "independent"}, "so2_attn_res 'independent'"),
    ({"layer_scale": True}, "layer_scale"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"s2_activation": True}, "s2_activation"),
    ({"activation_function": "tanh"}, "activation_function 'tanh'"),
    ({"node_wise_s2": True}, "node_wise_s2"),
    ({"atten_f_mix": True, "n_focus": 2}, "atten_f_mix"),
    ({"atten_v_proj": True}, "atten_v_proj"),
    ({"atten_o_proj": True}, "atten_o_proj"),
    ({"dtype": torch.bfloat16}, "precision bfloat16"),
]


@pytest.mark.parametrize("options, reason", UNSUPPORTED, ids=[r.split()[0] for _, r in UNSUPPORTED])
def test_each_unsupported_option_is_named_and_left_on_deepmd(options, reason):
    conv = make_conv(channels=16, **options)
    found = unsupported_reason(conv)
    assert found is not None and found.startswith(reason), found
    report = accelerate(conv)
    assert report.on_mixstack == () and report.convolutions[0].reason == found
    assert type(conv).__name__ == "SO2Convolution"


@pytest.mark.parametrize("options", [{}, {"n_atten_head": 0}, {"radial_so2_mode": "none"},
                                     {"radial_so2_mode": "degree"}, {"n_focus": 3, "focus_compete": False},
                                     {"message_node_so3": True}, {"dtype": torch.float32}])
def test_supported_options_have_no_reason(options):
    assert unsupported_reason(make_conv(channels=16, **options)) is None


def test_a_stack_built_differently_is_refused_by_the_safety_net():
    """An option check can miss what a newer deepmd-kit builds; the modules themselves are
    checked too (here a norm between the mixing layers that no option asked for)."""
    conv = make_conv(channels=16)
    conv.so2_inter_norms[0] = torch.nn.LayerNorm(16)
    assert unsupported_reason(conv) == "so2_inter_norms[0] is LayerNorm, not Identity"
    assert unsupported_reason(torch.nn.Linear(2, 2)) == "Linear is not a SeZM SO2Convolution"


def test_sezm_wigner_rows_are_deepmd_rows_up_to_a_roll_about_the_edge():
    """The m = 0 rows equal deepmd-kit's; the (m = -1, m = +1) rows are deepmd-kit's turned by one
    rotation about the edge (the same angle at every degree): the frames differ by a roll only."""
    from deepmd.pt.model.descriptor.sezm_nn.wignerd import WignerDCalculator, build_edge_quaternion

    lmax = 4
    vec = torch.randn(9, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d_full, _ = WignerDCalculator(lmax, dtype=torch.float64)(build_edge_quaternion(vec, eps=1e-7))
    ours = mixstack.edge_wigner(vec, lmax, convention="sezm")
    turns = []
    for l in range(1, lmax + 1):
        cols = slice(l * l, (l + 1) ** 2)
        assert max_rel(ours[:, 1, cols], d_full[:, l * l + l, cols]) < 1e-13
        theirs_pm = d_full[:, [l * l + l - 1, l * l + l + 1], cols]                  # (E, 2, 2l+1)
        turn = theirs_pm @ torch.linalg.pinv(ours[:, [0, 2], cols])                  # (E, 2, 2)
        assert max_rel(turn @ ours[:, [0, 2], cols], theirs_pm) < 1e-12
        eye = torch.eye(2, dtype=torch.float64).expand_as(turn)
        assert (turn @ turn.transpose(1, 2) - eye).abs().max() < 1e-12
        assert (torch.linalg.det(turn) - 1).abs().max() < 1e-12                      # a rotation
        turns.append(turn)
    assert all((t - turns[0]).abs().max() < 1e-12 for t in turns)


@pytest.mark.parametrize("mode, rank", [("degree", 0), ("degree_channel", 0), ("degree_channel", 1),
                                        ("degree_channel", 3)])
def test_degree_mix_is_deepmd_radial_degree_mixer(mode, rank):
    from deepmd.pt.model.descriptor.sezm_nn.so2 import DynamicRadialDegreeMixer

    from mixstack.deepmd.configs import perturb

    lmax, channels, n_edges = 3, 8, 11
    mixer = perturb(DynamicRadialDegreeMixer(lmax=lmax, mmax=1, channels=channels, mode=mode, rank=rank,
                                             dtype=torch.float64, seed=1, trainable=True), scale=0.3)
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(n_edges, 3 * lmax + 1, channels, generator=gen, dtype=torch.float64)
    rad = torch.randn(n_edges, lmax + 1, channels, generator=gen, dtype=torch.float64)
    degree_index = torch.tensor(list(range(lmax + 1)) + 2 * list(range(1, lmax + 1)))
    ref = mixer(u, rad[:, degree_index])
    out = degree_mixed(u[:, None], glue.degree_mix(mixer, rad, detach=False), lmax)[:, 0]
    assert max_rel(out, ref) < FLOAT64_RTOL


def test_the_frames_wigner_rows_and_destination_order_are_built_once():
    """The first convolution of a frame builds the Wigner rows and the destination order in the
    edge cache's per-frame dict; the next reads them; a cache without the dict builds its own."""
    from deepmd_cases import conv_inputs

    conv = make_conv(channels=16)
    _, cache, _ = conv_inputs(conv)
    first = glue.frame_edges(cache, conv.lmax, torch.float64, 7)
    again = glue.frame_edges(cache, conv.lmax, torch.float64, 7)
    assert again.wigner is first.wigner and again.order.perm is first.order.perm
    assert torch.equal(first.order.perm, torch.argsort(cache.dst, stable=True))
    assert first.src is cache.src and first.dst is cache.dst                      # no edge tensor copied
    alone = glue.frame_edges(cache._replace(D_to_m_cache=None), conv.lmax, torch.float64, 7)
    assert alone.wigner is not first.wigner and torch.equal(alone.wigner, first.wigner)
