"""``mixstack.packages``: the GPU kernels of an AOTInductor package, read from the archive."""

from __future__ import annotations

import json
import zipfile

import pytest

from mixstack.cli import main
from mixstack.packages import mixstack_kernel_names, package_kernels

MODEL = "pkg/data/aotinductor/model/"


def _archive(path, members: dict) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return str(path)


def test_the_kernel_names_are_the_launched_kernels_only():
    names = mixstack_kernel_names()
    assert {"block_gemm_kernel", "gate_kernel", "gate_backward_kernel", "rotate_in_kernel",
            "split_weights_kernel", "alpha_grad_kernel"} <= names
    assert "degree_order_dot" not in names and "gemm_epilogue" not in names      # jit helpers, inlined


def test_kernels_are_found_in_binaries_and_named_sources_apart(tmp_path):
    # a cubin's symbols and section names as an ELF string table holds them
    cubin = (b"\x7fELF\x00.text.block_gemm_kernel\x00.nv.info.gate_kernel\x00block_gemm_kernel\x00"
             b"triton_poi_fused_add_mul_0\x00triton_red_fused_sum_1\x00blockgemm\x00")
    path = _archive(tmp_path / "m.pt2", {
        MODEL + "abc.cubin": cubin,
        MODEL + "def.cubin": b"\x00block_gemm_kernel\x00",
        MODEL + "x.wrapper.cpp": "loadKernel(\"rotate_in_kernel\"); // block_gemm_kernel",
        MODEL + "x.wrapper_metadata.json": json.dumps({"AOTI_DEVICE_KEY": "cuda"}),
        "pkg/archive_format": "pt2",
    })
    found = package_kernels(path)
    assert found.mixstack == {"block_gemm_kernel": 2, "gate_kernel": 1}
    assert set(found.inductor) == {"triton_poi_fused_add_mul_0", "triton_red_fused_sum_1"}
    assert dict(found.sources) == {"rotate_in_kernel": 1}       # named in the C++, in no binary
    assert found.members == 5 and found.metadata["AOTI_DEVICE_KEY"] == "cuda"
    text = "\n".join(found.lines())
    assert "built for cuda" in text and "mixstack kernels compiled in: 2 (block_gemm_kernel, gate_kernel)" in text


def test_a_package_without_gpu_kernels_reports_none(tmp_path):
    path = _archive(tmp_path / "cpu.pt2", {MODEL + "w.so": b"\x00cpp_fused_add_0\x00",
                                           MODEL + "w.wrapper_metadata.json": '{"AOTI_DEVICE_KEY": "cpu"}'})
    found = package_kernels(path)
    assert not found.mixstack and not found.inductor and found.metadata["AOTI_DEVICE_KEY"] == "cpu"


def test_bad_paths_name_the_problem(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="no file at"):
        package_kernels(tmp_path / "missing.pt2")
    not_zip = tmp_path / "plain.pt2"
    not_zip.write_text("not an archive")
    with pytest.raises(ValueError, match="not an AOTInductor package"):
        package_kernels(not_zip)
    assert main(["info", "--package", str(not_zip)]) == 2
    assert "--package: " in capsys.readouterr().err
    assert main(["info", "--package", str(tmp_path / "missing.pt2")]) == 2
    assert "--package" in capsys.readouterr().err


def test_cli_prints_the_kernels_and_json(tmp_path, capsys):
    path = _archive(tmp_path / "m.pt2", {MODEL + "a.cubin": b"\x00gate_kernel\x00triton_per_fused_0\x00"})
    assert main(["info", "--package", path]) == 0
    assert "mixstack kernels compiled in: 1 (gate_kernel)" in capsys.readouterr().out
    assert main(["info", "--package", path, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["mixstack"] == {"gate_kernel": 1} and record["inductor"] == {"triton_per_fused_0": 1}


def test_a_nested_package_and_other_names_are_read_too(tmp_path):
    """deepmd-kit nests its multi-rank LAMMPS graph as a second .pt2 inside the first."""
    import io
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr(MODEL + "c.cubin", b"\x00gate_backward_kernel\x00so2_block_gemm_kernel\x00")
    path = _archive(tmp_path / "outer.pt2", {
        MODEL + "a.cubin": b"\x00block_gemm_kernel\x00",
        MODEL + "w.wrapper.cpp": "so2_block_gemm_kernel",
        "outer/extra/forward_lower_with_comm.pt2": inner.getvalue(),
    })
    found = package_kernels(path, names=frozenset({"so2_block_gemm_kernel"}))
    assert set(found.mixstack) == {"block_gemm_kernel"} and dict(found.named) == {"so2_block_gemm_kernel": 1}
    nested = found.nested["outer/extra/forward_lower_with_comm.pt2"]
    assert set(nested.mixstack) == {"gate_backward_kernel"} and set(nested.named) == {"so2_block_gemm_kernel"}
    text = "\n".join(found.lines())
    assert "forward_lower_with_comm.pt2" in text and "gate_backward_kernel" in text
