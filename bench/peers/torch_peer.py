#!/usr/bin/env python3
"""torch_peer.py — the same model as specdec (MODEL.md) in plain PyTorch, at the kimi-linear-48b-a3b
shape (configs/kimi-linear-48b-a3b.json), bs = 1, a context of 512 positions, synthetic bf16 weights
(~98 GB, made on the device): the peer specdec's decode step and verify pass are timed against
(issue 25). Built the way a careful PyTorch implementation would be:
  KDA     the six projections of a layer in one matmul; the short convolutions over the conv state
          (the W taps summed, fused with the silu and the q/k/v split); fla's fused_recurrent_kda_fwd
          (fla-core 0.6.0) with the q/k L2 norm, the decay gate (-exp(A_log)·softplus(g + dt_bias))
          and the beta sigmoid in its kernel, writing the state after every token into its own slot
          (what speculative rollback needs, the same bytes as specdec's scan); the gated output norm
          and o_proj in torch;
  MLA     absorbed (MODEL.md): q̃ = W_UKᵀ qn scored against the bf16 latent cache, softmax, the
          latent sum, W_UV after it; the cache rows of the new positions written in place;
  MoE     fp32 router (sigmoid, bias, top-k, renormalised, scaled); a Triton kernel pair that reads
          each SELECTED expert's weights once whatever the number of tokens that chose it (the up
          kernel: one program per (distinct expert, 64 rows of gate and up), all T tokens against the
          tile, SwiGLU; the down kernel likewise), then the weighted combine and the shared expert;
  glue    compiled by inductor (torch.compile, fullgraph, static shapes: one graph per region and T,
          made in the warm-up before capture): the embedding and every rmsnorm with its residual
          add, the KDA pre-kernel glue (conv, silu, q/k/v, g, beta, gate projection) and post-kernel
          glue (gate sigmoid, o-norm, product, o_proj), MLA's score, mask and softmax, the router
          with the MoE slot bookkeeping (its fp32 product a fused reduction, its top-k a sort), the
          combine with the shared expert, the argmax: each region a few fused kernels around the
          cuBLAS GEMMs (inductor's extern calls). fla's kernel and the two MoE Triton kernels are
          called from plain Python between the regions, the in-place state and cache writes
          likewise; a compile failure or a graph break is an error, never an eager fallback;
  graphs  one CUDA graph per T (the whole step: embedding to each row's argmax), replayed.
Printed, for T = 1 (the decode step) .. 9 (a verify pass of k = 8): `peer T=<T> ms=<median ms>`,
one line each, after `# ` header lines; the MoE kernels are checked against plain torch first
(`# moe check ... ok`), and the script exits 1 when that check fails. `--profile T` (repeatable)
adds the per-kernel device time of a step at T as `# prof` lines: where the peer's time goes.

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
import torch._dynamo
import torch._inductor.config
import torch.nn.functional as F
import triton
import triton.language as tl

from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

dev = "cuda"
BF = torch.bfloat16

# Inductor for the glue: a graph per (region, T) with T = 1..9, each compiled at its first call (the
# warm-up); an error, a graph break or a hit recompile limit raises, never falls back to eager.
for _name in ("cache_size_limit", "recompile_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 64)
if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
    torch._dynamo.config.fail_on_recompile_limit_hit = True
torch._dynamo.config.suppress_errors = False
if hasattr(torch._inductor.config, "emulate_precision_casts"):
    torch._inductor.config.emulate_precision_casts = True      # bf16 intermediates rounded as eager rounds them


def compiled(fn):
    """fn compiled by inductor as one graph (fullgraph: a break is an error), static shapes."""
    return torch.compile(fn, fullgraph=True, dynamic=False)


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


def moe_slots(sel):
    """The distinct experts of sel (T, K) in slots: slot_expert[s] (int32, T·K, the first n_slots
    used), n_slots (int32, one element) and entry_slot[t, j], the slot of sel[t, j]."""
    T, K = sel.shape
    flat = sel.reshape(-1)
    sorted_e, _ = torch.sort(flat)
    first = torch.cat([torch.ones_like(sorted_e[:1]), (sorted_e[1:] != sorted_e[:-1]).long()])
    slot_sorted = torch.cumsum(first, 0) - 1                # the distinct expert's slot of each sorted entry
    n_slots = (slot_sorted[-1:] + 1).to(torch.int32)
    s = torch.arange(T * K, device=sel.device).view(-1, 1)  # no scatter: (T·K)² compares, one fused kernel
    slot_expert = torch.where((first > 0) & (slot_sorted == s), sorted_e, 0).sum(1).to(torch.int32)
    entry_slot = (first * (sorted_e < flat.view(-1, 1))).sum(1)     # the distinct experts below sel[t, j]
    return slot_expert, n_slots, entry_slot.view(T, K)


def moe_kernels(x, w13, w2, slot_expert, n_slots, bufs):
    """y[s, t] = expert_{slot_expert[s]}(x_t) for the slots s < n_slots: the Triton pair."""
    T, D = x.shape
    IE = w13.shape[1] // 2
    slots = slot_expert.shape[0]
    h, y = bufs["h"], bufs["y"]
    moe_up_kernel[(slots, IE // BLOCK_N)](x, w13, slot_expert, n_slots, h, T, D=D, IE=IE, T_PAD=T_PAD,
                                          BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    moe_down_kernel[(slots, D // BLOCK_N)](h, w2, slot_expert, n_slots, y, T, D=D, IE=IE, T_PAD=T_PAD,
                                           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


def moe_combine(y, entry_slot, w):
    """Σ_j w[t, j] · y[entry_slot[t, j], t] (fp32), j in order."""
    T, K = entry_slot.shape
    tok = torch.arange(T, device=y.device)
    acc = y[entry_slot[:, 0], tok] * w[:, 0:1]
    for j in range(1, K):
        acc = acc + y[entry_slot[:, j], tok] * w[:, j:j + 1]
    return acc


moe_slots_c, moe_combine_c = compiled(moe_slots), compiled(moe_combine)


def routed_experts(x, sel, w, w13, w2, bufs):
    """Σ_j w[t, j] · expert_{sel[t, j]}(x_t), each selected expert's weights read once."""
    slot_expert, n_slots, entry_slot = moe_slots_c(sel)
    return moe_combine_c(moe_kernels(x, w13, w2, slot_expert, n_slots, bufs), entry_slot, w)


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


