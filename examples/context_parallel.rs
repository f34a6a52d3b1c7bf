//! Context parallelism over MPI: one long causal sequence spread over the ranks, each holding
//! its zigzag chunks on its own `Context`. Checks a sample of rows against one process's own
//! call over the whole sequence, and prints each rank's time and the bytes it sent beside the
//! model's.
//!
//! ```text
//! cargo build --release --features mpi --example context_parallel
//! mpiexec -n 4 target/release/examples/context_parallel            # 64K tokens, 16K a rank
//! LP_NUM_THREADS=1 mpiexec -n 2 target/release/examples/context_parallel --bench --seq 8192
//! ```
//!
//! `--bench`: strong scaling in one run: in each round rank 0 first runs the whole call alone
//! (a ring of one rank, the others waiting), then every rank runs its share; forward and
//! forward+backward, `--rounds` interleaved rounds, medians, and the ratio (1 rank / R ranks).
//! FLOPs: forward 4 * B * H * N * N * D / 2 (causal), backward 2.5x. With lavapipe, give each
//! rank one core (`LP_NUM_THREADS=1`). The model of the bytes a rank sends per call: the ring's
//! forward passes its K and V blocks once round (R - 1 blocks of `B * N/R * Hkv * D` elements
//! each, twice: K and V), the backward the same and, R times, the block's dK and dV (f32).

#[path = "common/stats.rs"]
mod stats;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use flash_attn_wgpu::distributed::{
    take_rows, Comm, ContextParallel, LocalRing, MpiComm, Schedule,
};
use flash_attn_wgpu::{AttentionConfig, Block, Context};
use mpi::collective::CommunicatorCollectives;
use mpi::topology::Communicator;
use rand::{Rng, SeedableRng};
use stats::Stats;

#[derive(Parser, Debug)]
#[command(name = "context_parallel")]
struct Args {
    /// Tokens in the whole sequence
    #[arg(long, default_value_t = 65536)]
    seq: usize,
    /// Query heads
    #[arg(long, default_value_t = 2)]
    heads: usize,
    /// Key/value heads
    #[arg(long, default_value_t = 1)]
    kv_heads: usize,
    /// Head dimension
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// ring, all-gather or auto
    #[arg(long, default_value = "ring")]
    schedule: String,
    /// Strong scaling against one rank, forward and forward+backward
    #[arg(long)]
    bench: bool,
    /// Interleaved rounds of --bench
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let universe = mpi::initialize().expect("MPI initialized once");
    let world = universe.world();
    match run(&args, &world) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rank {}: {e}", world.rank());
            ExitCode::from(2)
        }
    }
}

/// This rank's GPU: where a machine has several GPUs, the ranks on it take them in turn (by
/// their rank among the machine's ranks, MPI's shared-memory split); else the default
/// adapter (`WGPU_ADAPTER_NAME` chooses).
fn this_ranks_context(
    world: &mpi::topology::SimpleCommunicator,
) -> Result<Context, Box<dyn std::error::Error>> {
    let local_rank = world.split_shared(world.rank()).rank() as usize;
    let gpus: Vec<wgpu::Adapter> = pollster::block_on(async {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        instance.enumerate_adapters(wgpu::Backends::all()).await
    })
    .into_iter()
    .filter(|a| {
        matches!(
            a.get_info().device_type,
            wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu
        )
    })
    .collect();
    if gpus.len() < 2 || std::env::var_os("WGPU_ADAPTER_NAME").is_some() {
        return Ok(Context::new()?);
    }
    let n = gpus.len();
    let adapter = gpus
        .into_iter()
        .nth(local_rank % n)
        .expect("index below the count");
    let wanted = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("context_parallel rank"),
        required_features: adapter.features() & wanted,
        required_limits: adapter.limits(),
        ..Default::default()
    }))?;
    Ok(Context::from_wgpu(device, queue)?)
}

