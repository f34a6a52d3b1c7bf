// Merge: folds one shard's partial result (shard_out, shard_lse), attention over a disjoint
// part of the keys, into the running merge (acc, lse_in) -> (acc, lse_out), exactly:
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
// The merge of n shards is n dispatches (plan::merge); the first (params.resume == 0) starts
// from nothing (lse -inf, out 0). A row that no shard lets see a key keeps lse -inf and out 0;
// a row with a NaN lse in some shard comes out NaN.
// The last dispatch (params.merge_last) stores the result rounded to the element type into
// `out` (once: half outputs are stored with atomicOr), and its lse_out is the call's lse.
// out-layout tensors: [batch, seq_q, heads_q, head_dim]; lse: [batch, heads_q, seq_q].
// Grid: ceil(total_items / 64) workgroups, folded; one invocation per element of out.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    let row = e / params.head_dim;
    let h = row % params.heads_q;
    let bs = row / params.heads_q;
    let r = ((bs / params.seq_q) * params.heads_q + h) * params.seq_q + bs % params.seq_q;
    let lb = shard_lse[r];
    var la = neg_inf();
    var xa = 0.0;
    if (params.resume != 0u) {
        la = lse_in[r];
        xa = acc[e];
    }
    let m = max(la, lb);
    var l = m;
    var x = 0.0;
    if (is_nan(la) || is_nan(lb)) {
        // a row that saw a NaN stays NaN (max may drop a NaN operand)
        l = bitcast<f32>(runtime_bits(0x7fc00000u));
        x = l;
    } else if (m != neg_inf()) {
        // one of the two weights is 1, so their sum lies in [1, 2]: no overflow, no 0 / 0
        let wa = exp(la - m);
        let wb = exp(lb - m);
        let s = wa + wb;
        l = m + log(s);
        x = (wa * xa + wb * load_shard_out(e)) / s;
    }
    acc[e] = x;
    if (params.merge_last != 0u) {
        store_out(e, x);
    }
    if (e % params.head_dim == 0u) {
        lse_out[r] = l;
    }
}
