"""``potential.graphs.graph_replay``: a function captured on the capture stream, its replay."""

import pytest
import torch

from mixstack.potential.graphs import graph_replay


def test_graph_replay_needs_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA device"):
        graph_replay(lambda: None, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_repeats_the_captured_work():
    x = torch.zeros(4, device="cuda")
    replay = graph_replay(lambda: x.add_(1), "cuda", warmup=2)      # 2 eager runs, then the capture
    assert x.tolist() == [2.0] * 4
    replay()
    replay()
    torch.cuda.synchronize()
    assert x.tolist() == [4.0] * 4