/// The whole sequence's inputs, the same on every rank (one seed).
fn inputs(c: &AttentionConfig, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut r = |n: usize| {
        (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    (
        r(c.q_shape().iter().product()),
        r(c.kv_shape().iter().product()),
        r(c.v_shape().iter().product()),
    )
}

fn run(
    a: &Args,
    world: &mpi::topology::SimpleCommunicator,
) -> Result<bool, Box<dyn std::error::Error>> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let schedule = match a.schedule.as_str() {
        "ring" => Schedule::Ring,
        "all-gather" => Schedule::AllGather,
        "auto" => Schedule::Auto,
        other => return Err(format!("--schedule: ring, all-gather or auto, got {other}").into()),
    };
    let ctx = this_ranks_context(world)?;
    let mut c = AttentionConfig::new(1, a.seq, a.seq, a.heads, a.kv_heads, a.head_dim);
    c.causal = true;
    let (q, k, v) = inputs(&c, 42);
    let comm = MpiComm::new(world);
    let cp = ContextParallel::new(&ctx, &comm).with_schedule(schedule);
    let mine = cp.local_rows(&c);
    let (hq, hkv, d) = (c.heads_q, c.heads_kv, c.head_dim);
    let (ql, kl, vl) = (
        take_rows(&q, (1, c.seq_q, hq * d), &mine)?,
        take_rows(&k, (1, c.seq_q, hkv * d), &mine)?,
        take_rows(&v, (1, c.seq_q, hkv * d), &mine)?,
    );
    if rank == 0 {
        println!(
            "context_parallel: {} tokens over {size} ranks ({} a rank), {hq} heads over {hkv}, \
             head_dim {d}, f32, causal (zigzag), {schedule:?}; {}",
            c.seq_q,
            c.seq_q / size,
            ctx.adapter_info().name
        );
    }
    if a.bench {
        return bench(a, world, &ctx, &cp, &c, (&q, &k, &v), (&ql, &kl, &vl));
    }
    world.barrier();
    let started = Instant::now();
    let f = cp.forward(&c, &ql, &kl, &vl)?;
    let took = started.elapsed().as_secs_f64();
    let t = cp.traffic();
    let local = mine.iter().map(|r| r.len()).sum::<usize>();
    let model = (size - 1) * local * hkv * d * 4 * 2;
    println!(
        "rank {rank}: rows {mine:?}, forward {took:.2} s, sent {} B of K/V (model: {model} B: \
         its block, {local} rows, once round the ring; all-gather: the same bytes in one \
         collective)",
        t.kv
    );
    // a sample of rows, the first and last 8 of each chunk, checked against this rank's own
    // call of those rows over every key (a block of the whole call)
    let mut worst = 0f64;
    let mut checked = 0;
    let mut at_chunk = 0;
    for r in &mine {
        for start in [r.start, r.end.saturating_sub(8).max(r.start)] {
            let rows = start..(start + 8).min(r.end);
            let mut b = c.clone();
            b.seq_q = rows.len();
            b.block = Some(Block {
                whole_seq_q: c.seq_q,
                whole_seq_kv: c.seq_kv,
                q0: start,
                k0: 0,
            });
            let want = ctx.forward_host(
                &b,
                &take_rows(&q, (1, c.seq_q, hq * d), std::slice::from_ref(&rows))?,
                &k,
                &v,
            )?;
            // where these rows sit in this rank's out
            let at = at_chunk + (start - r.start);
            let got = &f.out[at * hq * d..(at + rows.len()) * hq * d];
            for (g, w) in got.iter().zip(&want.out) {
                worst = worst.max((g - w).abs() as f64);
            }
            checked += rows.len();
        }
        at_chunk += r.len();
    }
    let ok = worst <= 1e-4;
    println!(
        "rank {rank}: {checked} rows checked against one process's call over all {} keys: \
         max difference {worst:.2e} ({})",
        c.seq_kv,
        if ok { "ok" } else { "MISMATCH" }
    );
    let mut all = vec![0u8; size];
    world.all_gather_into(&[ok as u8][..], &mut all[..]);
    Ok(all.iter().all(|&x| x == 1))
}

#[allow(clippy::type_complexity)]
fn bench(
    a: &Args,
    world: &mpi::topology::SimpleCommunicator,
    ctx: &Context,
    cp: &ContextParallel<'_>,
    c: &AttentionConfig,
    (q, k, v): (&[f32], &[f32], &[f32]),
    (ql, kl, vl): (&[f32], &[f32], &[f32]),
) -> Result<bool, Box<dyn std::error::Error>> {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let d_out_all: Vec<f32> = (0..q.len())
        .map(|i| ((i % 13) as f32 - 6.0) * 0.05)
        .collect();
    let d_out = take_rows(
        &d_out_all,
        (1, c.seq_q, c.heads_q * c.head_dim),
        &cp.local_rows(c),
    )?;
    let flops = 4.0 * (c.heads_q * c.seq_q * c.seq_kv * c.head_dim) as f64 / 2.0;
    let (mut one_f, mut one_fb, mut all_f, mut all_fb) = (vec![], vec![], vec![], vec![]);
    for round in 0..a.rounds {
        // one rank alone: a ring of one on rank 0, the others waiting
        world.barrier();
        if rank == 0 {
            let solo = LocalRing::new(1).pop().expect("one rank");
            let one = ContextParallel::new(ctx, &solo as &dyn Comm);
            let t0 = Instant::now();
            let f = one.forward(c, q, k, v)?;
            let tf = t0.elapsed().as_secs_f64();
            one.backward(c, q, k, v, &f.out, &f.lse, &d_out_all)?;
            one_f.push(tf);
            one_fb.push(t0.elapsed().as_secs_f64());
        }
        world.barrier();
        let t0 = Instant::now();
        let f = cp.forward(c, ql, kl, vl)?;
        let tf = t0.elapsed().as_secs_f64();
        cp.backward(c, ql, kl, vl, &f.out, &f.lse, &d_out)?;
        let tfb = t0.elapsed().as_secs_f64();
        // the slowest rank's time is the call's
        let mut times = vec![0f64; 2 * size];
        world.all_gather_into(&[tf, tfb][..], &mut times[..]);
        all_f.push((0..size).map(|r| times[2 * r]).fold(0.0, f64::max));
        all_fb.push((0..size).map(|r| times[2 * r + 1]).fold(0.0, f64::max));
        if rank == 0 {
            println!(
                "round {round}: 1 rank {:.2} s fwd, {:.2} s fwd+bwd; {size} ranks {:.2} s, {:.2} s",
                one_f[round], one_fb[round], all_f[round], all_fb[round]
            );
        }
    }
    if rank == 0 {
        let median = |v: &[f64]| Stats::of(v).median;
        let (of, ofb, af, afb) = (
            median(&one_f),
            median(&one_fb),
            median(&all_f),
            median(&all_fb),
        );
        let t = cp.traffic();
        println!(
            "medians of {} rounds: forward 1 rank {of:.2} s ({:.1} GFLOP/s), {size} ranks {af:.2} s: \
             {:.2}x; forward+backward 1 rank {ofb:.2} s, {size} ranks {afb:.2} s: {:.2}x; rank 0 \
             sent {} B of K/V and {} B of dK/dV in its last backward",
            a.rounds,
            flops / of / 1e9,
            of / af,
            ofb / afb,
            t.kv,
            t.grads
        );
    }
    Ok(true)
}
