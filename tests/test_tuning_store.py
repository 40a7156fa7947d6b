"""Persistence: atomic locked writes, reload, and corrupt or stale tables reported and ignored."""

import json
import os
import shutil
import threading
import time
import warnings

import pytest
from tuning_fakes import DEVICE, entry_for, write_table

from mixstack import tuning
from mixstack.tuning import families, kernel_hash, registry, store, validity

KEY = tuning.shape_key(focus_dim=32, lmax=3, n_focus=2, apply_alpha=True)
KEY2 = tuning.shape_key(focus_dim=64, lmax=3, n_focus=1, apply_alpha=True)
CFG = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}
GEMM = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
FUSED = "stack_bwd_fused"


# Every test runs on empty, private tables (the ``tuning_env`` fixture, tests/conftest.py).
pytestmark = pytest.mark.usefixtures("tuning_env")


def _lookup(key=KEY, family=FUSED):
    return tuning.lookup(family, key, device_name=DEVICE)


def test_a_recorded_entry_persists_and_a_fresh_registry_reads_it(tuning_env):
    registry.record(FUSED, KEY, entry_for(CFG, medians_ms={"baseline": 2.0}), device_name=DEVICE)
    doc = json.loads(tuning_env.user_file.read_text())
    assert doc["format"] == store.FORMAT and doc["device"] == DEVICE
    assert doc["entries"][FUSED][str(KEY)]["config"] == CFG
    tuning.reload()                                           # as a new process would
    assert _lookup() == CFG
    assert tuning.find(FUSED, KEY, device_name=DEVICE)[1]["medians_ms"] == {"baseline": 2.0}


def test_writes_merge_with_entries_written_meanwhile(tuning_env):
    registry.record(FUSED, KEY, entry_for(CFG), device_name=DEVICE)
    # another process adds an entry behind this one's back
    doc = json.loads(tuning_env.user_file.read_text())
    doc["entries"]["stack_fwd"] = {str(KEY2): entry_for(GEMM, family="stack_fwd")}
    tuning_env.user_file.write_text(json.dumps(doc))
    registry.record("stack_bwd_relay", KEY, entry_for(None, family="stack_bwd_relay"), device_name=DEVICE)
    assert _lookup() == CFG
    assert _lookup(KEY2, "stack_fwd") == GEMM
    assert _lookup(KEY, "stack_bwd_relay") is None


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(tuning_env, monkeypatch):
    registry.record(FUSED, KEY, entry_for(CFG), device_name=DEVICE)
    before = tuning_env.user_file.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(store.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        registry.record(FUSED, KEY2, entry_for(CFG), device_name=DEVICE)
    assert tuning_env.user_file.read_bytes() == before
    assert sorted(os.listdir(tuning_env.user)) == sorted([store.file_name(DEVICE),
                                                          store.file_name(DEVICE) + ".lock"])


def test_a_writer_waits_for_the_file_lock(tuning_env):
    path = str(tuning_env.user_file)
    held, release = threading.Event(), threading.Event()

    def hold():
        with store.locked(path):
            held.set()
            release.wait(5)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    threading.Timer(0.3, release.set).start()
    t0 = time.perf_counter()
    registry.record(FUSED, KEY, entry_for(CFG), device_name=DEVICE)
    waited = time.perf_counter() - t0
    t.join()
    assert waited >= 0.25
    assert _lookup() == CFG


@pytest.mark.parametrize("text, why", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "not a mixstack tuning table"),
    ('{"format": 99, "entries": {}}', "format 99"),
])
def test_a_corrupt_user_file_is_reported_and_ignored(tuning_env, text, why):
    write_table(tuning_env.builtin_file, {(FUSED, KEY): entry_for(CFG)})
    tuning_env.user.mkdir()
    tuning_env.user_file.write_text(text)
    with pytest.warns(tuning.TuningTableWarning, match=why) as rec:
        assert _lookup() == CFG                                # the built-in table still answers
    assert str(tuning_env.user_file) in str(rec[0].message)


