// Merge: folds one shard's partial result (shard_out, shard_lse), attention over a disjoint
// part of the keys, into the running merge (acc, lse_in) -> (acc, lse_out), exactly
// (merge_fold in common.wgsl).
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
    var la = neg_inf();
    var xa = 0.0;
    if (params.resume != 0u) {
        la = lse_in[r];
        xa = acc[e];
    }
    let m = merge_fold(la, xa, shard_lse[r], load_shard_out(e));
    acc[e] = m.x;
    if (params.merge_last != 0u) {
        store_out(e, m.x);
    }
    if (e % params.head_dim == 0u) {
        lse_out[r] = m.lse;
    }
}
