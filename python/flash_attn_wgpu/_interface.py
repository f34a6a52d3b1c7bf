"""flash-attn 2's functions, with its exact positional signatures and return values, the
handle a forward returns for its backward, and the explicit backward functions.

Our extras come after flash-attn 2's parameters and are keyword-only, so that a positional
flash-attn 2 call can never land on one of them."""

import numpy as np

from . import _args, _native
from ._errors import InvalidInputError, UnsupportedError
from ._tensor import Tensor, _dtype_name, out_of, tensor


# ---- options

def _options(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
             softcap=0.0, alibi_slopes=None, seed=None, cu_seqlens_q=None, cu_seqlens_k=None,
             block_table=None, num_splits=0, leftpad_k=None, score_mod=None,
             score_mod_tensors=None, mask_mod=None, mask_mod_tensors=None, block_mask=None,
             score_mod_trainable=None):
    """The native module's options dict, every argument checked in the caller's words."""
    dropout_p = _args.number(dropout_p, "dropout_p", 0.0, 1.0, high_open=True)
    mask_mod, mask_mod_tensors = _mask_of(block_mask, mask_mod, mask_mod_tensors)

    def listed(a):
        return None if a is None else [int(n) for n in a.ravel()]

    return {
        "causal": _args.flag(causal, "causal"),
        "softmax_scale": _args.number(softmax_scale, "softmax_scale", allow_none=True),
        "window_size": _args.window(window_size),
        "softcap": _args.number(softcap, "softcap", low=0.0),
        "alibi_slopes": _args.alibi(alibi_slopes),
        "dropout_p": dropout_p,
        "seed": _args.seed_for(seed, dropout_p),
        "cu_seqlens_q": listed(cu_seqlens_q),
        "cu_seqlens_k": listed(cu_seqlens_k),
        "block_table": block_table,
        "num_splits": _args.integer(num_splits, "num_splits"),
        "leftpad_k": listed(leftpad_k),
        "score_mod": _args.wgsl(score_mod, "score_mod"),
        "score_mod_tensors": _captured(score_mod_tensors, "score_mod_tensors"),
        "score_mod_trainable": _trainable(score_mod_trainable, score_mod_tensors),
        "mask_mod": _args.wgsl(mask_mod, "mask_mod"),
        "mask_mod_tensors": _captured(mask_mod_tensors, "mask_mod_tensors"),
        "block_mask": block_mask,
    }


def _captured(tensors, name):
    if tensors is None:
        return []
    if not isinstance(tensors, dict):
        raise InvalidInputError(f"{name} must be a dict of name -> float32 array, got "
                                f"{type(tensors).__name__}")
    out = []
    for key, t in tensors.items():
        try:
            values = np.asarray(t, dtype=np.float32).ravel()
        except Exception:
            raise InvalidInputError(f"{name}[{key!r}] must be an array of floats") from None
        out.append((str(key), [float(x) for x in values]))
    return out


def _trainable(name, tensors):
    """The name of the captured tensor whose gradient the backward returns: one of
    ``score_mod_tensors``' names (the library checks the rest: that score_mod reads it once)."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidInputError(f"score_mod_trainable must be the name of one of "
                                f"score_mod_tensors, got {type(name).__name__}")
    if not isinstance(tensors, dict) or name not in tensors:
        names = sorted(tensors) if isinstance(tensors, dict) else []
        raise InvalidInputError(f"score_mod_trainable={name!r} is not one of score_mod_tensors' "
                                f"names {names}")
    return name


def _table_grad(d_table, options, tensors):
    """The trainable tensor's gradient, a float32 numpy array of the tensor's shape as given:
    the gradients' last element, after (dq, dk, dv); nothing without one."""
    if d_table is None:
        return ()
    shape = np.shape(tensors[options["score_mod_trainable"]])
    return (np.asarray(out_of(True, d_table)).reshape(shape),)


