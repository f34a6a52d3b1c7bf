//! Strided tensor views of a caller's buffer (`Context::tensor_from_buffer` with strides or an
//! unaligned offset): BHSD layouts and q, k, v inside one packed QKV projection are read in
//! place by the forward (tiled in every variant, naive, decode) and the backward, and give the
//! f64 reference's results (and the row-major call's bits); calls that take row-major tensors
//! refuse views with typed errors.

use crate::common;

use common::{assert_close, assert_close_tol, assert_lse_close, cfg, ctx, inputs, rel_tol};
use flash_attn_wgpu::dtype::{from_f32_slice, to_f32_vec, Element};
use flash_attn_wgpu::{
    unstable::reference, Algorithm, AttentionConfig, Context, DType, Error, Tensor, Tuning, Variant,
};

/// Where a `[batch, seq, heads, head_dim]` tensor lies in the caller's buffer: its first
/// element and its batch, row and head strides (head_dim contiguous).
#[derive(Clone, Copy, Debug)]
struct Layout {
    first: usize,
    strides: [usize; 4],
}

impl Layout {
    /// `[batch, heads, seq, head_dim]` from element `first`.
    fn bhsd(first: usize, shape: [usize; 4]) -> Layout {
        let [_, s, h, d] = shape;
        Layout {
            first,
            strides: [h * s * d, d, s * d, 1],
        }
    }

    /// Heads `h0 ..` of a packed projection whose rows hold `width` elements (`[batch, seq,
    /// width]`), from element `first` of the buffer.
    fn packed(first: usize, shape: [usize; 4], width: usize, h0: usize) -> Layout {
        let [_, s, _, d] = shape;
        Layout {
            first: first + h0 * d,
            strides: [s * width, width, d, 1],
        }
    }

    fn at(&self, [b, i, h, d]: [usize; 4]) -> usize {
        self.first + b * self.strides[0] + i * self.strides[1] + h * self.strides[2] + d
    }
}

/// A caller's buffer holding each row-major `[batch, seq, heads, head_dim]` host tensor at its
/// layout, every element no layout names NaN (a stray read shows in the results), and the
/// views of it.
fn place<T: Element>(
    x: &Context,
    tensors: &[(&[f32], [usize; 4], Layout)],
    len: usize,
) -> (wgpu::Buffer, Vec<Tensor>) {
    let mut host = vec![f32::NAN; len];
    for (data, shape, l) in tensors {
        let [nb, ns, nh, nd] = *shape;
        let mut n = 0;
        for b in 0..nb {
            for i in 0..ns {
                for h in 0..nh {
                    for d in 0..nd {
                        host[l.at([b, i, h, d])] = data[n];
                        n += 1;
                    }
                }
            }
        }
    }
    let bytes: Vec<u8> = bytemuck::cast_slice(&from_f32_slice::<T>(&host)).to_vec();
    let buffer = x.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("caller's views"),
        size: (bytes.len() as u64).next_multiple_of(4),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let mut padded = bytes;
    padded.resize(buffer.size() as usize, 0);
    x.queue().write_buffer(&buffer, 0, &padded);
    let esz = T::DTYPE.size_bytes();
    let views = tensors
        .iter()
        .map(|(_, shape, l)| {
            x.tensor_from_buffer(
                &buffer,
                (l.first * esz) as u64,
                shape,
                Some(&l.strides),
                T::DTYPE,
            )
            .unwrap_or_else(|e| panic!("view {l:?}: {e}"))
        })
        .collect();
    (buffer, views)
}

