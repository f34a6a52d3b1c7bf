//! One `Context` shared by several threads: every call gives the result it gives alone, bit for
//! bit, and the reference's; failing and succeeding calls mixed leak no device memory.

use crate::common;

use common::{assert_close, cfg, inputs};
use flash_attn_wgpu::{unstable::reference, Context};

#[test]
fn context_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Context>();
}

#[test]
fn four_threads_on_one_context_get_what_one_thread_gets() {
    let ctx = Context::new().unwrap();
    let shapes = [
        cfg(1, 37, 45, 2, 1, 16, true),
        cfg(2, 20, 20, 4, 2, 32, false),
        cfg(1, 64, 33, 1, 1, 8, true),
        cfg(1, 9, 70, 2, 2, 24, false),
    ];
    let data: Vec<_> = shapes.iter().map(|c| inputs(c, 1.0)).collect();
    // alone, one after the other
    let alone: Vec<_> = shapes
        .iter()
        .zip(&data)
        .map(|(c, d)| {
            let f = ctx.forward_host(c, &d.q, &d.k, &d.v).unwrap();
            let g = ctx
                .backward_host(c, &d.q, &d.k, &d.v, &f.out, &f.lse, &d.d_out)
                .unwrap();
            (f, g)
        })
        .collect();
    for ((c, d), (f, g)) in shapes.iter().zip(&data).zip(&alone) {
        let msg = common::describe(c, d.seed);
        assert_close(
            "out",
            &f.out,
            &reference::forward(c, &d.q, &d.k, &d.v).out,
            &msg,
        );
        let wg = reference::backward(c, &d.q, &d.k, &d.v, &d.d_out);
        assert_close("dq", &g.dq, &wg.dq, &msg);
    }
    let before = ctx.memory_stats().live_bytes;
    // together: each thread repeats its shape, with a failing call between
    std::thread::scope(|s| {
        for ((c, d), (f, g)) in shapes.iter().zip(&data).zip(&alone) {
            let ctx = &ctx;
            s.spawn(move || {
                for _ in 0..6 {
                    let f2 = ctx.forward_host(c, &d.q, &d.k, &d.v).unwrap();
                    assert_eq!(f2.out, f.out, "out differs from the lone call");
                    assert_eq!(f2.lse, f.lse, "lse differs from the lone call");
                    let g2 = ctx
                        .backward_host(c, &d.q, &d.k, &d.v, &f2.out, &f2.lse, &d.d_out)
                        .unwrap();
                    assert_eq!((&g2.dq, &g2.dk, &g2.dv), (&g.dq, &g.dk, &g.dv));
                    assert!(ctx.forward_host(c, &d.q[1..], &d.k, &d.v).is_err());
                }
            });
        }
    });
    assert_eq!(
        ctx.memory_stats().live_bytes,
        before,
        "device memory still held after every call returned"
    );
}