def ffn(gate_up, down, a):
    h = a @ gate_up.t()
    n = h.shape[1] // 2
    return (F.silu(h[:, :n]) * h[:, n:]) @ down.t()


# The compiled regions of a step; the plain Python between them launches fla's kernel, the MoE pair
# and the in-place writes of the conv states and the latent cache.
@compiled
def embed_norm(embed, tokens, w, eps):
    x = embed[tokens]
    return x, rmsnorm(x, w, eps)


@compiled
def add_norm(x, y, w, eps):
    x = x + y
    return x, rmsnorm(x, w, eps)


@compiled
def ffn_add_norm(x, a, gate_up, down, w, eps):
    x = x + ffn(gate_up, down, a)
    return x, rmsnorm(x, w, eps)


@compiled
def kda_pre(a, proj_w, conv_state, conv_w, f_b, g_b):
    """The projections, the short convolutions over the conv state (its next value returned), silu;
    q, k, v, g (fp32, (1, T, H, d)), beta (fp32, (1, T, H)), the gate's projection (bf16, (T, P))."""
    T = a.shape[0]
    P, d = f_b.shape
    H, W = P // d, conv_w.shape[-1]
    proj = a @ proj_w.t()
    qkv, fa, ga, b = proj[:, :3 * P], proj[:, 3 * P:3 * P + d], proj[:, 3 * P + d:3 * P + 2 * d], proj[:, 3 * P + 2 * d:]
    xs = torch.cat([conv_state[0].t(), qkv.float()], dim=0)                 # (W-1+T, 3P)
    taps = conv_w[:, 0]                                                      # (3P, W)
    acc = xs[0:T] * taps[:, 0]
    for j in range(1, W):                                                    # F.conv1d(xs, conv_w, groups=3P)
        acc = acc + xs[j:j + T] * taps[:, j]
    qkv = F.silu(acc)                                                        # (T, 3P)
    q, k, v = [qkv[:, i * P:(i + 1) * P].reshape(1, T, H, d).contiguous() for i in range(3)]
    g = (fa @ f_b.t()).float().view(1, T, H, d).contiguous()
    beta = b.float().view(1, T, H).contiguous()
    return q, k, v, g, beta, ga @ g_b.t(), xs[T:].t().unsqueeze(0).contiguous()


