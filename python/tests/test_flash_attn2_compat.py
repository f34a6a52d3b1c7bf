"""flash-attn 2's calls, written as its own test-suite and README write them (positional
arguments included), against the float64 numpy reference; the handle's backward; every bad
argument named in the caller's words."""

import numpy as np
import pytest

import flash_attn_wgpu as fa
from reference import attention, varlen
from helpers import close, rand


def test_the_dangerous_positional_call_means_what_it_means_in_flash_attn_2(rng):
    # q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
    # deterministic, return_attn_probs: the last True asks for (out, softmax_lse, S_dmask)
    q, k, v = rand(rng, (2, 19, 4, 32)), rand(rng, (2, 23, 2, 32)), rand(rng, (2, 23, 2, 32))
    r = fa.flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, False, True)
    assert isinstance(r, tuple) and len(r) == 3, type(r)
    out, lse, s_dmask = r
    want = attention(q, k, v, causal=True)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    assert s_dmask is None
    # deterministic=True in position 10 returns out alone, as in flash-attn 2
    out = fa.flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, True)
    assert isinstance(out, np.ndarray)
    close(out, want[0], 2e-5, "out")


def test_flash_attn_2_test_suite_calls(rng):
    b, s, h, d = 2, 33, 4, 64
    window_size, softcap = (9, 3), 2.5
    slopes = rng.uniform(0.05, 0.4, (b, h)).astype(np.float32)
    q, k, v = (rand(rng, (b, s, h, d)) for _ in range(3))
    # tests/test_flash_attn.py, test_flash_attn_output: keyword options after dropout_p
    out, lse, s_dmask = fa.flash_attn_func(
        q, k, v, 0.0, causal=True, window_size=window_size, softcap=softcap,
        alibi_slopes=slopes, deterministic=True, return_attn_probs=True)
    want = attention(q, k, v, causal=True, window=window_size, softcap=softcap, alibi=slopes)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    # test_flash_attn_qkvpacked: qkv [b, s, 3, h, d]
    qkv = np.stack([q, k, v], axis=2)
    out, lse, _ = fa.flash_attn_qkvpacked_func(
        qkv, 0.0, causal=True, window_size=window_size, softcap=softcap, alibi_slopes=slopes,
        deterministic=False, return_attn_probs=True)
    close(out, want[0], 2e-5, "qkvpacked out")
    # test_flash_attn_output with kvpacked=True: kv [b, s, 2, h_k, d]
    kv = np.stack([k, v], axis=2)
    out = fa.flash_attn_kvpacked_func(q, kv, 0.0, None, True, window_size, softcap, slopes)
    close(out, want[0], 2e-5, "kvpacked out")


def test_flash_attn_2_readme_calls(rng):
    q, k, v = rand(rng, (1, 17, 2, 16)), rand(rng, (1, 17, 2, 16)), rand(rng, (1, 17, 2, 16))
    out = fa.flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), alibi_slopes=None, deterministic=False)
    close(out, attention(q, k, v)[0], 2e-5, "out")
    qkv = np.stack([q, k, v], axis=2)
    out = fa.flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                                       window_size=(-1, -1), alibi_slopes=None,
                                       deterministic=False)
    close(out, attention(q, k, v)[0], 2e-5, "qkvpacked out")