def _mask_of(block_mask, mask_mod, mask_mod_tensors):
    """The mask a call applies, and its tensors: those given, or the block mask's own (a block
    mask knows the mask it was made from, as FlexAttention's does). A block mask made from
    another mask is refused: its full blocks skip the mask, and would skip the wrong one."""
    if block_mask is None:
        return mask_mod, mask_mod_tensors
    if not isinstance(block_mask, _native.BlockMask):
        raise InvalidInputError(
            f"block_mask must come from create_block_mask, got {type(block_mask).__name__}")
    if mask_mod is None and mask_mod_tensors is None:
        return block_mask.mask_mod, dict(block_mask.mask_mod_tensors)
    given = _captured(mask_mod_tensors, "mask_mod_tensors")
    if _args.wgsl(mask_mod, "mask_mod") != block_mask.mask_mod or \
            given != block_mask.mask_mod_tensors:
        raise InvalidInputError(
            "block_mask was made from another mask_mod or other mask_mod_tensors than the "
            "ones given: give the mask it was made from, or none (the block mask's is applied)")
    return mask_mod, mask_mod_tensors


def _table(block_table, batch, num_pages, name="block_table"):
    """(flattened, pages per sequence) of a [batch, pages_per_seq] table of page indices."""
    t = _args.int_array(block_table, name, ndim=2, high=max(num_pages - 1, 0))
    if t.shape[0] != batch:
        raise InvalidInputError(
            f"{name} must have one row per batch entry ({batch}), got shape {t.shape}")
    if num_pages == 0:
        raise InvalidInputError(f"{name} names pages, but the cache holds none")
    return [int(n) for n in t.ravel()], int(t.shape[1])


# ---- the handle

class FlashAttnCall:
    """One forward call, as its backward needs it: ``out`` and ``softmax_lse`` (as the call
    returned them), the options and the dropout ``seed`` it ran with (``options``), and its
    inputs as the GPU saw them. ``backward(dout)`` gives the gradients of that call, with no
    option to repeat: ``(dq, dk, dv)``, or the packed forms (``dqkv`` for
    flash_attn_qkvpacked_func, ``(dq, dkv)`` for the kv-packed ones), in the layouts and
    dtypes of the inputs. The backward is deterministic (``deterministic`` is recorded, and
    changes nothing here).

    The saved tensors are the uploaded copies, so changing the caller's arrays after the
    forward does not change the gradients."""

    __slots__ = ("out", "softmax_lse", "seed", "options", "_saved", "_layout", "_numpy",
                 "_tables")

    def __init__(self, out, softmax_lse, options, user_options, saved, layout, as_numpy,
                 tables=None):
        self.out = out
        self.softmax_lse = softmax_lse
        self.seed = options["seed"]
        self.options = dict(user_options, seed=options["seed"])
        self._saved = (options, saved)
        self._layout = layout
        self._numpy = as_numpy
        self._tables = tables

    def backward(self, dout):
        """The gradients of this call for ``dout``, the gradient of ``out`` (its shape)."""
        options, (q, k, v, out, lse) = self._saved
        want = tuple(self.out.shape)
        got = tuple(np.shape(dout)) if not isinstance(dout, Tensor) else dout.shape
        if got != want:
            raise InvalidInputError(f"dout has shape {list(got)}, expected out's shape "
                                    f"{list(want)}")
        varlen = self._layout.startswith("varlen")
        bhsd = self._layout == "bhsd"
        if bhsd:
            dout = _bhsd(dout, "dout")
        d = _packed(dout, "dout") if varlen else tensor(dout, "dout")
        grads = _native.backward(d._t, q, k, v, out, lse, options)
        dq, dk, dv = (out_of(self._numpy, g) for g in grads[:3])
        table = _table_grad(grads[3], options, self._tables)
        if varlen and self._numpy:
            dq, dk, dv = dq[0], dk[0], dv[0]
        if bhsd:
            return tuple(_bhsd(g, name) for g, name in ((dq, "dq"), (dk, "dk"), (dv, "dv"))) \
                + table
        if self._layout.endswith("qkvpacked"):
            return np.stack([dq, dk, dv], axis=-3)
        if self._layout.endswith("kvpacked"):
            return dq, np.stack([dk, dv], axis=-3)
        return (dq, dk, dv) + table

    def __repr__(self):
        return (f"flash_attn_wgpu.FlashAttnCall(out shape {tuple(self.out.shape)}, "
                f"seed {self.seed}, {self._layout})")


