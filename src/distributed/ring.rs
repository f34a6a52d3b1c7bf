//! The algorithms of context parallelism (module docs): the ring's forward and backward, the
//! all-gather form, and decode over sharded keys. Each rank computes in f32 on its context;
//! blocks of the whole call ([`crate::Block`]) carry the positions.
//!
//! The forward, rank r of R, rows in chunks `C_r` (one, or two for zigzag): the K/V block of
//! rank `(r - s) mod R` is in hand at step s = 0..R-1; the next one is received from rank
//! r - 1 while this one computes (a `shift`: its send and receive overlap the blocks' calls);
//! each (row chunk, key chunk) pair is one block call, skipped where a causal mask hides every
//! pair; each row chunk's partials are merged in key order (one order whatever the ring's
//! timing: the same bits every run). The backward: the block of rank `(r - s) mod R` comes with
//! the dK, dV its rows have collected so far (f32); each pair's block backward at the whole
//! call's out and lse adds to them and to dQ; R shifts later each block is home with every
//! rank's contribution, summed in ring order.

use std::ops::Range;

use super::layout::rows_of;
use super::rank::{Rank, Schedule, Traffic, ALL_GATHER_BELOW};
use crate::config::{AttentionConfig, Block};
use crate::dtype::{to_f32_vec, Element};
use crate::error::Result;
use crate::outputs::{HostForward, HostGradients};

/// A row chunk's place: its range in the whole sequence, and its first row in the rank's local
/// tensors.
#[derive(Debug, Clone)]
struct Chunk {
    rows: Range<usize>,
    local: usize,
}

/// The chunks of `ranges` (a rank's rows, in its local order).
fn chunks(ranges: Vec<Range<usize>>) -> Vec<Chunk> {
    let mut at = 0;
    ranges
        .into_iter()
        .map(|rows| {
            let c = Chunk {
                local: at,
                rows: rows.clone(),
            };
            at += rows.len();
            c
        })
        .collect()
}

/// Rows `off..off + len` of each batch of a `[batch, n, width]` tensor.
fn take(x: &[f32], dims: (usize, usize, usize), off: usize, len: usize) -> Vec<f32> {
    rows_of(x, dims, std::slice::from_ref(&(off..off + len)))
}

/// Adds `part` (`[batch, len, width]`) into rows `off..` of each batch of `x` (`[batch, n,
/// width]`).
fn add(x: &mut [f32], (batch, n, width): (usize, usize, usize), off: usize, part: &[f32]) {
    let len = part.len() / (batch * width).max(1);
    for b in 0..batch {
        let dst = &mut x[(b * n + off) * width..(b * n + off + len) * width];
        for (d, p) in dst
            .iter_mut()
            .zip(&part[b * len * width..(b + 1) * len * width])
        {
            *d += p;
        }
    }
}

/// Rows `off..off + len` of each (batch, head) of an lse `[rows_of, n]`.
fn take_lse(lse: &[f32], (bh, n): (usize, usize), off: usize, len: usize) -> Vec<f32> {
    (0..bh)
        .flat_map(|i| lse[i * n + off..i * n + off + len].iter().copied())
        .collect()
}

fn put_lse(lse: &mut [f32], (bh, n): (usize, usize), off: usize, part: &[f32]) {
    let len = part.len() / bh.max(1);
    for i in 0..bh {
        lse[i * n + off..i * n + off + len].copy_from_slice(&part[i * len..(i + 1) * len]);
    }
}

