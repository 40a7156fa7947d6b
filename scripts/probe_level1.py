"""Exploratory GPU probe for level 1 (temporary; the bench module replaces it)."""
import json, os, sys, time, statistics
import torch
sys.path.insert(0, os.getcwd())
import mixstack
from mixstack import launch, reference
from mixstack.layout import StackLayout

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False
import torch._functorch.config as _fc; _fc.donated_buffer = False
SHAPES = {"S1": (300003, 2, 32, 3), "S2": (300003, 2, 32, 6), "S3": (646000, 2, 32, 3), "S4": (300003, 1, 64, 3)}
NL = 4
log = open(os.path.join(OUT, "probe.log"), "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

def inputs(E, F, Cf, L, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    lay = StackLayout(L, Cf)
    r = lambda *s: torch.randn(*s, device=dev, generator=g)
    u0 = r(F, E, lay.row)
    al = torch.rand(E, F, device=dev, generator=g) + 0.1
    w0 = r(NL, F, lay.m0, lay.m0) / (lay.m0 * NL) ** .5
    w1 = r(NL, F, lay.m1, lay.m1) / (lay.m1 * NL) ** .5
    gw = r(NL - 1, F, Cf, lay.gate_width) / Cf ** .5
    go = r(E, F, lay.row)
    return u0, al, w0, w1, gw, go

def timeit(fns, rounds=7, inner=3):
    names = list(fns); res = {n: [] for n in names}
    for n in names:
        fns[n](); 
    torch.cuda.synchronize()
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner): fns[n]()
            e.record(); torch.cuda.synchronize()
            res[n].append(s.elapsed_time(e) / inner)
    return {n: statistics.median(v) for n, v in res.items()}

def peak(fn):
    torch.cuda.synchronize(); base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats(); fn(); torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20

def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()

which = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
summary = []
for name in which:
    E, F, Cf, L = SHAPES[name]
    u0, al, w0, w1, gw, go = inputs(E, F, Cf, L)
    kw = dict(lmax=L, focus_dim=Cf, apply_alpha=True)
    # accuracy on a subset vs float64
    n = 4096
    sub = [t.double() for t in (u0[:, :n], al[:n])]
    uu = sub[0].clone().requires_grad_(); aa = sub[1].clone().requires_grad_()
    o64 = reference.mixing_stack(uu, aa, w0.double(), w1.double(), gw.double(), **kw)
    g64 = torch.autograd.grad(o64, [uu, aa], go[:n].double())
    us = u0[:, :n].clone().requires_grad_(); as_ = al[:n].clone().requires_grad_()
    with mixstack.use_level(1), mixstack.dispatch_log() as dl:
        o1 = mixstack.mixing_stack(us, as_, w0, w1, gw, **kw)
        g1 = torch.autograd.grad(o1, [us, as_], go[:n])
    p(name, "paths", dict(dl), "err out", rel(o1, o64), "gu", rel(g1[0], g64[0]), "ga", rel(g1[1], g64[1]))
    ur = u0.clone().requires_grad_(); ar = al.clone().requires_grad_()
    def l1_fwd():
        with torch.no_grad(), mixstack.use_level(1):
            mixstack.mixing_stack(u0, al, w0, w1, gw, **kw)
    def l1_both():
        with mixstack.use_level(1):
            o = mixstack.mixing_stack(ur, ar, w0, w1, gw, **kw)
            torch.autograd.grad(o, [ur, ar], go)
    torch._dynamo.reset(); comp = torch.compile(reference.mixing_stack)
    def c_both():
        o = comp(ur, ar, w0, w1, gw, **kw)
        torch.autograd.grad(o, [ur, ar], go)
    def e_both():
        o = reference.mixing_stack(ur, ar, w0, w1, gw, **kw)
        torch.autograd.grad(o, [ur, ar], go)
    t0 = time.time(); l1_both(); c_both(); torch.cuda.synchronize(); p(name, "warm/compile s", round(time.time() - t0, 1))
    # backward only: forward kept
    with mixstack.use_level(1):
        o_keep = mixstack.mixing_stack(ur, ar, w0, w1, gw, **kw)
    def l1_bwd():
        torch.autograd.grad(o_keep, [ur, ar], go, retain_graph=True)
    oc_keep = comp(ur, ar, w0, w1, gw, **kw)
    def c_bwd():
        torch.autograd.grad(oc_keep, [ur, ar], go, retain_graph=True)
    t = timeit({"L1 fwd": l1_fwd, "L1 bwd": l1_bwd, "L1 both": l1_both, "C bwd": c_bwd, "C both": c_both, "E both": e_both}, rounds=5, inner=2)
    del o_keep, oc_keep
    m1 = peak(l1_both); mc = peak(c_both)
    row = dict(shape=name, **{k: round(v, 2) for k, v in t.items()}, mem_L1=round(m1), mem_C=round(mc))
    p(json.dumps(row)); summary.append(row)
    if name in ("S1", "S2") and os.environ.get("PROBE_SWEEP"):
        cfgs = [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3), dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
                dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4),
                dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2), dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)]
        orig = dict(launch.GEMM_CONFIG)
        fns = {}
        for i, c in enumerate(cfgs):
            def f(c=c):
                launch.GEMM_CONFIG.clear(); launch.GEMM_CONFIG.update(c); l1_fwd(); l1_bwd_fresh()
            fns[str(tuple(c.values()))] = f
        def l1_bwd_fresh():
            with mixstack.use_level(1):
                o = mixstack.mixing_stack(ur, ar, w0, w1, gw, **kw)
                torch.autograd.grad(o, [ur, ar], go)
        try:
            tc = timeit(fns, rounds=3, inner=1)
            p(name, "gemm config sweep (fwd + fwd&bwd):", json.dumps({k: round(v, 2) for k, v in tc.items()}))
        except Exception as ex:
            p("sweep failed", repr(ex)[:300])
        launch.GEMM_CONFIG.clear(); launch.GEMM_CONFIG.update(orig)
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            l1_both(); torch.cuda.synchronize()
        p(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    del u0, al, w0, w1, gw, go, ur, ar
    torch.cuda.empty_cache()

# register / spill report of every compiled kernel
from mixstack.kernels import gemm, gate, reduce
for fn in (gemm.block_gemm_kernel, gate.gate_kernel, gate.gate_backward_kernel, reduce.alpha_grad_kernel):
    for d, caches in fn.device_caches.items():
        for key, k in caches[0].items():
            p(fn.__name__, "regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared)
p("SUMMARY")
for r in summary:
    p(json.dumps(r))
