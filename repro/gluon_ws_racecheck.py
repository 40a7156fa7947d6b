"""Does ``compute-sanitizer --tool racecheck`` report a hazard in a Gluon kernel whose partitions share
no shared memory at all?

The Gluon probes (``scripts/gluon_gemm_probe.py``, ``scripts/gluon_chain_probe.py``) report one kind of
racecheck hazard and no other: warps 4-7's first lanes (threads 128-224) reading one 4-byte word of
shared memory at the kernel's entry and thread 31 writing it at the default partition's end.  The
probes' own buffers (ring slots, mbarriers, tiles) never appear.  This kernel has the same shape of
partitions (a default partition of ``num_warps`` warps, one one-warp worker) and nothing else: each
partition writes its own global outputs, neither allocates shared memory or waits on an mbarrier.
Its PTX (``--offline``) shows the word: the default partition stores the partitions' state, a byte
a warp, before ``barrier.sync 1``, and each worker warp loads its byte after it.  On an H100
racecheck reports nothing here (2026-12-07), so the handshake alone does not raise the probes'
report; ``--sync`` adds the one thing the probes' partitions add around it, their own barrier
(``bar.sync 0, <its threads>``), before and after the store.

    compute-sanitizer --tool racecheck --racecheck-report hazard python3 repro/gluon_ws_racecheck.py [--sync]
    python3 repro/gluon_ws_racecheck.py --offline   # the PTX's barriers and shared-memory words, no GPU
"""

from __future__ import annotations

import argparse
import re
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

N = 1024


# Triton 3.6 names the partition's barrier thread_barrier, 3.7 barrier
_sync = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier


@gluon.jit
def _default_part(out_ptr, n, BLOCK: gl.constexpr, SYNC: gl.constexpr, num_warps: gl.constexpr):
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    if SYNC:                                      # the partition's own barrier, as the probes' phases use it
        _sync()
    gl.store(out_ptr + offs, offs.to(gl.float32), mask=offs < n)
    if SYNC:
        _sync()


@gluon.jit
def _worker_part(flag_ptr):
    offs = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    gl.store(flag_ptr + gl.program_id(0) * 32 + offs, offs + 1)


@gluon.jit
def ws_only(out_ptr, flag_ptr, n, BLOCK: gl.constexpr, SYNC: gl.constexpr, num_warps: gl.constexpr):
    """Two partitions that touch disjoint global memory and no shared memory; with ``SYNC`` the default
    partition passes its own barrier (``bar.sync 0`` over its warps) before and after its store."""
    gl.warp_specialize([
        (_default_part, (out_ptr, n, BLOCK, SYNC, num_warps)),
        (_worker_part, (flag_ptr,)),
    ], [1], [24])


def offline(arch: int, sync: bool) -> int:
    """Compile for ``sm_<arch>`` without a GPU; print the PTX's barrier and shared-memory lines."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(ws_only, {"out_ptr": "*fp32", "flag_ptr": "*i32", "n": "i32", "BLOCK": "constexpr",
                                   "SYNC": "constexpr", "num_warps": "constexpr"},
                         constexprs={(3,): 128, (4,): sync, (5,): 4})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4})
    for line in kernel.asm["ptx"].splitlines():
        if re.search(r"bar\.|barrier|\.shared|setmaxnreg", line):
            print(line.strip())
    print(f"shared memory: {kernel.metadata.shared} bytes")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for --arch and print the PTX's barriers")
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--sync", action="store_true", help="the default partition passes its own barrier twice")
    args = p.parse_args(argv)
    if args.offline:
        return offline(args.arch, args.sync)
    import torch
    out = torch.zeros(N, device="cuda")
    blocks = triton.cdiv(N, 128)
    flags = torch.zeros(blocks * 32, dtype=torch.int32, device="cuda")
    ws_only[(blocks,)](out, flags, N, BLOCK=128, SYNC=args.sync, num_warps=4)
    torch.cuda.synchronize()
    ok = torch.equal(out, torch.arange(N, device="cuda", dtype=torch.float32)) and \
        torch.equal(flags, torch.arange(1, 33, device="cuda", dtype=torch.int32).repeat(blocks))
    print(f"outputs {'right' if ok else 'WRONG'}; {blocks} programs, 4 + 1 warps each")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
