#!/usr/bin/env python3
"""The decode step and the verify pass, specdec against the PyTorch peer, in one run on one GPU.

Runs torch_peer.py and bench_gpu_e2e (graph mode, --decode-only) at the same shape and context,
alternating them --rounds times so a drift of the device's clocks shows up in both, and prints per
T = 1..tmax the medians of each side's medians, the ratio peer / specdec (> 1: specdec is faster)
and one JSON line per T. Exit 1 when either side fails or prints no row for some T.

usage: verify_vs_peer.py [--bench PATH] [--config NAME] [--ctx N] [--tmax T] [--reps N] [--rounds R]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def run(cmd):
    print("# " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        raise SystemExit(f"verify_vs_peer: {cmd[0]} exited with {p.returncode}")
    return p.stdout


def specdec_rows(out, config):
    rows = {}
    for line in out.splitlines():
        if not line.startswith('{"bench":"gpu_e2e",'):
            continue
        r = json.loads(line)
        if r["config"] == config and r["moe_arm"] == "graph":
            rows[r["T"]] = (r["ms_median"], r["pct_roofline"])
    return rows


def peer_rows(out):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^peer T=(\d+) ms=([0-9.]+)$", out, re.M)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_bench = os.path.join(os.path.dirname(os.environ["SPECDEC_BIN"]), "bench_gpu_e2e") if "SPECDEC_BIN" in os.environ \
        else os.path.join(here, "..", "..", "build", "bench", "bench_gpu_e2e")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=default_bench, help="the bench_gpu_e2e binary (default: beside $SPECDEC_BIN, else build/)")
    ap.add_argument("--config", default="kimi-linear-48b-a3b", help="a config in configs/ without .json")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tmax", type=int, default=9)
    ap.add_argument("--reps", type=int, default=10, help="bench_gpu_e2e's repetitions a row")
    ap.add_argument("--rounds", type=int, default=2, help="how many times each side runs, alternating")
    a = ap.parse_args()
    if a.tmax < 1 or a.rounds < 1 or a.ctx < 1:
        raise SystemExit("verify_vs_peer: --tmax, --rounds and --ctx must be positive")
    src = os.environ.get("SPECDEC_SOURCE_DIR", os.path.join(here, "..", ".."))
    cfg = os.path.join(src, "configs", a.config + ".json")
    if not os.path.isfile(cfg):
        raise SystemExit(f"verify_vs_peer: {cfg}: no such config")
    if not os.access(a.bench, os.X_OK):
        raise SystemExit(f"verify_vs_peer: {a.bench}: not an executable (--bench)")
    peer = [sys.executable, os.path.join(here, "torch_peer.py"), "--config", cfg, "--ctx", str(a.ctx), "--tmax", str(a.tmax)]
    ours = [a.bench, "--config", a.config, "--ctx", str(a.ctx), "--decode-only", "--kmax", str(a.tmax - 1), "--reps", str(a.reps)]
    got_peer, got_ours = [], []
    for _ in range(a.rounds):
        got_peer.append(peer_rows(run(peer)))
        got_ours.append(specdec_rows(run(ours), a.config))
    print(f"# {a.config}, ctx {a.ctx}, graph mode, medians of {a.rounds} alternating runs")
    print(f"{'T':>2} {'specdec_ms':>10} {'roofline':>8} {'peer_ms':>9} {'peer/specdec':>12}")
    bad = 0
    for T in range(1, a.tmax + 1):
        if any(T not in r for r in got_peer) or any(T not in r for r in got_ours):
            print(f"{T:>2} missing a row", file=sys.stderr)
            bad = 1
            continue
        s = statistics.median(r[T][0] for r in got_ours)
        pct = statistics.median(r[T][1] for r in got_ours)
        p = statistics.median(r[T] for r in got_peer)
        print(f"{T:>2} {s:>10.3f} {pct:>7.1f}% {p:>9.3f} {p / s:>12.3f}")
        print(json.dumps({"bench": "verify_vs_peer", "config": a.config, "ctx": a.ctx, "T": T, "specdec_ms": s,
                          "pct_roofline": pct, "peer_ms": p, "peer_over_specdec": p / s, "rounds": a.rounds}))
    return bad


if __name__ == "__main__":
    sys.exit(main())