fn bits<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Forward and backward with every input a view (q, k, v packed in one projection buffer,
/// from an unaligned element; out and d_out BHSD in a second buffer), on `x` with the tuning
/// it has, against the reference and against the row-major call's bits.
fn check_views<T: Element>(x: &Context, c: &AttentionConfig, backward: bool, msg: &str) {
    assert_eq!(c.seq_q, c.seq_kv, "a packed projection: one sequence");
    let data = inputs(c, 1.0);
    let (qr, kr, vr, dor) = (
        to_f32_vec(&from_f32_slice::<T>(&data.q)),
        to_f32_vec(&from_f32_slice::<T>(&data.k)),
        to_f32_vec(&from_f32_slice::<T>(&data.v)),
        to_f32_vec(&from_f32_slice::<T>(&data.d_out)),
    );
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let width = (c.heads_q + 2 * c.heads_kv) * c.head_dim;
    let first = 3; // an element past the buffer's start: bound from below, at a shift
    let len = first + c.batch * c.seq_q * width;
    let (_qkv, v3) = place::<T>(
        x,
        &[
            (&qr, qs, Layout::packed(first, qs, width, 0)),
            (&kr, kvs, Layout::packed(first, kvs, width, c.heads_q)),
            (
                &vr,
                kvs,
                Layout::packed(first, kvs, width, c.heads_q + c.heads_kv),
            ),
        ],
        len,
    );
    let (q, k, v) = (&v3[0], &v3[1], &v3[2]);
    let ctxm = format!("{msg} {}", common::describe(c, data.seed));
    // the views download as the row-major tensors they describe
    assert_eq!(
        bits(&x.download::<T>(k).unwrap()),
        bits(&from_f32_slice::<T>(&kr)),
        "{ctxm}"
    );
    let f = x
        .forward(c, q, k, v)
        .unwrap_or_else(|e| panic!("{e} ({ctxm})"));
    let out: Vec<T> = x.download(&f.out).unwrap();
    let lse: Vec<f32> = x.download(&f.lse).unwrap();
    let want = reference::forward(c, &qr, &kr, &vr);
    assert_close_tol(
        "out",
        &to_f32_vec(&out),
        &want.out,
        rel_tol(T::DTYPE),
        &ctxm,
    );
    assert_lse_close(&lse, &want.lse, &ctxm);
    let (qd, kd, vd) = (
        x.upload(&from_f32_slice::<T>(&qr), &qs).unwrap(),
        x.upload(&from_f32_slice::<T>(&kr), &kvs).unwrap(),
        x.upload(&from_f32_slice::<T>(&vr), &kvs).unwrap(),
    );
    let plain = x.forward(c, &qd, &kd, &vd).unwrap();
    assert_eq!(
        bits(&out),
        bits(&x.download::<T>(&plain.out).unwrap()),
        "bits ({ctxm})"
    );
    if !backward {
        return;
    }
    // out and d_out as BHSD views of one buffer
    let n = c.batch * c.seq_q * c.heads_q * c.head_dim;
    let out_f = to_f32_vec(&out);
    let (_od, v2) = place::<T>(
        x,
        &[
            (&out_f, qs, Layout::bhsd(0, qs)),
            (&dor, qs, Layout::bhsd(n + 5, qs)),
        ],
        2 * n + 5,
    );
    let g = x
        .backward(c, q, k, v, &v2[0], &f.lse, &v2[1])
        .unwrap_or_else(|e| panic!("{e} ({ctxm})"));
    let want = reference::backward(c, &qr, &kr, &vr, &dor);
    let tol = rel_tol(T::DTYPE);
    for (name, t, w) in [
        ("dq", &g.dq, &want.dq),
        ("dk", &g.dk, &want.dk),
        ("dv", &g.dv, &want.dv),
    ] {
        let got = to_f32_vec(&x.download::<T>(t).unwrap());
        assert_close_tol(name, &got, w, tol, &ctxm);
    }
    let dout_d = x.upload(&from_f32_slice::<T>(&dor), &qs).unwrap();
    let plain_g = x
        .backward(c, &qd, &kd, &vd, &plain.out, &plain.lse, &dout_d)
        .unwrap();
    for (name, a, b) in [
        ("dq", &g.dq, &plain_g.dq),
        ("dk", &g.dk, &plain_g.dk),
        ("dv", &g.dv, &plain_g.dv),
    ] {
        assert_eq!(
            bits(&x.download::<T>(a).unwrap()),
            bits(&x.download::<T>(b).unwrap()),
            "{name} bits ({ctxm})"
        );
    }
}

#[test]
#[ignore = "full tier: scripts/test-full.sh (docs/TESTING.md)"]
fn packed_qkv_and_bhsd_views_run_forward_and_backward_in_every_variant() {
    // a context of its own: the test sets its tuning
    let x = Context::new().expect("context");
    let default = x.tuning();
    let mut c = cfg(2, 29, 29, 4, 2, 12, true);
    for variant in Variant::ALL {
        x.set_tuning(Tuning {
            variant,
            rows_subgroup: 0,
            ..default
        })
        .unwrap();
        check_views::<f32>(&x, &c, true, &format!("{variant:?}"));
    }
    x.set_tuning(default).unwrap();
    check_views::<f32>(&x, &c, true, "default tuning");
    c.algorithm = Algorithm::Naive;
    check_views::<f32>(&x, &c, true, "naive");
}

#[test]
fn half_views_at_odd_element_shifts() {
    let x = ctx();
    let c = cfg(1, 21, 21, 2, 1, 6, false);
    check_views::<half::f16>(x, &c, true, "f16");
    check_views::<half::bf16>(x, &c, false, "bf16");
}

#[test]
fn decode_reads_the_packed_projection_of_its_step() {
    // one query row per batch against a k/v of its own (BHSD), q packed with other heads
    let x = ctx();
    let c = cfg(2, 1, 300, 8, 2, 16, false);
    let data = inputs(&c, 1.0);
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let nkv = data.k.len();
    let width = 12 * 16;
    let (_b, t) = place::<f32>(
        x,
        &[
            (&data.q, qs, Layout::packed(0, qs, width, 2)),
            (&data.k, kvs, Layout::bhsd(2 * width, kvs)),
            (&data.v, kvs, Layout::bhsd(2 * width + nkv + 7, kvs)),
        ],
        2 * width + 2 * nkv + 7,
    );
    let msg = common::describe(&c, data.seed);
    let want = reference::forward(&c, &data.q, &data.k, &data.v);
    for splits in [None, Some(1), Some(7)] {
        let mut cs = c.clone();
        cs.kv_splits = splits;
        let f = x.forward(&cs, &t[0], &t[1], &t[2]).unwrap();
        assert_close("out", &x.download::<f32>(&f.out).unwrap(), &want.out, &msg);
        assert_lse_close(&x.download::<f32>(&f.lse).unwrap(), &want.lse, &msg);
    }
}

#[test]
fn calls_that_take_row_major_tensors_refuse_views() {
    let x = ctx();
    let c = cfg(1, 8, 8, 2, 1, 4, false);
    let data = inputs(&c, 1.0);
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let (buffer, t) = place::<f32>(
        x,
        &[
            (&data.q, qs, Layout::bhsd(0, qs)),
            (&data.k, kvs, Layout::bhsd(64, kvs)),
            (&data.v, kvs, Layout::bhsd(96, kvs)),
        ],
        128,
    );
    let unsupported = |r: Result<_, Error>, what: &str| match r {
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: a view was taken"),
    };
    // casts, merges and KV-cache appends take row-major tensors
    unsupported(x.cast(&t[0], DType::F16).map(|_| ()), "cast");
    let f = x.forward(&c, &t[0], &t[1], &t[2]).unwrap();
    let out_view = x
        .tensor_from_buffer(
            &buffer,
            0,
            &qs,
            Some(&Layout::bhsd(0, qs).strides),
            DType::F32,
        )
        .unwrap();
    let shard = flash_attn_wgpu::Forward {
        out: out_view,
        lse: f.lse,
    };
    unsupported(x.merge(&[shard]).map(|_| ()), "merge");
    // an append from a half view whose rows start mid-word
    let half_buf = x.upload(&[half::f16::ONE; 64], &[64]).unwrap();
    let kn = x
        .tensor_from_buffer(half_buf.buffer(), 2, &[1, 1, 1, 4], None, DType::F16)
        .unwrap();
    let mut kc = x.zeros_of(&[1, 16, 1, 4], DType::F16).unwrap();
    let mut vc = x.zeros_of(&[1, 16, 1, 4], DType::F16).unwrap();
    let mut one = c.clone();
    one.seq_q = 1;
    one.seq_kv = 16;
    one.heads_q = 1;
    let q1 = x.zeros_of(&[1, 1, 1, 4], DType::F16).unwrap();
    unsupported(
        x.forward_with_kvcache(&one, &q1, &mut kc, &mut vc, &[3], Some((&kn, &kn)))
            .map(|_| ()),
        "append from a view off 4-byte words",
    );
    // bad views
    let shape = [1, 8, 2, 4];
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 2, &shape, None, DType::F32),
        Err(Error::Buffer { expected, .. }) if expected.contains("element size")
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 0, &shape, Some(&[64, 8, 4, 2]), DType::F32),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 0, &shape, Some(&[64, 32, 4, 1]), DType::F32),
        Err(Error::Buffer { got, .. }) if got.contains("past the buffer")
    ));
    assert!(matches!(
        x.tensor_from_buffer(&buffer, 0, &shape, Some(&[64, 16, 4]), DType::F32),
        Err(Error::InvalidConfig(m)) if m.contains("3 strides")
    ));
}

