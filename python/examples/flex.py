"""Your own modifiers from Python (FlexAttention for WebGPU): three the library does not have,
each a few lines of WGSL passed as a string, run forward and backward on the GPU and checked
against a float64 numpy computation of the same definition:

- a document mask (``mask_mod`` over captured document ids) with its block mask made on the
  GPU (``create_block_mask``), so that blocks across documents are never visited;
- prefix-LM (every row sees the first keys, the rest causally);
- T5's bucketed relative positions (``score_mod`` reading a captured table per head), the
  table trainable: the backward also returns its gradient (``score_mod_trainable``).

    python python/examples/flex.py [--seq 256] [--heads 4] [--head-dim 32] [--seed N]
"""

import argparse

import numpy as np

import flash_attn_wgpu as fa

DOCUMENTS = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return doc(i) == doc(j); }"

PREFIX_LM = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return j < 32u || j <= i; }"

T5 = """
fn t5_bucket(i: u32, j: u32) -> u32 {
    let rel = i32(j) - i32(i);
    let side = select(0u, 8u, rel > 0);
    let n = u32(abs(rel));
    if (n < 4u) {
        return side + n;
    }
    return side + select(select(select(7u, 6u, n < 32u), 5u, n < 16u), 4u, n < 8u);
}
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return s + table(h * 16u + t5_bucket(i, j));
}
"""


def t5_bucket(i, j):
    rel = j - i
    n = np.abs(rel)
    far = np.where(n < 8, 4, np.where(n < 16, 5, np.where(n < 32, 6, 7)))
    return np.where(rel > 0, 8, 0) + np.where(n < 4, n, far)


def reference(q, k, v, dout, visible, bias, entries=None):
    """out and dq, dk, dv in float64 for one batch: q [n, h, d]; visible(h) a [n, n] bool
    matrix, bias(h) a [n, n] term added to the scaled scores; with entries(h) (the [n, n]
    table entries the bias reads) also the table's gradient, each pair's dS summed into its
    entry."""
    n, heads, d = q.shape
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    out, dq, dk, dv = (np.zeros_like(q) for _ in range(4))
    d_table = np.zeros(heads * 16)
    for h in range(heads):
        s = np.where(visible(h), q[:, h] @ k[:, h].T / np.sqrt(d) + bias(h), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ v[:, h]
        dp = dout[:, h] @ v[:, h].T
        ds = p * (dp - (dout[:, h] * out[:, h]).sum(axis=1, keepdims=True))
        dq[:, h] = ds @ k[:, h] / np.sqrt(d)
        dk[:, h] = ds.T @ q[:, h] / np.sqrt(d)
        dv[:, h] = p.T @ dout[:, h]
        if entries is not None:
            np.add.at(d_table, entries(h), ds)
    return (out, dq, dk, dv) + ((d_table,) if entries is not None else ())


def check(name, got, want):
    err = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want))
    what = "out, dq, dk, dv" + (", d_table" if len(want) > 4 else "")
    print(f"{name:28} max |error| {err:.2e} ({what})")
    assert err < 1e-4, f"{name}: error {err}"


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--seq", type=int, default=256)
    a.add_argument("--heads", type=int, default=4)
    a.add_argument("--head-dim", type=int, default=32)
    a.add_argument("--seed", type=int, default=None)
    args = a.parse_args()
    seed = args.seed if args.seed is not None else np.random.SeedSequence().entropy % 2**32
    rng = np.random.default_rng(seed)
    n, h, d = args.seq, args.heads, args.head_dim
    print(f"adapter: {fa.adapter()}; seq {n}, heads {h}, head_dim {d}, seed {seed}")
    q, k, v, dout = (rng.standard_normal((1, n, h, d)).astype(np.float32) for _ in range(4))
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    none = lambda head: 0.0  # noqa: E731

    def run(name, visible, bias, entries=None, trainable=None, **opts):
        out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
        grads = fa.flash_attn_backward(dout, q, k, v, out, lse, score_mod_trainable=trainable,
                                       **opts)
        want = reference(q[0], k[0], v[0], dout[0], visible, bias, entries)
        check(name, [out[0]] + [g[0] for g in grads[:3]] + list(grads[3:]), want)

    # four documents of uneven lengths, packed in one sequence
    ids = np.repeat(np.arange(4), np.diff([0, n // 8, n // 2, 3 * n // 4, n])).astype(np.float32)
    bm = fa.create_block_mask(DOCUMENTS, None, None, n, n, BLOCK_SIZE=32,
                              mask_mod_tensors={"doc": ids})
    on, full, total = bm.counts
    print(f"document mask: {on} of {total} blocks visited, {full} of them whole")
    run("document mask", lambda head: ids[i] == ids[j], none, mask_mod=DOCUMENTS,
        mask_mod_tensors={"doc": ids}, block_mask=bm)
    run("prefix-LM", lambda head: (j < 32) | (j <= i), none, mask_mod=PREFIX_LM)
    table = rng.uniform(-1, 1, h * 16).astype(np.float32)
    run("T5 relative positions", lambda head: np.ones((n, n), bool),
        lambda head: table[head * 16 + t5_bucket(i, j)],
        lambda head: head * 16 + t5_bucket(i, j), "table", score_mod=T5,
        score_mod_tensors={"table": table})


if __name__ == "__main__":
    main()
