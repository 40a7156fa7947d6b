"""The ``grid`` part of ``scripts/gpu_check.sh`` runs first time: on the CPU at level 0, a
tiny slice, then a second slice that resumes from the first's key files (``GRID_FROM``), as
the lead runs it on the GPU.  (The ``retune`` part was run on the CPU through the interpreter
by hand: it takes minutes there.)"""

import os
import shutil
import subprocess
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, **env):
    full = {**os.environ, "OUT": str(out), "BUDGET": "300", "PARTS": "grid", **env}
    full.pop("TRITON_INTERPRET", None)
    return subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar")
def test_the_grid_part_runs_and_resumes_from_a_previous_slice(tmp_path):
    args = "--focus-dim 16 --lmax 1 --focus {} --edges 33 --levels 0 --repeats 1 --warmup 0 --check-edges 8 --no-plot"
    first = _run(tmp_path / "a", GRID_ARGS=args.format(1))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "bench grid rc=0: measured 1, skipped 0 (done before), left 0 in " in (tmp_path / "a" / "summary.txt").read_text()
    with tarfile.open(tmp_path / "a" / "gpu_check.tgz") as tgz:
        tgz.extractall(tmp_path / "a" / "x")
    keys = tmp_path / "a" / "x" / "grid" / "keys"
    assert [p.name for p in keys.iterdir()] == ["Cf16-l1-F1.json"]
    second = _run(tmp_path / "b", GRID_ARGS=args.format("1,2"), GRID_FROM=str(keys))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "measured 1, skipped 1" in (tmp_path / "b" / "summary.txt").read_text()