def _finish(out, lse, options, user_options, saved, layout, as_numpy, return_attn_probs,
            return_lse, return_handle, tables=None):
    """What a forward returns: out; (out, softmax_lse, S_dmask) with return_attn_probs
    (S_dmask None); (out, lse) with return_lse; the handle with return_handle."""
    if return_handle and return_attn_probs:
        raise InvalidInputError(
            "return_attn_probs and return_handle: give one (the handle holds out and "
            "softmax_lse)")
    o, l = out_of(as_numpy, out), out_of(as_numpy, lse)
    if layout.startswith("varlen") and as_numpy:
        o, l = o[0], l[0]
    if return_handle:
        return FlashAttnCall(o, l, options, user_options, saved + (out, lse), layout, as_numpy,
                             tables)
    if _args.flag(return_attn_probs, "return_attn_probs"):
        return o, l, None
    if _args.flag(return_lse, "return_lse"):
        return o, l
    return o


def _user(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic):
    return {"dropout_p": dropout_p, "softmax_scale": softmax_scale, "causal": causal,
            "window_size": window_size, "softcap": softcap, "alibi_slopes": alibi_slopes,
            "deterministic": _args.flag(deterministic, "deterministic")}


# ---- the forwards

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, return_lse=False, return_handle=False,
                    seed=None, score_mod=None, score_mod_tensors=None, mask_mod=None,
                    mask_mod_tensors=None, block_mask=None, score_mod_trainable=None):
    """flash-attn 2's ``flash_attn_func``: attention of q ``[batch, seqlen_q, nheads,
    headdim]`` over k, v ``[batch, seqlen_k, nheads_k, headdim]`` (nheads a multiple of
    nheads_k: GQA/MQA). v may be narrower or wider than q and k (``headdim_v``, as flash-attn
    3 reads it; out is then that wide; head dims of q and k up to 576 and of v up to 512 on
    wgpu; CUDA runs one head dim for all three, up to 256).

    flash-attn 2's parameters, in its order: ``causal`` bottom-right aligned (query i sees
    keys j <= i + seqlen_k - seqlen_q); ``window_size`` (left, right), negative unbounded;
    ``softcap`` > 0 caps the scaled scores with tanh; ``alibi_slopes`` ``[nheads]`` or
    ``[batch, nheads]`` float32; ``dropout_p`` drops probabilities (Philox keyed by ``seed``:
    a fresh seed each call unless given); ``deterministic`` is accepted and changes nothing
    (every pass here is deterministic); ``return_attn_probs`` returns ``(out, softmax_lse,
    S_dmask)`` with ``S_dmask`` None: the probabilities are never materialized (flash-attn 2
    too fills it only with dropout, for its own tests).

    Keyword-only extras: ``return_handle`` returns a :class:`FlashAttnCall` whose
    ``backward(dout)`` gives the gradients with this call's options and seed;
    ``return_lse`` returns ``(out, lse)``; ``seed``; ``score_mod``: WGSL defining
    ``score_mod(s, b, h, i, j)`` (FlexAttention's score_mod, after the built-in modifiers;
    its derivative ``score_mod_ds`` derived, or given; docs/SEMANTICS.md), reading the arrays
    (float32) of ``score_mod_tensors`` (a dict) by name; ``score_mod_trainable``: the name of
    one of them to learn (read once, in ``score_mod``'s own body): a handle's backward then
    returns its gradient (float32, its shape) after ``(dq, dk, dv)``, summed in a fixed order
    (the same bits every run; wgpu only); ``mask_mod``: WGSL defining
    ``mask_mod(b, h, i, j) -> bool`` (pairs where it is false are hidden), reading
    ``mask_mod_tensors``; ``block_mask`` from :func:`create_block_mask`, which applies the mask
    it was made from (give that mask, or none).
    lse is ``[batch, nheads, seqlen_q]`` float32."""
    as_numpy = not isinstance(q, Tensor)
    user = _user(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                 deterministic)
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed,
                    score_mod=score_mod, score_mod_tensors=score_mod_tensors,
                    mask_mod=mask_mod, mask_mod_tensors=mask_mod_tensors,
                    block_mask=block_mask, score_mod_trainable=score_mod_trainable)
    qt, kt, vt = tensor(q, "q"), tensor(k, "k"), tensor(v, "v")
    out, lse = _native.forward(qt._t, kt._t, vt._t, opts)
    return _finish(out, lse, opts, user, (qt._t, kt._t, vt._t), "dense", as_numpy,
                   return_attn_probs, return_lse, return_handle, score_mod_tensors)


