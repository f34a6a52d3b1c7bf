"""The Python package against the float64 numpy reference (tests/reference.py) on fresh random
data each run (the seed is printed on failure): forward and backward in every dtype, the
modifiers, varlen, the KV cache (dense and paged, numpy and device-resident), dropout through
finite differences, and typed errors."""

import numpy as np
import pytest

import flash_attn_wgpu as fa
from reference import attention, rotary, varlen

from helpers import SEED, close, dtypes, rand, tol


def test_the_adapter_is_named():
    assert fa.adapter()


@pytest.mark.parametrize("dtype", dtypes(), ids=lambda d: np.dtype(d).name)
def test_causal_gqa_forward_and_backward_match_the_reference(rng, dtype):
    b, sq, sk, hq, hk, d = 2, 37, 45, 4, 2, 32
    q, k, v = rand(rng, (b, sq, hq, d), dtype), rand(rng, (b, sk, hk, d), dtype), \
        rand(rng, (b, sk, hk, d), dtype)
    dout = rand(rng, (b, sq, hq, d), dtype)
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == np.dtype(dtype) and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq)
    want = attention(q, k, v, dout, causal=True)
    close(out, want[0], tol(dtype), "out")
    close(lse, want[1], 2e-5, "lse")
    dq, dk, dv = fa.flash_attn_backward(dout, q, k, v, out, lse, causal=True)
    for got, w, name in zip((dq, dk, dv), want[2:], ("dq", "dk", "dv")):
        assert got.dtype == np.dtype(dtype)
        close(got, w, 2 * tol(dtype), name)


def test_window_softcap_alibi_and_scale_forward_and_backward(rng):
    b, sq, sk, hq, hk, d = 2, 29, 41, 6, 3, 24
    q, k, v = rand(rng, (b, sq, hq, d)), rand(rng, (b, sk, hk, d)), rand(rng, (b, sk, hk, d))
    dout = rand(rng, (b, sq, hq, d))
    slopes = rng.uniform(0.05, 0.5, (b, hq)).astype(np.float32)
    opts = dict(causal=True, window_size=(7, 0), softcap=3.0, alibi_slopes=slopes,
                softmax_scale=0.3)
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
    want = attention(q, k, v, dout, causal=True, window=(7, 0), softcap=3.0, alibi=slopes,
                     scale=0.3)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    grads = fa.flash_attn_backward(dout, q, k, v, out, lse, **opts)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        close(got, w, 4e-5, name)


def test_rows_that_see_no_key_give_zero_and_minus_infinity(rng):
    # causal, bottom-right aligned, more queries than keys: the first 4 rows see nothing
    q, k, v = rand(rng, (1, 9, 2, 16)), rand(rng, (1, 5, 2, 16)), rand(rng, (1, 5, 2, 16))
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)
    want = attention(q, k, v, causal=True)
    assert np.all(np.isneginf(want[1][:, :, :4]))
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_varlen_matches_each_sequence_alone(rng, dtype):
    lens_q, lens_k = [5, 17, 1, 11], [9, 17, 4, 20]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    hq, hk, d = 4, 1, 40
    q, k, v = rand(rng, (cu_q[-1], hq, d), dtype), rand(rng, (cu_k[-1], hk, d), dtype), \
        rand(rng, (cu_k[-1], hk, d), dtype)
    dout = rand(rng, q.shape, dtype)
    out, lse = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                         causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == (hq, cu_q[-1])
    want = varlen(q, k, v, cu_q, cu_k, dout, causal=True)
    close(out, want[0], tol(dtype), "out")
    close(lse, want[1], 2e-5, "lse")
    grads = fa.flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, causal=True)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        assert got.shape == w.shape
        close(got, w, 2 * tol(dtype), name)