def lengths(rng, batch, low, high):
    lens = rng.integers(low, high + 1, batch)
    return lens, np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def test_varlen_calls_in_flash_attn_2s_order(rng):
    lens_q, cu_q = lengths(rng, 3, 1, 13)
    lens_k, cu_k = lengths(rng, 3, 5, 17)
    hq, hk, d = 4, 2, 32
    q, k, v = rand(rng, (cu_q[-1], hq, d)), rand(rng, (cu_k[-1], hk, d)), \
        rand(rng, (cu_k[-1], hk, d))
    # test_flash_attn_varlen_output: positional through dropout_p, then keywords
    out, lse, s_dmask = fa.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()), 0.0, causal=True,
        window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
        return_attn_probs=True)
    want = varlen(q, k, v, cu_q, cu_k, causal=True)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    assert s_dmask is None
    # every parameter positional, block_table last (None)
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
                                    0.0, None, True, (-1, -1), 0.0, None, False, False, None)
    close(out, want[0], 2e-5, "positional out")
    # packed forms
    kv = np.stack([k, v], axis=1)
    out = fa.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, int(lens_q.max()),
                                             int(lens_k.max()), 0.0, None, True)
    close(out, want[0], 2e-5, "kvpacked out")
    qkv = np.stack([rand(rng, (cu_q[-1], hq, d)) for _ in range(3)], axis=1)
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu_q, int(lens_q.max()), 0.0, None, True)
    want = varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_q, cu_q, causal=True)
    close(out, want[0], 2e-5, "qkvpacked out")


def test_varlen_over_a_paged_cache_with_block_table(rng):
    lens_q, cu_q = lengths(rng, 3, 1, 6)
    lens_k, cu_k = lengths(rng, 3, 7, 20)
    hq, hk, d, page, pages = 4, 2, 16, 8, 3
    q = rand(rng, (cu_q[-1], hq, d))
    keys = [rand(rng, (pages * page, hk, d)) for _ in range(3)]
    vals = [rand(rng, (pages * page, hk, d)) for _ in range(3)]
    table = rng.permutation(3 * pages).astype(np.int32).reshape(3, pages)
    pool_k = np.full((3 * pages, page, hk, d), np.nan, np.float32)
    pool_v = np.full_like(pool_k, np.nan)
    for s in range(3):
        for p in range(pages):
            # rows past a sequence's length stay NaN: they must never be read
            rows = slice(p * page, (p + 1) * page)
            kk, vv = keys[s][rows].copy(), vals[s][rows].copy()
            kk[max(0, lens_k[s] - p * page):] = np.nan
            vv[max(0, lens_k[s] - p * page):] = np.nan
            pool_k[table[s, p]], pool_v[table[s, p]] = kk, vv
    slopes = rng.uniform(0.1, 0.3, hq).astype(np.float32)
    out, lse, _ = fa.flash_attn_varlen_func(
        q, pool_k, pool_v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()), 0.0, None, True,
        (-1, -1), 0.0, slopes, False, True, table)
    k = np.concatenate([keys[s][:lens_k[s]] for s in range(3)])
    v = np.concatenate([vals[s][:lens_k[s]] for s in range(3)])
    want = varlen(q, k, v, cu_q, cu_k, causal=True, alibi=slopes)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")
    with pytest.raises(fa.UnsupportedError, match="block_table"):
        fa.flash_attn_varlen_func(q, pool_k, pool_v, cu_q, cu_k, None, None,
                                  block_table=table, return_handle=True)


def test_with_kvcache_every_parameter_positional(rng):
    b, hq, hk, d, cap = 2, 4, 2, 16, 12
    k_cache, v_cache = rand(rng, (b, cap, hk, d)), rand(rng, (b, cap, hk, d))
    keys, vals = k_cache.copy(), v_cache.copy()
    q, k, v = rand(rng, (b, 1, hq, d)), rand(rng, (b, 1, hk, d)), rand(rng, (b, 1, hk, d))
    lens = np.array([4, 9], np.int32)
    out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, None, None, lens, None,
                                          None, None, None, True, (-1, -1), 0.0, True, None, 0,
                                          True)
    for bi in range(b):
        keys[bi, lens[bi]], vals[bi, lens[bi]] = k[bi, 0], v[bi, 0]
    want = attention(q, keys, vals, causal=True, seqlens_k=lens + 1)
    close(out, want[0], 2e-5, "out")
    close(lse, want[1], 2e-5, "lse")