def _as_layout(result, return_handle, layout):
    """A packed form's result: its handle's backward gives that layout's gradients."""
    if return_handle:
        result._layout = layout
    return result


def _unpack(x, parts, name, varlen=False):
    """Slices a packed numpy array along its parts axis (-3): ``[batch, seqlen, parts,
    heads, headdim]``, or ``[total, parts, heads, headdim]`` for varlen."""
    shape = "[total, {p}, nheads, headdim]" if varlen else "[batch, seqlen, {p}, nheads, headdim]"
    if isinstance(x, Tensor):
        raise InvalidInputError(
            f"{name} must be a numpy array (a packed Tensor cannot be sliced on the device): "
            "pass the parts to flash_attn_func as Tensors")
    a = np.asarray(x)
    if a.ndim != (4 if varlen else 5) or a.shape[-3] != parts:
        raise InvalidInputError(
            f"{name} must be {shape.format(p=parts)}, got shape {a.shape}")
    return [a[..., n, :, :] for n in range(parts)]


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *,
                              return_lse=False, return_handle=False, seed=None):
    """flash-attn 2's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` on q, k and v
    stacked in one numpy array ``[batch, seqlen, 3, nheads, headdim]``; a handle's backward
    gives ``dqkv`` in that layout."""
    q, k, v = _unpack(qkv, 3, "qkv")
    r = flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        alibi_slopes, deterministic, return_attn_probs, return_lse=return_lse,
                        return_handle=return_handle, seed=seed)
    return _as_layout(r, return_handle, "qkvpacked")


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *,
                             return_lse=False, return_handle=False, seed=None):
    """flash-attn 2's ``flash_attn_kvpacked_func``: :func:`flash_attn_func` with k and v
    stacked in one numpy array ``[batch, seqlen_k, 2, nheads_k, headdim]``; a handle's
    backward gives ``(dq, dkv)``."""
    k, v = _unpack(kv, 2, "kv")
    r = flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        alibi_slopes, deterministic, return_attn_probs, return_lse=return_lse,
                        return_handle=return_handle, seed=seed)
    return _as_layout(r, return_handle, "kvpacked")