def test_device_tensors_chain_calls_and_return_tensors(rng):
    q, k, v = rand(rng, (1, 16, 2, 8)), rand(rng, (1, 20, 2, 8)), rand(rng, (1, 20, 2, 8))
    tq, tk, tv = fa.tensor(q), fa.tensor(k), fa.tensor(v)
    assert tq.shape == (1, 16, 2, 8) and tq.dtype == np.float32
    out = fa.flash_attn_func(tq, tk, tv)
    assert isinstance(out, fa.Tensor)
    # out feeds the next call without a copy to the host
    out2 = fa.flash_attn_func(out, tk, tv)
    want1 = attention(q, k, v)[0]
    close(out.numpy(), want1, 2e-5, "out")
    close(out2.numpy(), attention(want1, k, v)[0], 4e-5, "out2")
    np.testing.assert_array_equal(tq.numpy(), q)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_a_decode_loop_over_a_device_cache_matches_the_reference(rng, paged):
    b, hq, hk, d, cap, page = 2, 8, 2, 32, 24, 8
    lens = np.array([3, 10])
    keys, vals = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    if paged:
        pages_per_seq = cap // page
        table = rng.permutation(b * pages_per_seq).astype(np.int32).reshape(b, pages_per_seq)
        pool_k = np.zeros((b * pages_per_seq, page, hk, d), np.float32)
        pool_v = np.zeros_like(pool_k)
        for bi in range(b):
            for p in range(pages_per_seq):
                pool_k[table[bi, p]] = keys[bi, p * page:(p + 1) * page]
                pool_v[table[bi, p]] = vals[bi, p * page:(p + 1) * page]
        kc, vc, extra = fa.tensor(pool_k), fa.tensor(pool_v), dict(block_table=table)
    else:
        kc, vc, extra = fa.tensor(keys), fa.tensor(vals), {}
    for step in range(3):
        q = rand(rng, (b, 1, hq, d))
        k_new, v_new = rand(rng, (b, 1, hk, d)), rand(rng, (b, 1, hk, d))
        out, lse = fa.flash_attn_with_kvcache(
            fa.tensor(q), kc, vc, fa.tensor(k_new), fa.tensor(v_new), cache_seqlens=lens,
            causal=True, return_softmax_lse=True, **extra)
        for bi in range(b):
            keys[bi, lens[bi]], vals[bi, lens[bi]] = k_new[bi, 0], v_new[bi, 0]
        lens = lens + 1
        want = attention(q, keys, vals, causal=True, seqlens_k=lens)
        close(out.numpy(), want[0], 2e-5, f"out, step {step}")
        close(lse.numpy(), want[1], 2e-5, f"lse, step {step}")


@pytest.mark.parametrize("fmt", ["q8_0", "e4m3"])
def test_an_8_bit_cache_appends_on_the_gpu_and_attends_over_what_it_holds(rng, fmt):
    b, hq, hk, d, cap = 2, 8, 2, 32, 24
    lens = np.array([3, 10])
    keys, vals = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    scales = (lambda x: fa.e4m3_head_scales(x) * 2) if fmt == "e4m3" else (lambda x: None)
    kc = fa.quantize_cache(keys, fmt, scales(keys))
    vc = fa.quantize_cache(vals, fmt, scales(vals))
    assert kc.shape == [b, cap, hk, d] and kc.format == fmt
    for step in range(2):
        before_k = kc.dequantize()
        q = rand(rng, (b, 1, hq, d))
        k_new, v_new = rand(rng, (b, 1, hk, d)), rand(rng, (b, 1, hk, d))
        out, lse = fa.flash_attn_with_kvcache(
            fa.tensor(q), kc, vc, fa.tensor(k_new), fa.tensor(v_new), cache_seqlens=lens,
            causal=True, return_softmax_lse=True)
        held_k, held_v = kc.dequantize(), vc.dequantize()
        # the new rows hold the new keys to the format's rounding, the others are unchanged
        for bi in range(b):
            step_k = np.abs(k_new[bi, 0]).max() / (127 if fmt == "q8_0" else 8)
            assert np.abs(held_k[bi, lens[bi]] - k_new[bi, 0]).max() <= step_k
            held_k[bi, lens[bi]] = before_k[bi, lens[bi]]
        np.testing.assert_array_equal(held_k, before_k)
        lens = lens + 1
        want = attention(q, kc.dequantize(), held_v, causal=True, seqlens_k=lens)
        close(out.numpy(), want[0], 2e-5, f"out, step {step}")
        close(lse.numpy(), want[1], 2e-5, f"lse, step {step}")
    with pytest.raises(fa.InvalidInputError, match="both QuantizedCache or neither"):
        fa.flash_attn_with_kvcache(q, kc, vals, cache_seqlens=lens)
    with pytest.raises(fa.FlashAttnError, match="head_dim 16"):
        fa.quantize_cache(np.zeros((1, 4, 1, 16), np.float32), fmt, scales(np.ones((1, 1, 1, 16))))