def test_a_corrupt_file_is_replaced_by_the_next_write_and_kept_aside(tuning_env):
    tuning_env.user.mkdir()
    tuning_env.user_file.write_text("{not json")
    with pytest.warns(tuning.TuningTableWarning):
        registry.record(FUSED, KEY, entry_for(CFG), device_name=DEVICE)
    assert _lookup() == CFG
    assert (tuning_env.user / (store.file_name(DEVICE) + ".corrupt")).read_text() == "{not json"


def test_a_malformed_entry_is_reported_and_the_others_kept(tuning_env):
    write_table(tuning_env.user_file, {(FUSED, KEY): entry_for({"BLOCK_M": "big"}),
                                       (FUSED, KEY2): entry_for(CFG)})
    with pytest.warns(tuning.TuningTableWarning, match="malformed"):
        assert _lookup() is tuning.MISSING
    assert _lookup(KEY2) == CFG


@pytest.mark.parametrize("field, value, why", [
    ("triton", "2.0.0", "Triton 2.0.0"),
    ("kernel_hash", "0" * 64, "kernel sources"),
    ("device", "NVIDIA H20", "NVIDIA H20"),
])
def test_a_stale_entry_is_reported_and_ignored(tuning_env, field, value, why):
    write_table(tuning_env.user_file, {(FUSED, KEY): entry_for(CFG, **{field: value}),
                                       (FUSED, KEY2): entry_for(CFG)})
    with pytest.warns(tuning.TuningTableWarning, match=why):
        assert _lookup() is tuning.MISSING
    assert _lookup(KEY2) == CFG