def test_the_handle_backward_is_the_explicit_backward_with_the_forwards_options(rng):
    b, sq, sk, hq, hk, d = 2, 21, 27, 4, 2, 32
    q, k, v = rand(rng, (b, sq, hq, d)), rand(rng, (b, sk, hk, d)), rand(rng, (b, sk, hk, d))
    dout = rand(rng, (b, sq, hq, d))
    opts = dict(causal=True, window_size=(11, 2), softcap=4.0, softmax_scale=0.2)
    call = fa.flash_attn_func(q, k, v, **opts, return_handle=True)
    assert call.options["causal"] is True and call.options["window_size"] == (11, 2)
    want = attention(q, k, v, dout, causal=True, window=(11, 2), softcap=4.0, scale=0.2)
    close(call.out, want[0], 2e-5, "out")
    close(call.softmax_lse, want[1], 2e-5, "lse")
    q[...] = 0  # the handle keeps what the GPU saw, not the caller's array
    grads = call.backward(dout)
    for got, w, name in zip(grads, want[2:], ("dq", "dk", "dv")):
        close(got, w, 4e-5, name)
    q = rand(rng, (b, sq, hq, d))
    # with dropout: a fresh seed per call, recorded; the handle's backward equals the explicit
    # backward given that seed and the same options
    drop = dict(opts, dropout_p=0.25)
    c1 = fa.flash_attn_func(q, k, v, **drop, return_handle=True)
    c2 = fa.flash_attn_func(q, k, v, **drop, return_handle=True)
    assert c1.seed != c2.seed and not np.array_equal(c1.out, c2.out)
    again = fa.flash_attn_func(q, k, v, **drop, seed=c1.seed)
    np.testing.assert_array_equal(again, c1.out)
    explicit = fa.flash_attn_backward(dout, q, k, v, c1.out, c1.softmax_lse, **drop,
                                      seed=c1.seed)
    for got, w, name in zip(c1.backward(dout), explicit, ("dq", "dk", "dv")):
        np.testing.assert_array_equal(got, w, err_msg=name)
    with pytest.raises(fa.InvalidInputError, match="seed"):
        fa.flash_attn_backward(dout, q, k, v, c1.out, c1.softmax_lse, **drop)
    with pytest.raises(fa.InvalidInputError, match="dout has shape"):
        c1.backward(dout[:, :3])


def test_packed_and_varlen_handles_give_gradients_in_their_layouts(rng):
    qkv = rand(rng, (2, 13, 3, 2, 16))
    dout = rand(rng, (2, 13, 2, 16))
    call = fa.flash_attn_qkvpacked_func(qkv, causal=True, return_handle=True)
    dqkv = call.backward(dout)
    assert dqkv.shape == qkv.shape
    want = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dout, causal=True)
    for n, name in enumerate(("dq", "dk", "dv")):
        close(dqkv[:, :, n], want[2 + n], 4e-5, name)
    q, kv = rand(rng, (2, 7, 4, 16)), rand(rng, (2, 13, 2, 2, 16))
    dout = rand(rng, (2, 7, 4, 16))
    dq, dkv = fa.flash_attn_kvpacked_func(q, kv, return_handle=True).backward(dout)
    assert dq.shape == q.shape and dkv.shape == kv.shape
    want = attention(q, kv[:, :, 0], kv[:, :, 1], dout)
    close(dq, want[2], 4e-5, "dq")
    close(dkv[:, :, 0], want[3], 4e-5, "dk")
    close(dkv[:, :, 1], want[4], 4e-5, "dv")
    lens_q, cu_q = lengths(rng, 3, 1, 9)
    lens_k, cu_k = lengths(rng, 3, 2, 11)
    q, k, v = rand(rng, (cu_q[-1], 4, 16)), rand(rng, (cu_k[-1], 1, 16)), \
        rand(rng, (cu_k[-1], 1, 16))
    dout = rand(rng, q.shape)
    call = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, None, None, causal=True,
                                     return_handle=True)
    want = varlen(q, k, v, cu_q, cu_k, dout, causal=True)
    for got, w, name in zip(call.backward(dout), want[2:], ("dq", "dk", "dv")):
        assert got.shape == w.shape
        close(got, w, 4e-5, name)