def _packed(x, name):
    """A varlen array ``[total, heads, headdim]`` as the library's batch of one."""
    if isinstance(x, Tensor):
        if len(x.shape) != 4 or x.shape[0] != 1:
            raise InvalidInputError(
                f"a varlen {name} Tensor must be [1, total, heads, headdim], got {x.shape}")
        return x
    a = np.asarray(x)
    if a.ndim != 3:
        raise InvalidInputError(
            f"varlen {name} must be [total, heads, headdim], got shape {a.shape}")
    return tensor(a[None], name)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           return_lse=False, return_handle=False, seed=None):
    """flash-attn 2's ``flash_attn_varlen_func``: sequences of different lengths packed end
    to end, q ``[total_q, nheads, headdim]``, k and v ``[total_k, nheads_k, headdim]``,
    ``cu_seqlens_q``/``cu_seqlens_k`` the cumulative lengths (batch + 1 entries from 0,
    ending at the totals), ``max_seqlen_*`` at least the longest sequence (checked). Each
    sequence attends within itself, causal and window aligned per sequence. With
    ``block_table`` ``[batch, pages_per_seq]`` k and v are page pools ``[num_pages,
    page_size, nheads_k, headdim]`` and sequence s's keys are the first
    ``cu_seqlens_k[s + 1] - cu_seqlens_k[s]`` rows of its pages (a forward only, as in
    flash-attn 2: no dropout, no handle). Returns out ``[total_q, nheads, headdim]``; lse is
    ``[nheads, total_q]``. Other parameters and the extras as :func:`flash_attn_func`."""
    as_numpy = not isinstance(q, Tensor)
    user = _user(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                 deterministic)
    if block_table is not None:
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             user, block_table, return_attn_probs, return_lse, return_handle,
                             seed)
    qt, kt, vt = _packed(q, "q"), _packed(k, "k"), _packed(v, "v")
    if vt.shape[1] != kt.shape[1]:
        raise InvalidInputError(f"v has {vt.shape[1]} rows and k {kt.shape[1]}: they hold the "
                                "same keys (cu_seqlens_k)")
    cu_q, cu_k = _args.varlen_bounds(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     qt.shape[1], kt.shape[1])
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, seed,
                    cu_q, cu_k)
    out, lse = _native.forward(qt._t, kt._t, vt._t, opts)
    return _finish(out, lse, opts, user, (qt._t, kt._t, vt._t), "varlen", as_numpy,
                   return_attn_probs, return_lse, return_handle)


def _varlen_paged(q, k_pool, v_pool, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  user, block_table, return_attn_probs, return_lse, return_handle, seed):
    """Varlen queries over paged keys: one KV-cache call whose queries are each sequence's,
    left-padded to the longest (so bottom-right alignment puts each sequence's rows where a
    call of it alone would), the padding rows dropped from the result."""
    if return_handle:
        raise UnsupportedError("block_table with return_handle: a paged varlen call is a "
                               "forward only (as in flash-attn 2)")
    if user["dropout_p"] != 0.0:
        raise UnsupportedError(f"block_table with dropout_p={user['dropout_p']}: a paged "
                               "varlen call is a forward only, without dropout")
    if isinstance(q, Tensor):
        raise InvalidInputError("q must be a numpy array with block_table (its rows are "
                                "regrouped by sequence on the host)")
    q = np.asarray(q)
    if q.ndim != 3:
        raise InvalidInputError(f"varlen q must be [total, heads, headdim], got shape {q.shape}")
    cu_q, cu_k = _args.varlen_bounds(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     q.shape[0], None)
    batch = cu_q.size - 1
    pool = k_pool.shape if isinstance(k_pool, Tensor) else np.shape(k_pool)
    if len(pool) != 4:
        raise InvalidInputError(f"with block_table, k must be a page pool [num_pages, "
                                f"page_size, nheads_k, headdim], got shape {tuple(pool)}")
    table = _table(block_table, batch, pool[0])
    lens_q, lens_k = np.diff(cu_q), np.diff(cu_k)
    room = table[1] * pool[1]
    if lens_k.size and lens_k.max() > room:
        s = int(np.argmax(lens_k))
        raise InvalidInputError(
            f"cu_seqlens_k gives sequence {s} {int(lens_k[s])} keys, but block_table holds "
            f"{table[1]} pages of {pool[1]} rows ({room}) a sequence")
    longest = int(lens_q.max()) if lens_q.size else 0
    padded = np.zeros((batch, longest) + q.shape[1:], q.dtype)
    for s in range(batch):
        padded[s, longest - lens_q[s]:] = q[cu_q[s]:cu_q[s + 1]]
    opts = _options(0.0, user["softmax_scale"], user["causal"], user["window_size"],
                    user["softcap"], user["alibi_slopes"], seed, block_table=table)
    kc, vc = tensor(k_pool, "k"), tensor(v_pool, "v")
    out, lse = _native.forward_with_kvcache(tensor(padded, "q")._t, kc._t, vc._t,
                                            [int(n) for n in lens_k], None, None, opts)
    out, lse = Tensor(out).numpy(), Tensor(lse).numpy()
    o = np.concatenate([out[s, longest - lens_q[s]:] for s in range(batch)], axis=0)
    l = np.concatenate([lse[s, :, longest - lens_q[s]:] for s in range(batch)], axis=1)
    if _args.flag(return_attn_probs, "return_attn_probs"):
        return o, l, None
    return (o, l) if _args.flag(return_lse, "return_lse") else o


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, return_lse=False,
                                     return_handle=False, seed=None):
    """flash-attn 2's ``flash_attn_varlen_qkvpacked_func``: :func:`flash_attn_varlen_func`
    on q, k and v stacked in one numpy array ``[total, 3, nheads, headdim]`` with one
    ``cu_seqlens``; a handle's backward gives ``dqkv`` in that layout."""
    q, k, v = _unpack(qkv, 3, "qkv", varlen=True)
    r = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                               softmax_scale, causal, window_size, softcap, alibi_slopes,
                               deterministic, return_attn_probs, return_lse=return_lse,
                               return_handle=return_handle, seed=seed)
    return _as_layout(r, return_handle, "varlen_qkvpacked")


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, return_lse=False,
                                    return_handle=False, seed=None):
    """flash-attn 2's ``flash_attn_varlen_kvpacked_func``: :func:`flash_attn_varlen_func`
    with k and v stacked in one numpy array ``[total_k, 2, nheads_k, headdim]``; a handle's
    backward gives ``(dq, dkv)``."""
    k, v = _unpack(kv, 2, "kv", varlen=True)
    r = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               dropout_p, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, deterministic, return_attn_probs,
                               return_lse=return_lse, return_handle=return_handle, seed=seed)
    return _as_layout(r, return_handle, "varlen_kvpacked")