def test_numpy_caches_are_updated_in_place(rng):
    b, hk, d, cap = 1, 2, 16, 12
    k_cache, v_cache = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    q, k, v = rand(rng, (b, 2, 4, d)), rand(rng, (b, 2, hk, d)), rand(rng, (b, 2, hk, d))
    keys, vals = k_cache.copy(), v_cache.copy()
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=5, causal=True)
    keys[:, 5:7], vals[:, 5:7] = k, v
    np.testing.assert_array_equal(k_cache, keys)
    np.testing.assert_array_equal(v_cache, vals)
    close(out, attention(q, keys, vals, causal=True, seqlens_k=[7])[0], 2e-5, "out")


def test_cache_batch_idx_picks_the_cache_rows(rng):
    hk, d, cap = 2, 16, 10
    k_cache, v_cache = rand(rng, (3, cap, hk, d)), rand(rng, (3, cap, hk, d))
    keys, vals = k_cache.copy(), v_cache.copy()
    q, k, v = rand(rng, (2, 1, 4, d)), rand(rng, (2, 1, hk, d)), rand(rng, (2, 1, hk, d))
    idx, lens = np.array([2, 0], np.int32), np.array([4, 7])
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                     cache_batch_idx=idx, causal=True)
    for b, row in enumerate(idx):
        keys[row, lens[b]], vals[row, lens[b]] = k[b, 0], v[b, 0]
    np.testing.assert_array_equal(k_cache, keys)  # row 1 untouched
    np.testing.assert_array_equal(v_cache, vals)
    want = attention(q, keys[idx], vals[idx], causal=True, seqlens_k=lens + 1)
    close(out, want[0], 2e-5, "out")
    with pytest.raises(fa.InvalidInputError, match="cache_batch_idx names cache row 1 for two"):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=[3, 3],
                                   cache_batch_idx=[1, 1])


def test_cache_leftpad_hides_the_padding(rng):
    b, hq, hk, d, cap = 3, 4, 2, 16, 12
    k_cache, v_cache = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    keys, vals = k_cache.copy(), v_cache.copy()
    q, k, v = rand(rng, (b, 2, hq, d)), rand(rng, (b, 2, hk, d)), rand(rng, (b, 2, hk, d))
    # batch 2's padding covers every cached key: only its new keys take part
    lens, pad = np.array([5, 8, 3]), np.array([2, 0, 3], np.int32)
    slopes = rng.uniform(0.1, 0.5, hq).astype(np.float32)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                          cache_leftpad=pad, causal=True, alibi_slopes=slopes,
                                          return_softmax_lse=True)
    for bi in range(b):
        keys[bi, lens[bi]:lens[bi] + 2], vals[bi, lens[bi]:lens[bi] + 2] = k[bi], v[bi]
    np.testing.assert_array_equal(k_cache, keys)
    want = attention(q, keys, vals, causal=True, alibi=slopes, seqlens_k=lens + 2,
                     leftpad_k=pad)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    with pytest.raises(fa.InvalidInputError,
                       match=r"cache_leftpad\[0\] is 6, past batch 0's 5 keys"):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                   cache_leftpad=[6, 0, 0])


@pytest.mark.parametrize("interleaved, causal", [(True, True), (False, False)])
def test_rotary_tables_rotate_q_and_the_new_keys(rng, interleaved, causal):
    b, hq, hk, d, cap, rd = 2, 4, 2, 16, 12, 8
    k_cache, v_cache = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    keys, vals = k_cache.copy(), v_cache.copy()
    q, k, v = rand(rng, (b, 2, hq, d)), rand(rng, (b, 2, hk, d)), rand(rng, (b, 2, hk, d))
    theta = np.arange(cap)[:, None] * 10000.0 ** (-np.arange(rd // 2) * 2.0 / rd)
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    lens = np.array([3, 9])
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                     cache_seqlens=lens, causal=causal,
                                     rotary_interleaved=interleaved)
    # flash-attn's positions: new keys at lens + i; queries there too when causal, else at lens
    k_rot = rotary(k, cos, sin, lens, 1, interleaved)
    q_rot = rotary(q, cos, sin, lens, 1 if causal else 0, interleaved)
    for bi in range(b):
        keys[bi, lens[bi]:lens[bi] + 2], vals[bi, lens[bi]:lens[bi] + 2] = k_rot[bi], v[bi]
    close(k_cache, keys, 1e-6, "rotated keys in the cache")
    np.testing.assert_array_equal(v_cache, vals)
    want = attention(q_rot, keys, vals, causal=causal, seqlens_k=lens + 2)
    close(out, want[0], 2e-5, "out")
    # not causal: the queries at 10, the new keys at 10 and 11
    with pytest.raises(fa.InvalidInputError, match="rotary tables hold positions 0..10, but "
                       "batch 1's rows reach position 10 .2 rows at one position"):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos[:10],
                                   rotary_sin=sin[:10], cache_seqlens=[3, 10])
    with pytest.raises(fa.InvalidInputError, match="give both or neither"):
        fa.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=cos)