# ---- every bad argument named as the caller passed it

def bad(fn, match, *args, **kwargs):
    """fn(*args, **kwargs) raises InvalidInputError (a ValueError) naming `match`; nothing
    else (no bare TypeError or OverflowError from a conversion)."""
    with pytest.raises(fa.InvalidInputError, match=match) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, ValueError)


def test_any_negative_window_side_is_unbounded_as_in_flash_attn_2(rng):
    # flash-attn 2 tests `window_size[0] < 0`, so (-2, 0) is a causal call without a window
    q, k, v = rand(rng, (1, 12, 2, 16)), rand(rng, (1, 12, 2, 16)), rand(rng, (1, 12, 2, 16))
    want = fa.flash_attn_func(q, k, v, causal=True, window_size=(-1, -1))
    for window in [(-2, 0), (-1, -7), (-(2**40), -3)]:
        got = fa.flash_attn_func(q, k, v, causal=True, window_size=window)
        assert np.array_equal(got, want), window


def test_flash_attn_func_arguments_are_named(rng):
    q, k = rand(rng, (1, 8, 2, 16)), rand(rng, (1, 8, 2, 16))
    f = fa.flash_attn_func
    bad(f, r"window_size must be a pair", q, k, k, window_size=None)
    bad(f, r"window_size\[0\] must be an integer", q, k, k, window_size=("x", 0))
    bad(f, r"window_size\[1\] must be an integer", q, k, k, window_size=(1, 2.5))
    bad(f, r"dropout_p must be a finite number in \[0.0, 1.0\)", q, k, k, 1.5)
    bad(f, r"softmax_scale must be a number", q, k, k, softmax_scale="0.1")
    bad(f, r"softcap must be a finite number >= 0.0", q, k, k, softcap=-1.0)
    bad(f, r"causal must be True or False", q, k, k, causal="yes")
    bad(f, r"deterministic must be True or False", q, k, k, deterministic=None)
    bad(f, r"return_attn_probs must be True or False", q, k, k, return_attn_probs=2)
    bad(f, r"alibi_slopes must be \[nheads\]", q, k, k, alibi_slopes=np.ones((1, 1, 2)))
    bad(f, r"seed must be an integer in \[0, ", q, k, k, 0.1, seed=-1)
    bad(f, r"seed must be an integer", q, k, k, 0.1, seed="x")
    bad(f, r"return_attn_probs and return_handle", q, k, k, return_attn_probs=True,
        return_handle=True)
    bad(f, r"v must be a float32, float16 or bfloat16 array, got dtype int64", q, k,
        np.ones((1, 8, 2, 16), np.int64))
    bad(f, r"k must be a float32, float16 or bfloat16 array, got dtype object", q, None, k)