@compiled
def kda_post(o, gate, o_norm, o_w, eps):
    T, H, d = o.shape[1], o.shape[2], o.shape[3]
    y = rmsnorm(o.view(T, H, d), o_norm, eps) * torch.sigmoid(gate.float()).view(T, H, d)
    return y.reshape(T, H * d).to(BF) @ o_w.t()


@compiled
def mla_pre(a, proj_w, kv_norm, w_uk, dr, eps):
    """q̃ (T, Hm, R), the rope part of q (T·Hm, dr), the new latent and rope cache rows."""
    T = a.shape[0]
    Hm, dn, R = w_uk.shape
    proj = a @ proj_w.t()
    q = proj[:, :Hm * (dn + dr)].view(T, Hm, dn + dr)
    kv = proj[:, Hm * (dn + dr):]
    q_abs = torch.einsum("thn,hnr->thr", q[:, :, :dn], w_uk)
    return q_abs, q[:, :, dn:].reshape(T * Hm, dr), rmsnorm(kv[:, :R], kv_norm, eps), kv[:, R:].contiguous()


@compiled
def mla_attn(q_abs, q_pe, c, kpe, mask, w_uv, o_w, scale):
    T, Hm, R = q_abs.shape
    L = c.shape[0]
    s = q_abs.reshape(T * Hm, R) @ c.t() + q_pe @ kpe.t()
    s = s.float().view(T, Hm, L) * scale
    s = s + mask
    lat = torch.softmax(s, dim=-1).to(BF).view(T * Hm, L) @ c                  # (T·Hm, R)
    o = torch.einsum("thr,hvr->thv", lat.view(T, Hm, R), w_uv)
    return o.reshape(T, -1) @ o_w.t()


@compiled
def route(a, router_w, bias, K, renormalize, scale):
    """The fp32 router and the slots of its choice: (w, slot_expert, n_slots, entry_slot). Its
    product a fused fp32 reduction and its top-k a sort (inductor's; cuBLAS's fp32 GEMV / SIMT GEMM
    and ATen's top-k are several launches and µs at these sizes)."""
    s = torch.sigmoid((a.float().unsqueeze(1) * router_w).sum(-1))            # (T, E)
    sel = torch.sort(s + bias, dim=-1, descending=True)[1][:, :K]            # top-k, highest first
    w = s.gather(1, sel)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    w = w * scale
    return (w,) + moe_slots(sel)


@compiled
def moe_add_norm(x, a, y, entry_slot, w, shared_gate_up, shared_down, norm_w, eps):
    m = (moe_combine(y, entry_slot, w) + ffn(shared_gate_up, shared_down, a).float()).to(BF)
    x = x + m
    return x, rmsnorm(x, norm_w, eps)


