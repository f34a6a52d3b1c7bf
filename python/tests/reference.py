"""Attention in float64 numpy, forward and backward, written from the definitions: the
reference the package's tests compare against (independent of the library's own Rust
reference)."""

import numpy as np


def _visible(sq, sk, causal, window, offset):
    """[sq, sk] booleans: query i sits at position i + offset (bottom-right alignment)."""
    i = np.arange(sq)[:, None] + offset
    j = np.arange(sk)[None, :]
    ok = np.ones((sq, sk), dtype=bool)
    left, right = window
    if causal:
        ok &= j <= i
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def _one(q, k, v, dout, scale, causal, window, softcap, slopes, seqlen_k=None, leftpad=0):
    """One sequence: q [sq, hq, d], k and v [sk, hk, d]; keys at or past seqlen_k hidden and
    the alignment taken from seqlen_k; keys before leftpad hidden (positions unchanged).
    Returns out, lse [hq, sq] and, with dout, the grads."""
    sq, hq, d = q.shape
    sk, hk, _ = k.shape
    n = sk if seqlen_k is None else seqlen_k
    g = hq // hk
    kk = np.repeat(k, g, axis=1)  # [sk, hq, d]
    vv = np.repeat(v, g, axis=1)
    s = np.einsum("ihd,jhd->hij", q, kk) * scale
    t = s
    if softcap:
        t = softcap * np.tanh(s / softcap)
    offset = n - sq
    if slopes is not None:
        i = np.arange(sq)[:, None] + offset
        j = np.arange(sk)[None, :]
        t = t - slopes[:, None, None] * np.abs(i - j)[None]
    ok = _visible(sq, sk, causal, window, offset)
    ok[:, n:] = False
    ok[:, :leftpad] = False
    t = np.where(ok[None], t, -np.inf)
    m = t.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(t - m)
    z = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(z > 0, e / z, 0.0)
        lse = np.where(z[..., 0] > 0, np.log(z[..., 0]) + m[..., 0], -np.inf)
    out = np.einsum("hij,jhd->ihd", p, vv)
    if dout is None:
        return out, lse
    dp = np.einsum("ihd,jhd->hij", dout, vv)
    dvv = np.einsum("hij,ihd->jhd", p, dout)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if softcap:
        ds = ds * (1.0 - np.tanh(s / softcap) ** 2)
    dq = np.einsum("hij,jhd->ihd", ds, kk) * scale
    dkk = np.einsum("hij,ihd->jhd", ds, q) * scale
    dk = dkk.reshape(sk, hk, g, d).sum(axis=2)
    dv = dvv.reshape(sk, hk, g, v.shape[-1]).sum(axis=2)
    return out, lse, dq, dk, dv


def attention(q, k, v, dout=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
              scale=None, seqlens_k=None, leftpad_k=None):
    """Padded batches: q [b, sq, hq, d], k and v [b, sk, hk, d]; alibi [hq] or [b, hq];
    seqlens_k [b] hides keys past each batch's length and aligns to it (a KV cache);
    leftpad_k [b] hides each batch's keys before it."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, _, hq, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    res = []
    for bi in range(b):
        slopes = None
        if alibi is not None:
            a = np.asarray(alibi, dtype=np.float64)
            slopes = a if a.ndim == 1 else a[bi]
        res.append(_one(q[bi], k[bi], v[bi], None if dout is None else
                        np.asarray(dout[bi], np.float64), scale, causal, window, softcap,
                        slopes, None if seqlens_k is None else int(seqlens_k[bi]),
                        0 if leftpad_k is None else int(leftpad_k[bi])))
    outs = [np.stack([r[n] for r in res]) for n in range(len(res[0]))]
    return tuple(outs)


def varlen(q, k, v, cu_q, cu_k, dout=None, **opts):
    """Packed sequences: q [total_q, hq, d], k and v [total_k, hk, d]; lse [hq, total_q]."""
    parts = []
    for s in range(len(cu_q) - 1):
        a, b = cu_q[s], cu_q[s + 1]
        c, e = cu_k[s], cu_k[s + 1]
        parts.append(attention(q[None, a:b], k[None, c:e], v[None, c:e],
                               None if dout is None else dout[None, a:b], **opts))
    out = np.concatenate([p[0][0] for p in parts], axis=0)
    lse = np.concatenate([p[1][0] for p in parts], axis=1)
    if dout is None:
        return out, lse
    return (out, lse) + tuple(np.concatenate([p[n][0] for p in parts], axis=0)
                              for n in (2, 3, 4))


def rotary(x, cos, sin, start, step, interleaved):
    """Rotary embedding of x [b, s, h, d], float64: row i of batch b at start[b] + i * step;
    the first 2 * cols dims turn in pairs ((2f, 2f + 1) interleaved, else (f, f + cols)) by
    the angle whose cosine and sine are cos[p, f], sin[p, f]."""
    x = np.asarray(x, dtype=np.float64).copy()
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    cols = cos.shape[1]
    for bi in range(x.shape[0]):
        for i in range(x.shape[1]):
            p = start[bi] + i * step
            c, s = cos[p][None, :], sin[p][None, :]
            row = x[bi, i]
            if interleaved:
                x0, x1 = row[:, 0:2 * cols:2].copy(), row[:, 1:2 * cols:2].copy()
                row[:, 0:2 * cols:2], row[:, 1:2 * cols:2] = x0 * c - x1 * s, x1 * c + x0 * s
            else:
                x0, x1 = row[:, :cols].copy(), row[:, cols:2 * cols].copy()
                row[:, :cols], row[:, cols:2 * cols] = x0 * c - x1 * s, x1 * c + x0 * s
    return x