#[test]
fn kv_cache_appends_from_views_of_the_projection() {
    // q and k_new packed in one projection (rows contiguous), v_new BHSD (heads apart): two
    // new rows per batch appended at each batch's length, then attended over
    let x = ctx();
    let (lens, new) = ([3usize, 9], 2usize);
    let c = cfg(2, new, 16, 4, 2, 8, true);
    let seed = common::fresh_seed();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let row = c.heads_kv * c.head_dim;
    let kc = common::random(&mut rng, c.batch * c.seq_kv * row, 1.5);
    let vc = common::random(&mut rng, c.batch * c.seq_kv * row, 1.0);
    let qn = common::random(&mut rng, c.batch * new * c.heads_q * c.head_dim, 1.5);
    let kn = common::random(&mut rng, c.batch * new * row, 1.5);
    let vn = common::random(&mut rng, c.batch * new * row, 1.0);
    let (qs, ns) = (
        [c.batch, new, c.heads_q, c.head_dim],
        [c.batch, new, c.heads_kv, c.head_dim],
    );
    let width = (c.heads_q + c.heads_kv) * c.head_dim;
    let proj = c.batch * new * width;
    let (_b, t) = place::<f32>(
        x,
        &[
            (&qn, qs, Layout::packed(0, qs, width, 0)),
            (&kn, ns, Layout::packed(0, ns, width, c.heads_q)),
            (&vn, ns, Layout::bhsd(proj + 4, ns)),
        ],
        proj + 4 + vn.len(),
    );
    let mut kd = x.upload(&kc, &c.kv_shape()).unwrap();
    let mut vd = x.upload(&vc, &c.kv_shape()).unwrap();
    let f = x
        .forward_with_kvcache(&c, &t[0], &mut kd, &mut vd, &lens, Some((&t[1], &t[2])))
        .unwrap();
    let out: Vec<f32> = x.download(&f.out).unwrap();
    let lse: Vec<f32> = x.download(&f.lse).unwrap();
    // the caches hold the new rows at each length, and nothing else changed
    let (mut kw, mut vw) = (kc.clone(), vc.clone());
    for (b, &n) in lens.iter().enumerate() {
        let at = (b * c.seq_kv + n) * row;
        kw[at..at + new * row].copy_from_slice(&kn[b * new * row..(b + 1) * new * row]);
        vw[at..at + new * row].copy_from_slice(&vn[b * new * row..(b + 1) * new * row]);
    }
    let msg = format!("seed {seed}");
    assert_eq!(x.download::<f32>(&kd).unwrap(), kw, "k_cache ({msg})");
    assert_eq!(x.download::<f32>(&vd).unwrap(), vw, "v_cache ({msg})");
    // each batch over exactly its keys, as the reference computes it
    for (b, &n) in lens.iter().enumerate() {
        let mut one = c.clone();
        one.batch = 1;
        one.seq_kv = n + new;
        let q_len = new * c.heads_q * c.head_dim;
        let keys = b * c.seq_kv * row..(b * c.seq_kv + n + new) * row;
        let want = reference::forward(
            &one,
            &qn[b * q_len..(b + 1) * q_len],
            &kw[keys.clone()],
            &vw[keys],
        );
        let m = format!("batch {b} ({msg})");
        assert_close("out", &out[b * q_len..(b + 1) * q_len], &want.out, &m);
        let l = c.heads_q * new;
        assert_lse_close(&lse[b * l..(b + 1) * l], &want.lse, &m);
    }
}

