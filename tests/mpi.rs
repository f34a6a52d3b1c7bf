//! Context parallelism over MPI (feature `mpi`): every rank a process with its own `Context`,
//! run under `mpiexec -n 2` and `-n 4` by scripts/mpi-check.sh (oversubscribed on a 2-core
//! machine, each rank on lavapipe). The checks are collective: every rank runs each in turn
//! and the ranks agree on each result (an all-gather of pass or fail), so that one rank's
//! failure cannot leave the others waiting. Against the f64 reference of the whole call, each
//! rank checking its own rows: the ring and the all-gather forms, causal (zigzag) and not,
//! GQA, an odd length, f32 and f16, a window, ALiBi and a user score modifier, decode over
//! sharded keys (one shard empty, and all), the same bits twice, ranks that disagree (named in
//! the caller's words), and a rank that refuses its inputs (its reason on every rank). `--leave` runs one check in
//! which the last rank leaves before the call: the others must fail with a typed error within
//! their deadline. Prints `N passed, M failed` on rank 0; exits non-zero on a failure.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use flash_attn_wgpu::distributed::{Comm, ContextParallel, MpiComm, Schedule};
use flash_attn_wgpu::unstable::reference;
use flash_attn_wgpu::{AttentionConfig, Context, Element, Error, ScoreMod, Window};
use mpi::collective::{CommunicatorCollectives, Root};
use mpi::topology::Communicator;
use rand::{Rng, SeedableRng};

/// Inputs of `c`, the same on every rank (one seed, from rank 0's clock, broadcast).
struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_out: Vec<f32>,
}

fn data(c: &AttentionConfig, seed: u64) -> Data {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut r = |n: usize| {
        (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    Data {
        q: r(c.q_shape().iter().product()),
        k: r(c.kv_shape().iter().product()),
        v: r(c.v_shape().iter().product()),
        d_out: r(c.out_shape().iter().product()),
    }
}

/// Rows of each batch of a `[batch, n, width]` tensor in `ranges`, concatenated.
fn rows_of(x: &[f32], dims: (usize, usize, usize), ranges: &[std::ops::Range<usize>]) -> Vec<f32> {
    flash_attn_wgpu::distributed::take_rows(x, dims, ranges).expect("shapes made here")
}

fn close(what: &str, got: &[f32], want: &[f64], tol: f64) -> Result<(), String> {
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (*g as f64 - w).abs() > tol * scale && !(w.is_infinite() && (*g as f64) == *w) {
            return Err(format!(
                "{what}[{i}]: got {g}, want {w} (tol {tol} x {scale:.3})"
            ));
        }
    }
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()));
    }
    Ok(())
}

