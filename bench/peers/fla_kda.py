#!/usr/bin/env python3
"""fla_kda.py — times flash-linear-attention's fused_recurrent_kda (fla-core 0.6.0) at our scan's
shape: B=1, H=32, d=128 (K = V = 128), T in {1, 5} (decode, verify k=4), fp32 throughout, so the
numbers sit beside bench/kda_lab.cu's on the same GPU.

Two calls:
  api    fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True): the public
         entry; q, k already L2-normalised (use_qk_l2norm_in_kernel=False, as our scan receives
         them), g the log decay (gate applied outside, use_gate_in_kernel=False), beta post-sigmoid.
         It allocates its output (a zero fill kernel) and writes only the final state.
  slots  fused_recurrent_kda_fwd(..., initial_state=slots, inplace_final_state=True,
         ssm_state_indices=[[1..T]], out=preallocated): the vLLM-style continuous-batching path that
         writes the state after every token into slot indices[t] (reads slot indices[0]) — the same
         bytes as our scan (read one slot, write T), one kernel, no allocation.
Timing (µs per call, median): events around one call on one buffer set (ev warm) and on rotating
sets (ev cold); CUDA-graph replay of one captured call (graph warm) and of one call per rotating
set (graph cold; the sets touch >= 150 MB, beyond the 60 MB L2).

Run: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fla_core-*.whl
     PYTHONPATH=/tmp/site python3 bench/peers/fla_kda.py
"""
import math
import statistics
import sys

import torch
import torch.nn.functional as F

from fla.ops.kda import fused_recurrent_kda
from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

H, D = 32, 128
dev = "cuda"


def make_set(T, n_slots):
    q = F.normalize(torch.randn(1, T, H, D, device=dev), p=2, dim=-1)
    k = F.normalize(torch.randn(1, T, H, D, device=dev), p=2, dim=-1)
    v = torch.randn(1, T, H, D, device=dev)
    g = -2.5 * torch.rand(1, T, H, D, device=dev) * torch.rand(1, T, H, D, device=dev)
    beta = 0.05 + 0.9 * torch.rand(1, T, H, device=dev)
    h0 = 0.1 * torch.randn(1, H, D, D, device=dev)
    slots = 0.1 * torch.randn(n_slots, H, D, D, device=dev)
    idx = torch.arange(1, T + 1, device=dev, dtype=torch.int32).view(1, T)
    out = torch.empty_like(v)
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, slots=slots, idx=idx, out=out)


def call_api(s):
    return fused_recurrent_kda(s["q"], s["k"], s["v"], s["g"], s["beta"], initial_state=s["h0"],
                               output_final_state=True, use_qk_l2norm_in_kernel=False)


def call_slots(s):
    return fused_recurrent_kda_fwd(s["q"], s["k"], s["v"], s["g"], s["beta"], initial_state=s["slots"],
                                   inplace_final_state=True, ssm_state_indices=s["idx"], out=s["out"])


def check(T):
    """fla against a float64 transcription of the recurrence (MODEL.md KDA), both calls."""
    s = make_set(T, T + 1)
    S0 = s["h0"][0].double()
    Sslot = s["slots"][1].double().clone()
    o_api, ht = call_api(s)
    o_sl, _ = call_slots(s)
    torch.cuda.synchronize()
    scale = D ** -0.5
    S, ys, states = S0.clone(), [], []
    for t in range(T):
        q, k, v = s["q"][0, t].double(), s["k"][0, t].double(), s["v"][0, t].double()
        g, b = s["g"][0, t].double(), s["beta"][0, t].double()
        S = S * g.exp()[:, :, None]
        u = b[:, None] * (v - torch.einsum("hij,hi->hj", S, k))
        S = S + k[:, :, None] * u[:, None, :]
        ys.append(torch.einsum("hij,hi->hj", S, q * scale))
    ref = torch.stack(ys)
    e_api = ((o_api[0].double() - ref).norm() / ref.norm()).item()
    e_ht = ((ht[0].double() - S).norm() / S.norm()).item()
    # the slots call starts from slot 1's original contents
    S = Sslot
    ys2 = []
    for t in range(T):
        q, k, v = s["q"][0, t].double(), s["k"][0, t].double(), s["v"][0, t].double()
        g, b = s["g"][0, t].double(), s["beta"][0, t].double()
        S = S * g.exp()[:, :, None]
        u = b[:, None] * (v - torch.einsum("hij,hi->hj", S, k))
        S = S + k[:, :, None] * u[:, None, :]
        ys2.append(torch.einsum("hij,hi->hj", S, q * scale))
    ref2 = torch.stack(ys2)
    e_sl = ((o_sl[0].double() - ref2).norm() / ref2.norm()).item()
    e_slS = ((s["slots"][T].double() - S).norm() / S.norm()).item()
    print(f"check T={T}: api o rel {e_api:.2e} final state rel {e_ht:.2e}; slots o rel {e_sl:.2e} "
          f"last slot rel {e_slS:.2e}")
    return max(e_api, e_ht, e_sl, e_slS) < 1e-4


def time_call(fn, sets):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(20):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    res = {}
    for name, pick in (("ev_warm", lambda r: sets[0]), ("ev_cold", lambda r: sets[r % len(sets)])):
        ts = []
        for r in range(200):
            s = pick(r)
            e0.record()
            fn(s)
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        res[name] = statistics.median(ts)
    stream = torch.cuda.Stream()
    for name, group, replays in (("graph_warm", sets[:1], 2000), ("graph_cold", sets, 200)):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on the capture stream
            for s in group:
                fn(s)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for s in group:
                fn(s)
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            e0.record()
            for _ in range(replays):
                graph.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / (replays * len(group)))
        res[name] = statistics.median(ts)
    return res


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}")
    import fla
    print(f"fla {fla.__version__} from {fla.__file__}")
    ok = all(check(T) for T in (1, 5))
    print("fla check vs float64:", "ok" if ok else "FAIL")
    rows = []
    for T in (1, 5):
        touched = 4 * (H * D * D * (1 + T) + 5 * T * H * D + T * H)
        nsets = max(8, math.ceil(150e6 / touched))
        sets = [make_set(T, T + 1) for _ in range(nsets)]
        for name, fn in (("api (final state)", call_api), ("slots (per-position)", call_slots)):
            r = time_call(fn, sets)
            gbs = touched / (r["graph_cold"] * 1e-6) / 1e9
            rows.append((name, T, r, gbs))
        del sets
        torch.cuda.empty_cache()
    print("\nfla fused_recurrent_kda, H=32 d=128 fp32, µs per call (median)")
    print(f"{'call':24s} {'T':>2s} | {'ev warm':>8s} {'ev cold':>8s} | {'gr warm':>8s} {'gr cold':>8s} | "
          f"{'GB/s cold (our bytes)':>21s}")
    for name, T, r, gbs in rows:
        print(f"{name:24s} {T:2d} | {r['ev_warm']:8.2f} {r['ev_cold']:8.2f} | {r['graph_warm']:8.2f} "
              f"{r['graph_cold']:8.2f} | {gbs:21.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
