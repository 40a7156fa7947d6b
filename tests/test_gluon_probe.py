"""The Gluon probe of level 3's block product (``scripts/gluon_gemm_probe.py``) builds for Hopper
without a GPU: the compiler's own report of what it made (the GPU run measures it)."""

import pytest
from helpers import load_script

from mixstack.measure import compiler_report

needs_ptxas = pytest.mark.skipif(not compiler_report.tools_available(), reason="needs Triton's bundled ptxas")


@needs_ptxas
def test_the_gluon_kernel_builds_for_sm90_with_its_partitions_tma_loads_and_warpgroup_mmas(monkeypatch):
    """One config (two MMA warpgroups, pipelined, persistent) at the |m| = 1 block: TMA loads, warpgroup
    MMAs, register reallocation between the partitions, the loader's warps added, no spills."""
    probe = load_script("gluon_gemm_probe")
    monkeypatch.setattr(probe, "BLOCKS", (192,))
    monkeypatch.setattr(probe, "CONFIGS", ((128, 64, 32, 4, 8, 1, 1),))
    (row,) = probe.offline(90)
    assert "error" not in row, row
    assert row["spill_bytes"] == 0 and row["warps"] > 8
    assert row["wgmma"] > 0 and row["tma_loads"] > 0 and row["setmaxnreg"] > 0
    assert row["shared_bytes"] >= 4 * (128 * 32 * 4 + 2 * 32 * 64 * 2)      # the ring of four slots


def test_the_probes_rates_come_from_the_one_timing_loop_a_call_at_a_time(monkeypatch):
    """``rates``: every variant through ``time_interleaved`` (rotating order, a warm-up round), each
    sample ``reps`` calls, the median divided back to one call."""
    from mixstack.measure import timing

    probe = load_script("gluon_gemm_probe")
    calls = {"a": 0, "b": 0}
    seen = {}
    real = timing.time_interleaved

    def spy(variants, **kw):
        seen.update(kw)
        return real(variants, **kw, clock=lambda fn: (fn(), 0.002)[1])        # 2 ms a sample

    monkeypatch.setattr(timing, "time_interleaved", spy)
    out = probe.rates({n: (lambda n=n: calls.__setitem__(n, calls[n] + 1)) for n in calls}, 3, 4, 2e9, device="cpu")
    assert seen == {"rounds": 3, "warmup": 1, "device": "cpu"}
    assert calls == {"a": 16, "b": 16}                                           # (1 + 3) rounds x 4 calls
    assert out["ms"] == {"a": 0.5, "b": 0.5} and out["tflops"]["a"] == 2e9 / 0.5 / 1e9


@needs_ptxas
def test_the_ping_pong_chain_builds_two_mma_partitions_on_one_weight_ring(monkeypatch):
    """Design B's product phase with two row tiles an SM (``gluon_chain`` with ``GROUPS`` 2): the same K loop
    twice over (each MMA partition its own tile), each partition's phases behind its own named barrier,
    the ring's slots released by both, no spills; the single-tile kernel alongside it unchanged."""
    chain = load_script("gluon_chain_probe")
    monkeypatch.setattr(chain, "BLOCKS", (128,))
    monkeypatch.setattr(chain, "CONFIGS", ((64, 64, 64, 4, 4),))
    monkeypatch.setattr(chain, "PINGPONG_CONFIGS", ((64, 64, 64, 4, 4),))
    single, pingpong = chain.offline(90, 4, ("chain", "pingpong"))
    assert single["form"] == "chain" and pingpong["form"] == "pingpong"
    assert "error" not in single and "error" not in pingpong, (single, pingpong)
    assert pingpong["spill_bytes"] == 0 and pingpong["warps"] == 12 and single["warps"] == 8
    assert pingpong["wgmma"] == 2 * single["wgmma"] > 0
    assert pingpong["shared_bytes"] > single["shared_bytes"] + 64 * 128 * 8 - 1024        # a second row tile
    assert chain.fits((64, 64, 32, 2, 4), 192, groups=2) and not chain.fits((64, 64, 64, 4, 4), 192, groups=2)