#[test]
fn views_where_a_call_binds_row_major_windows_or_pages_are_typed_errors() {
    // a call past one binding (a device that binds 64 KiB at once) runs in windows of
    // row-major tensors: a view there is Unsupported, the row-major call runs
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: 64 << 10,
        ..wgpu::Limits::default()
    };
    let (device, queue) = common::device_with(limits, wgpu::Features::empty());
    let x = Context::from_wgpu(device, queue).expect("context");
    let c = cfg(4, 128, 128, 4, 2, 16, true);
    let data = inputs(&c, 1.0);
    let (qs, kvs) = (c.q_shape(), c.kv_shape());
    let nq = data.q.len();
    let (_b, t) = place::<f32>(
        &x,
        &[
            (&data.q, qs, Layout::bhsd(0, qs)),
            (&data.k, kvs, Layout::bhsd(nq, kvs)),
            (&data.v, kvs, Layout::bhsd(nq + data.k.len(), kvs)),
        ],
        nq + 2 * data.k.len(),
    );
    let (qd, kd, vd) = (
        x.upload(&data.q, &qs).unwrap(),
        x.upload(&data.k, &kvs).unwrap(),
        x.upload(&data.v, &kvs).unwrap(),
    );
    x.forward(&c, &qd, &kd, &vd)
        .expect("the row-major call runs in windows");
    match x.forward(&c, &t[0], &kd, &vd) {
        Err(Error::Unsupported { reason, .. }) => assert!(reason.contains("windows"), "{reason}"),
        other => panic!("a view in a windowed call: {other:?}"),
    }
    // paged pools are row-major pages
    let x = ctx();
    let p = common::kv::paged_cfg(&cfg(1, 1, 16, 2, 1, 8, false), 4, 7);
    let pool = p.kv_shape();
    let n: usize = pool.iter().product();
    let host: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
    let (_b, pools) = place::<f32>(
        x,
        &[
            (&host, pool, Layout::bhsd(4, pool)),
            (&host, pool, Layout::bhsd(4, pool)),
        ],
        n + 4,
    );
    let q = x.upload(&[0.5f32; 16], &p.q_shape()).unwrap();
    match x.forward(&p, &q, &pools[0], &pools[1]) {
        Err(Error::Unsupported { reason, .. }) => assert!(reason.contains("paged"), "{reason}"),
        other => panic!("a view of a page pool: {other:?}"),
    }
}