def test_varlen_arguments_are_named(rng):
    q, k = rand(rng, (20, 2, 32)), rand(rng, (25, 2, 32))
    f = fa.flash_attn_varlen_func
    bad(f, r"cu_seqlens_q ends at 25, but q has 20 rows", q, k, k, [0, 25], [0, 25], 25, 25)
    bad(f, r"cu_seqlens_k ends at 20, but k has 25 rows", q, k, k, [0, 20], [0, 20], 20, 20)
    bad(f, r"cu_seqlens_q must start at 0 and never decrease", q, k, k, [0, 15, 10, 20],
        [0, 5, 20, 25], None, None)
    bad(f, r"cu_seqlens_q must hold integers in \[0, ", q, k, k, [-1, 20], [0, 25], None, None)
    bad(f, r"cu_seqlens_q must be an array of integers", q, k, k, ["a", "b"], [0, 25], None,
        None)
    bad(f, r"cu_seqlens_q has 3 entries and cu_seqlens_k 2", q, k, k, [0, 10, 20], [0, 25],
        None, None)
    bad(f, r"max_seqlen_q is 4, but the longest sequence in cu_seqlens_q has 20", q, k, k,
        [0, 20], [0, 25], 4, 25)
    bad(f, r"max_seqlen_k must be an integer", q, k, k, [0, 20], [0, 25], 20, "25")
    bad(f, r"varlen q must be \[total, heads, headdim\]", q[None], k, k, [0, 20], [0, 25],
        20, 25)
    pool = rand(rng, (4, 8, 2, 32))
    bad(f, r"block_table must hold integers in \[0, 3\], got 4", q, pool, pool, [0, 20],
        [0, 25], None, None, block_table=[[0, 1, 2, 4]])
    bad(f, r"block_table must have one row per batch entry \(1\)", q, pool, pool, [0, 20],
        [0, 25], None, None, block_table=[[0, 1], [2, 3]])
    bad(f, r"cu_seqlens_k gives sequence 0 25 keys, but block_table holds 2 pages", q, pool,
        pool, [0, 20], [0, 25], None, None, block_table=[[0, 1]])


def test_kvcache_arguments_are_named(rng):
    b, hk, d, cap = 2, 2, 16, 10
    kc, vc = rand(rng, (3, cap, hk, d)), rand(rng, (3, cap, hk, d))
    q, k = rand(rng, (b, 1, 4, d)), rand(rng, (b, 1, hk, d))
    f = fa.flash_attn_with_kvcache
    bad(f, r"cache_seqlens must hold integers in \[0, ", q, kc[:2], vc[:2], cache_seqlens=[-1, 2])
    bad(f, r"cache_seqlens must be an integer in \[0, ", q, kc[:2], vc[:2], cache_seqlens=-3)
    bad(f, r"cache_seqlens must be an int or hold one value per batch entry \(2\)", q, kc[:2],
        vc[:2], cache_seqlens=[1, 2, 3])
    bad(f, r"cache_seqlens\[1\] is 10 and k appends 1 rows, but the cache holds 10 rows", q,
        kc[:2], vc[:2], k, k, cache_seqlens=[3, 10])
    bad(f, r"cache_batch_idx must hold integers in \[0, 2\], got 3", q, kc, vc,
        cache_seqlens=2, cache_batch_idx=[0, 3])
    bad(f, r"cache_batch_idx must hold one cache row per batch entry \(2\), got 3", q, kc, vc,
        cache_seqlens=2, cache_batch_idx=[0, 1, 2])
    bad(f, r"cache_batch_idx names cache row 2 for two batch entries", q, kc, vc, k, k,
        cache_seqlens=[1, 4], cache_batch_idx=[2, 2])
    bad(f, r"k_cache holds 3 sequences and q 2: give cache_batch_idx", q, kc, vc,
        cache_seqlens=2)
    bad(f, r"cache_leftpad\[1\] is 9, past batch 1's 4 keys", q, kc[:2], vc[:2],
        cache_seqlens=[2, 4], cache_leftpad=[0, 9])
    bad(f, r"cache_leftpad must hold integers in \[0, ", q, kc[:2], vc[:2], cache_seqlens=2,
        cache_leftpad=[0, -1])
    bad(f, r"num_splits must be an integer in \[0, ", q, kc[:2], vc[:2], num_splits=-1)
    bad(f, r"rotary_interleaved must be True or False", q, kc[:2], vc[:2], k, k,
        rotary_cos=np.ones((12, 4), np.float32), rotary_sin=np.ones((12, 4), np.float32),
        cache_seqlens=1, rotary_interleaved="no")
    bad(f, r"window_size must be a pair", q, kc[:2], vc[:2], window_size=None)
    bad(f, r"block_table must have 2 dimensions", q, kc, vc, block_table=[0, 1])
    bad(f, r"return_softmax_lse must be True or False", q, kc[:2], vc[:2],
        return_softmax_lse=None)
