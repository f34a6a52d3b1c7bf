// Shared by the "blocks" backward kernels (dQ, dK/dV), after blocks.wgsl: what they stage that
// the forward does not bind (d_out).

// Stages query rows [q0, q0 + BR) of q (times q_scale) and d_out (batch b, query head h) as rows
// at sm[oq] (stride RS) and sm[odo] (stride RSV): zeros past seq_q. Where the values' dims
// differ, q and d_out are staged one after the other.
fn stage_q_dout(oq: u32, odo: u32, b: u32, h: u32, q0: u32, t: u32, q_scale: f32) {
    if (D4 != D4V) {
        for (var e = t; e < BR * D4; e += NT) {
            let i = q0 + e / D4;
            var qx = vec4<f32>();
            if (i < params.seq_q) {
                qx = load4_q(q_at(b, i, h, 0u), e % D4) * q_scale;
            }
            sm[oq + (e / D4) * RS + e % D4] = qx;
        }
        for (var e = t; e < BR * D4V; e += NT) {
            let i = q0 + e / D4V;
            var dox = vec4<f32>();
            if (i < params.seq_q) {
                dox = load4_d_out(dout_at(b, i, h, 0u), e % D4V);
            }
            sm[odo + (e / D4V) * RSV + e % D4V] = dox;
        }
        return;
    }
    for (var e = t; e < BR * D4; e += NT) {
        let r = e / D4;
        let g = e % D4;
        let i = q0 + r;
        var qx = vec4<f32>();
        var dox = vec4<f32>();
        if (i < params.seq_q) {
            qx = load4_q(q_at(b, i, h, 0u), g) * q_scale;
            dox = load4_d_out(dout_at(b, i, h, 0u), g);
        }
        sm[oq + r * RS + g] = qx;
        sm[odo + r * RS + g] = dox;
    }
}