# ---- explicit backwards (the handle's backward needs no options: prefer it)

def _backward_seed(seed, dropout_p):
    dropout_p = _args.number(dropout_p, "dropout_p", 0.0, 1.0, high_open=True)
    if dropout_p > 0 and seed is None:
        raise InvalidInputError(
            "seed: a backward with dropout_p > 0 needs the forward's seed (handle.seed, or the "
            "seed passed to the forward); the handle's backward(dout) needs none")
    return seed


def flash_attn_backward(dout, q, k, v, out, lse, dropout_p=0.0, softmax_scale=None,
                        causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        seed=None, score_mod=None, score_mod_tensors=None, mask_mod=None,
                        mask_mod_tensors=None, block_mask=None, score_mod_trainable=None):
    """Gradients (dq, dk, dv) of attention from the forward's ``out`` and ``lse`` and the
    output's gradient ``dout``, with the forward's options, which must be repeated exactly
    (``return_handle=True`` on the forward and ``handle.backward(dout)`` need none).
    The probabilities are recomputed, never stored. Shapes and dtypes as q, k and v. With
    ``score_mod_trainable``, the named tensor's gradient follows (float32, its shape)."""
    as_numpy = not isinstance(q, Tensor)
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    _backward_seed(seed, dropout_p), score_mod=score_mod,
                    score_mod_tensors=score_mod_tensors, mask_mod=mask_mod,
                    mask_mod_tensors=mask_mod_tensors, block_mask=block_mask,
                    score_mod_trainable=score_mod_trainable)
    grads = _native.backward(tensor(dout, "dout")._t, tensor(q, "q")._t, tensor(k, "k")._t,
                             tensor(v, "v")._t, tensor(out, "out")._t, tensor(lse, "lse")._t,
                             opts)
    return tuple(out_of(as_numpy, g) for g in grads[:3]) \
        + _table_grad(grads[3], opts, score_mod_tensors)


