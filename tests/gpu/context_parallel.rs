//! Context parallelism (src/distributed/) between threads of this process (`LocalRing`: the
//! same algorithms MPI's ranks run, tests/mpi.rs runs them under mpiexec): the ring and the
//! all-gather forms at 2 and 4 ranks, causal (zigzag) and not, GQA, odd lengths, the
//! position-aware modifiers and every dtype, forward and backward, against the f64 reference
//! of the whole call; the same bits twice; decode over sharded keys, empty shards included;
//! ranks that disagree (named in the caller's words), one that refuses its inputs (its reason
//! carried to the others), and one that leaves, are typed errors on every rank in bounded time.

use std::time::Duration;

use crate::common;
use common::{assert_close_tol, cfg, inputs, score_mods};
use flash_attn_wgpu::distributed::{Comm, ContextParallel, LocalRing, Schedule};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{AttentionConfig, Element, Error, HostForward, HostGradients, Window};

/// Rows of each batch of a `[batch, n, width]` tensor in `ranges`, concatenated.
fn rows_of(x: &[f32], dims: (usize, usize, usize), ranges: &[std::ops::Range<usize>]) -> Vec<f32> {
    flash_attn_wgpu::distributed::take_rows(x, dims, ranges).expect("shapes made here")
}

/// The inverse of `rows_of`: `local` written back at its rows.
fn put_rows(
    x: &mut [f32],
    (batch, n, width): (usize, usize, usize),
    ranges: &[std::ops::Range<usize>],
    local: &[f32],
) {
    let mut at = 0;
    for b in 0..batch {
        for r in ranges {
            let len = r.len() * width;
            x[(b * n + r.start) * width..(b * n + r.end) * width]
                .copy_from_slice(&local[at..at + len]);
            at += len;
        }
    }
}

/// The call over `ranks` threads, each its rows: (out, lse, dq, dk, dv, d_sinks) assembled
/// whole, in f32.
#[allow(clippy::type_complexity)]
fn run<T: Element>(
    c: &AttentionConfig,
    ranks: usize,
    schedule: Schedule,
    data: &common::Inputs,
) -> (
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    Vec<f32>,
    Option<Vec<f32>>,
) {
    let ctx = common::ctx();
    let (b, n, hq, hkv, d) = (c.batch, c.seq_q, c.heads_q, c.heads_kv, c.head_dim);
    let t = |x: &[f32]| flash_attn_wgpu::from_f32_slice::<T>(x);
    let results: Vec<(
        Vec<std::ops::Range<usize>>,
        HostForward<T>,
        HostGradients<T>,
    )> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalRing::new(ranks)
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let cp = ContextParallel::new(ctx, &comm).with_schedule(schedule);
                    let mine = cp.local_rows(c);
                    let q = t(&rows_of(&data.q, (b, n, hq * d), &mine));
                    let k = t(&rows_of(&data.k, (b, n, hkv * d), &mine));
                    let v = t(&rows_of(&data.v, (b, n, hkv * d), &mine));
                    let dout = t(&rows_of(&data.d_out, (b, n, hq * d), &mine));
                    let f = cp.forward(c, &q, &k, &v).unwrap();
                    let g = cp.backward(c, &q, &k, &v, &f.out, &f.lse, &dout).unwrap();
                    (mine, f, g)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let f32s = |x: &[T]| flash_attn_wgpu::to_f32_vec(x);
    let mut out = vec![0f32; data.q.len()];
    let mut lse = vec![0f32; b * hq * n];
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; data.q.len()],
        vec![0f32; data.k.len()],
        vec![0f32; data.v.len()],
    );
    let mut d_sinks = None;
    for (mine, f, g) in &results {
        put_rows(&mut out, (b, n, hq * d), mine, &f32s(&f.out));
        // lse [batch, heads, rows]: each (batch, head) a row of n
        put_rows(&mut lse, (b * hq, n, 1), mine, &f.lse);
        put_rows(&mut dq, (b, n, hq * d), mine, &f32s(&g.dq));
        put_rows(&mut dk, (b, n, hkv * d), mine, &f32s(&g.dk));
        put_rows(&mut dv, (b, n, hkv * d), mine, &f32s(&g.dv));
        // every rank holds the same summed d_sinks
        if let Some(s) = &g.d_sinks {
            assert!(d_sinks.as_ref().is_none_or(|x: &Vec<f32>| x == s));
            d_sinks = Some(s.clone());
        }
    }
    (out, lse, dq, dk, dv, d_sinks)
}

