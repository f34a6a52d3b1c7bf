//! Calls inside someone else's GPU work: forward and backward recorded into the caller's
//! command encoder run only when the caller submits, and give the results of the ordinary
//! calls bit for bit; GPU timestamps are opt-in.

use crate::common;

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
        let r = flash_attn_wgpu::unstable::reference::forward(&c, &d.q, &d.k, &d.v);
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

#[test]
fn tensors_wrapping_the_callers_buffer_are_read_in_place() {
    // q, k and v at aligned offsets of one buffer the caller made and filled
    let x = ctx();
    let c = cfg(2, 9, 40, 4, 2, 16, true);
    let d = inputs(&c, 1.5);
    let align = x.device().limits().min_storage_buffer_offset_alignment as u64;
    let at = |bytes: u64| bytes.next_multiple_of(align);
    let (q_off, k_off) = (align, at(align + 4 * d.q.len() as u64));
    let v_off = at(k_off + 4 * d.k.len() as u64);
    let size = at(v_off + 4 * d.v.len() as u64);
    let buffer = x.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("caller's qkv"),
        size,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    for (off, data) in [(q_off, &d.q), (k_off, &d.k), (v_off, &d.v)] {
        x.queue()
            .write_buffer(&buffer, off, bytemuck::cast_slice(data));
    }
    let f32 = flash_attn_wgpu::DType::F32;
    let q = x
        .tensor_from_buffer(&buffer, q_off, &c.q_shape(), None, f32)
        .unwrap();
    let k = x
        .tensor_from_buffer(
            &buffer,
            k_off,
            &c.kv_shape(),
            Some(&[40 * 2 * 16, 2 * 16, 16, 1]),
            f32,
        )
        .unwrap();
    let v = x
        .tensor_from_buffer(&buffer, v_off, &c.kv_shape(), None, f32)
        .unwrap();
    assert_eq!(x.download::<f32>(&k).unwrap(), d.k);
    let f = x.forward(&c, &q, &k, &v).unwrap();
    let want = x.forward_host(&c, &d.q, &d.k, &d.v).unwrap();
    assert_eq!(x.download::<f32>(&f.out).unwrap(), want.out);
    // and as a KV cache appended to in place
    let mut kc = x
        .tensor_from_buffer(&buffer, k_off, &c.kv_shape(), None, f32)
        .unwrap();
    let mut vc = x
        .tensor_from_buffer(&buffer, v_off, &c.kv_shape(), None, f32)
        .unwrap();
    let q1 = x.upload(&d.q[..4 * 16 * 2], &[2, 1, 4, 16]).unwrap();
    let kn = x.upload(&[0.5f32; 2 * 2 * 16], &[2, 1, 2, 16]).unwrap();
    let mut one = c.clone();
    one.seq_q = 1;
    x.forward_with_kvcache(&one, &q1, &mut kc, &mut vc, &[3, 39], Some((&kn, &kn)))
        .unwrap();
    let k_after: Vec<f32> = x.download(&kc).unwrap();
    let row = 2 * 16;
    assert!(k_after[3 * row..4 * row].iter().all(|x| *x == 0.5));
    assert!(k_after[(40 + 39) * row..(40 + 40) * row]
        .iter()
        .all(|x| *x == 0.5));
    assert_eq!(k_after[..3 * row], d.k[..3 * row]);

    // bad views are typed errors
    use flash_attn_wgpu::Error;
    let shape = c.q_shape();
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 6, &shape, None, f32),
        Err(Error::Buffer { expected, .. }) if expected.contains("element size")
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, v_off, &c.kv_shape(), None, f32).and_then(|_| {
            x.tensor_from_buffer(&buffer, size - align, &shape, None, f32)
        }),
        Err(Error::Buffer { got, .. }) if got.contains("past the buffer")
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 0, &shape, Some(&[1, 1, 1, 2]), f32),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 0, &shape, Some(&[1, 1]), f32),
        Err(Error::InvalidConfig(_))
    ));
    let uniform = x.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 1024,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    assert!(matches!(
        x.tensor_from_buffer(&uniform, 0, &[4], None, f32),
        Err(Error::Buffer { expected, .. }) if expected.contains("STORAGE")
    ));
    let other = Context::new().unwrap();
    let foreign = other
        .tensor_from_buffer(&buffer, q_off, &shape, None, f32)
        .unwrap();
    assert!(matches!(
        x.forward(&c, &foreign, &k, &v),
        Err(Error::ForeignTensor { .. })
    ));
}