def flash_attn_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                               dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               seed=None):
    """Gradients (dq, dk, dv) of a varlen call, in the packed layouts of q, k and v, with the
    forward's options repeated (a handle's backward needs none)."""
    as_numpy = not isinstance(q, Tensor)
    qt, kt = _packed(q, "q"), _packed(k, "k")
    cu_q = _args.cu_seqlens(cu_seqlens_q, "cu_seqlens_q", qt.shape[1], "q")
    cu_k = _args.cu_seqlens(cu_seqlens_k, "cu_seqlens_k", kt.shape[1], "k")
    opts = _options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    _backward_seed(seed, dropout_p), cu_q, cu_k)
    if not isinstance(lse, Tensor):
        lse = np.asarray(lse)[None]
    grads = _native.backward(_packed(dout, "dout")._t, qt._t, kt._t, _packed(v, "v")._t,
                             _packed(out, "out")._t, tensor(lse, "lse")._t, opts)
    grads = tuple(out_of(as_numpy, g) for g in grads[:3])
    return tuple(g[0] for g in grads) if as_numpy else grads


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, BLOCK_SIZE=128, mask_mod_tensors=None):
    """The block mask of a user mask (FlexAttention's ``create_block_mask``), evaluated on the
    GPU: ``mask_mod`` the WGSL given to :func:`flash_attn_func` (with its ``mask_mod_tensors``),
    over ``B x H`` grids (``None`` or 1: the mask does not depend on the batch or the head, and
    the block mask is shared) of ``Q_LEN x KV_LEN`` pairs, in blocks of ``BLOCK_SIZE`` (an int,
    or (rows, keys)). Pass it as ``block_mask=``: it carries the mask it was made from
    (``.mask_mod``, ``.mask_mod_tensors``), which the call applies; blocks the mask hides are
    never visited, and blocks it keeps whole skip its evaluation. Make it once and reuse it
    across calls and layers (it depends on the mask and the shape only)."""
    if np.isscalar(BLOCK_SIZE):
        bq = bkv = _args.integer(BLOCK_SIZE, "BLOCK_SIZE", low=1)
    else:
        try:
            bq, bkv = BLOCK_SIZE
        except Exception:
            raise InvalidInputError(f"BLOCK_SIZE must be an int or a pair (rows, keys), got "
                                    f"{BLOCK_SIZE!r}") from None
        bq = _args.integer(bq, "BLOCK_SIZE[0]", low=1)
        bkv = _args.integer(bkv, "BLOCK_SIZE[1]", low=1)
    # None means one grid shared by every batch entry or head, as in FlexAttention; 0 is
    # no grid at all, an error rather than a silent 1
    grid = (1 if B is None else _args.integer(B, "B", low=1),
            1 if H is None else _args.integer(H, "H", low=1),
            _args.integer(Q_LEN, "Q_LEN"), _args.integer(KV_LEN, "KV_LEN"))
    if mask_mod is None:
        raise InvalidInputError(f"mask_mod must be a WGSL string defining "
                                f"`{_args.SIGNATURES['mask_mod']}`, got None")
    return _native.create_block_mask(_args.wgsl(mask_mod, "mask_mod"),
                                     _captured(mask_mod_tensors, "mask_mod_tensors"),
                                     grid, (bq, bkv))


# ---- FlexAttention's call

def _bhsd(x, name):
    """A numpy array's [B, H, S, D] as [B, S, H, D] (and back: the swap is its own inverse)."""
    if isinstance(x, Tensor):
        raise InvalidInputError(
            f"{name}: flex_attention takes numpy arrays in FlexAttention's [B, H, S, D] layout; "
            f"device tensors go to flash_attn_func in [B, S, H, D]")
    a = np.asarray(x)
    if a.ndim != 4:
        raise InvalidInputError(f"{name} must have 4 dimensions [B, H, S, D], got shape "
                                f"{list(a.shape)}")
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))


