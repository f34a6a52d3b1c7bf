#!/usr/bin/env python3
"""One table from the benches of one GPU run: the CUDA path (examples/cuda_bench.rs), PyTorch
SDPA's flash and cuDNN backends (scripts/sdpa_bench.py) and the wgpu path (examples/bench,
tiled, its fastest variant per point), matched on (dtype, pass, B, Hq, Hkv, N, D, causal).

  python3 scripts/bench_compare.py --out-json compare.json --out-md compare.md \
      cuda.json sdpa.json bench.json

Each input is a JSON array of records; a missing or unreadable file is named in the output
and left out. TFLOP/s use the records' FLOP convention: forward 4 * B * H * Sq * Sk * D,
halved for causal; forward+backward 3.5x the forward. The issue's goals are printed beside
the ratios: CUDA forward >= 0.70 of SDPA's flash backend, forward+backward >= 0.60; the cuDNN
backend (on Hopper the stronger peer) has its own column and ratio beside them.
"""
import argparse
import json
import sys

GOALS = {"fwd": 0.70, "fwdbwd": 0.60}


def key(r):
    return (r["dtype"], r["pass"], r["batch"], r["heads_q"], r["heads_kv"], r["seq_q"],
            r["head_dim"], bool(r["causal"]))


def flops(r):
    f = 4.0 * r["batch"] * r["heads_q"] * r["seq_q"] * r["seq_kv"] * r["head_dim"]
    f /= 2.0 if r["causal"] else 1.0
    return f * (3.5 if r["pass"] == "fwdbwd" else 1.0)


def tflops(r):
    ms = r.get("median_ms")
    return flops(r) / (ms * 1e-3) / 1e12 if ms else None


def load(path, notes):
    try:
        with open(path) as f:
            recs = json.load(f)
    except (OSError, ValueError) as e:
        notes.append(f"{path}: left out ({e})")
        return []
    if not isinstance(recs, list):
        notes.append(f"{path}: left out (not a JSON array)")
        return []
    out = []
    for r in recs:
        if "backend" not in r:
            # the wgpu bench: tiled records only, named by variant
            if r.get("algorithm") != "tiled":
                continue
            r = dict(r, backend=f"wgpu-{r.get('variant', '?')}")
        try:
            key(r)
        except KeyError as e:
            notes.append(f"{path}: a record without {e} left out")
            continue
        out.append(r)
    notes.append(f"{path}: {len(out)} records")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+")
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    a = p.parse_args()
    notes, records = [], []
    for path in a.inputs:
        records += load(path, notes)
    # per point: CUDA, SDPA, and the fastest wgpu variant
    points = {}
    for r in records:
        t = tflops(r)
        slot = points.setdefault(key(r), {})
        b = r["backend"]
        kind = "wgpu" if b.startswith("wgpu-") else b
        best = slot.get(kind)
        if t is not None and (best is None or tflops(best) is None or t > tflops(best)):
            slot[kind] = r
        elif best is None:
            slot[kind] = r
    fmt = lambda x: "-" if x is None else f"{x:.3g}"
    ratio = lambda x, y: None if x is None or not y else x / y
    lines = [
        "| dtype | pass | B | Hq | Hkv | N | D | causal | CUDA TFLOP/s | SDPA flash TFLOP/s "
        "| CUDA / SDPA (goal) | SDPA cuDNN TFLOP/s | CUDA / cuDNN | wgpu TFLOP/s (variant) "
        "| wgpu / SDPA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    merged = []
    for k in sorted(points, key=lambda k: (k[0], k[1], k[7], k[5], k[2], k[3], k[6])):
        s = points[k]
        c, t, w = (s.get("cuda"), s.get("torch-sdpa-flash"), s.get("wgpu"))
        n = s.get("torch-sdpa-cudnn")
        tc, tt, tw = (tflops(c) if c else None, tflops(t) if t else None,
                      tflops(w) if w else None)
        tn = tflops(n) if n else None
        if tc is None and tt is None and tw is None and tn is None:
            continue
        rc, rw, rn = ratio(tc, tt), ratio(tw, tt), ratio(tc, tn)
        goal = GOALS.get(k[1])
        verdict = "" if rc is None else (" met" if rc >= goal else " missed")
        rc_s = "-" if rc is None else f"{rc:.2f} (>= {goal:.2f}{verdict})"
        variant = w["backend"][5:] if w else ""
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[5]} | {k[6]} | "
            f"{str(k[7]).lower()} | {fmt(tc)} | {fmt(tt)} | {rc_s} | {fmt(tn)} | "
            f"{'-' if rn is None else f'{rn:.2f}'} | "
            f"{fmt(tw)}{f' ({variant})' if w else ''} | {'-' if rw is None else f'{rw:.3f}'} |")
        merged.append(dict(dtype=k[0], pass_=k[1], batch=k[2], heads_q=k[3], heads_kv=k[4],
                           seq=k[5], head_dim=k[6], causal=k[7], cuda_tflops=tc,
                           sdpa_tflops=tt, sdpa_cudnn_tflops=tn, wgpu_tflops=tw,
                           wgpu_variant=variant or None, cuda_over_sdpa=rc,
                           cuda_over_cudnn=rn, wgpu_over_sdpa=rw))
    for m in merged:
        m["pass"] = m.pop("pass_")
    md = "\n".join(["Inputs: " + "; ".join(notes), ""] + lines) + "\n"
    with open(a.out_md, "w") as f:
        f.write(md)
    with open(a.out_json, "w") as f:
        json.dump({"inputs": notes, "points": merged, "records": records}, f, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