#[test]
fn calls_write_into_the_callers_tensors_in_place() {
    use flash_attn_wgpu::{Error, Forward};
    let x = ctx();
    for c in [
        cfg(2, 37, 45, 4, 2, 32, true),
        cfg(1, 1, 300, 8, 2, 64, true),
    ] {
        let d = inputs(&c, 1.5);
        let (q, k, v) = (
            x.upload(&d.q, &c.q_shape()).unwrap(),
            x.upload(&d.k, &c.kv_shape()).unwrap(),
            x.upload(&d.v, &c.kv_shape()).unwrap(),
        );
        // the destination starts as NaN: an element a call left unwritten would show
        let nan = |n: usize| vec![f32::NAN; n];
        let dst = Forward {
            out: x.upload(&nan(d.q.len()), &c.q_shape()).unwrap(),
            lse: x
                .upload(&nan(c.lse_shape().iter().product()), &c.lse_shape())
                .unwrap(),
        };
        let msg = common::describe(&c, d.seed);
        for round in 0..2 {
            // round 1: a new query written in place, the same destination
            let qh = if round == 0 {
                d.q.clone()
            } else {
                inputs(&c, 0.7).q
            };
            x.write(&q, &qh).unwrap();
            x.forward_into(&c, &q, &k, &v, &dst).unwrap();
            let r = flash_attn_wgpu::unstable::reference::forward(&c, &qh, &d.k, &d.v);
            let m = format!("round {round}: {msg}");
            common::assert_close("out", &x.download::<f32>(&dst.out).unwrap(), &r.out, &m);
            common::assert_lse_close(&x.download::<f32>(&dst.lse).unwrap(), &r.lse, &m);
        }
        // bad destinations and writes are typed errors, found before any work
        let short = x.zeros(&[c.batch, c.seq_q, c.heads_q]).unwrap();
        let bad = Forward {
            out: short,
            lse: x.zeros(&c.lse_shape()).unwrap(),
        };
        assert!(matches!(
            x.forward_into(&c, &q, &k, &v, &bad),
            Err(Error::Shape { .. })
        ));
        let aliased = Forward {
            out: x.upload(&d.q, &c.q_shape()).unwrap(),
            lse: x.zeros(&c.lse_shape()).unwrap(),
        };
        let e = x.forward_into(&c, &aliased.out, &k, &v, &aliased);
        assert!(
            matches!(&e, Err(Error::InvalidConfig(m)) if m.contains("out")),
            "{e:?}"
        );
        assert!(matches!(
            x.write(&q, &d.q[1..]),
            Err(Error::InvalidConfig(_))
        ));
        let half: Vec<half::f16> = flash_attn_wgpu::from_f32_slice(&d.q);
        assert!(matches!(x.write(&q, &half), Err(Error::DType { .. })));
    }
    // a wrapped buffer is refused as a destination: outputs bind whole buffers
    let c = cfg(1, 1, 300, 8, 2, 64, true);
    let d = inputs(&c, 1.5);
    let (q, k, v) = (
        x.upload(&d.q, &c.q_shape()).unwrap(),
        x.upload(&d.k, &c.kv_shape()).unwrap(),
        x.upload(&d.v, &c.kv_shape()).unwrap(),
    );
    let f = x.forward(&c, &q, &k, &v).unwrap();
    let wrapped = x
        .tensor_from_buffer(
            f.out.buffer(),
            0,
            &c.q_shape(),
            None,
            flash_attn_wgpu::DType::F32,
        )
        .unwrap();
    let dst = Forward {
        out: wrapped,
        lse: x.zeros(&c.lse_shape()).unwrap(),
    };
    assert!(matches!(
        x.forward_into(&c, &q, &k, &v, &dst),
        Err(Error::Buffer { .. })
    ));
}