def _flex_inputs(query, key, value, enable_gqa):
    """query, key and value checked in FlexAttention's words and layout ([B, Hq, L, E], [B,
    Hkv, S, E], [B, Hkv, S, Ev]: every error names the argument and the shape as passed),
    then as [B, S, H, D] for flash_attn_func, which then finds nothing more to refuse in them."""
    arrays = {n: x for n, x in (("query", query), ("key", key), ("value", value))}
    swapped = [_bhsd(x, n) for n, x in arrays.items()]  # numpy arrays of 4 dimensions
    shapes = {n: list(np.shape(x)) for n, x in arrays.items()}
    for n, shape in shapes.items():
        if 0 in shape:
            raise InvalidInputError(f"{n} has an empty dimension: shape {shape} [B, H, S, D]; "
                                    f"each must be at least 1")
    dtypes = {n: x.dtype for n, x in zip(arrays, swapped)}
    for n, d in dtypes.items():
        _dtype_name(d, n)
    if len(set(dtypes.values())) != 1:
        raise InvalidInputError(
            "query, key and value must share one dtype, got " +
            ", ".join(f"{n} {d}" for n, d in dtypes.items()))
    (b, hq, _, e), (bk, hkv, s, ek), (bv, hv, sv, _) = shapes.values()
    if bk != b or bv != b:
        raise InvalidInputError(f"query, key and value must share B, got query "
                                f"{shapes['query']}, key {shapes['key']}, value "
                                f"{shapes['value']}")
    if ek != e:
        raise InvalidInputError(f"key's E must be query's ({e}), got key {shapes['key']} "
                                f"for query {shapes['query']}")
    if (hv, sv) != (hkv, s):
        raise InvalidInputError(f"value must have key's heads and length [B, {hkv}, {s}, Ev], "
                                f"got {shapes['value']}")
    if hq != hkv and not _args.flag(enable_gqa, "enable_gqa"):
        raise InvalidInputError(
            f"query has {hq} heads and key {hkv}: grouped-query attention needs enable_gqa=True "
            f"(as in FlexAttention)")
    if hq % hkv:
        raise InvalidInputError(f"query's heads ({hq}) must be a multiple of key's ({hkv}), "
                                f"got query {shapes['query']} and key {shapes['key']}")
    return swapped


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, *, score_mod_tensors=None,
                   mask_mod=None, mask_mod_tensors=None, return_handle=False,
                   score_mod_trainable=None):
    """PyTorch's ``flex_attention`` in its layout: query ``[B, Hq, L, E]``, key ``[B, Hkv, S,
    E]``, value ``[B, Hkv, S, Ev]`` (numpy, float32, float16 or bfloat16), out ``[B, Hq, L,
    Ev]``. ``score_mod`` is WGSL defining ``score_mod(s, b, h, i, j)``, its derivative
    derived (a WGSL string, not a Python function; see :func:`flash_attn_func`), reading
    ``score_mod_tensors`` by name; ``block_mask`` from :func:`create_block_mask`,
    whose mask the call applies (``mask_mod`` alone: a mask evaluated at every pair);
    ``scale`` the softmax scale (default ``1/sqrt(E)``); ``enable_gqa`` lets Hq be a multiple
    of Hkv, as there. ``return_lse`` returns ``(out, lse)`` with lse ``[B, Hq, L]`` (natural
    log); ``return_handle`` a :class:`FlashAttnCall` whose ``backward(dout)`` gives ``(dq,
    dk, dv)`` in this layout, and with ``score_mod_trainable`` (a name of
    ``score_mod_tensors``, as FlexAttention trains a captured tensor that requires grad) that
    tensor's gradient after them.

    A FlexAttention ``score_mod`` written in Python, such as ``lambda score, b, h, q_idx,
    kv_idx: score + bias[kv_idx]``, is here the WGSL string ``"fn score_mod(s: f32, b: u32,
    h: u32, i: u32, j: u32) -> f32 { return s + bias(j); }"`` with
    ``score_mod_tensors={"bias": bias}``."""
    q, k, v = _flex_inputs(query, key, value, enable_gqa)
    r = flash_attn_func(q, k, v, softmax_scale=scale, return_lse=not return_handle,
                        return_handle=return_handle, score_mod=score_mod,
                        score_mod_tensors=score_mod_tensors, mask_mod=mask_mod,
                        mask_mod_tensors=mask_mod_tensors, block_mask=block_mask,
                        score_mod_trainable=score_mod_trainable)
    if return_handle:
        r.out = _bhsd(r.out, "out")
        r._layout = "bhsd"
        return r
    out, lse = r
    out = _bhsd(out, "out")
    return (out, lse) if _args.flag(return_lse, "return_lse") else out