/// A rank's K and V block: its chunks and the two tensors, f32.
struct KvBlock {
    chunks: Vec<Chunk>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The block call of rows `q` over keys `k` of the whole call `cfg`: `None` where a causal
/// mask hides every pair (every key after every row). Sinks only where the keys are the rows'
/// own chunk (each row meets that block once).
fn block_cfg(cfg: &AttentionConfig, q: &Range<usize>, k: &Range<usize>) -> Option<AttentionConfig> {
    if q.is_empty() || k.is_empty() || (cfg.causal && k.start >= q.end) {
        return None;
    }
    Some(AttentionConfig {
        seq_q: q.len(),
        seq_kv: k.len(),
        sinks: if q == k { cfg.sinks.clone() } else { None },
        block: Some(Block {
            whole_seq_q: cfg.seq_q,
            whole_seq_kv: cfg.seq_kv,
            q0: q.start,
            k0: k.start,
        }),
        ..cfg.clone()
    })
}

/// The K/V block of rank `owner` as bytes of `T` (what travels), and back.
fn kv_bytes<T: Element>(k: &[f32], v: &[f32]) -> Vec<u8> {
    let (k, v) = (
        crate::dtype::from_f32_slice::<T>(k),
        crate::dtype::from_f32_slice::<T>(v),
    );
    let mut out = bytemuck::cast_slice::<T, u8>(&k).to_vec();
    out.extend_from_slice(bytemuck::cast_slice::<T, u8>(&v));
    out
}

fn kv_from<T: Element>(bytes: &[u8], k_len: usize) -> (Vec<f32>, Vec<f32>) {
    let all: Vec<T> = bytemuck::pod_collect_to_vec(bytes);
    (to_f32_vec(&all[..k_len]), to_f32_vec(&all[k_len..]))
}

/// Every rank's chunks and block sizes (elements of K and V), from the layout.
fn owners(cp: &Rank<'_>, cfg: &AttentionConfig) -> Vec<(Vec<Chunk>, usize, usize)> {
    let (size, layout) = (cp.comm.size(), cp.layout(cfg));
    (0..size)
        .map(|o| {
            let c = chunks(layout.rows(cfg.seq_q, size, o));
            let n: usize = c.iter().map(|c| c.rows.len()).sum();
            (
                c,
                cfg.batch * n * cfg.heads_kv * cfg.head_dim,
                cfg.batch * n * cfg.heads_kv * cfg.dv(),
            )
        })
        .collect()
}

/// Whether this call takes the all-gather form.
fn all_gather(cp: &Rank<'_>, cfg: &AttentionConfig) -> bool {
    match cp.schedule {
        Schedule::Ring => false,
        Schedule::AllGather => true,
        Schedule::Auto => {
            let n = cp
                .layout(cfg)
                .local_len(cfg.seq_q, cp.comm.size(), cp.comm.rank());
            cfg.batch * n * cfg.heads_kv * (cfg.head_dim + cfg.dv()) * 4 < ALL_GATHER_BELOW
        }
    }
}

/// The rank's inputs in f32, with their shapes' row widths.
struct Local {
    chunks: Vec<Chunk>,
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn local<T: Element>(cp: &Rank<'_>, cfg: &AttentionConfig, (q, k, v): (&[T], &[T], &[T])) -> Local {
    let chunks = chunks(cp.local_rows(cfg));
    let n = chunks.iter().map(|c| c.rows.len()).sum();
    Local {
        chunks,
        n,
        q: to_f32_vec(q),
        k: to_f32_vec(k),
        v: to_f32_vec(v),
    }
}

/// Every rank's K and V gathered, as one block per owner.
fn gather_all<T: Element>(
    cp: &Rank<'_>,
    cfg: &AttentionConfig,
    me: &Local,
) -> Result<Vec<KvBlock>> {
    let owners = owners(cp, cfg);
    let widest = owners
        .iter()
        .map(|o| (o.1 + o.2) * std::mem::size_of::<T>())
        .max()
        .unwrap_or(0);
    let mut mine = kv_bytes::<T>(&me.k, &me.v);
    mine.resize(widest, 0);
    let all = cp.comm.all_gather(&mine)?;
    cp.count(|t| &mut t.kv, widest * (cp.comm.size() - 1));
    Ok(owners
        .into_iter()
        .enumerate()
        .map(|(o, (chunks, kl, vl))| {
            let at = o * widest;
            let (k, v) = kv_from::<T>(&all[at..at + (kl + vl) * std::mem::size_of::<T>()], kl);
            KvBlock { chunks, k, v }
        })
        .collect())
}

/// The forward: this rank's rows of out (f32) and lse.
pub(super) fn forward<T: Element>(
    cp: &Rank<'_>,
    cfg: &AttentionConfig,
    inputs: (&[T], &[T], &[T]),
) -> Result<HostForward<f32>> {
    let me = local(cp, cfg, inputs);
    let (hq, hkv, d, dv) = (cfg.heads_q, cfg.heads_kv, cfg.head_dim, cfg.dv());
    // each row chunk's partials, with the first key of their block (the merge order)
    let mut parts: Vec<Vec<(usize, HostForward<f32>)>> = vec![Vec::new(); me.chunks.len()];
    let mut attend = |blk: &KvBlock| -> Result<()> {
        for (ci, qc) in me.chunks.iter().enumerate() {
            let q = take(&me.q, (cfg.batch, me.n, hq * d), qc.local, qc.rows.len());
            let kn = blk.chunks.iter().map(|c| c.rows.len()).sum();
            for kc in &blk.chunks {
                let Some(b) = block_cfg(cfg, &qc.rows, &kc.rows) else {
                    continue;
                };
                let k = take(&blk.k, (cfg.batch, kn, hkv * d), kc.local, kc.rows.len());
                let v = take(&blk.v, (cfg.batch, kn, hkv * dv), kc.local, kc.rows.len());
                parts[ci].push((kc.rows.start, cp.ctx.forward_host(&b, &q, &k, &v)?));
            }
        }
        Ok(())
    };
    if all_gather(cp, cfg) {
        for blk in gather_all::<T>(cp, cfg, &me)? {
            attend(&blk)?;
        }
    } else {
        let owners = owners(cp, cfg);
        let (size, rank) = (cp.comm.size(), cp.comm.rank());
        let mut held = KvBlock {
            chunks: me.chunks.clone(),
            k: me.k.clone(),
            v: me.v.clone(),
        };
        for s in 0..size {
            if s + 1 == size {
                attend(&held)?;
                break;
            }
            let next = (rank + size - s - 1) % size;
            let (chunks, kl, vl) = owners[next].clone();
            let send = kv_bytes::<T>(&held.k, &held.v);
            cp.count(|t| &mut t.kv, send.len());
            let got = cp
                .comm
                .shift(send, (kl + vl) * std::mem::size_of::<T>(), &mut || {
                    attend(&held)
                })?;
            let (k, v) = kv_from::<T>(&got, kl);
            held = KvBlock { chunks, k, v };
        }
    }
    let mut out = vec![0f32; cfg.batch * me.n * hq * dv];
    let mut lse = vec![0f32; cfg.batch * hq * me.n];
    for (ci, qc) in me.chunks.iter().enumerate() {
        let mut p = std::mem::take(&mut parts[ci]);
        p.sort_by_key(|x| x.0);
        let shards: Vec<HostForward<f32>> = p.into_iter().map(|x| x.1).collect();
        let shape = [cfg.batch, qc.rows.len(), hq, dv];
        let merged = cp.ctx.merge_host(&shape, &shards)?;
        add(&mut out, (cfg.batch, me.n, hq * dv), qc.local, &merged.out);
        put_lse(&mut lse, (cfg.batch * hq, me.n), qc.local, &merged.lse);
    }
    Ok(HostForward { out, lse })
}

/// A backward's inputs, this rank's rows: q, k, v, out, lse, d_out.
type BackwardInputs<'x, T> = (&'x [T], &'x [T], &'x [T], &'x [T], &'x [f32], &'x [T]);

/// The backward: this rank's dq, dk, dv (f32) and the ranks' d_sinks summed.
pub(super) fn backward<T: Element>(
    cp: &Rank<'_>,
    cfg: &AttentionConfig,
    (q, k, v, out, lse, d_out): BackwardInputs<'_, T>,
) -> Result<HostGradients<f32>> {
    let me = local(cp, cfg, (q, k, v));
    let (out, d_out) = (to_f32_vec(out), to_f32_vec(d_out));
    let (hq, hkv, d, dv) = (cfg.heads_q, cfg.heads_kv, cfg.head_dim, cfg.dv());
    let (size, rank) = (cp.comm.size(), cp.comm.rank());
    let mut dq = vec![0f32; me.q.len()];
    let mut d_sinks: Option<Vec<f32>> = cfg.sinks.as_ref().map(|s| vec![0f32; s.len()]);
    // one block's gradients from this rank's rows, added into its accumulators
    let mut grads = |blk: &KvBlock, dk: &mut [f32], dvv: &mut [f32]| -> Result<()> {
        let kn = blk.chunks.iter().map(|c| c.rows.len()).sum();
        for qc in &me.chunks {
            let len = qc.rows.len();
            let qs = take(&me.q, (cfg.batch, me.n, hq * d), qc.local, len);
            let os = take(&out, (cfg.batch, me.n, hq * dv), qc.local, len);
            let ds = take(&d_out, (cfg.batch, me.n, hq * dv), qc.local, len);
            let ls = take_lse(lse, (cfg.batch * hq, me.n), qc.local, len);
            for kc in &blk.chunks {
                let Some(b) = block_cfg(cfg, &qc.rows, &kc.rows) else {
                    continue;
                };
                let kl = kc.rows.len();
                let ks = take(&blk.k, (cfg.batch, kn, hkv * d), kc.local, kl);
                let vs = take(&blk.v, (cfg.batch, kn, hkv * dv), kc.local, kl);
                let g = cp.ctx.backward_host(&b, &qs, &ks, &vs, &os, &ls, &ds)?;
                add(&mut dq, (cfg.batch, me.n, hq * d), qc.local, &g.dq);
                add(dk, (cfg.batch, kn, hkv * d), kc.local, &g.dk);
                add(dvv, (cfg.batch, kn, hkv * dv), kc.local, &g.dv);
                if let (Some(acc), Some(part)) = (d_sinks.as_mut(), g.d_sinks) {
                    acc.iter_mut().zip(part).for_each(|(a, p)| *a += p);
                }
            }
        }
        Ok(())
    };
    let (dk, dvv) = if all_gather(cp, cfg) {
        // every block here at once; the dK, dV of each owner's rows summed round the ring
        let blocks = gather_all::<T>(cp, cfg, &me)?;
        let mut acc: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
        for blk in &blocks {
            let (mut dk, mut dvv) = (vec![0f32; blk.k.len()], vec![0f32; blk.v.len()]);
            grads(blk, &mut dk, &mut dvv)?;
            acc.push((dk, dvv));
        }
        reduce_scatter(cp, acc)?
    } else {
        let owners = owners(cp, cfg);
        let mut held = KvBlock {
            chunks: me.chunks.clone(),
            k: me.k.clone(),
            v: me.v.clone(),
        };
        let (mut dk, mut dvv) = (vec![0f32; me.k.len()], vec![0f32; me.v.len()]);
        for s in 0..size {
            grads(&held, &mut dk, &mut dvv)?;
            // the block moves on, with its accumulators; after the last step only those
            // (home to their owner)
            let next = (rank + size - s - 1) % size;
            let (chunks, kl, vl) = owners[next].clone();
            let last = s + 1 == size;
            let mut send = if last {
                Vec::new()
            } else {
                kv_bytes::<T>(&held.k, &held.v)
            };
            cp.count(|t| &mut t.kv, send.len());
            let grad_bytes = (dk.len() + dvv.len()) * 4;
            cp.count(|t| &mut t.grads, grad_bytes);
            send.extend_from_slice(bytemuck::cast_slice(&dk));
            send.extend_from_slice(bytemuck::cast_slice(&dvv));
            let kv_len = if last {
                0
            } else {
                (kl + vl) * std::mem::size_of::<T>()
            };
            let got = cp
                .comm
                .shift(send, kv_len + (kl + vl) * 4, &mut || Ok(()))?;
            let (kv, g) = got.split_at(kv_len);
            let g: Vec<f32> = bytemuck::pod_collect_to_vec(g);
            dk = g[..kl].to_vec();
            dvv = g[kl..].to_vec();
            if !last {
                let (k, v) = kv_from::<T>(kv, kl);
                held = KvBlock { chunks, k, v };
            }
        }
        (dk, dvv)
    };
    // the sinks' gradient: each rank's part, summed in rank order on every rank
    let d_sinks = match d_sinks {
        None => None,
        Some(mine) => {
            let all = cp.comm.all_gather(bytemuck::cast_slice(&mine))?;
            cp.count(|t| &mut t.other, mine.len() * 4);
            let all: Vec<f32> = bytemuck::pod_collect_to_vec(&all);
            Some(
                (0..mine.len())
                    .map(|h| (0..size).map(|r| all[r * mine.len() + h]).sum())
                    .collect(),
            )
        }
    };
    Ok(HostGradients {
        dq,
        dk,
        dv: dvv,
        d_sinks,
        d_bias: None,
        d_table: None,
    })
}

/// A ring reduce-scatter of every owner's dK, dV partials (`acc[o]`): rank r ends with the
/// sum over the ranks of its own rows', added in ring order from rank r + 1 round to itself.
fn reduce_scatter(
    cp: &Rank<'_>,
    mut acc: Vec<(Vec<f32>, Vec<f32>)>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (size, rank) = (cp.comm.size(), cp.comm.rank());
    // at step s this rank passes on the sum it holds for owner r - s - 1 and takes the one
    // for owner r - s - 2 from the rank before, adding its own part
    for s in 0..size.saturating_sub(1) {
        let (out_owner, in_owner) = (
            (rank + 2 * size - s - 1) % size,
            (rank + 2 * size - s - 2) % size,
        );
        let (dk, dv) = &acc[out_owner];
        let mut send = bytemuck::cast_slice::<f32, u8>(dk).to_vec();
        send.extend_from_slice(bytemuck::cast_slice(dv));
        cp.count(|t| &mut t.grads, send.len());
        let (kl, vl) = (acc[in_owner].0.len(), acc[in_owner].1.len());
        let got = cp.comm.shift(send, (kl + vl) * 4, &mut || Ok(()))?;
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&got);
        let (dk, dv) = &mut acc[in_owner];
        // theirs first, then this rank's own part: one order on every run
        for (mine, theirs) in dk.iter_mut().zip(&got[..kl]) {
            *mine += theirs;
        }
        for (mine, theirs) in dv.iter_mut().zip(&got[kl..]) {
            *mine += theirs;
        }
    }
    Ok(std::mem::take(&mut acc[rank]))
}

/// Decode over sharded keys: this rank's partial, then every rank's merged in rank order.
pub(super) fn decode_sharded<T: Element>(
    cp: &Rank<'_>,
    cfg: &AttentionConfig,
    shard: Range<usize>,
    (q, k, v): (&[T], &[T], &[T]),
) -> Result<HostForward<f32>> {
    let (size, rank) = (cp.comm.size(), cp.comm.rank());
    // positions matter to the masks and modifiers that read them: a block of the call; the
    // rest run as a plain call over the shard (the decode kernel takes it)
    let positional = cfg.window.left.is_some()
        || cfg.window.right.is_some()
        || cfg.alibi_slopes.is_some()
        || cfg.score_mod.is_some()
        || cfg.mask_mod.is_some()
        || cfg.block_mask.is_some()
        || cfg.dropout.is_some()
        || (cfg.causal && cfg.seq_q > 1);
    let shard_cfg = AttentionConfig {
        seq_kv: shard.len(),
        sinks: if rank == 0 { cfg.sinks.clone() } else { None },
        block: positional.then_some(Block {
            whole_seq_q: cfg.seq_q,
            whole_seq_kv: cfg.seq_kv,
            q0: 0,
            k0: shard.start,
        }),
        ..cfg.clone()
    };
    let mine = if shard.is_empty() {
        // a rank that holds no key yet adds nothing to the merge: out 0 and lse -inf (or its
        // sink, a row's one "key"), what a call with no visible key gives
        let rows = cfg.batch * cfg.heads_q * cfg.seq_q;
        HostForward {
            out: vec![0f32; cfg.out_shape().iter().product()],
            lse: (0..rows)
                .map(|i| {
                    let h = i / cfg.seq_q % cfg.heads_q;
                    shard_cfg.sink(h).unwrap_or(f32::NEG_INFINITY)
                })
                .collect(),
        }
    } else {
        let (q, k, v) = (to_f32_vec(q), to_f32_vec(k), to_f32_vec(v));
        cp.ctx.forward_host(&shard_cfg, &q, &k, &v)?
    };
    let (no, nl) = (mine.out.len(), mine.lse.len());
    let mut bytes = bytemuck::cast_slice::<f32, u8>(&mine.out).to_vec();
    bytes.extend_from_slice(bytemuck::cast_slice(&mine.lse));
    let all = cp.comm.all_gather(&bytes)?;
    cp.count(|t: &mut Traffic| &mut t.other, bytes.len() * (size - 1));
    let all: Vec<f32> = bytemuck::pod_collect_to_vec(&all);
    let shards: Vec<HostForward<f32>> = (0..size)
        .map(|r| {
            let at = r * (no + nl);
            HostForward {
                out: all[at..at + no].to_vec(),
                lse: all[at + no..at + no + nl].to_vec(),
            }
        })
        .collect();
    cp.ctx.merge_host(&cfg.out_shape(), &shards)
}