@compiled
def head(a, lm_head):
    return torch.argmax(a @ lm_head.t(), dim=-1)


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

    def kda(self, ly, a):
        T = a.shape[0]
        q, k, v, g, beta, gate, state = kda_pre(a, ly["proj"], ly["conv_state"], ly["conv"], ly["f_b"], ly["g_b"])
        ly["conv_state"].copy_(state)
        o, _ = fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=ly["A_log"], dt_bias=ly["dt_bias"],
                                       initial_state=ly["slots"], inplace_final_state=True,
                                       ssm_state_indices=self.kda_idx[T], use_qk_l2norm_in_kernel=True,
                                       use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                       out=self.kda_out[T])
        return kda_post(o, gate, ly["o_norm"], ly["o"], self.eps)

    def mla(self, ly, a):
        T = a.shape[0]
        L = self.ctx + T
        q_abs, q_pe, c_new, kpe_new = mla_pre(a, ly["proj"], ly["kv_norm"], ly["w_uk"], self.dr, self.eps)
        ly["c"][self.ctx:L] = c_new
        ly["kpe"][self.ctx:L] = kpe_new
        return mla_attn(q_abs, q_pe, ly["c"][:L], ly["kpe"][:L], self.mask[T], ly["w_uv"], ly["o"],
                        (self.dn + self.dr) ** -0.5)

    def moe(self, ly, x, a, norm_w):
        """x + moe(a), and its rmsnorm with norm_w (the next sublayer's)."""
        w, slot_expert, n_slots, entry_slot = route(a, ly["router"], ly["bias"], self.K,
                                                    bool(self.c.get("moe_renormalize", True)),
                                                    float(self.c["routed_scaling_factor"]))
        y = moe_kernels(a, ly["w13"], ly["w2"], slot_expert, n_slots, self.bufs)
        return moe_add_norm(x, a, y, entry_slot, w, ly["shared_gate_up"], ly["shared_down"], norm_w, self.eps)

    def step(self, tokens, out):
        n = len(self.layers)
        x, a = embed_norm(self.embed, tokens, self.layers[0]["in_norm"], self.eps)
        for i, ly in enumerate(self.layers):
            x, a = add_norm(x, self.kda(ly, a) if i in self.kda_layers else self.mla(ly, a), ly["post_norm"], self.eps)
            nxt = self.layers[i + 1]["in_norm"] if i + 1 < n else self.final_norm
            if i < self.F:
                x, a = ffn_add_norm(x, a, ly["gate_up"], ly["down"], nxt, self.eps)
            else:
                x, a = self.moe(ly, x, a, nxt)
        out.copy_(head(a, self.lm_head))

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
    with torch.cuda.stream(side):                             # warm-up (compiles the Triton kernels, inductor's graphs at T)
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


def profile_step(peer, T, top=25):
    """Per-kernel device time of one step at T (eager launches, the kernels the graph replays),
    printed as `# prof` lines: where the peer's time goes."""
    from torch.profiler import ProfilerActivity, profile
    tokens = torch.randint(0, peer.c["vocab_size"], (T,), device=dev)
    out = torch.empty(T, dtype=torch.long, device=dev)
    peer.step(tokens, out)
    torch.cuda.synchronize()
    steps = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            peer.step(tokens, out)
        torch.cuda.synchronize()
    rows = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            n, us = rows.get(ev.name, (0, 0.0))
            rows[ev.name] = (n + 1, us + ev.device_time)
    total = sum(us for _, us in rows.values()) / steps
    print(f"# prof T={T}: {total / 1e3:.3f} ms of kernels a step, {sum(n for n, _ in rows.values()) // steps} launches")
    for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"# prof T={T} {us / steps:9.1f} us {n // steps:5d}x  {name[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tmax", type=int, default=9)
    ap.add_argument("--config", default=None, help="config.json (default: configs/kimi-linear-48b-a3b.json)")
    ap.add_argument("--profile", type=int, action="append", default=[], metavar="T",
                    help="after the timing, the per-kernel device time of a step at T (repeatable)")
    args = ap.parse_args()
    path = args.config or os.path.join(os.environ.get("SPECDEC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                                       "configs", "kimi-linear-48b-a3b.json")
    with open(path) as f:
        c = json.load(f)
    torch.manual_seed(0)
    import fla
    print(f"# torch {torch.__version__}, triton {triton.__version__}, fla {fla.__version__}, {torch.cuda.get_device_name()}")
    with torch.inference_mode():
        if not check_moe(c["hidden_size"], c["moe_intermediate_size"], c["num_experts"], c["num_experts_per_token"]):
            return 1
        peer = Peer(c, args.ctx, args.tmax)
        peer.build_masks()
        torch.cuda.synchronize()
        print(f"# {os.path.basename(path)}: {torch.cuda.memory_allocated() / 1e9:.1f} GB on the device, ctx {args.ctx}, "
              "one CUDA graph per T, median of 5 rounds of 20 replays")
        print(f"# glue compiled by inductor (torch.compile fullgraph, static shapes, a graph per region and T); "
              "fla's kernel, the MoE Triton pair and the GEMMs as before")
        for T in range(1, args.tmax + 1):
            print(f"peer T={T} ms={time_graph(peer, T):.3f}", flush=True)
        for T in args.profile:
            profile_step(peer, T)
    return 0


if __name__ == "__main__":
    sys.exit(main())