/// The whole call over the ranks in `schedule`, each rank checking its rows against the
/// reference, twice (the same bits).
fn check_call<T: Element>(
    ctx: &Context,
    comm: &dyn Comm,
    c: &AttentionConfig,
    schedule: Schedule,
    seed: u64,
    tol: f64,
) -> Result<(), String> {
    let d = data(c, seed);
    let round = |x: &[f32]| flash_attn_wgpu::to_f32_vec(&flash_attn_wgpu::from_f32_slice::<T>(x));
    let d = Data {
        q: round(&d.q),
        k: round(&d.k),
        v: round(&d.v),
        d_out: round(&d.d_out),
    };
    let cp = ContextParallel::new(ctx, comm).with_schedule(schedule);
    let mine = cp.local_rows(c);
    let (b, n, hq, hkv, hd) = (c.batch, c.seq_q, c.heads_q, c.heads_kv, c.head_dim);
    let t = |x: Vec<f32>| flash_attn_wgpu::from_f32_slice::<T>(&x);
    let q = t(rows_of(&d.q, (b, n, hq * hd), &mine));
    let k = t(rows_of(&d.k, (b, n, hkv * hd), &mine));
    let v = t(rows_of(&d.v, (b, n, hkv * hd), &mine));
    let dout = t(rows_of(&d.d_out, (b, n, hq * hd), &mine));
    // out, lse, dq, dk, dv
    type Five = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);
    let run = || -> Result<Five, String> {
        let f = cp.forward(c, &q, &k, &v).map_err(|e| e.to_string())?;
        let g = cp
            .backward(c, &q, &k, &v, &f.out, &f.lse, &dout)
            .map_err(|e| e.to_string())?;
        let f32s = flash_attn_wgpu::to_f32_vec::<T>;
        Ok((f32s(&f.out), f.lse, f32s(&g.dq), f32s(&g.dk), f32s(&g.dv)))
    };
    let (out, lse, dq, dk, dv) = run()?;
    let want_f = reference::forward(c, &d.q, &d.k, &d.v);
    let want_g = reference::backward(c, &d.q, &d.k, &d.v, &d.d_out);
    let f64s = |x: Vec<f32>| x.into_iter().map(|v| v as f64).collect::<Vec<_>>();
    let mine_of = |x: &[f64], width| {
        f64s(rows_of(
            &x.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            (b, n, width),
            &mine,
        ))
    };
    close("out", &out, &mine_of(&want_f.out, hq * hd), tol)?;
    let lse_want = rows_of(
        &want_f.lse.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        (b * hq, n, 1),
        &mine,
    );
    close("lse", &lse, &f64s(lse_want), 1e-4)?;
    close("dq", &dq, &mine_of(&want_g.dq, hq * hd), tol)?;
    close("dk", &dk, &mine_of(&want_g.dk, hkv * hd), tol)?;
    close("dv", &dv, &mine_of(&want_g.dv, hkv * hd), tol)?;
    let again = run()?;
    if again.0 != out || again.3 != dk {
        return Err("the same call gave other bits the second time".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let Some(universe) = mpi::initialize() else {
        eprintln!("mpi_tests: MPI was initialized already");
        return ExitCode::from(2);
    };
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let comm = MpiComm::new(&world).with_timeout(Duration::from_secs(60));
    let ctx = match Context::new() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mpi_tests rank {rank}: no context: {e}");
            world.abort(2);
        }
    };
    let mut seed = [std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)];
    world.process_at_rank(0).broadcast_into(&mut seed[..]);
    let seed = seed[0];
    if std::env::args().any(|a| a == "--leave") {
        return leave(&ctx, &world, rank, size);
    }
    let mut causal = AttentionConfig::new(1, 97, 97, 4, 2, 32);
    causal.causal = true;
    let plain = AttentionConfig::new(2, 61, 61, 2, 1, 32);
    let mut modded = causal.clone();
    modded.seq_q = 80;
    modded.seq_kv = 80;
    modded.window = Window::new(Some(23), None);
    modded.alibi_slopes = Some(vec![0.5, 0.25, 0.125, 0.0625]);
    modded.score_mod = Some(
        ScoreMod::wgsl(
            "fn score_mod(s: f32, b: u32, h: u32, i: u32, j: u32) -> f32 {
    return s / (1.0 + abs(s) / 3.0) + 0.05 * f32((i + 2u * j) % 5u);
}",
        )
        .unwrap()
        .with_reference(
            |s, _, _, i, j| s / (1.0 + s.abs() / 3.0) + 0.05 * ((i + 2 * j) % 5) as f64,
            |s, _, _, _, _| 1.0 / (1.0 + s.abs() / 3.0).powi(2),
        ),
    );
    type Check<'a> = (&'a str, Box<dyn Fn() -> Result<(), String> + 'a>);
    let checks: Vec<Check> = vec![
        (
            "a causal call (zigzag), the ring",
            Box::new(|| check_call::<f32>(&ctx, &comm, &causal, Schedule::Ring, seed, 2e-5)),
        ),
        (
            "a causal call (zigzag), the all-gather",
            Box::new(|| check_call::<f32>(&ctx, &comm, &causal, Schedule::AllGather, seed, 2e-5)),
        ),
        (
            "a non-causal call in f16, the ring",
            Box::new(|| check_call::<half::f16>(&ctx, &comm, &plain, Schedule::Ring, seed, 4e-3)),
        ),
        (
            "a window, ALiBi and a score_mod, Auto",
            Box::new(|| check_call::<f32>(&ctx, &comm, &modded, Schedule::Auto, seed, 2e-5)),
        ),
        (
            "decode over sharded keys",
            Box::new(|| decode(&ctx, &comm, rank, size, seed)),
        ),
        (
            "decode over shards of which one is empty, and over no key at all",
            Box::new(|| decode_empty(&ctx, &comm, rank, size, seed)),
        ),
        (
            "ranks that disagree",
            Box::new(|| disagree(&ctx, &comm, rank, size)),
        ),
        (
            "a rank that refuses its inputs",
            Box::new(|| refuse(&ctx, &comm, rank, size)),
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in checks {
        let started = Instant::now();
        let mine = check();
        // every rank's verdict, so that all count the same
        let ok = [mine.is_ok() as u8];
        let mut all = vec![0u8; size];
        world.all_gather_into(&ok[..], &mut all[..]);
        if let Err(e) = &mine {
            eprintln!("mpi_tests rank {rank}/{size}: FAILED {name}: {e}");
        }
        if all.iter().all(|&x| x == 1) {
            passed += 1;
            if rank == 0 {
                eprintln!(
                    "mpi_tests ({size} ranks): ok {name} ({:.1} s)",
                    started.elapsed().as_secs_f64()
                );
            }
        } else {
            failed += 1;
        }
    }
    if rank == 0 {
        println!("mpi ({size} ranks): {passed} passed, {failed} failed");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One query row a batch over 300 keys in uneven shards, one a rank.
fn decode(
    ctx: &Context,
    comm: &dyn Comm,
    rank: usize,
    size: usize,
    seed: u64,
) -> Result<(), String> {
    let mut c = AttentionConfig::new(2, 1, 300, 8, 2, 32);
    c.causal = true;
    let d = data(&c, seed);
    let want = reference::forward(&c, &d.q, &d.k, &d.v);
    let cut = |r: usize| r * 300 / size + usize::from(r > 0) * 7;
    let shard = cut(rank)..if rank + 1 == size { 300 } else { cut(rank + 1) };
    let k = rows_of(&d.k, (2, 300, 64), std::slice::from_ref(&shard));
    let v = rows_of(&d.v, (2, 300, 64), std::slice::from_ref(&shard));
    let f = ContextParallel::new(ctx, comm)
        .decode_sharded(&c, shard, &d.q, &k, &v)
        .map_err(|e| e.to_string())?;
    close("decode out", &f.out, &want.out, 2e-5)
}

/// Rank 1 holds no key of 83 (the last rank's shard its place at 2 ranks), then every shard
/// is empty (a cache of no key yet): out 0 and lse the sink's, as the reference of a call with
/// no visible key. With sinks, on rank 0.
fn decode_empty(
    ctx: &Context,
    comm: &dyn Comm,
    rank: usize,
    size: usize,
    seed: u64,
) -> Result<(), String> {
    let a = if size == 2 { 83 } else { 40 };
    // rank 0: 0..a, rank 1: a..a, the others a..83 in equal parts
    let cut = |r: usize| match r {
        0 => 0,
        1 => a,
        _ => a + (r - 1) * (83 - a) / (size - 2).max(1),
    };
    let shard = cut(rank)..if rank + 1 == size { 83 } else { cut(rank + 1) };
    for (keys, shard) in [(83, shard), (0, 0..0)] {
        // the shapes of `decode` (its pipelines)
        let mut c = AttentionConfig::new(2, 1, keys, 8, 2, 32);
        c.causal = true;
        c.sinks = Some((0..8).map(|h| h as f32 * 0.5 - 2.0).collect());
        let d = data(&c, seed);
        let want = reference::forward(&c, &d.q, &d.k, &d.v);
        let k = rows_of(&d.k, (2, keys, 64), std::slice::from_ref(&shard));
        let v = rows_of(&d.v, (2, keys, 64), std::slice::from_ref(&shard));
        let f = ContextParallel::new(ctx, comm)
            .decode_sharded(&c, shard, &d.q, &k, &v)
            .map_err(|e| e.to_string())?;
        close(&format!("out of {keys} keys"), &f.out, &want.out, 2e-5)?;
        let lse: Vec<f64> = want.lse.iter().map(|&x| x as f32 as f64).collect();
        close(&format!("lse of {keys} keys"), &f.lse, &lse, 1e-5)?;
    }
    Ok(())
}

/// The last rank calls without the causal mask: every rank fails naming it, the field and
/// both values in the caller's words.
fn disagree(ctx: &Context, comm: &dyn Comm, rank: usize, size: usize) -> Result<(), String> {
    let mut c = AttentionConfig::new(1, 40, 40, 2, 1, 16);
    c.causal = rank + 1 != size;
    let cp = ContextParallel::new(ctx, comm);
    let n: usize = cp.local_rows(&c).iter().map(|r| r.len()).sum();
    let q = vec![0.25f32; n * 32];
    let k = vec![0.5f32; n * 16];
    let want = format!(
        "rank {}: the ranks disagree on the call: rank {} calls with causal = false, rank 0 with \
         causal = true",
        rank,
        size - 1
    );
    match cp.forward(&c, &q, &k, &k) {
        Err(e @ Error::Distributed { .. }) if e.to_string() == want => Ok(()),
        other => Err(format!("expected {want:?}, got {other:?}")),
    }
}

/// The last rank passes a q one row short: it gets its own error, the others its reason.
fn refuse(ctx: &Context, comm: &dyn Comm, rank: usize, size: usize) -> Result<(), String> {
    let c = AttentionConfig::new(1, 40, 40, 2, 1, 16);
    let cp = ContextParallel::new(ctx, comm);
    let n: usize = cp.local_rows(&c).iter().map(|r| r.len()).sum();
    let short = usize::from(rank + 1 == size);
    let q = vec![0.25f32; (n - short) * 32];
    let k = vec![0.5f32; n * 16];
    let why = format!(
        "q of rank {} holds {} elements ({} rows of 32) where its rows of the call",
        size - 1,
        (n - 1) * 32,
        n - 1
    );
    match (cp.forward(&c, &q, &k, &k), short) {
        (Err(Error::InvalidConfig(m)), 1) if m.starts_with(&why) => Ok(()),
        (Err(Error::Distributed { message, .. }), 0)
            if message.starts_with(&format!(
                "rank {} refused its inputs: invalid attention config: {why}",
                size - 1
            )) =>
        {
            Ok(())
        }
        (other, _) => Err(format!("expected the refusal ({why}), got {other:?}")),
    }
}

/// `--leave`: the last rank leaves before the call; the others must fail, naming a rank,
/// within their deadline.
fn leave(
    ctx: &Context,
    world: &mpi::topology::SimpleCommunicator,
    rank: usize,
    size: usize,
) -> ExitCode {
    if rank + 1 == size {
        println!("mpi --leave rank {rank}: leaving before the call");
        return ExitCode::SUCCESS;
    }
    let comm = MpiComm::new(world).with_timeout(Duration::from_secs(3));
    let c = AttentionConfig::new(1, 40, 40, 2, 1, 16);
    let cp = ContextParallel::new(ctx, &comm);
    let n: usize = cp.local_rows(&c).iter().map(|r| r.len()).sum();
    let q = vec![0.25f32; n * 32];
    let k = vec![0.5f32; n * 16];
    let started = Instant::now();
    let r = cp.forward(&c, &q, &k, &k);
    let took = started.elapsed();
    match r {
        Err(Error::Distributed { message, .. })
            if message.contains("from rank") && took < Duration::from_secs(30) =>
        {
            println!(
                "mpi --leave rank {rank}: 1 passed, 0 failed ({message}; {:.1} s)",
                took.as_secs_f64()
            );
            // the abandoned transfers stay with MPI: end the job rather than finalize
            std::process::exit(0);
        }
        other => {
            println!("mpi --leave rank {rank}: 0 passed, 1 failed: {other:?} after {took:?}");
            std::process::exit(1);
        }
    }
}
