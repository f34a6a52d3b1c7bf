//! Calls inside someone else's GPU work: forward and backward recorded into the caller's
//! command encoder run only when the caller submits, and give the results of the ordinary
//! calls bit for bit; GPU timestamps are opt-in.

mod common;

use common::{cfg, ctx, inputs};
use flash_attn_wgpu::Context;

/// Reads a tensor's buffer back through the caller's own staging buffer, copied in `enc`.
fn staged(
    x: &Context,
    enc: &mut wgpu::CommandEncoder,
    t: &flash_attn_wgpu::Tensor,
) -> wgpu::Buffer {
    let read = x.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("caller's readback"),
        size: t.size_bytes(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    enc.copy_buffer_to_buffer(t.buffer(), 0, &read, 0, t.size_bytes());
    read
}

fn read_f32(x: &Context, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    b.slice(..).map_async(wgpu::MapMode::Read, |r| r.unwrap());
    x.device()
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
    let v: Vec<f32> = {
        let view = b.slice(..).get_mapped_range().expect("mapped");
        let words: &[f32] = bytemuck::cast_slice(&view[..]);
        words[..n].to_vec()
    };
    b.unmap();
    v
}

#[test]
fn forward_and_backward_recorded_into_the_callers_encoder_run_when_it_submits() {
    let x = ctx();
    for c in [
        cfg(2, 37, 45, 4, 2, 32, true),
        cfg(1, 1, 300, 8, 2, 64, true),
    ] {
        let d = inputs(&c, 1.5);
        let (q, k, v, d_out) = (
            x.upload(&d.q, &c.q_shape()).unwrap(),
            x.upload(&d.k, &c.kv_shape()).unwrap(),
            x.upload(&d.v, &c.kv_shape()).unwrap(),
            x.upload(&d.d_out, &c.q_shape()).unwrap(),
        );
        let mut enc = x
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("caller"),
            });
        let f = x.record_forward(&mut enc, &c, &q, &k, &v).unwrap();
        let g = x
            .record_backward(&mut enc, &c, &q, &k, &v, &f.out, &f.lse, &d_out)
            .unwrap();
        let (out_read, dq_read) = (staged(x, &mut enc, &f.out), staged(x, &mut enc, &g.dq));
        // nothing ran yet: the results are the zeros they were made with
        assert!(x.download::<f32>(&f.out).unwrap().iter().all(|v| *v == 0.0));
        x.queue().submit([enc.finish()]);
        let out = read_f32(x, &out_read, d.q.len());
        let dq = read_f32(x, &dq_read, d.q.len());
        // the ordinary calls give the same bits
        let want_f = x.forward_host(&c, &d.q, &d.k, &d.v).unwrap();
        let want_g = x
            .backward_host(&c, &d.q, &d.k, &d.v, &want_f.out, &want_f.lse, &d.d_out)
            .unwrap();
        assert_eq!(out, want_f.out, "{}", common::describe(&c, d.seed));
        assert_eq!(dq, want_g.dq, "{}", common::describe(&c, d.seed));
        assert_eq!(x.download::<f32>(&f.lse).unwrap(), want_f.lse);
        // and out is out: the reference agrees
        let r = flash_attn_wgpu::reference::forward(&c, &d.q, &d.k, &d.v);
        common::assert_close("out", &out, &r.out, &common::describe(&c, d.seed));
    }
}

#[test]
fn gpu_timestamps_are_opt_in() {
    let x = Context::new().unwrap();
    let c = cfg(1, 16, 16, 2, 2, 16, false);
    let d = inputs(&c, 1.0);
    assert!(!x.gpu_timing());
    x.forward_host(&c, &d.q, &d.k, &d.v).unwrap();
    let t = x.last_gpu_timing().unwrap();
    assert!(!t.from_timestamps && t.per_kernel.is_empty(), "{t:?}");
    x.set_gpu_timing(true);
    x.forward_host(&c, &d.q, &d.k, &d.v).unwrap();
    let t = x.last_gpu_timing().unwrap();
    assert_eq!(t.from_timestamps, x.adapter_info().timestamp_query, "{t:?}");
    assert!(t.seconds > 0.0);
}
