#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention, its flash backend and its cuDNN backend (each alone,
through torch.nn.attention.sdpa_kernel), over the grid examples/cuda_bench.rs measures, as
records of the same shape, for scripts/bench_compare.py.

FLOPs: forward 4 * B * H * Sq * Sk * D, halved for causal; forward+backward 3.5x forward.
Tensors are laid out [B, N, H, D] as this crate's and transposed to SDPA's [B, H, N, D] view
(no copy; the flash backend takes strided inputs). Times are CUDA events around the calls:
one warm-up, then the median (with min and max) of --repeats; forward+backward times one
forward and one backward (autograd, grad of out given) from the same call, as the crate's
benches do. Without --batch, B = 16384 / N (at least 1), as examples/cuda_bench.rs.

  python3 scripts/sdpa_bench.py --seq 4096,8192,16384 --batch 4,2,1 --heads 32 \
      --head-dim 128 --dtype bf16 --causal-both --json sdpa.json

--backends picks them (default flash,cudnn). A backend this PyTorch lacks or refuses for a
point (cuDNN's attention needs a cuDNN build and a supported shape) gives records with no time
and the reason in their note; the other backend's points still run.
--dry-run checks the arguments and prints the points without importing PyTorch.
Exits 3, writing no records, where PyTorch or CUDA is missing.
"""
import argparse
import json
import os
import statistics
import sys


def comma_ints(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{s!r}: {e}")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: whole numbers of at least 1 expected")
    return v


# --backends: the SDPBackend member each names, and the records' backend field
BACKENDS = {
    "flash": ("FLASH_ATTENTION", "torch-sdpa-flash"),
    "cudnn": ("CUDNN_ATTENTION", "torch-sdpa-cudnn"),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=comma_ints, default=[4096, 8192, 16384])
    p.add_argument("--batch", type=comma_ints, default=None)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=comma_ints, default=[128])
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--causal-both", action="store_true")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--backends", default="flash,cudnn",
                   help="comma-separated: flash (FLASH_ATTENTION), cudnn (CUDNN_ATTENTION)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            p.error(f"--backends takes {', '.join(BACKENDS)}, got {b!r}")
    if a.batch is None:
        a.batch = [max(1, 16384 // n) for n in a.seq]
    if len(a.batch) not in (1, len(a.seq)):
        p.error(f"--batch takes one value or one per --seq value ({len(a.seq)})")
    for d in a.dtype.split(","):
        if d not in ("f16", "bf16"):
            p.error(f"--dtype takes f16 and bf16 (the flash backend's), got {d!r}")
    if a.kv_heads is not None and (a.kv_heads < 1 or a.heads % a.kv_heads):
        p.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads}")
    if a.dry_run:
        for i, n in enumerate(a.seq):
            b = a.batch[0 if len(a.batch) == 1 else i]
            for d in a.head_dim:
                for dname in a.dtype.split(","):
                    print(f"would measure: {'/'.join(backends)} {dname} B={b} N={n} "
                          f"H={a.heads}/{a.kv_heads or a.heads} "
                          f"D={d} causal={'both' if a.causal_both else a.causal}")
        return 0

    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
    except ImportError as e:
        print(f"sdpa_bench: PyTorch is not available ({e})", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device for PyTorch", file=sys.stderr)
        return 3
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16}
    device = f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    print(f"device: {device}")
    causals = [False, True] if a.causal_both else [a.causal]
    hkv = a.kv_heads or a.heads
    records = []

    def timed(fn):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    print("| backend | dtype | B | H | N | D | causal | fwd ms | fwd TFLOP/s | fwd+bwd ms "
          "| fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, n in enumerate(a.seq):
        b = a.batch[0 if len(a.batch) == 1 else i]
        for d in a.head_dim:
            for dname in a.dtype.split(","):
                dt = dtypes[dname]
                for causal in causals:
                    g = torch.Generator(device="cuda").manual_seed(7)

                    def rnd(shape, grad):
                        x = torch.rand(shape, generator=g, device="cuda", dtype=torch.float32) * 2 - 1
                        return x.to(dt).requires_grad_(grad)

                    q = rnd((b, n, a.heads, d), not a.forward_only)
                    k = rnd((b, n, hkv, d), not a.forward_only)
                    v = rnd((b, n, hkv, d), not a.forward_only)
                    d_out = rnd((b, a.heads, n, d), False)

                    def fwd():
                        return F.scaled_dot_product_attention(
                            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            is_causal=causal, enable_gqa=hkv != a.heads)

                    for bname in backends:
                        member, record_name = BACKENDS[bname]
                        fwd_ms, fb_ms, note = [], [], ""
                        backend = getattr(SDPBackend, member, None)
                        try:
                            if backend is None:
                                raise RuntimeError(f"SDPBackend.{member} is not in torch "
                                                   f"{torch.__version__}")
                            with sdpa_kernel(backend):
                                for rep in range(a.repeats + 1):
                                    with torch.no_grad():
                                        tf = timed(fwd)
                                    tb = None
                                    if not a.forward_only:
                                        holder = {}
                                        tfb = timed(lambda: holder.setdefault("o", fwd()))
                                        out = holder["o"]
                                        tb = timed(lambda: out.backward(d_out))
                                        q.grad = k.grad = v.grad = None
                                        del out, holder
                                        tb = tfb + tb
                                    if rep > 0:
                                        fwd_ms.append(tf)
                                        if tb is not None:
                                            fb_ms.append(tb)
                        except (RuntimeError, NotImplementedError, ValueError) as e:
                            # fail soft: this backend's point has no time, the rest still run
                            note = f"SDPA {bname} backend refused: {e}".splitlines()[0]
                            fwd_ms, fb_ms = [], []
                            q.grad = k.grad = v.grad = None
                        flops = 4.0 * b * a.heads * n * n * d / (2.0 if causal else 1.0)
                        cells = []
                        for pass_, ms_list, f in (("fwd", fwd_ms, flops),
                                                  ("fwdbwd", fb_ms, 3.5 * flops)):
                            if a.forward_only and pass_ == "fwdbwd":
                                continue
                            ms = statistics.median(ms_list) if ms_list else None
                            tflops = f / (ms * 1e-3) / 1e12 if ms else None
                            records.append(dict(
                                backend=record_name, device=device, dtype=dname, pass_=pass_,
                                batch=b, heads_q=a.heads, heads_kv=hkv, seq_q=n, seq_kv=n,
                                head_dim=d, causal=causal, median_ms=ms,
                                min_ms=min(ms_list) if ms_list else None,
                                max_ms=max(ms_list) if ms_list else None, tflops=tflops,
                                kernels_ms=[], note=note))
                            cells += [f"{ms:.3f}" if ms else "-",
                                      f"{tflops:.1f}" if tflops else "-"]
                        cells += ["-"] * (4 - len(cells))
                        print(f"| {bname} | {dname} | {b} | {a.heads} | {n} | {d} | "
                              f"{str(causal).lower()} | " + " | ".join(cells) + " |")
                        if note:
                            print(f"  {note}", file=sys.stderr)
                        write_records(records, a.json)
                    del q, k, v, d_out
                    torch.cuda.empty_cache()
    if a.json:
        print(f"wrote {a.json} ({len(records)} records)")
    return 0


def write_records(records, path):
    """The records so far, rewritten after every point (a run killed at its limit keeps what
    it measured), written beside and renamed."""
    if not path:
        return
    out = [{("pass" if k == "pass_" else k): v for k, v in r.items()} for r in records]
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=2)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
