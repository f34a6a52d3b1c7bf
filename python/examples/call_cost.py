"""The Python side of the overhead measurement (scripts/python-overhead.sh): the wall time of
the calls examples/call_cost.rs makes from Rust, made through the package: a forward at
N = 1024 from numpy arrays to numpy arrays, and a decode step over a device-resident KV cache
(q and the new row uploaded, out read back). Prints the median of --reps calls after one
warm-up each."""

import argparse
import time

import numpy as np

import flash_attn_wgpu as fa

FORWARD = (1024, 8, 64)  # seq, heads, head_dim (as examples/call_cost.rs)
DECODE = (8, 2, 64, 4096, 1000)  # heads, kv heads, head_dim, cache rows, cached


def filled(shape, salt):
    i = np.arange(int(np.prod(shape)))
    return (((i * 7 + salt) % 23).astype(np.float32) - 11.0).reshape(shape) / 11.0


def median_ms(reps, call):
    call()  # compiles the pipelines
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        ms.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ms))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=20)
    reps = p.parse_args().reps
    n, h, d = FORWARD
    q, k, v = (filled((1, n, h, d), s) for s in (1, 2, 3))
    forward = median_ms(reps, lambda: fa.flash_attn_func(q, k, v))
    hq, hk, d, rows, cached = DECODE
    kc = fa.tensor(filled((1, rows, hk, d), 4))
    vc = fa.tensor(filled((1, rows, hk, d), 5))
    qs, ks, vs = filled((1, 1, hq, d), 6), filled((1, 1, hk, d), 7), filled((1, 1, hk, d), 8)

    def step():
        fa.flash_attn_with_kvcache(fa.tensor(qs), kc, vc, fa.tensor(ks), fa.tensor(vs),
                                   cache_seqlens=cached, causal=True).numpy()

    decode = median_ms(reps, step)
    print(f"python forward {forward:.3f} ms")
    print(f"python decode {decode:.3f} ms")


if __name__ == "__main__":
    main()
