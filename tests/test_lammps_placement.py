"""Rank-to-GPU pinning and the launch environment, with the launchers' variables mocked (no GPU,
no MPI needed)."""

from __future__ import annotations

import os

import pytest

from mixstack.lammps import placement
from mixstack.lammps.placement import MULTICAST_OFF, local_rank, rank_device


def no_mpi():
    return None


@pytest.mark.parametrize("name", ["MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"])
def test_each_launcher_variable_gives_the_local_rank(name):
    assert local_rank({name: "3"}, mpi_fallback=no_mpi) == (3, name)


def test_the_launcher_variables_are_asked_in_order_and_blank_ones_skipped():
    env = {"SLURM_LOCALID": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "MPI_LOCALRANKID": " "}
    assert local_rank(env, mpi_fallback=no_mpi) == (2, "OMPI_COMM_WORLD_LOCAL_RANK")


def test_without_a_variable_mpi_decides_and_without_mpi_it_is_rank_zero():
    assert local_rank({}, mpi_fallback=lambda: 6) == (6, "mpi4py")
    assert local_rank({}, mpi_fallback=no_mpi) == (0, "none")
    assert local_rank({}, mpi_fallback=None) == (0, "none")


@pytest.mark.parametrize("value", ["x", "1.5", "-1"])
def test_a_bad_local_rank_names_the_variable(value):
    with pytest.raises(ValueError, match="MPI_LOCALRANKID"):
        local_rank({"MPI_LOCALRANKID": value}, mpi_fallback=no_mpi)


def _devices(n_ranks, n_gpus, requested="cuda", var="MPI_LOCALRANKID"):
    return [rank_device(requested, environ={var: str(r)}, device_count=n_gpus, mpi_fallback=no_mpi).device
            for r in range(n_ranks)]


def test_cuda_without_an_index_takes_one_gpu_per_local_rank():
    assert _devices(4, 4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert _devices(2, 2, var="OMPI_COMM_WORLD_LOCAL_RANK") == ["cuda:0", "cuda:1"]


def test_more_ranks_than_gpus_share_them_round_robin():
    assert _devices(5, 2, var="SLURM_LOCALID") == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert _devices(4, 1) == ["cuda:0"] * 4


def test_an_explicit_index_is_respected_on_every_rank():
    assert _devices(3, 4, requested="cuda:2") == ["cuda:2"] * 3
    with pytest.raises(ValueError, match="cuda:4.*4 CUDA device"):
        rank_device("cuda:4", environ={}, device_count=4, mpi_fallback=no_mpi)


def test_default_cpu_and_errors():
    assert rank_device(None, environ={"MPI_LOCALRANKID": "1"}, device_count=0, mpi_fallback=no_mpi).device == "cpu"
    assert rank_device(None, environ={"MPI_LOCALRANKID": "1"}, device_count=2, mpi_fallback=no_mpi).device == "cuda:1"
    p = rank_device("cpu", environ={"MPI_LOCALRANKID": "3"}, device_count=8, mpi_fallback=no_mpi)
    assert (p.device, p.local_rank, p.local_rank_source) == ("cpu", 3, "MPI_LOCALRANKID")
    assert set(p.to_dict()) == {"device", "local_rank", "local_rank_source", "host"}
    with pytest.raises(ValueError, match="no CUDA device"):
        rank_device("cuda", environ={}, device_count=0, mpi_fallback=no_mpi)
    with pytest.raises(ValueError, match="device"):
        rank_device("tpu", environ={}, device_count=1, mpi_fallback=no_mpi)


def test_multicast_stays_off_in_launches_without_touching_this_process(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = placement.launch_env()
    assert {k: env[k] for k in MULTICAST_OFF} == MULTICAST_OFF
    assert os.environ["NCCL_NVLS_ENABLE"] == "1"                    # a copy was changed
    assert MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                             "NVSHMEM_DISABLE_NVLS": "1"}
    mine = {"NCCL_NVLS_ENABLE": "1", "OTHER": "x"}
    placement.multicast_off(mine)
    assert mine == {**MULTICAST_OFF, "OTHER": "x"}
