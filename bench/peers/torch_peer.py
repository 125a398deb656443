#!/usr/bin/env python3
"""torch_peer.py — the same model as specdec (MODEL.md) in plain PyTorch, at the kimi-linear-48b-a3b
shape (configs/kimi-linear-48b-a3b.json), bs = 1, a context of 512 positions, synthetic bf16 weights
(~98 GB, made on the device): the peer specdec's decode step and verify pass are timed against
(issue 25). Built the way a careful PyTorch implementation would be:
  KDA     the six projections of a layer in one matmul; the short convolutions with F.conv1d over the
          conv state; fla's fused_recurrent_kda_fwd (fla-core 0.6.0) with the q/k L2 norm, the decay
          gate (-exp(A_log)·softplus(g + dt_bias)) and the beta sigmoid in its kernel, writing the
          state after every token into its own slot (what speculative rollback needs, the same bytes
          as specdec's scan); the gated output norm and o_proj in torch;
  MLA     absorbed (MODEL.md): q̃ = W_UKᵀ qn scored against the bf16 latent cache, softmax, the
          latent sum, W_UV after it; the cache rows of the new positions written in place;
  MoE     fp32 router (sigmoid, bias, top-k, renormalised, scaled); a Triton kernel pair that reads
          each SELECTED expert's weights once whatever the number of tokens that chose it (the up
          kernel: one program per (distinct expert, 64 rows of gate and up), all T tokens against the
          tile, SwiGLU; the down kernel likewise), then the weighted combine and the shared expert;
  graphs  one CUDA graph per T (the whole step: embedding to each row's argmax), replayed.
Printed, for T = 1 (the decode step) .. 9 (a verify pass of k = 8): `peer T=<T> ms=<median ms>`,
one line each, after `# ` header lines; the MoE kernels are checked against plain torch first
(`# moe check ... ok`), and the script exits 1 when that check fails.

Run (torch and triton installed; fla-core and einops from .whl/):
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site SPECDEC_SOURCE_DIR=$PWD python3 bench/peers/torch_peer.py [--ctx 512] [--tmax 9]
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

dev = "cuda"
BF = torch.bfloat16


# ---------------------------------------------------------------------------- the MoE kernels
@triton.jit
def moe_up_kernel(x_ptr, w13_ptr, slot_expert_ptr, n_slots_ptr, h_ptr, T,
                  D: tl.constexpr, IE: tl.constexpr, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """h[s, t, n] = silu(gate_e[n]·x_t) · (up_e[n]·x_t) for the expert e of slot s, every token t:
    the expert's gate and up rows n of this program are read once."""
    s = tl.program_id(0)
    if s >= tl.load(n_slots_ptr):
        return
    e = tl.load(slot_expert_ptr + s).to(tl.int64)
    offs_t = tl.arange(0, T_PAD)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_gate = w13_ptr + e * (2 * IE * D) + offs_n[None, :] * D
    w_up = w_gate + IE * D
    acc_g = tl.zeros((T_PAD, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((T_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_t[:, None] * D + kk[None, :], mask=offs_t[:, None] < T, other=0.0)
        acc_g += tl.dot(x, tl.load(w_gate + kk[:, None]))
        acc_u += tl.dot(x, tl.load(w_up + kk[:, None]))
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + s * (T_PAD * IE) + offs_t[:, None] * IE + offs_n[None, :], h.to(tl.bfloat16),
             mask=offs_t[:, None] < T)


@triton.jit
def moe_down_kernel(h_ptr, w2_ptr, slot_expert_ptr, n_slots_ptr, y_ptr, T,
                    D: tl.constexpr, IE: tl.constexpr, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr):
    """y[s, t, n] = down_e[n]·h[s, t] for the expert e of slot s: its down rows read once."""
    s = tl.program_id(0)
    if s >= tl.load(n_slots_ptr):
        return
    e = tl.load(slot_expert_ptr + s).to(tl.int64)
    offs_t = tl.arange(0, T_PAD)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w = w2_ptr + e * (D * IE) + offs_n[None, :] * IE
    acc = tl.zeros((T_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, IE, BLOCK_K):
        kk = k0 + offs_k
        h = tl.load(h_ptr + s * (T_PAD * IE) + offs_t[:, None] * IE + kk[None, :], mask=offs_t[:, None] < T,
                    other=0.0)
        acc += tl.dot(h, tl.load(w + kk[:, None]))
    tl.store(y_ptr + s * (T_PAD * D) + offs_t[:, None] * D + offs_n[None, :], acc, mask=offs_t[:, None] < T)


T_PAD, BLOCK_N, BLOCK_K = 16, 64, 128


def routed_experts(x, sel, w, w13, w2, bufs):
    """Σ_j w[t, j] · expert_{sel[t, j]}(x_t), each selected expert's weights read once."""
    T, K = sel.shape
    E, two_ie, D = w13.shape
    IE = two_ie // 2
    flat = sel.reshape(-1)
    sorted_e, order = torch.sort(flat)
    first = torch.ones_like(sorted_e)
    first[1:] = (sorted_e[1:] != sorted_e[:-1]).long()
    slot_sorted = torch.cumsum(first, 0) - 1                # the distinct expert's slot of each sorted entry
    n_slots = (slot_sorted[-1:] + 1).to(torch.int32)
    slot_expert = torch.zeros(T * K, dtype=torch.int32, device=dev)
    slot_expert.scatter_(0, slot_sorted, sorted_e.to(torch.int32))
    entry_slot = torch.empty_like(slot_sorted)
    entry_slot[order] = slot_sorted
    h, y = bufs["h"], bufs["y"]
    moe_up_kernel[(T * K, IE // BLOCK_N)](x, w13, slot_expert, n_slots, h, T, D=D, IE=IE, T_PAD=T_PAD,
                                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    moe_down_kernel[(T * K, D // BLOCK_N)](h, w2, slot_expert, n_slots, y, T, D=D, IE=IE, T_PAD=T_PAD,
                                           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    tok = torch.arange(T, device=dev).repeat_interleave(K)
    y_entry = y[entry_slot, tok]                            # (T·K, D) fp32
    return (y_entry.view(T, K, D) * w.unsqueeze(-1)).sum(1)


def moe_bufs(tmax, K, D, IE):
    return {"h": torch.empty(tmax * K, T_PAD, IE, dtype=BF, device=dev),
            "y": torch.empty(tmax * K, T_PAD, D, dtype=torch.float32, device=dev)}


def check_moe(D, IE, E, K, T=5):
    """The Triton pair against plain torch on random weights: relative error of the combined output."""
    g = torch.Generator(device=dev).manual_seed(1)
    w13 = (torch.randn(E, 2 * IE, D, device=dev, generator=g) / math.sqrt(D)).to(BF)
    w2 = (torch.randn(E, D, IE, device=dev, generator=g) / math.sqrt(IE)).to(BF)
    x = torch.randn(T, D, device=dev, generator=g).to(BF)
    sel = torch.stack([torch.randperm(E, device=dev, generator=g)[:K] for _ in range(T)])
    sel[1, :3] = sel[0, :3]                                  # shared experts between tokens
    w = torch.rand(T, K, device=dev, generator=g)
    got = routed_experts(x, sel, w, w13, w2, moe_bufs(T, K, D, IE))
    ref = torch.zeros(T, D, device=dev)
    for t in range(T):
        for j in range(K):
            e = sel[t, j]
            hg = w13[e, :IE].float() @ x[t].float()
            hu = w13[e, IE:].float() @ x[t].float()
            h = (F.silu(hg) * hu).to(BF).float()
            ref[t] += w[t, j] * (w2[e].float() @ h)
    rel = ((got - ref).norm() / ref.norm()).item()
    ok = math.isfinite(rel) and rel < 2e-2                   # bf16 operands, fp32 accumulation
    print(f"# moe check T={T}: relative error {rel:.2e} {'ok' if ok else 'FAIL'}")
    return ok


# ---------------------------------------------------------------------------- the model
def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


class Peer:
    def __init__(self, c, ctx, tmax):
        self.c, self.ctx, self.tmax = c, ctx, tmax
        D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
        la = c["linear_attn_config"]
        self.kda_layers = {i - 1 for i in la["kda_layers"]}
        self.H, self.d, self.W = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        self.P = self.H * self.d
        self.Hm, self.R = c["num_attention_heads"], c["kv_lora_rank"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.E, self.K, self.Ie = c["num_experts"], c["num_experts_per_token"], c["moe_intermediate_size"]
        self.S, self.I, self.F = c["num_shared_experts"], c["intermediate_size"], c["first_k_dense_replace"]
        self.eps = c["rms_norm_eps"]

        def mat(rows, cols, scale=1.0):
            t = torch.empty(rows, cols, dtype=BF, device=dev)
            return t.normal_(0.0, scale / math.sqrt(cols))

        res = 1.0 / math.sqrt(2 * L)                         # residual writers
        self.embed = torch.empty(V, D, dtype=BF, device=dev).normal_(0.0, 1.0)
        self.lm_head = mat(V, D)
        self.final_norm = torch.ones(D, device=dev)
        self.layers = []
        P, d, H, W = self.P, self.d, self.H, self.W
        for i in range(L):
            ly = {"in_norm": torch.ones(D, device=dev), "post_norm": torch.ones(D, device=dev)}
            if i in self.kda_layers:
                ly["proj"] = mat(3 * P + 2 * d + H, D)        # q | k | v | f_a | g_a | b
                ly["conv"] = torch.empty(3 * P, 1, W, device=dev).normal_(0.0, 0.5)
                ly["A_log"] = torch.empty(H, device=dev).uniform_(0.0, 2.5)
                ly["dt_bias"] = torch.empty(P, device=dev).uniform_(-1.0, 1.0)
                ly["f_b"], ly["g_b"] = mat(P, d), mat(P, d)
                ly["o_norm"] = torch.ones(d, device=dev)
                ly["o"] = mat(D, P, res)
                ly["conv_state"] = torch.zeros(1, 3 * P, W - 1, device=dev)
                ly["slots"] = torch.empty(tmax + 1, H, d, d, device=dev).normal_(0.0, 0.01)
            else:
                ly["proj"] = mat(self.Hm * (self.dn + self.dr) + self.R + self.dr, D)
                ly["kv_norm"] = torch.ones(self.R, device=dev)
                ly["w_uk"] = mat(self.Hm * self.dn, self.R).view(self.Hm, self.dn, self.R)
                ly["w_uv"] = mat(self.Hm * self.dv, self.R).view(self.Hm, self.dv, self.R)
                ly["o"] = mat(D, self.Hm * self.dv, res)
                ly["c"] = torch.empty(ctx + tmax, self.R, dtype=BF, device=dev).normal_(0.0, 1.0)
                ly["kpe"] = torch.empty(ctx + tmax, self.dr, dtype=BF, device=dev).normal_(0.0, 1.0)
            if i < self.F:
                ly["gate_up"], ly["down"] = mat(2 * self.I, D), mat(D, self.I, res)
            else:
                ly["router"] = torch.empty(self.E, D, device=dev).normal_(0.0, 1.0 / math.sqrt(D))
                ly["bias"] = torch.zeros(self.E, device=dev)
                ly["w13"] = torch.empty(self.E, 2 * self.Ie, D, dtype=BF, device=dev).normal_(0.0, 1.0 / math.sqrt(D))
                ly["w2"] = torch.empty(self.E, D, self.Ie, dtype=BF, device=dev).normal_(0.0, res / math.sqrt(self.Ie))
                ly["shared_gate_up"] = mat(2 * self.S * self.Ie, D)
                ly["shared_down"] = mat(D, self.S * self.Ie, res)
            self.layers.append(ly)
        self.bufs = moe_bufs(tmax, self.K, D, self.Ie)
        self.kda_out = {T: torch.empty(1, T, H, d, device=dev) for T in range(1, tmax + 1)}
        self.kda_idx = {T: torch.arange(1, T + 1, device=dev, dtype=torch.int32).view(1, T) for T in range(1, tmax + 1)}

    def kda(self, ly, a, T):
        P, d, H, W = self.P, self.d, self.H, self.W
        proj = a @ ly["proj"].t()
        qkv, fa, ga, b = proj[:, :3 * P], proj[:, 3 * P:3 * P + d], proj[:, 3 * P + d:3 * P + 2 * d], proj[:, 3 * P + 2 * d:]
        xs = torch.cat([ly["conv_state"], qkv.float().t().unsqueeze(0)], dim=2)      # (1, 3P, W-1+T)
        ly["conv_state"].copy_(xs[:, :, -(W - 1):])
        qkv = F.silu(F.conv1d(xs, ly["conv"], groups=3 * P)).squeeze(0).t()         # (T, 3P)
        q, k, v = (qkv[:, i * P:(i + 1) * P].reshape(1, T, H, d).contiguous() for i in range(3))
        g = (fa @ ly["f_b"].t()).float().view(1, T, H, d).contiguous()
        beta = b.float().view(1, T, H).contiguous()
        o, _ = fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=ly["A_log"], dt_bias=ly["dt_bias"],
                                       initial_state=ly["slots"], inplace_final_state=True,
                                       ssm_state_indices=self.kda_idx[T], use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                       out=self.kda_out[T])
        gate = torch.sigmoid((ga @ ly["g_b"].t()).float()).view(T, H, d)
        y = rmsnorm(o.view(T, H, d), ly["o_norm"], self.eps) * gate
        return y.reshape(T, P).to(BF) @ ly["o"].t()

    def mla(self, ly, a, T):
        Hm, R, dn, dr = self.Hm, self.R, self.dn, self.dr
        proj = a @ ly["proj"].t()
        q = proj[:, :Hm * (dn + dr)].view(T, Hm, dn + dr)
        kv = proj[:, Hm * (dn + dr):]
        L = self.ctx + T
        ly["c"][self.ctx:L] = rmsnorm(kv[:, :R], ly["kv_norm"], self.eps)
        ly["kpe"][self.ctx:L] = kv[:, R:]
        q_abs = torch.einsum("thn,hnr->thr", q[:, :, :dn], ly["w_uk"])                # (T, Hm, R)
        s = (q_abs.reshape(T * Hm, R) @ ly["c"][:L].t() + q[:, :, dn:].reshape(T * Hm, dr) @ ly["kpe"][:L].t())
        s = s.float().view(T, Hm, L) * (dn + dr) ** -0.5
        s = s + self.mask[T]
        lat = torch.softmax(s, dim=-1).to(BF).view(T * Hm, L) @ ly["c"][:L]          # (T·Hm, R)
        o = torch.einsum("thr,hvr->thv", lat.view(T, Hm, R), ly["w_uv"])
        return o.reshape(T, Hm * self.dv) @ ly["o"].t()

    def ffn(self, gate_up, down, a):
        h = a @ gate_up.t()
        n = h.shape[1] // 2
        return (F.silu(h[:, :n]) * h[:, n:]) @ down.t()

    def moe(self, ly, a):
        s = torch.sigmoid(a.float() @ ly["router"].t())
        _, sel = torch.topk(s + ly["bias"], self.K, dim=-1)
        w = s.gather(1, sel)
        if self.c.get("moe_renormalize", True):
            w = w / w.sum(-1, keepdim=True)
        w = w * self.c["routed_scaling_factor"]
        routed = routed_experts(a, sel, w, ly["w13"], ly["w2"], self.bufs)
        return (routed + self.ffn(ly["shared_gate_up"], ly["shared_down"], a).float()).to(BF)

    def step(self, tokens, out):
        T = tokens.shape[0]
        x = self.embed[tokens]
        for i, ly in enumerate(self.layers):
            a = rmsnorm(x, ly["in_norm"], self.eps)
            x = x + (self.kda(ly, a, T) if i in self.kda_layers else self.mla(ly, a, T))
            a = rmsnorm(x, ly["post_norm"], self.eps)
            x = x + (self.ffn(ly["gate_up"], ly["down"], a) if i < self.F else self.moe(ly, a))
        logits = rmsnorm(x, self.final_norm, self.eps) @ self.lm_head.t()
        out.copy_(torch.argmax(logits, dim=-1))

    def build_masks(self):
        self.mask = {}
        for T in range(1, self.tmax + 1):
            L = self.ctx + T
            j = torch.arange(L, device=dev).view(1, 1, L)
            t = torch.arange(T, device=dev).view(T, 1, 1)
            self.mask[T] = torch.where(j > self.ctx + t, float("-inf"), 0.0).to(torch.float32)


def time_graph(peer, T, replays=20, rounds=5):
    tokens = torch.randint(0, peer.c["vocab_size"], (T,), device=dev)
    out = torch.empty(T, dtype=torch.long, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                             # warm-up (compiles the Triton kernels)
        for _ in range(3):
            peer.step(tokens, out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        peer.step(tokens, out)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(rounds):
        e0.record()
        for _ in range(replays):
            graph.replay()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1) / replays)
    del graph
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tmax", type=int, default=9)
    ap.add_argument("--config", default=None, help="config.json (default: configs/kimi-linear-48b-a3b.json)")
    args = ap.parse_args()
    path = args.config or os.path.join(os.environ.get("SPECDEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                                       "configs", "kimi-linear-48b-a3b.json")
    with open(path) as f:
        c = json.load(f)
    torch.manual_seed(0)
    import fla
    print(f"# torch {torch.__version__}, triton {triton.__version__}, fla {fla.__version__}, {torch.cuda.get_device_name()}")
    if not check_moe(c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_token"]):
        return 1
    with torch.inference_mode():
        peer = Peer(c, args.ctx, args.tmax)
        peer.build_masks()
        torch.cuda.synchronize()
        print(f"# {os.path.basename(path)}: {torch.cuda.memory_allocated() / 1e9:.1f} GB on the device, ctx {args.ctx}, "
              "one CUDA graph per T, median of 5 rounds of 20 replays")
        for T in range(1, args.tmax + 1):
            print(f"peer T={T} ms={time_graph(peer, T):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
