// Rotary position embedding (RoPE) of a tensor [batch, rows, heads, head_dim]: q, or the new
// keys before a KV cache appends them. Row i of batch b sits at position
// positions[b] + i * rotary_step (rotary_step 0: every row of a batch at one position, as
// flash-attn rotates q of a non-causal KV-cache call). The first rotary_dim dims of each head
// turn in pairs by angle theta(pos, f), read as cos and sin from tables [table_rows,
// rotary_dim / 2]: pairs (2f, 2f + 1) when interleaved (GPT-J), else (f, f + rotary_dim / 2)
// (GPT-NeoX); the other dims are copied. Grid: ceil(total_items / 64) workgroups, folded.

// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

// Element e of dst; each element reads its pair's partner, so no element waits on another.
fn item(e: u32) {
    let d = e % params.head_dim;
    let row = e / (params.head_dim * params.heads_q);
    let b = row / params.seq_q;
    let i = row % params.seq_q;
    let x = load_src(e);
    if (d >= params.rotary_dim) {
        store_dst(e, x);
        return;
    }
    let half = params.rotary_dim / 2u;
    var f = d % half;
    var first = d < half;
    var partner = select(e - half, e + half, first);
    if (params.rotary_interleaved != 0u) {
        f = d / 2u;
        first = (d & 1u) == 0u;
        partner = select(e - 1u, e + 1u, first);
    }
    let at = (positions[b] + i * params.rotary_step) * half + f;
    let c = load_rot_cos(at);
    let s = load_rot_sin(at);
    let y = load_src(partner);
    // (x0, x1) -> (x0 c - x1 s, x1 c + x0 s)
    store_dst(e, select(x * c + y * s, x * c - y * s, first));
}