def test_dropout_is_reproducible_and_its_backward_is_the_forward_derivative(rng):
    q, k, v = (rand(rng, s).astype(np.float32) for s in ((1, 13, 2, 8), (1, 17, 1, 8),
                                                        (1, 17, 1, 8)))
    dout = rand(rng, q.shape)
    opts = dict(dropout_p=0.3, seed=1234, causal=True)
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
    np.testing.assert_array_equal(out, fa.flash_attn_func(q, k, v, **opts))
    assert not np.array_equal(out, fa.flash_attn_func(q, k, v, causal=True, dropout_p=0.3,
                                                      seed=99))
    dq, dk, dv = fa.flash_attn_backward(dout, q, k, v, out, lse, **opts)

    # <dout, d out/d x . delta> by central differences in float64 sums of float32 calls
    def loss(q, k, v):
        o = fa.flash_attn_func(q, k, v, **opts).astype(np.float64)
        return float(np.sum(o * dout))

    eps = 1e-2
    for x, g, name in ((q, dq, "dq"), (k, dk, "dk"), (v, dv, "dv")):
        delta = rand(rng, x.shape)
        args = {"q": q, "k": k, "v": v}
        key = name[1]
        plus, minus = dict(args), dict(args)
        plus[key] = (x + eps * delta).astype(np.float32)
        minus[key] = (x - eps * delta).astype(np.float32)
        fd = (loss(**plus) - loss(**minus)) / (2 * eps)
        an = float(np.sum(g.astype(np.float64) * delta))
        assert abs(fd - an) <= 2e-3 * max(1.0, abs(an)), f"{name}: {fd} vs {an} (seed {SEED})"


def test_packed_qkv_and_kv_equal_the_separate_call(rng):
    qkv = rand(rng, (2, 21, 3, 4, 16))
    out, lse = fa.flash_attn_qkvpacked_func(qkv, causal=True, return_lse=True)
    want = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    q, kv = rand(rng, (2, 5, 4, 16)), rand(rng, (2, 13, 2, 2, 16))
    out = fa.flash_attn_kvpacked_func(q, kv, softcap=2.0)
    close(out, attention(q, kv[:, :, 0], kv[:, :, 1], softcap=2.0)[0], 2e-5, "out")
    with pytest.raises(fa.InvalidInputError, match=r"\[batch, seqlen, 2, nheads, headdim\]"):
        fa.flash_attn_kvpacked_func(q, qkv)