def test_the_warning_is_given_once(tuning_env):
    write_table(tuning_env.user_file, {(FUSED, KEY): entry_for(CFG, triton="2.0.0")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            tuning.reload()
            _lookup()
    assert len([w for w in caught if issubclass(w.category, tuning.TuningTableWarning)]) == 1


def test_editing_a_kernel_body_invalidates_the_entries(tuning_env, tmp_path, monkeypatch):
    kernels = tmp_path / "kernels"
    shutil.copytree(kernel_hash.KERNELS_DIR, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(kernel_hash, "KERNELS_DIR", str(kernels))
    registry.record(FUSED, KEY, entry_for(CFG), device_name=DEVICE)
    assert _lookup() == CFG
    gemm = kernels / "gemm.py"
    gemm.write_text(gemm.read_text().replace("acc = tl.dot(a, w, acc, input", "acc = tl.dot(a, w, 1.0 * acc, input", 1))
    tuning.reload()
    with pytest.warns(tuning.TuningTableWarning, match="kernel sources"):
        assert _lookup() is tuning.MISSING
    assert not tuning.covered(FUSED, KEY, device_name=DEVICE)     # the sweep measures it again


TOY = {
    "a.py": ('"""Toy kernels."""\nimport triton\n\nfrom .b import helper\n\n\n@triton.jit\ndef k1(x):\n'
             '    return helper(x)\n\n\n@triton.jit\ndef k2(x):\n    return x * SCALE\n\n\nSCALE = 2\n'),
    "b.py": ('import triton\n\n\n@triton.jit\ndef helper(x):\n    """Adds one."""\n    return x + 1  # one\n\n\n'
             '@triton.jit\ndef unused(x):\n    return x - 1\n'),
}


def _toy(tmp_path, **edits):
    d = tmp_path / f"k{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    for name, text in {**TOY, **edits}.items():
        (d / name).write_text(text)
    return str(d)


def test_a_kernel_hash_covers_the_roots_and_what_they_reach_and_nothing_else(tmp_path):
    h = kernel_hash.kernel_hash
    base = _toy(tmp_path)
    assert sorted(kernel_hash.closure(["a.k1"], base)) == ["a.k1", "b.helper"]
    assert sorted(kernel_hash.closure(["a.k2"], base)) == ["a.SCALE", "a.k2"]
    k1, k2 = h(["a.k1"], base), h(["a.k2"], base)
    helper_edited = _toy(tmp_path, **{"b.py": TOY["b.py"].replace("x + 1", "x + 2")})
    assert h(["a.k1"], helper_edited) != k1 and h(["a.k2"], helper_edited) == k2
    unused_edited = _toy(tmp_path, **{"b.py": TOY["b.py"].replace("x - 1", "x - 3")})
    assert h(["a.k1"], unused_edited) == k1                  # code no root reaches voids nothing
    constant_edited = _toy(tmp_path, **{"a.py": TOY["a.py"].replace("SCALE = 2", "SCALE = 3")})
    assert h(["a.k2"], constant_edited) != k2
    prose_edited = _toy(tmp_path, **{"b.py": TOY["b.py"].replace("Adds one.", "Adds 1.").replace("# one", "# 1")})
    assert h(["a.k1"], prose_edited) == k1                   # comments and docstrings are not code
    moved = _toy(tmp_path, **{"a.py": TOY["a.py"].replace("from .b import", "from .c import"),
                              "c.py": TOY["b.py"]})
    assert h(["a.k1"], moved) == k1                          # a helper moved to another file


def test_an_unknown_kernel_or_module_is_an_error(tmp_path):
    base = _toy(tmp_path)
    with pytest.raises(LookupError, match="nothing"):
        kernel_hash.closure(["a.nothing"], base)
    with pytest.raises(FileNotFoundError, match="missing"):
        kernel_hash.closure(["missing.k"], base)


@pytest.mark.slow
def test_each_familys_hash_moves_with_its_own_kernels_only(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(kernel_hash.KERNELS_DIR, kernels, ignore=shutil.ignore_patterns("__pycache__"))
    fams = list(families.FAMILIES)

    def hashes():
        return {f: validity.kernel_source_hash(f, kernels_dir=str(kernels)) for f in fams}
    h0 = hashes()
    assert h0 == {f: validity.kernel_source_hash(f) for f in fams}
    for f in fams:                 # every family runs the GEMM and reaches its K order and split
        reached = kernel_hash.closure(families.family(f).kernels, str(kernels))
        assert {"gemm.block_gemm_kernel", "degree_order.degree_order_k", "compensated.split_fp16"} <= set(reached)
    fused = kernels / "fused.py"
    text = fused.read_text()
    fused.write_text(text.replace('"""', '"""Edited docstring. ', 1) + "\n# edited\n")
    assert hashes() == h0
    fused.write_text(text.replace("def fused_backward_kernel(", "def fused_backward_kernel(_edited, ", 1))
    changed = {f for f, v in hashes().items() if v != h0[f]}
    assert changed == {"stack_bwd_fused"}                    # the GEMM families' entries stand


def test_the_code_of_a_kernel_module_is_its_text_without_comments_and_docstrings():
    """A subset of the file's own text, so every Python version reads the same bytes."""
    source = (b'"""Module doc."""\n\nimport triton  # why\n\n\n@triton.jit\ndef f(x):\n'
              b'    """Doc of f,\n    two lines."""\n    y = x + 1   # a comment\n    return "#not a comment"\n')
    assert kernel_hash.code_of(source) == b'import triton\n@triton.jit\ndef f(x):\n    y = x + 1\n    return "#not a comment"'


def test_every_shipped_entry_was_measured_on_the_kernels_as_they_are():
    """An edit to a kernel that a family's roots reach voids that family's shipped entries
    (``tuning.kernel_hash``): the package would ship tables a GPU ignores.  Such an edit waits
    for the tables' next tuning, or comes with it."""
    import glob
    from importlib import resources

    # the package's own tables (this module's fixture points store.BUILTIN_DIR at an empty folder)
    tables = glob.glob(os.path.join(str(resources.files("mixstack") / "tables"), "*.json"))
    stale = []
    for path in tables:
        with open(path) as fh:
            doc = json.load(fh)
        for name, entries in doc.get("entries", {}).items():
            current = validity.kernel_source_hash(family=name)
            stale += [f"{os.path.basename(path)} {name} {key}" for key, e in entries.items()
                      if e.get("kernel_hash") not in (None, current)]
    assert tables and not stale, stale[:5]
