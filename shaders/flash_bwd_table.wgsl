// Backward, a trainable captured tensor's gradient (ScoreMod::with_trainable), in parts:
// d_table[e] = sum over the visible pairs that read entry e of g * d score_mod / d entry,
// where g is the gradient at the pair's finished score and the score score_mod took there,
// both kept by the dQ kernels (or the naive dS kernel) in `kept_grads` (KEPT_WORDS = 2 a pair,
// [batch, heads_q, seq_q, seq_kv]; 0 where a tile was skipped), and the partial and the
// entry's index come from `score_mod_dt` (derived from the user's WGSL: src/modifiers/derive.rs,
// appended to the user code of this kernel's pipelines alone).
// Workgroup w sums part w % params.splits of the pairs (params.split_keys of them, a multiple
// of 64, in order) into the entries of slab w / params.splits (SLAB entries of the table's
// params.total_items), held in workgroup memory; parts[part * total_items + entry] gets them.
// Within a workgroup each entry has one owner invocation, which adds a batch of 64 pairs'
// contributions in the pairs' order (a batch of one entry: their sum in order): every sum has
// a fixed order (no float atomics), so the bits are the same run to run;
// flash_bwd_table_sum.wgsl adds the parts in order.
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

const SLAB: u32 = 2048u;
const NONE: u32 = 0xffffffffu;

var<workgroup> acc: array<f32, SLAB>;
var<workgroup> batch_entry: array<u32, 64>;
var<workgroup> batch_value: array<f32, 64>;
// per batch parity: its least entry and its greatest one other than NONE
var<workgroup> least: array<atomic<u32>, 2>;
var<workgroup> greatest: array<atomic<u32>, 2>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let w = linear_workgroup(wid, nwg);
    if (w >= params.total_wg || !SCORE_MOD()) {
        return;
    }
    let part = w % params.splits;
    let lo = (w / params.splits) * SLAB;
    let entries = min(SLAB, params.total_items - lo);
    for (var e = t; e < SLAB; e += 64u) {
        acc[e] = 0.0;
    }
    if (t == 0u) {
        atomicStore(&least[0], NONE);
        atomicStore(&greatest[0], 0u);
    }
    workgroupBarrier();
    let grid = params.seq_q * params.seq_kv;
    let pairs = params.batch * params.heads_q * grid;
    let first = part * params.split_keys;
    let end = min(first + params.split_keys, pairs);
    for (var base = first; base < end; base += 64u) {
        var entry = NONE;
        var value = 0.0;
        let p = base + t;
        if (p < end) {
            let g = kept_grads[KEPT_WORDS * p];
            if (g != 0.0) {
                let s = kept_grads[KEPT_WORDS * p + 1u];
                let pair = p % grid;
                let slice = p / grid;
                let d = score_mod_dt(s, slice / params.heads_q, slice % params.heads_q,
                    pair / params.seq_kv, pair % params.seq_kv);
                if (score_mod__read != NONE) {
                    // the accessor reads the last entry past the end
                    entry = min(score_mod__read, params.total_items - 1u);
                    value = g * d;
                }
            }
        }
        batch_entry[t] = entry;
        batch_value[t] = value;
        // the batch's entries, least and greatest (NONE ignored by the greatest): a batch that
        // reads one entry (a per-head slope, T5's far buckets) is summed by one invocation, one
        // that reads none (hidden pairs) skipped; atomics on integers, so the same bits
        let parity = (base / 64u) & 1u;
        atomicMin(&least[parity], entry);
        atomicMax(&greatest[parity], select(entry, 0u, entry == NONE));
        workgroupBarrier();
        let lo_e = atomicLoad(&least[parity]);
        let hi_e = atomicLoad(&greatest[parity]);
        if (t == 0u) {
            // the next batch's pair, untouched until the barrier below
            atomicStore(&least[parity ^ 1u], NONE);
            atomicStore(&greatest[parity ^ 1u], 0u);
        }
        if (lo_e != NONE) {
            if (lo_e == hi_e) {
                let e = lo_e - lo;
                if (t == 0u && e < entries) {
                    var sum = 0.0;
                    for (var k = 0u; k < 64u; k++) {
                        sum += batch_value[k];
                    }
                    acc[e] += sum;
                }
            } else {
                for (var k = 0u; k < 64u; k++) {
                    // an entry below the slab wraps past it
                    let e = batch_entry[k] - lo;
                    if (e < entries && e % 64u == t) {
                        acc[e] += batch_value[k];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    for (var e = t; e < entries; e += 64u) {
        parts[part * params.total_items + lo + e] = acc[e];
    }
}
