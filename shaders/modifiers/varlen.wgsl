// VARLEN (src/modifiers/varlen.rs): packed sequences (batch 1). Sequence s holds the whole call's rows
// [cu_q(s), cu_q(s + 1)) and keys [cu_kv(s), cu_kv(s + 1)); a part of a windowed call adds
// q_base / kv_base to its own indices. Pure functions of their arguments and uniform values,
// so bounds computed from uniform rows stay uniform.

fn cu_q(s: u32) -> u32 {
    return extra_u32(params.varlen_base + s);
}

fn cu_kv(s: u32) -> u32 {
    return extra_u32(params.varlen_base + params.sequences + 1u + s);
}

// The sequence holding whole-call row (or key, `keys`) r: the last s with start(s) <= r, so
// empty sequences are passed over. A binary search of the boundaries.
fn sequence_of(r: u32, keys: bool) -> u32 {
    var lo = 0u;
    var hi = params.sequences - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) / 2u;
        let start = select(cu_q(mid), cu_kv(mid), keys);
        if (start <= r) {
            lo = mid;
        } else {
            hi = mid - 1u;
        }
    }
    return lo;
}

// The sequence of this part's query row i.
fn row_sequence(i: u32) -> u32 {
    return sequence_of(params.q_base + i, false);
}

// How far sequence s moves the causal diagonal and the window from the whole call's
// (params.causal_offset, band_lo, band_hi): row i of s is aligned bottom-right in s, i' =
// i - cu_q(s) + len_kv(s) - len_q(s), so its diagonal is j = i + cu_kv(s + 1) - cu_q(s + 1)
// in whole-call indices; 0 without VARLEN.
fn band_shift(s: u32) -> i32 {
    if (!VARLEN()) {
        return 0;
    }
    let whole = params.causal_offset - i32(params.q_base) + i32(params.kv_base);
    return i32(cu_kv(s + 1u)) - i32(cu_q(s + 1u)) - whole;
}

// The sequence context of a row: its sequence's keys [kv_lo, kv_hi) (whole-call indices) and
// band_shift. tile_visit caches it for a tile whose rows lie in one sequence (the common
// case), so that per-pair code reads private values; other rows search the boundaries.
struct RowSequence {
    kv_lo: u32,
    kv_hi: u32,
    shift: i32,
}

const NO_SEQUENCE: u32 = 0xffffffffu;
var<private> tile_sequence: u32 = NO_SEQUENCE;
var<private> tile_context: RowSequence;

fn sequence_context(s: u32) -> RowSequence {
    return RowSequence(cu_kv(s), cu_kv(s + 1u), band_shift(s));
}

fn row_context(i: u32) -> RowSequence {
    if (tile_sequence != NO_SEQUENCE) {
        return tile_context;
    }
    return sequence_context(row_sequence(min(i, params.seq_q - 1u)));
}
