// A user mask's block mask (Context::create_block_mask, FlexAttention's create_block_mask):
// item e is block (b, h, r, c) of [batch, heads, rows, cols] (params.batch, heads_q; blocks
// of params.block_q x block_kv over seq_q x seq_kv, params.blocks_cols a row); 2.0 where every
// pair of it passes `mask_mod` (a full block: the kernels skip evaluating it there), 1.0
// where some pair does, else 0.0 (a block it hides entirely is never visited).
// Bindings 1..: declared by the generated prelude from Kernel::bindings (src/kernels/mod.rs).

fn item(e: u32) {
    let cols = params.blocks_cols;
    let rows = (params.seq_q + params.block_q - 1u) / params.block_q;
    let c = e % cols;
    let r = (e / cols) % rows;
    let bh = e / (cols * rows);
    // the arguments mask_mod_on passes (begin_head's, without the rest of its work)
    head_b = bh / params.heads_q;
    head_h = bh % params.heads_q;
    let i_end = min((r + 1u) * params.block_q, params.seq_q);
    let j_end = min((c + 1u) * params.block_kv, params.seq_kv);
    var any = false;
    var all = true;
    for (var i = r * params.block_q; i < i_end; i++) {
        for (var j = c * params.block_kv; j < j_end; j++) {
            let seen = mask_mod_on(i, j);
            any = any || seen;
            all = all && seen;
        }
        // decided: partly on
        if (any && !all) {
            break;
        }
    }
    blocks[e] = select(select(0.0, 1.0, any), 2.0, all);
}