/// The call over `ranks` in both schedules against the reference, at `tol` (the dtype's
/// rounding of the inputs and outputs).
fn check<T: Element>(c: &AttentionConfig, ranks: usize, tol: f64) {
    let data = inputs(c, 1.0);
    // the reference of what the ranks compute on: the inputs rounded to T
    let round = |x: &[f32]| flash_attn_wgpu::to_f32_vec(&flash_attn_wgpu::from_f32_slice::<T>(x));
    let data = common::Inputs {
        q: round(&data.q),
        k: round(&data.k),
        v: round(&data.v),
        d_out: round(&data.d_out),
        ..data
    };
    let msg = format!(
        "{} over {ranks} ranks, {}",
        common::describe(c, data.seed),
        T::DTYPE
    );
    let want_f = reference::forward(c, &data.q, &data.k, &data.v);
    let want_g = reference::backward(c, &data.q, &data.k, &data.v, &data.d_out);
    for schedule in [Schedule::Ring, Schedule::AllGather] {
        let msg = format!("{msg}, {schedule:?}");
        let (out, lse, dq, dk, dv, d_sinks) = run::<T>(c, ranks, schedule, &data);
        assert_close_tol("out", &out, &want_f.out, tol, &msg);
        common::assert_lse_close(&lse, &want_f.lse, &msg);
        assert_close_tol("dq", &dq, &want_g.dq, tol, &msg);
        assert_close_tol("dk", &dk, &want_g.dk, tol, &msg);
        assert_close_tol("dv", &dv, &want_g.dv, tol, &msg);
        if let (Some(got), Some(want)) = (&d_sinks, &want_g.d_sinks) {
            assert_close_tol("d_sinks", got, want, tol, &msg);
        }
        assert_eq!(d_sinks.is_some(), c.sinks.is_some(), "{msg}");
        // the same bits again: every sum in a fixed order, whatever the threads' timing
        let again = run::<T>(c, ranks, schedule, &data);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&again.0), bits(&out), "out differs run to run ({msg})");
        assert_eq!(bits(&again.3), bits(&dk), "dk differs run to run ({msg})");
    }
}

#[test]
fn a_causal_call_over_2_and_4_ranks_is_the_whole_call() {
    // zigzag chunks of an odd length (97 over 8 chunks: the first take 13), GQA, sinks (one
    // block of each row counts them)
    let mut c = cfg(1, 97, 97, 4, 2, 32, true);
    c.sinks = Some(common::random_sinks(&c));
    check::<f32>(&c, 2, 2e-5);
    check::<f32>(&c, 4, 2e-5);
}

#[test]
fn a_non_causal_call_and_the_half_dtypes_over_the_ranks_are_the_whole_call() {
    // contiguous chunks, batch 2, MQA; f16 and bf16 inputs (the ranks compute in f32 and
    // round each output once)
    let c = cfg(2, 61, 61, 2, 1, 32, false);
    check::<f32>(&c, 3, 2e-5);
    check::<half::f16>(&c, 2, 4e-3);
    check::<half::bf16>(&c, 2, 3e-2);
}

#[test]
fn the_position_aware_modifiers_see_the_whole_sequence() {
    // a window, ALiBi and a user score modifier that reads the indices, over zigzag chunks
    let mut c = cfg(1, 80, 80, 4, 2, 32, true);
    c.window = Window::new(Some(23), None);
    c.alibi_slopes = Some(common::random_alibi(&c, false));
    c.score_mod = Some(score_mods::rational());
    check::<f32>(&c, 4, 2e-5);
}