@needs_ptxas
def test_the_in_flight_chain_waits_for_the_last_steps_mmas_not_its_own(monkeypatch):
    """``INFLIGHT``: the same MMAs, but each K step waits only until its own three are the ones outstanding
    (``wgmma.wait_group 3``, the previous step's slot freed then) and the tile's end waits for all; the
    plain form waits for every step's own (``wait_group 0`` only)."""
    chain = load_script("gluon_chain_probe")
    monkeypatch.setattr(chain, "BLOCKS", (128,))
    monkeypatch.setattr(chain, "CONFIGS", ((64, 64, 32, 6, 4),))
    plain, inflight = chain.offline(90, 4, ("chain", "chain-inflight"))
    assert "error" not in plain and "error" not in inflight, (plain, inflight)
    assert plain["wgmma_waits"] == [0] and inflight["wgmma_waits"] == [0, 3]
    assert inflight["wgmma"] == plain["wgmma"] > 0 and inflight["spill_bytes"] == 0


@needs_ptxas
def test_the_diagnostic_chain_forms_leave_out_mmas_or_the_split_and_nothing_else(monkeypatch):
    """The forms that ask what bounds the chain: ``chain-mma1`` issues the head product alone (a third of
    the in-flight chain's MMAs, waits of depth 1), ``chain-mma2`` two thirds; ``chain-nosplit`` the same
    MMAs as the in-flight chain; ``chain-mma1-nosplit-headw`` loads the weights' head tiles alone (half
    the TMA loads).  Never among the default forms (their results are wrong by design)."""
    chain = load_script("gluon_chain_probe")
    monkeypatch.setattr(chain, "BLOCKS", (128,))
    monkeypatch.setattr(chain, "CONFIGS", ((64, 64, 64, 4, 4),))
    monkeypatch.setattr(chain, "DIAGNOSTIC_CONFIGS", ((64, 64, 64, 4, 4),))
    full, one, two, nosplit, both, headw = chain.offline(90, 4, ("chain-inflight", "chain-mma1", "chain-mma2", "chain-nosplit",
                                                                "chain-mma1-nosplit", "chain-mma1-nosplit-headw"))
    rows = (full, one, two, nosplit, both, headw)
    assert all("error" not in r and r["spill_bytes"] == 0 for r in rows), rows
    assert full["wgmma"] == 3 * one["wgmma"] == nosplit["wgmma"] and 2 * full["wgmma"] == 3 * two["wgmma"] > 0
    assert one["wgmma_waits"] == [0, 1] and two["wgmma_waits"] == [0, 2] and nosplit["wgmma_waits"] == [0, 3]
    assert headw["wgmma"] == both["wgmma"] == one["wgmma"] and 2 * headw["tma_loads"] == both["tma_loads"] > 0
    assert not set(chain.DIAGNOSTIC_FORMS) & set(chain.FORMS)
    assert chain.parser().parse_args(["--forms", "chain-mma1,chain"]).forms == ("chain-mma1", "chain")


@needs_ptxas
def test_the_prefetching_chain_copies_the_next_row_tile_in_under_this_ones_layers(monkeypatch):
    """``chain-prefetch``: the in-flight chain's MMAs and weight loads, plus a second fp32 row buffer that
    the next row tile's rows are copied into by ``cp.async`` (waited to depth 1 in the loop, 0 at the end)
    in place of the blocking loads; the forms without it copy nothing asynchronously."""
    chain = load_script("gluon_chain_probe")
    monkeypatch.setattr(chain, "BLOCKS", (128,))
    monkeypatch.setattr(chain, "CONFIGS", ((64, 64, 64, 4, 4),))
    inflight, prefetch = chain.offline(90, 4, ("chain-inflight", "chain-prefetch"))
    assert "error" not in inflight and "error" not in prefetch, (inflight, prefetch)
    assert prefetch["wgmma"] == inflight["wgmma"] > 0 and prefetch["tma_loads"] == inflight["tma_loads"]
    assert inflight["cp_async"] == 0 and prefetch["cp_async"] > 0 and prefetch["cp_async_waits"] == [0, 1]
    assert prefetch["shared_bytes"] >= inflight["shared_bytes"] + 64 * 128 * 4 and prefetch["spill_bytes"] == 0
    assert chain.fits((64, 128, 64, 4, 4), 128, prefetch=True) and not chain.fits((128, 128, 64, 2, 8), 128, prefetch=True)
    assert "chain-prefetch" in chain.FORMS and "chain-prefetch" not in chain.DIAGNOSTIC_FORMS


