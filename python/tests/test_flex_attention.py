"""flex_attention: FlexAttention's call in its [B, H, S, D] layout, forward and backward
against float64 numpy, with a score modifier reading a captured table, a block mask that
carries its mask, and grouped-query heads."""

import numpy as np
import pytest

import flash_attn_wgpu as fa
from helpers import close, rand

# a bias per key, its derivative derived (as FlexAttention differentiates score_mod), and
# documents (the mask of test_flash_attn.py)
BIAS = "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + t(j); }"
DOCS = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return doc(i) == doc(j); }"


def reference(q, k, v, dout, scale, visible, bias):
    """out, lse, dq, dk, dv and d_bias in float64, [B, H, S, D] (grouped heads: query head h
    reads kv head h // (Hq / Hkv)); visible a [L, S] bool matrix, bias a [S] term on the
    scores, whose gradient (d_bias, [S]) sums each key's gradients at its scores."""
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    b, hq, n, _ = q.shape
    g = hq // k.shape[1]
    out, lse, dq = np.zeros_like(q), np.zeros((b, hq, n)), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    d_bias = np.zeros(k.shape[2])
    for x in range(b):
        for h in range(hq):
            kh, vh = k[x, h // g], v[x, h // g]
            s = np.where(visible, q[x, h] @ kh.T * scale + bias, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            lse[x, h] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
            p /= p.sum(axis=1, keepdims=True)
            out[x, h] = p @ vh
            dp = dout[x, h] @ vh.T
            ds = p * (dp - (dout[x, h] * out[x, h]).sum(axis=1, keepdims=True))
            dq[x, h] = ds @ kh * scale
            dk[x, h // g] += ds.T @ q[x, h] * scale
            dv[x, h // g] += p.T @ dout[x, h]
            d_bias += ds.sum(axis=0)
    return out, lse, dq, dk, dv, d_bias


def documents_case(rng):
    """Two batches of 4 query heads over 2 kv heads, 70 positions of 16 dims in three
    documents (their block mask in blocks of 8), a per-key bias t, scale 0.3: (q, k, v, dout,
    t, the block mask, the scale, the float64 reference)."""
    b, hq, hkv, n, d = 2, 4, 2, 70, 16
    cu = [0, 17, 41, 70]
    ids = np.repeat(np.arange(3), np.diff(cu)).astype(np.float32)
    q, k, v = rand(rng, (b, hq, n, d)), rand(rng, (b, hkv, n, d)), rand(rng, (b, hkv, n, d))
    dout = rand(rng, (b, hq, n, d))
    t = rng.uniform(-1, 1, n).astype(np.float32)
    bm = fa.create_block_mask(DOCS, None, None, n, n, BLOCK_SIZE=8,
                              mask_mod_tensors={"doc": ids})
    scale = 0.3
    want = reference(q, k, v, dout, scale, ids[:, None] == ids[None, :], t)
    return q, k, v, dout, t, bm, scale, want


def test_flex_attention_takes_its_layout_its_block_mask_and_grouped_heads(rng):
    q, k, v, dout, t, bm, scale, want = documents_case(rng)
    call = fa.flex_attention(q, k, v, score_mod=BIAS, block_mask=bm, scale=scale,
                             enable_gqa=True, score_mod_tensors={"t": t}, return_handle=True)
    assert call.out.shape == q.shape
    close(call.out, want[0], 2e-5, "out")
    close(call.softmax_lse, want[1], 2e-5, "lse")
    for got, w, name in zip(call.backward(dout), want[2:5], ("dq", "dk", "dv")):
        assert got.shape == w.shape, name
        close(got, w, 4e-5, name)
    out, lse = fa.flex_attention(q, k, v, score_mod=BIAS, block_mask=bm, scale=scale,
                                 enable_gqa=True, score_mod_tensors={"t": t}, return_lse=True)
    assert np.array_equal(out, call.out) and np.array_equal(lse, call.softmax_lse)


def test_a_captured_tensor_marked_trainable_gets_its_gradient(rng):
    # FlexAttention trains a captured tensor that requires grad; here score_mod_trainable
    # names it, and the backward returns its gradient after (dq, dk, dv)
    q, k, v, dout, t, bm, scale, want = documents_case(rng)
    opts = dict(score_mod=BIAS, block_mask=bm, scale=scale, enable_gqa=True,
                score_mod_tensors={"t": t}, score_mod_trainable="t")
    call = fa.flex_attention(q, k, v, return_handle=True, **opts)
    grads = call.backward(dout)
    assert len(grads) == 4
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv", "d_t")):
        assert got.shape == w.shape, name
        close(got, w, 4e-5, name)
    assert grads[3].dtype == np.float32
    # summed in a fixed order: the same bits again
    assert np.array_equal(call.backward(dout)[3], grads[3])
    # the explicit backward, in flash_attn_func's layout, gives the same gradient
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))
    out, lse = fa.flash_attn_func(sw(q), sw(k), sw(v), softmax_scale=scale, return_lse=True,
                                  score_mod=BIAS, score_mod_tensors={"t": t}, block_mask=bm)
    again = fa.flash_attn_backward(sw(dout), sw(q), sw(k), sw(v), out, lse,
                                   softmax_scale=scale, score_mod=BIAS,
                                   score_mod_tensors={"t": t}, block_mask=bm,
                                   score_mod_trainable="t")
    assert len(again) == 4 and np.array_equal(again[3], grads[3])


def test_a_trainable_name_must_be_a_captured_tensor_of_a_score_mod(rng):
    q = rand(rng, (1, 2, 9, 16))
    t = np.ones(9, np.float32)
    with pytest.raises(fa.InvalidInputError, match=r"score_mod_trainable='u' is not one of "
                                                   r"score_mod_tensors' names \['t'\]"):
        fa.flex_attention(q, q, q, score_mod=BIAS, score_mod_tensors={"t": t},
                          score_mod_trainable="u")
    with pytest.raises(fa.InvalidInputError, match="no score_mod was given"):
        fa.flex_attention(q, q, q, score_mod_tensors={"t": t}, score_mod_trainable="t")
    # read twice: the derivative in the tensor is refused, naming the line
    twice = ("fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {\n"
             "    return s + t(j) * t(i);\n}")
    with pytest.raises(fa.InvalidInputError, match="line 2"):
        fa.flex_attention(q, q, q, score_mod=twice, score_mod_tensors={"t": t},
                          score_mod_trainable="t")


def test_flex_attention_refuses_what_flexattention_refuses_by_name(rng):
    q, k = rand(rng, (1, 4, 9, 16)), rand(rng, (1, 2, 9, 16))
    with pytest.raises(fa.InvalidInputError, match="enable_gqa"):
        fa.flex_attention(q, k, k)
    with pytest.raises(fa.InvalidInputError, match=r"query must have 4 dimensions"):
        fa.flex_attention(q[0], k, k, enable_gqa=True)
    with pytest.raises(fa.InvalidInputError, match="numpy arrays"):
        fa.flex_attention(fa.tensor(q), k, k, enable_gqa=True)
    call = fa.flex_attention(q, k, k, enable_gqa=True, return_handle=True)
    with pytest.raises(fa.InvalidInputError, match="dout has shape"):
        call.backward(np.zeros((1, 9, 4, 16), np.float32))


def test_flex_attention_names_its_arguments_in_its_layout(rng):
    # issue 61: these named q and k with the [B, S, H, D] shape flash_attn_func sees
    q, k = rand(rng, (2, 4, 9, 16)), rand(rng, (2, 2, 9, 16))
    f = fa.flex_attention
    bad = [
        (r"key's E must be query's \(16\), got key \[2, 2, 9, 8\] for query \[2, 4, 9, 16\]",
         (q, rand(rng, (2, 2, 9, 8)), rand(rng, (2, 2, 9, 8)))),
        (r"value must have key's heads and length \[B, 2, 9, Ev\], got \[2, 2, 7, 16\]",
         (q, k, rand(rng, (2, 2, 7, 16)))),
        (r"query, key and value must share B, got query \[2, 4, 9, 16\], key \[1, 2, 9, 16\]",
         (q, rand(rng, (1, 2, 9, 16)), rand(rng, (1, 2, 9, 16)))),
        (r"query has an empty dimension: shape \[2, 0, 9, 16\] \[B, H, S, D\]",
         (rand(rng, (2, 0, 9, 16)), k, k)),
        (r"key has an empty dimension: shape \[2, 2, 0, 16\]",
         (q, rand(rng, (2, 2, 0, 16)), rand(rng, (2, 2, 0, 16)))),
        (r"value must be a float32, float16 or bfloat16 array, got dtype int64",
         (q, k, np.ones((2, 2, 9, 16), np.int64))),
        (r"query, key and value must share one dtype, got query float32, key float16",
         (q, k.astype(np.float16), k)),
        (r"query's heads \(3\) must be a multiple of key's \(2\)",
         (rand(rng, (2, 3, 9, 16)), k, k)),
    ]
    for message, args in bad:
        with pytest.raises(fa.InvalidInputError, match=message):
            f(*args, enable_gqa=True)


def test_a_python_function_for_score_mod_or_mask_mod_is_told_that_wgsl_is_expected(rng):
    q = rand(rng, (1, 2, 9, 16))
    with pytest.raises(fa.InvalidInputError,
                       match=r"score_mod must be a WGSL string defining `fn score_mod\(s: f32, "
                             r"b: u32, h: u32, i: u32, j: u32\) -> f32`, got the Python "
                             r"callable '<lambda>'"):
        fa.flex_attention(q, q, q, score_mod=lambda score, b, h, i, j: score)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    with pytest.raises(fa.InvalidInputError, match=r"mask_mod must be a WGSL string .* got "
                                                   r"the Python callable 'causal'"):
        fa.create_block_mask(causal, None, None, 9, 9)
    with pytest.raises(fa.InvalidInputError, match=r"mask_mod must be a WGSL string .* got int"):
        fa.flex_attention(q, q, q, mask_mod=3)
    # a one-argument score_mod (a Python port's first WGSL) is told its signature, at line 1
    with pytest.raises(fa.InvalidInputError, match=r"line 1 of the snippet: `score_mod` must be "
                                                   r"`fn score_mod\(s: f32, b: u32"):
        fa.flex_attention(q, q, q, score_mod="fn score_mod(s: f32) -> f32 { return s; }")


def test_create_block_mask_takes_none_for_a_shared_grid_and_refuses_zero():
    bm = fa.create_block_mask(DOCS, None, None, 16, 16, BLOCK_SIZE=8,
                              mask_mod_tensors={"doc": np.zeros(16, np.float32)})
    assert bm is not None
    for b, h, name in [(0, None, "B"), (None, 0, "H")]:
        with pytest.raises(fa.InvalidInputError, match=rf"{name} must be an integer in \[1, "):
            fa.create_block_mask(DOCS, b, h, 16, 16, BLOCK_SIZE=8,
                                 mask_mod_tensors={"doc": np.zeros(16, np.float32)})