def test_bad_inputs_raise_typed_errors_with_the_librarys_message(rng):
    q, k = rand(rng, (1, 8, 4, 16)), rand(rng, (1, 8, 2, 16))
    with pytest.raises(fa.InvalidInputError, match="v has shape"):
        fa.flash_attn_func(q, k, rand(rng, (1, 8, 3, 16)))
    with pytest.raises(fa.InvalidInputError, match="float64"):
        fa.flash_attn_func(q.astype(np.float64), k, k)
    with pytest.raises(fa.InvalidInputError, match="4 dimensions"):
        fa.flash_attn_func(q[0], k, k)
    with pytest.raises(ValueError):  # InvalidInputError is a ValueError too
        fa.flash_attn_func(q, k, k, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(fa.InvalidInputError, match="max_seqlen_q"):
        fa.flash_attn_varlen_func(q[0], k[0], k[0], [0, 8], [0, 8], 4, 8)
    with pytest.raises(fa.InvalidInputError, match="give both"):
        fa.flash_attn_with_kvcache(q, k, k, k=k)


def test_values_of_their_own_head_dim_in_a_decode_call_and_a_cache(rng):
    # head_dim_v from v's last dimension (flash-attn 3's rule): values narrower than q and k,
    # on the decode kernel, then appended to a cache whose values are that wide
    q, k, v = rand(rng, (2, 2, 8, 40)), rand(rng, (2, 77, 2, 40)), rand(rng, (2, 77, 2, 24))
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)
    want = attention(q, k, v, causal=True)
    assert out.shape == (2, 2, 8, 24)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    lens = np.array([5, 60])
    kc, vc = fa.tensor(k.copy()), fa.tensor(v.copy())
    k_new, v_new = rand(rng, (2, 1, 2, 40)), rand(rng, (2, 1, 2, 24))
    out = fa.flash_attn_with_kvcache(fa.tensor(q[:, :1]), kc, vc, fa.tensor(k_new),
                                     fa.tensor(v_new), cache_seqlens=lens, causal=True)
    for bi in range(2):
        k[bi, lens[bi]], v[bi, lens[bi]] = k_new[bi, 0], v_new[bi, 0]
    want = attention(q[:, :1], k, v, causal=True, seqlens_k=lens + 1)
    close(out.numpy(), want[0], 2e-5, "cache out")
    # an 8-bit cache whose values are narrower than its keys: head_dim_v from the v cache
    k8, v8 = fa.quantize_cache(rand(rng, (1, 40, 2, 64)), "q8_0"), \
        fa.quantize_cache(rand(rng, (1, 40, 2, 32)), "q8_0")
    q8 = rand(rng, (1, 1, 8, 64))
    out = fa.flash_attn_with_kvcache(fa.tensor(q8), k8, v8, cache_seqlens=np.array([40]))
    assert out.shape == (1, 1, 8, 32)
    want = attention(q8, k8.dequantize(), v8.dequantize())
    close(out.numpy(), want[0], 2e-5, "8-bit cache out")
    # a prefill-sized call and its backward (the blocks kernels): dv as narrow as v
    q, dout = rand(rng, (1, 16, 8, 40)), rand(rng, (1, 16, 8, 24))
    out, lse = fa.flash_attn_func(q, k[:1], v[:1], causal=True, return_lse=True)
    want = attention(q, k[:1], v[:1], dout, causal=True)
    close(out, want[0], 2e-5, "prefill out")
    dq, dk, dv = fa.flash_attn_backward(dout, q, k[:1], v[:1], out, lse, causal=True)
    assert dv.shape == (1, 77, 2, 24)
    for got, w, name in zip((dq, dk, dv), want[2:], ("dq", "dk", "dv")):
        close(got, w, 4e-5, name)


def test_calls_from_several_threads_at_once_are_each_exact(rng):
    # the GIL is released during GPU work: four threads' calls overlap, each must be exact
    import threading

    cases = [tuple(rand(rng, s) for s in ((1, 11, 2, 16), (1, 19, 2, 16), (1, 19, 2, 16)))
             for _ in range(4)]
    results = [None] * len(cases)

    def run(n):
        results[n] = fa.flash_attn_func(*cases[n], causal=True)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (q, k, v), got in zip(cases, results):
        close(got, attention(q, k, v, causal=True)[0], 2e-5, "out")


SOFTCAP_WGSL = """
fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return 2.5 * tanh(s / 2.5);
}
fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    let t = tanh(s / 2.5);
    return 1.0 - t * t;
}
"""


def test_a_score_mod_string_is_the_softcap_it_re_expresses(rng):
    b, sq, sk, hq, hk, d = 2, 23, 37, 4, 2, 16
    q, k, v = rand(rng, (b, sq, hq, d)), rand(rng, (b, sk, hk, d)), rand(rng, (b, sk, hk, d))
    dout = rand(rng, (b, sq, hq, d))
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True, score_mod=SOFTCAP_WGSL)
    want = attention(q, k, v, dout, causal=True, softcap=2.5)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    grads = fa.flash_attn_backward(dout, q, k, v, out, lse, causal=True, score_mod=SOFTCAP_WGSL)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        close(got, w, 4e-5, name)


def test_score_mod_tensors_are_read_by_name_and_bad_snippets_name_their_line(rng):
    q, k, v = rand(rng, (1, 9, 2, 16)), rand(rng, (1, 11, 2, 16)), rand(rng, (1, 11, 2, 16))
    bias = "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return s + t(j); }\n" \
           "fn score_mod_ds(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 { return 1.0; }"
    plain = fa.flash_attn_func(q, k, v)
    zero = fa.flash_attn_func(q, k, v, score_mod=bias, score_mod_tensors={"t": np.zeros(11)})
    close(zero, plain.astype(np.float64), 2e-6, "a zero table")
    # a bias per key, against float64 numpy: softmax(q k^T / 4 + t[j]) v per head
    t = rng.uniform(-1, 1, 11).astype(np.float32)
    got = fa.flash_attn_func(q, k, v, score_mod=bias, score_mod_tensors={"t": t})
    want = np.empty((1, 9, 2, 16))
    for h in range(2):
        s = q[0, :, h].astype(np.float64) @ k[0, :, h].astype(np.float64).T / 4.0 + t
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want[0, :, h] = (p / p.sum(axis=1, keepdims=True)) @ v[0, :, h].astype(np.float64)
    close(got, want, 2e-5, "a bias per key")
    with pytest.raises(fa.InvalidInputError, match="line 1"):
        fa.flash_attn_func(q, k, v, score_mod=bias.replace("s + t(j)", "s +"),
                           score_mod_tensors={"t": t})
    with pytest.raises(fa.InvalidInputError, match="score_mod"):
        fa.flash_attn_func(q, k, v, score_mod=bias)  # t not captured