@needs_ptxas
def test_the_swizzled_chain_permutes_the_row_buffer_and_nothing_else(monkeypatch):
    """``chain-swizzle``: the fp32 row buffer's 16-byte pieces permuted by the row's index mod 8 (so that
    the epilogue's stores of eight rows' columns fall into different banks); the same MMAs, loads, copies
    and shared memory as the in-flight chain, and with ``chain-prefetch-swizzle`` both changes at once."""
    chain = load_script("gluon_chain_probe")
    monkeypatch.setattr(chain, "BLOCKS", (128,))
    monkeypatch.setattr(chain, "CONFIGS", ((64, 64, 64, 4, 4),))
    plain, swizzled, both, prefetch = chain.offline(90, 4, ("chain-inflight", "chain-swizzle", "chain-prefetch-swizzle",
                                                            "chain-prefetch"))
    assert all("error" not in r and r["spill_bytes"] == 0 for r in (plain, swizzled, both, prefetch))
    same = ("wgmma", "tma_loads", "cp_async", "wgmma_waits", "shared_bytes")
    assert all(swizzled[k] == plain[k] for k in same) and all(both[k] == prefetch[k] for k in same)
    assert chain.constexprs((64, 64, 64, 4, 4), 128, 4, swizzle=True)["XVEC"] == 4
    assert chain.constexprs((64, 64, 64, 4, 4), 128, 4)["XPHASES"] == 1          # the default: unswizzled


def test_the_chain_probe_names_an_unknown_form():
    chain = load_script("gluon_chain_probe")
    assert chain.parser().parse_args(["--forms", "pingpong-inflight,chain"]).forms == ("pingpong-inflight", "chain")
    with pytest.raises(SystemExit):
        chain.parser().parse_args(["--forms", "pingpong,zigzag"])


def test_design_b_forward_fits_s1s_row_only():
    """The forward keeps a 64-row tile of fp32 rows and their fp16 split in shared memory: at S1's row (320
    floats) with the sigmoids, the staging tile and the ring that is 224 KB, under an SM's 227 KB; at S4's
    (Cf 64, 640 floats) the row tile and its split alone are 320 KB, so no config fits and the probe says so."""
    probe = load_script("gluon_forward_probe")
    assert all(probe.fits(cfg, 3, 32) for cfg in probe.CONFIGS)
    assert probe.smem_bytes(probe.CONFIGS[0], 3, 32) == 64 * 320 * 8 + 64 * 96 * 4 + 64 * 64 * 4 + 64 * 32 * 4 + 2 * 2 * 32 * 64 * 2
    assert not any(probe.fits(cfg, 3, 64) for cfg in probe.CONFIGS)
    with pytest.raises(SystemExit, match="--focus-dim 64 --lmax 3"):
        probe.main(["--focus-dim", "64", "--cpu"])


@needs_ptxas
def test_design_b_forward_builds_for_sm90_with_its_loader_partition_and_no_spills(monkeypatch):
    """The Gluon forward at S1's key, one config: TMA loads of the weights, warpgroup MMAs, register
    reallocation between the MMA partition and the loader, the MMAs left in flight (wait depths 3 and 0),
    no spills, and the shared memory the probe counts (barriers aside)."""
    probe = load_script("gluon_forward_probe")
    monkeypatch.setattr(probe, "CONFIGS", ((64, 64, 16, 4, 4),))
    (row,) = probe.offline(90, 3, 32, 4)
    assert "error" not in row, row
    assert row["spill_bytes"] == 0 and row["wgmma"] > 0 and row["tma_loads"] > 0 and row["setmaxnreg"] > 0
    assert row["wgmma_waits"] == [0, 3]
    assert row["smem_counted"] <= row["shared_bytes"] <= row["smem_counted"] + 1024 <= 227 * 1024 + 1024