/// `decode_sharded` of `c` over the shards `cuts[r]..cuts[r + 1]`, one a rank: every rank's
/// result, against the reference of the whole call, and the same bits on every rank.
fn decode_over(c: &AttentionConfig, cuts: &[usize]) {
    let data = inputs(c, 1.0);
    let want = reference::forward(c, &data.q, &data.k, &data.v);
    let ctx = common::ctx();
    let (b, n, hkv, d) = (c.batch, c.seq_kv, c.heads_kv, c.head_dim);
    let msg = format!("decode_sharded over {cuts:?}");
    let got: Vec<HostForward<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = LocalRing::new(cuts.len() - 1)
            .into_iter()
            .map(|comm| {
                let data = &data;
                s.spawn(move || {
                    let r = comm.rank();
                    let shard = cuts[r]..cuts[r + 1];
                    let k = rows_of(&data.k, (b, n, hkv * d), std::slice::from_ref(&shard));
                    let v = rows_of(&data.v, (b, n, hkv * d), std::slice::from_ref(&shard));
                    ContextParallel::new(ctx, &comm)
                        .decode_sharded(c, shard, &data.q, &k, &v)
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for f in &got {
        assert_close_tol("out", &f.out, &want.out, 2e-5, &msg);
        common::assert_lse_close(&f.lse, &want.lse, &msg);
        assert_eq!(f.out, got[0].out, "every rank the same bits ({msg})");
    }
}

#[test]
fn decode_over_keys_sharded_across_ranks_is_one_call_over_all_keys() {
    // one query row a batch over 300 keys cut into uneven shards; every rank gets the result
    let mut c = cfg(2, 1, 300, 8, 2, 32, true);
    c.sinks = Some(common::random_sinks(&c));
    decode_over(&c, &[0, 70, 180, 300]);
}

#[test]
fn a_rank_of_a_sharded_cache_that_holds_no_key_adds_nothing() {
    // rank 1 holds no key yet; then rank 0, which counts the sinks
    let mut c = cfg(2, 1, 83, 8, 2, 32, true);
    c.sinks = Some(common::random_sinks(&c));
    decode_over(&c, &[0, 40, 40, 83]);
    decode_over(&c, &[0, 0, 83]);
}

#[test]
fn a_sharded_cache_with_no_key_at_all_gives_what_a_call_with_no_visible_key_gives() {
    // out 0, and lse -inf, or the sink where there is one
    let mut c = cfg(2, 1, 0, 8, 2, 32, false);
    decode_over(&c, &[0, 0, 0]);
    c.sinks = Some(common::random_sinks(&c));
    decode_over(&c, &[0, 0, 0]);
}

#[test]
fn shards_that_do_not_tile_the_keys_fail_on_every_rank_naming_the_rank() {
    let c = cfg(1, 1, 50, 2, 1, 16, false);
    let errors = errors_of(2, |cp, r| {
        let shard = [0..20, 30..50][r].clone();
        let kv = vec![0.5f32; shard.len() * 16];
        cp.decode_sharded(&c, shard, &[0.25f32; 32], &kv, &kv)
            .unwrap_err()
    });
    for e in &errors {
        assert!(
            matches!(e, Error::Distributed { message, .. } if message.contains(
                "rank 1's is 30..50, where rank 0's ends at 20"
            )),
            "{e:?}"
        );
    }
}

/// Every rank's error, rank r making its call through `call` (which returns its error).
fn errors_of(
    ranks: usize,
    call: impl Fn(ContextParallel<'_>, usize) -> Error + Sync,
) -> Vec<Error> {
    let ctx = common::ctx();
    std::thread::scope(|s| {
        let hs: Vec<_> = LocalRing::new(ranks)
            .into_iter()
            .map(|comm| {
                let call = &call;
                s.spawn(move || call(ContextParallel::new(ctx, &comm), comm.rank()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every rank's error is `Error::Distributed` from that rank, with `message`.
fn every_rank_says(errors: &[Error], message: &str) {
    for (r, e) in errors.iter().enumerate() {
        match e {
            Error::Distributed { rank, message: m } => {
                assert_eq!(*rank, r);
                assert_eq!(m, message);
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn disagreements_name_the_field_and_both_values_in_the_callers_words() {
    // the ranks fail in the agreement, before any work: no kernel runs here
    let c = cfg(1, 40, 40, 2, 1, 16, true);
    let (q, k) = (vec![0.25f32; 20 * 32], vec![0.5f32; 20 * 16]);
    let differ = |field: &str, rank_1: &str, rank_0: &str| {
        format!(
            "the ranks disagree on the call: rank 1 calls with {field} = {rank_1}, rank 0 with \
             {field} = {rank_0}"
        )
    };
    // causal, which also sets the layout: the field the caller set is the one named
    let e = errors_of(2, |cp, r| {
        let mine = AttentionConfig {
            causal: r == 0,
            ..c.clone()
        };
        cp.forward(&mine, &q, &k, &k).unwrap_err()
    });
    every_rank_says(&e, &differ("causal", "false", "true"));
    let e = errors_of(2, |cp, r| {
        let mut mine = c.clone();
        mine.window = Window::new((r == 1).then_some(8), Some(0));
        cp.forward(&mine, &q, &k, &k).unwrap_err()
    });
    every_rank_says(&e, &differ("window", "(8, 0)", "(None, 0)"));
    let e = errors_of(2, |cp, r| match r {
        1 => {
            let half = |x: &[f32]| flash_attn_wgpu::from_f32_slice::<half::f16>(x);
            cp.forward(&c, &half(&q), &half(&k), &half(&k)).unwrap_err()
        }
        _ => cp.forward(&c, &q, &k, &k).unwrap_err(),
    });
    every_rank_says(&e, &differ("dtype", "f16", "f32"));
    let e = errors_of(2, |cp, r| {
        let cp = cp.with_schedule([Schedule::Ring, Schedule::AllGather][r]);
        cp.forward(&c, &q, &k, &k).unwrap_err()
    });
    every_rank_says(&e, &differ("schedule", "AllGather", "Ring"));
    // a modifier on one rank only: named, with its WGSL
    let e = errors_of(2, |cp, r| {
        let mut mine = c.clone();
        mine.score_mod = (r == 1).then(score_mods::rational);
        cp.forward(&mine, &q, &k, &k).unwrap_err()
    });
    let m = e[0].to_string();
    assert!(
        m.contains("rank 1 calls with score_mod = \"")
            && m.contains("rank 0 with score_mod = None"),
        "{m}"
    );
}

#[test]
fn ranks_that_disagree_or_leave_fail_on_every_rank_with_who_and_what() {
    let ctx = common::ctx();
    let c = cfg(1, 40, 40, 2, 1, 16, false);
    let data = inputs(&c, 1.0);
    // rank 1 calls with another head count: every rank names rank 1 and the field
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = LocalRing::new(2)
            .into_iter()
            .map(|comm| {
                let (c, data) = (&c, &data);
                s.spawn(move || {
                    let mut mine = c.clone();
                    if comm.rank() == 1 {
                        mine.heads_q = 4;
                    }
                    let cp = ContextParallel::new(ctx, &comm);
                    let rows = cp.local_rows(&mine);
                    let q = rows_of(&data.q, (1, 40, 2 * 16), &rows);
                    let q = if comm.rank() == 1 {
                        [q.clone(), q].concat()
                    } else {
                        q
                    };
                    let k = rows_of(&data.k, (1, 40, 16), &rows);
                    cp.forward(&mine, &q, &k, &k).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, e) in errors.iter().enumerate() {
        match e {
            Error::Distributed { rank, message } => {
                assert_eq!(*rank, r);
                assert!(
                    message.contains("rank 1 calls with heads_q = 4, rank 0 with heads_q = 2"),
                    "{message}"
                );
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    // rank 1 refuses its own inputs (a q of the wrong length): it says why, rank 0 names it
    let errors: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = LocalRing::new(2)
            .into_iter()
            .map(|comm| {
                let (c, data) = (&c, &data);
                s.spawn(move || {
                    let cp = ContextParallel::new(ctx, &comm);
                    let rows = cp.local_rows(c);
                    let mut q = rows_of(&data.q, (1, 40, 32), &rows);
                    if comm.rank() == 1 {
                        q.pop();
                    }
                    let k = rows_of(&data.k, (1, 40, 16), &rows);
                    cp.forward(c, &q, &k, &k).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // the others learn why: the input, its length and the one expected
    assert!(
        matches!(&errors[0], Error::Distributed { message, .. } if message.contains(
            "rank 1 refused its inputs: invalid attention config: q of rank 1 holds 639 \
             elements (not a whole number of rows of 32) where its rows of the call, [20..40] \
             (20 of 40 over 2 ranks, Contiguous layout), take 640"
        )),
        "{:?}",
        errors[0]
    );
    assert!(
        matches!(&errors[1], Error::InvalidConfig(m) if m.contains("q of rank 1 holds 639 elements")),
        "{:?}",
        errors[1]
    );
    // rank 1 leaves before the call: rank 0 fails within its deadline, naming it
    let mut ranks: Vec<LocalRing> = LocalRing::new(2)
        .into_iter()
        .map(|r| r.with_timeout(Duration::from_millis(700)))
        .collect();
    let gone = ranks.pop();
    let cp = ContextParallel::new(ctx, &ranks[0]);
    let rows = cp.local_rows(&c);
    let q = rows_of(&data.q, (1, 40, 32), &rows);
    let k = rows_of(&data.k, (1, 40, 16), &rows);
    let started = std::time::Instant::now();
    let e = cp.forward(&c, &q, &k, &k).unwrap_err();
    drop(gone);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(&e, Error::Distributed { message, .. } if message.contains("from rank 1")),
        "{e:?}"
    );
}