def test_a_mask_mod_string_is_the_causal_mask_it_re_expresses(rng):
    # bottom-right aligned causal over 19 queries and 31 keys, written as a user mask
    b, sq, sk, hq, hk, d = 2, 19, 31, 4, 2, 16
    q, k, v = rand(rng, (b, sq, hq, d)), rand(rng, (b, sk, hk, d)), rand(rng, (b, sk, hk, d))
    dout = rand(rng, (b, sq, hq, d))
    causal = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return j <= i + off(0u); }"
    extra = {"mask_mod": causal.replace("off(0u)", "12u")}
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **extra)
    want = attention(q, k, v, dout, causal=True)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    grads = fa.flash_attn_backward(dout, q, k, v, out, lse, **extra)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        close(got, w, 4e-5, name)
    # the offset from a captured tensor (an f32 read as a whole number)
    with_table = fa.flash_attn_func(
        q, k, v, mask_mod=causal.replace("off(0u)", "u32(off(0u))"),
        mask_mod_tensors={"off": np.array([12.0])})
    close(with_table, want[0], 2e-5, "out, offset captured")


def test_a_document_mask_with_its_block_mask_is_the_varlen_call(rng):
    # three documents of uneven lengths packed in one sequence, as a user mask over captured
    # document ids, with the block mask made on the GPU: the packed varlen call's results
    cu = [0, 17, 41, 70]
    ids = np.repeat(np.arange(3), np.diff(cu)).astype(np.float32)
    n, hq, hk, d = cu[-1], 4, 2, 16
    q, k, v = rand(rng, (1, n, hq, d)), rand(rng, (1, n, hk, d)), rand(rng, (1, n, hk, d))
    dout = rand(rng, (1, n, hq, d))
    docs = "fn mask_mod(b: u32, h: u32, i: u32, j: u32) -> bool { return doc(i) == doc(j); }"
    tensors = {"doc": ids}
    bm = fa.create_block_mask(docs, None, None, n, n, BLOCK_SIZE=8, mask_mod_tensors=tensors)
    on, full, total = bm.counts
    assert bm.block_size == (8, 8) and total == 9 * 9
    assert full < on < total, bm.counts  # blocks across documents off, inside them full
    opts = {"causal": True, "mask_mod": docs, "mask_mod_tensors": tensors, "block_mask": bm}
    out, lse = fa.flash_attn_func(q, k, v, return_lse=True, **opts)
    want = varlen(q[0], k[0], v[0], cu, cu, dout[0], causal=True)
    close(out[0], want[0], 2e-5, "out")
    close(lse[0], want[1], 2e-5, "lse")
    grads = fa.flash_attn_backward(dout, q, k, v, out, lse, **opts)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        close(got[0], w, 4e-5, name)
    # a block mask carries its mask: alone it applies it, with another it is refused
    alone = fa.flash_attn_func(q, k, v, causal=True, block_mask=bm)
    assert np.array_equal(alone, out)
    with pytest.raises(fa.InvalidInputError, match="another mask_mod"):
        fa.flash_attn_func(q, k, v, block_mask=bm, mask_mod=docs.replace("==", "!="),
                           mask_mod_tensors=tensors)
    with pytest.raises(fa.InvalidInputError, match="another mask_mod"):
        fa.flash_attn_func(q, k, v, block_mask=bm, mask_mod=docs,
                           mask_mod_tensors={"doc": ids[::-1].copy()})
    with pytest.raises(fa.InvalidInputError, match="create_block_mask"):
        fa.flash_attn_func(q, k, v, mask_mod=docs, mask_mod_tensors=tensors, block_mask="dense")
    with pytest.raises(fa.InvalidInputError, match=r"BLOCK_SIZE\[0\]"):
        fa.create_block_mask(docs, 1, 1, n, n, BLOCK_SIZE=(0, 8), mask_mod_tensors=tensors)
