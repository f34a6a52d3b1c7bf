//! The decode plan (split-KV, FlashDecoding): calls with a few query rows against many keys.
//! One `flash_decode` dispatch serves, per workgroup, every query head sharing a kv head and
//! every query row (GQA packing: each K/V tile is read once per kv head) over one split of
//! the keys, writing partial results; one `flash_decode_combine` dispatch merges the splits
//! exactly (and adds the sinks) into out and lse. A call of one split takes one
//! `flash_decode_one` dispatch, which finishes its rows into out and lse itself.

use super::split::{self, Split};
use super::step::key;
use super::{BufRef, Plan, PlanEnv, ScratchSpec, Step, Window};
use crate::config::{Algorithm, AttentionConfig, MAX_KV_SPLITS};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::tiles::{decode_tiles_for, DECODE_KEYS};
use crate::kernels::wgsl::ELEMENTWISE_WORKGROUP;
use crate::kernels::{flags, Kernel, KernelKey, Params, Tiles};

/// The most query rows (`seq_q`) a call may have to take the decode path: a decode step, or
/// a few speculative tokens. Longer calls run the tiled forward kernels.
pub const MAX_DECODE_QUERIES: usize = 4;

/// Workgroups a decode dispatch aims for: enough to fill the largest GPUs (100+ compute
/// units, a few workgroups each).
pub const TARGET_WORKGROUPS: usize = 256;

/// The fewest keys the heuristic gives a split: below this, a split's fixed costs (its q
/// loads, its partial result and the merge's reads) outweigh its keys.
pub const MIN_SPLIT_KEYS: usize = 512;

/// True when a call has a decode step's shape, on any backend: tiled, at most
/// [`MAX_DECODE_QUERIES`] query rows, not packed sequences.
pub fn decode_shaped(cfg: &AttentionConfig) -> bool {
    cfg.algorithm == Algorithm::Tiled && cfg.varlen.is_none() && cfg.seq_q <= MAX_DECODE_QUERIES
}

/// Windows of whole batches, each (first batch, batches).
pub type BatchWindows = Vec<(usize, usize)>;

/// The decode route of a forward, given the call's split (`split::choose`): its batch
/// windows and the geometry of the widest, or `None` for a call the decode kernel does not
/// run (not [`decode_shaped`], or one batch past a binding). Head dims the windows cannot
/// place are a typed error.
pub(super) fn route(
    cfg: &AttentionConfig,
    split: Option<&Split>,
    env: &PlanEnv,
) -> Result<Option<(BatchWindows, DecodeShape)>> {
    if !decode_shaped(cfg) {
        return Ok(None);
    }
    let Some(batches) = batch_parts(cfg, split) else {
        return Ok(None);
    };
    if batches.len() > 1 {
        super::head_dims::refuse_windows(cfg, "a decode call")?;
    }
    // one geometry and one scratch for every window: the widest window's
    let widest = batches.iter().map(|p| p.1).max().unwrap_or(cfg.batch);
    let shape = shape(
        &AttentionConfig {
            batch: widest,
            ..cfg.clone()
        },
        env,
    )?;
    Ok(Some((batches, shape)))
}

/// The batch windows a decode-shaped call runs in, given the call's split
/// (`split::choose`): one window of every batch when its tensors fit one binding, else
/// windows of whole batches; `None` when one batch does not fit (the tiled kernels' windows
/// then run it).
fn batch_parts(cfg: &AttentionConfig, split: Option<&Split>) -> Option<Vec<(usize, usize)>> {
    match split {
        None => Some(vec![(0, cfg.batch)]),
        Some(s) if s.q_rows == cfg.seq_q && s.kv_rows == cfg.seq_kv && !s.accumulate => {
            Some(split::ranges(cfg.batch, s.batches).collect())
        }
        Some(_) => None,
    }
}

/// How many splits the keys of a decode call get, the pure heuristic: enough splits that
/// `unsplit_workgroups` (batch x kv heads x row chunks) times them reaches
/// [`TARGET_WORKGROUPS`], but no split under [`MIN_SPLIT_KEYS`] keys, and no more than
/// `max_splits` (what fits the partial results in one binding); at least 1.
pub fn kv_splits(unsplit_workgroups: usize, seq_kv: usize, max_splits: usize) -> usize {
    let by_fill = TARGET_WORKGROUPS.div_ceil(unsplit_workgroups.max(1));
    let by_keys = seq_kv / MIN_SPLIT_KEYS;
    by_fill.min(by_keys).min(max_splits).clamp(1, MAX_KV_SPLITS)
}

/// The widest columns (16-byte words) the decode kernel of `cfg` may read K and V in on the
/// adapter: its class's (`GpuClass::decode_max_words`) where values of 256 dims or fewer leave
/// every column an invocation at any width (`columns_fit`), else 2.
pub fn max_words(cfg: &AttentionConfig, env: &PlanEnv) -> u32 {
    if cfg.dv() <= 256 {
        env.caps.gpu.decode_max_words()
    } else {
        2
    }
}

/// How the decode kernel reads K and V (`KernelKey::wide`: 16-byte words a column, 0 for
/// element reads) and the subgroup size it shares reads across (`decode_subgroup`): the
/// widest columns (2 words, then 1) whose words every row starts on (head_dim a multiple of
/// them, windows' offsets aligned to 16 bytes) and that keep the adapter's fixed subgroup
/// usable; where no width keeps it, the widest reads without it.
pub fn wide_words(cfg: &AttentionConfig, dtype: DType, tiles: Tiles, env: &PlanEnv) -> (u32, u32) {
    let per_word = 16 / dtype.size_bytes();
    let fits = |w: usize| {
        w == 0
            || (cfg.head_dim.is_multiple_of(w * per_word)
                && cfg.dv().is_multiple_of(w * per_word)
                && env.offset_align.is_multiple_of(16))
    };
    let cols = |w: u32| crate::kernels::wgsl::column_vec4s(w, dtype == DType::F32);
    let cap = max_words(cfg, env);
    let widths: Vec<u32> = [2u32, 1, 0]
        .into_iter()
        .filter(|&w| fits(w as usize) && w <= cap)
        .collect();
    for &w in &widths {
        let sg = decode_subgroup(cfg, tiles, env, cols(w));
        if sg > 0 || env.tuning.rows_subgroup <= 1 {
            return (w, sg);
        }
    }
    (widths[0], 0)
}

/// `Error::Unsupported` where the decode kernel of `key` cannot give each output column an
/// invocation: P V gives each of its [`DECODE_KEYS`] invocations one column (`CW` vec4s) of
/// the output rows, so values past 256 dims need columns of whole 16-byte words (`wide`),
/// which rows that start on whole words give (the plan's `wide_words`; a view's rows where
/// its offset and strides are whole words: `record`).
pub(crate) fn columns_fit(key: &KernelKey) -> Result<()> {
    let columns = key.dv().div_ceil(4).div_ceil(key.wide_vec4s());
    if !key.kernel.is_decode() || columns <= DECODE_KEYS {
        return Ok(());
    }
    Err(Error::Unsupported {
        feature: format!(
            "the decode kernel at head_dim_v {} read element by element",
            key.dv()
        ),
        backend: crate::Backend::Wgpu,
        reason: format!(
            "its {columns} output columns a row are more than its {DECODE_KEYS} invocations; \
             values past 256 dims are read in 16-byte words, which needs head_dim and \
             head_dim_v multiples of 8 (MLA's 576 and 512 are), and views of k and v whose \
             offsets and strides are whole 16-byte words"
        ),
    })
}

/// True when the decode kernel of `tiles` holds each row's q of `cfg` whole, staged once
/// (`flash_decode.wgsl`'s QRES), not a chunk at a time each tile.
pub fn holds_q_whole(cfg: &AttentionConfig, tiles: Tiles) -> bool {
    tiles.rpt >= (cfg.head_dim as u32).div_ceil(4)
}

/// The subgroup size the decode kernel shares reads across (`flash_decode.wgsl`'s SG): the
/// adapter's fixed size the tuning names (`Tuning::rows_subgroup`) where a subgroup's lanes
/// share one key parity (the columns of a row, head_dim / 4 / `cw` with `cw` vec4s a column,
/// a multiple of it), the workgroup holds q whole (the tiles' `rpt`), each lane's share of its
/// group's q stays small (at most 32 vec4s) and the private arrays of the subgroup path fit
/// the adapter's register budget ([`decode_private_floats`] within
/// `DeviceCaps::private_floats`), else 0 (no subgroups).
pub fn decode_subgroup(cfg: &AttentionConfig, tiles: Tiles, env: &PlanEnv, cw: u32) -> u32 {
    let sg = env.tuning.rows_subgroup;
    let d4 = (cfg.head_dim as u32).div_ceil(4);
    let d4v = (cfg.dv() as u32).div_ceil(4);
    let group_rows = tiles.br / tiles.tpr.max(1);
    if sg > 1
        && (d4 / cw).is_multiple_of(sg)
        && d4.is_multiple_of(cw)
        && (d4v / cw).is_multiple_of(sg)
        && d4v.is_multiple_of(cw)
        && sg.is_multiple_of(cw)
        && holds_q_whole(cfg, tiles)
        && group_rows * d4 / sg <= 32
        && decode_private_floats(tiles, d4, d4v, sg, cw) <= env.caps.private_floats
        && DECODE_KEYS.is_multiple_of(sg)
    {
        sg
    } else {
        0
    }
}

/// The f32 values one invocation of the decode kernel's subgroup path holds in private
/// arrays (shaders/flash_decode.wgsl) for its tiles, `d4` vec4s a q row, `d4v` a v row,
/// subgroup `sg` and `cw` vec4s a column: of each of its group's `br / tpr` rows its share of
/// q (`qh`, d4 / sg vec4s), the q vectors the subgroup hands round (`qs`, sg vec4s) and the
/// score (`x`); of each of its P V rows (`PR`: the rows over the groups the invocations a
/// column cover) the weights the subgroup hands round (`ws`, sg) and its output column
/// (`acc`, cw vec4s). On NVIDIA (subgroup 32) 16 rows (two groups) hold 1,352 of them at
/// head_dim 128, five times the registers an invocation has.
pub fn decode_private_floats(tiles: Tiles, d4: u32, d4v: u32, sg: u32, cw: u32) -> u32 {
    let groups = tiles.tpr.max(1);
    let rows = tiles.br / groups;
    let columns = (d4v / cw.max(1)).max(1);
    let covered = groups.min((DECODE_KEYS * groups / columns).max(1));
    let pv_rows = tiles.br / (1u32 << covered.ilog2());
    let sg = sg.max(1);
    rows * ((d4 / sg) * 4 + sg * 4 + 1) + pv_rows * (sg + cw * 4)
}

/// How a decode call's keys are split, on any backend: `cfg.kv_splits = Some(n)` gives n
/// splits of ceil(seq_kv / n) keys (some empty when n does not divide well); `None` the
/// heuristic's count ([`kv_splits`], for `unsplit_workgroups` without splits and at most
/// `max_splits`), with splits rounded up to whole tiles of [`DECODE_KEYS`] keys. Returns
/// (splits, keys per split).
pub fn key_splits(
    cfg: &AttentionConfig,
    unsplit_workgroups: usize,
    max_splits: usize,
) -> (usize, usize) {
    match cfg.kv_splits {
        Some(n) => (n, cfg.seq_kv.div_ceil(n)),
        None => {
            let n = kv_splits(unsplit_workgroups, cfg.seq_kv, max_splits);
            let keys = cfg
                .seq_kv
                .div_ceil(n)
                .next_multiple_of(DECODE_KEYS as usize);
            (cfg.seq_kv.div_ceil(keys), keys)
        }
    }
}

/// The decode dispatch's geometry for a call: tiles, row chunks, splits and keys per split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    pub tiles: Tiles,
    pub chunks: usize,
    pub splits: usize,
    pub split_keys: usize,
}

/// The geometry `steps` plans: `cfg.kv_splits` splits of ceil(seq_kv / n) keys (some empty
/// when n does not divide well), or the heuristic's count with splits rounded up to whole
/// tiles of keys.
pub fn shape(cfg: &AttentionConfig, env: &PlanEnv) -> Result<DecodeShape> {
    // its q rows are head_dim wide and its output sums head_dim_v: the wider sizes the tiles
    let rows = cfg.group() * cfg.seq_q;
    let tiles = decode_tiles_for(
        u32::try_from(rows).unwrap_or(u32::MAX),
        cfg.head_dim.max(cfg.dv()) as u32,
        env.caps,
        env.tuning.decode_q_chunks,
    )?;
    let chunks = rows.div_ceil(tiles.br as usize);
    let per_split = (cfg.batch * cfg.seq_q * cfg.heads_q * cfg.dv()) as u64 * 4;
    let max_splits = (env.max_binding_bytes / per_split.max(1)) as usize;
    if let Some(n) = cfg.kv_splits.filter(|&n| n > max_splits) {
        return Err(Error::DeviceLimit {
            what: format!("partial results of {n} key splits (kv_splits)"),
            needed: n as u64 * per_split,
            limit: env.max_binding_bytes,
            hint: format!("ask for at most {max_splits} splits, or None"),
        });
    }
    let (splits, split_keys) = key_splits(cfg, cfg.batch * cfg.heads_kv * chunks, max_splits);
    Ok(DecodeShape {
        tiles,
        chunks,
        splits,
        split_keys,
    })
}

/// Appends the decode dispatch and the merge of its splits to a forward plan (inputs q, k,
/// v; outputs out, lse), once per window of whole batches (`batches`, the route's, as the
/// geometry `s`).
pub fn steps(
    cfg: &AttentionConfig,
    dtype: DType,
    env: &PlanEnv,
    (parts, s): (&[(usize, usize)], DecodeShape),
    plan: &mut Plan,
) -> Result<()> {
    let windowed = parts.len() > 1;
    let widest = parts.iter().map(|p| p.1).max().unwrap_or(cfg.batch);
    // out's elements a batch (head_dim_v wide)
    let per_batch = cfg.seq_q * cfg.heads_q * cfg.dv();
    // one split: the decode kernel finishes the rows itself, no partial results, no merge
    let one = s.splits == 1;
    let first = plan.scratch.len();
    if !one {
        plan.scratch.extend([
            ScratchSpec {
                label: "decode partial out",
                bytes: (s.splits * widest * per_batch) as u64 * 4,
            },
            ScratchSpec {
                label: "decode partial lse",
                bytes: (s.splits * widest * cfg.heads_q * cfg.seq_q) as u64 * 4,
            },
        ]);
    }
    let esz = dtype.size_bytes() as u64;
    let combine = key(Kernel::FlashDecodeCombine, cfg, Tiles::ONE, dtype, env);
    let (wide, subgroup) = wide_words(cfg, dtype, s.tiles, env);
    let decode = KernelKey {
        wide,
        subgroup,
        ..key(
            if one {
                Kernel::FlashDecodeOne
            } else {
                Kernel::FlashDecode
            },
            cfg,
            s.tiles,
            dtype,
            env,
        )
    };
    columns_fit(&decode)?;
    for &(b, nb) in parts {
        let part = AttentionConfig {
            batch: nb,
            ..cfg.clone()
        };
        let workgroups = nb * cfg.heads_kv * s.chunks * s.splits;
        let workgroups = u32::try_from(workgroups).map_err(|_| Error::DeviceLimit {
            what: "decode workgroups (batch x kv heads x row chunks x splits)".into(),
            needed: workgroups as u64,
            limit: u32::MAX as u64,
            hint: "ask for fewer kv_splits, or split the batch".into(),
        })?;
        let mut params = Params {
            n_q_tiles: s.chunks as u32,
            splits: s.splits as u32,
            split_keys: s.split_keys as u32,
            total_wg: workgroups,
            batch_base: b as u32,
            ..Params::from_part(&part, cfg)
        };
        let mut windows: [Option<Window>; 3] = [None; 3];
        if windowed {
            let [(qw, qs), (kw, ks), (rw, rs)] = split::batch_windows(cfg, env, esz, (b, nb));
            (params.q_shift, params.kv_shift, params.row_shift) = (qs, ks, rs);
            windows = [Some(qw), Some(kw), Some(rw)];
        }
        let [qw, kw, rw] = windows;
        let bind = |w: Vec<Option<Window>>| if windowed { w } else { Vec::new() };
        if one {
            plan.steps.push(Step {
                key: decode,
                params,
                buffers: vec![
                    BufRef::Input(0),
                    BufRef::Input(1),
                    BufRef::Input(2),
                    BufRef::Output(0),
                    BufRef::Output(1),
                ],
                windows: bind(vec![qw, kw, kw, qw, rw]),
                workgroups,
            });
            continue;
        }
        plan.steps.extend([
            Step {
                key: decode,
                params,
                buffers: vec![
                    BufRef::Input(0),
                    BufRef::Input(1),
                    BufRef::Input(2),
                    BufRef::Scratch(first),
                    BufRef::Scratch(first + 1),
                ],
                windows: bind(vec![qw, kw, kw, None, None]),
                workgroups,
            },
            Step {
                // the merge reads no score: of the modifiers, only the sinks reach it
                key: KernelKey {
                    runtime: combine.runtime & flags::SINKS,
                    flags: combine.flags & flags::SINKS,
                    // the merge runs over out's rows: its HEAD_DIM is the values' dim
                    head_dim: cfg.dv() as u32,
                    elem: combine.elem,
                    ..KernelKey::plain(Kernel::FlashDecodeCombine)
                },
                params: Params {
                    total_items: (nb * per_batch) as u32,
                    ..params
                },
                buffers: vec![
                    BufRef::Scratch(first),
                    BufRef::Scratch(first + 1),
                    BufRef::Output(0),
                    BufRef::Output(1),
                ],
                windows: bind(vec![None, None, qw, rw]),
                workgroups: (nb * per_batch).div_ceil(ELEMENTWISE_WORKGROUP as usize) as u32,
            },
        ]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::HalfStorage;
    use crate::kernels::Variant;

    fn env() -> PlanEnv {
        crate::plan::test_env(Variant::Blocks, HalfStorage::Packed)
    }

    #[test]
    fn the_heuristic_fills_the_device_without_splits_under_min_keys() {
        // B=1, 8 kv heads: 32 splits fill 256 workgroups where the keys allow
        assert_eq!(kv_splits(8, 32768, 1000), 32);
        // short caches: no split under MIN_SPLIT_KEYS keys
        assert_eq!(kv_splits(8, 1024, 1000), 2);
        assert_eq!(kv_splits(8, 100, 1000), 1);
        // a large batch fills the device alone
        assert_eq!(kv_splits(512, 32768, 1000), 1);
        // the binding caps it
        assert_eq!(kv_splits(1, 1 << 20, 3), 3);
        assert_eq!(kv_splits(0, 1 << 20, 0), 1);
    }

    #[test]
    fn k_and_v_are_read_in_the_widest_words_that_keep_the_subgroup() {
        // lavapipe: subgroup 8, private arrays in memory
        let mut e = env();
        e.tuning.rows_subgroup = 8;
        e.caps.private_floats = crate::kernels::CPU_PRIVATE_FLOATS;
        let t = shape(&AttentionConfig::new(1, 1, 4096, 32, 8, 128), &e)
            .unwrap()
            .tiles;
        let wide = |d: usize, dtype: DType, e: &PlanEnv| {
            wide_words(&AttentionConfig::new(1, 1, 4096, 32, 8, d), dtype, t, e)
        };
        // head_dim 128: two words a column (16 halves, 8 floats), 8 columns in f16 or 16
        // in f32, a multiple of the subgroup
        assert_eq!(wide(128, DType::F16, &e), (2, 8));
        assert_eq!(wide(128, DType::F32, &e), (2, 8));
        // head_dim 40: one word of halves (rows start every 5 words); no width leaves a
        // multiple of 8 columns, so the widest reads without the subgroup
        assert_eq!(wide(40, DType::F16, &e), (1, 0));
        // head_dim 12 in f32: three words a row, one a column
        assert_eq!(wide(12, DType::F32, &e).0, 1);
        // odd head dims: element reads
        assert_eq!(wide(33, DType::BF16, &e).0, 0);
        // windows whose offsets may sit off 16 bytes: element reads
        let mut small = e;
        small.offset_align = 4;
        assert_eq!(wide(128, DType::F16, &small), (0, 8));
        // no subgroup size to keep: the widest
        e.tuning.rows_subgroup = 0;
        assert_eq!(wide(40, DType::F16, &e), (1, 0));
    }

    #[test]
    fn the_subgroup_path_is_left_where_its_private_arrays_would_spill_a_gpus_registers() {
        // NVIDIA: subgroup 32; 32 query heads over 8 (4 packed rows), head_dim 128
        let mut e = env();
        e.tuning.rows_subgroup = 32;
        let c = AttentionConfig::new(1, 1, 4096, 32, 8, 128);
        let t = shape(&c, &e).unwrap().tiles;
        assert!(decode_private_floats(t, 32, 32, 32, 2) > crate::kernels::GPU_PRIVATE_FLOATS);
        assert_eq!(decode_subgroup(&c, t, &e, 2), 0);
        // 16 packed rows: two groups of 8, each invocation scoring 8 rows (qh 4, qs 128, x 1
        // a row) and summing 8 (ws 32, acc 4 a row): 1,352 floats
        let t16 = Tiles {
            br: 16,
            bc: DECODE_KEYS,
            tpr: 2,
            rpt: 32,
        };
        assert_eq!(
            decode_private_floats(t16, 32, 32, 32, 1),
            8 * (4 + 128 + 1) + 8 * (32 + 4)
        );
        // one packed row on a GPU fits; on a CPU driver the lavapipe shapes keep the subgroup
        let one = AttentionConfig::new(1, 1, 4096, 8, 8, 128);
        let t1 = shape(&one, &e).unwrap().tiles;
        assert_eq!(t1.br, 1);
        assert_eq!(decode_subgroup(&one, t1, &e, 1), 32);
        e.tuning.rows_subgroup = 8;
        e.caps.private_floats = crate::kernels::CPU_PRIVATE_FLOATS;
        assert_eq!(decode_subgroup(&c, t, &e, 2), 8);
    }

    #[test]
    fn gqa_rows_are_packed_per_kv_head_and_the_keys_split() {
        let mut c = AttentionConfig::new(1, 1, 32768, 32, 8, 128);
        let s = shape(&c, &env()).unwrap();
        // 4 query heads per kv head: one chunk of 4 packed rows
        assert_eq!((s.tiles.br, s.chunks), (4, 1));
        assert_eq!(s.splits, 32);
        assert_eq!(s.split_keys, 1024);
        let p = crate::plan::forward(&c, DType::F16, &env()).unwrap();
        let kernels: Vec<Kernel> = p.steps.iter().map(|s| s.key.kernel).collect();
        assert_eq!(kernels, [Kernel::FlashDecode, Kernel::FlashDecodeCombine]);
        assert_eq!(p.steps[0].workgroups, 8 * 32);
        // one split (MHA under 512 keys, or asked for): one dispatch writes out and lse, no
        // partial results
        let mut one = AttentionConfig::new(2, 1, 300, 8, 8, 64);
        let p = crate::plan::forward(&one, DType::F16, &env()).unwrap();
        let kernels: Vec<Kernel> = p.steps.iter().map(|s| s.key.kernel).collect();
        assert_eq!(kernels, [Kernel::FlashDecodeOne]);
        assert!(p.scratch.is_empty());
        assert_eq!(
            p.steps[0].buffers[3..],
            [BufRef::Output(0), BufRef::Output(1)]
        );
        one.seq_kv = 32768;
        one.kv_splits = Some(1);
        let p = crate::plan::forward(&one, DType::F16, &env()).unwrap();
        assert_eq!(p.steps.len(), 1);
        // 3 query rows of 8 heads a kv head at head_dim 256: one chunk of 32 rows in 4
        // groups, whose q 16 KiB holds 12 of the 64 vec4s a row at a time
        c = AttentionConfig::new(2, 3, 1000, 16, 2, 256);
        let s = shape(&c, &env()).unwrap();
        assert_eq!(
            (s.tiles.br, s.tiles.tpr, s.tiles.rpt, s.chunks),
            (32, 4, 12, 1)
        );
        // MLA's 128 heads over one latent head: 4 chunks of 32 rows (each latent row read 4
        // times a step); 2 of 64 where 512 invocations and 48 KiB are offered (q in chunks
        // of 28 vec4s); 8 rows of head_dim 128 hold q whole
        let mla = AttentionConfig {
            head_dim_v: Some(512),
            ..AttentionConfig::new(1, 1, 4096, 128, 1, 576)
        };
        let s = shape(&mla, &env()).unwrap();
        assert_eq!(
            (s.tiles.br, s.tiles.tpr, s.tiles.rpt, s.chunks),
            (32, 4, 12, 4)
        );
        let mut big = env();
        big.caps.max_invocations_per_workgroup = 1024;
        big.caps.max_workgroup_storage_bytes = 48 << 10;
        let s = shape(&mla, &big).unwrap();
        assert_eq!(
            (s.tiles.br, s.tiles.tpr, s.tiles.rpt, s.chunks),
            (64, 8, 28, 2)
        );
        let gqa = AttentionConfig::new(1, 1, 4096, 64, 8, 128);
        let s = shape(&gqa, &env()).unwrap();
        assert_eq!(
            (s.tiles.br, s.tiles.tpr, s.tiles.rpt, s.chunks),
            (8, 1, 32, 1)
        );
        // an override: n splits of ceil(seq_kv / n) keys, empty ones kept
        c.kv_splits = Some(7);
        let s = shape(&c, &env()).unwrap();
        assert_eq!((s.splits, s.split_keys), (7, 143));
        c.kv_splits = Some(1000);
        assert_eq!(shape(&c, &env()).unwrap().split_keys, 1);
        // five query rows: the tiled forward
        c.seq_q = 5;
        let route = crate::plan::route::forward(&c, DType::F32, &env()).unwrap();
        assert!(
            matches!(route, crate::plan::route::Route::Tiled(_)),
            "{route:?}"
        );
    }

    #[test]
    fn the_merge_step_keeps_only_the_sinks() {
        let mut c = AttentionConfig::new(1, 1, 300, 4, 2, 64);
        c.sinks = Some(vec![0.5; 4]);
        c.alibi_slopes = Some(vec![0.1; 4]);
        c.causal = true;
        c.kv_splits = Some(2);
        let p = crate::plan::forward(&c, DType::F32, &env()).unwrap();
        let k = p.steps[1].key;
        assert_eq!(k.runtime | k.flags, flags::SINKS);
        assert!(p.steps[0].key.reads(flags::ALIBI | flags::CAUSAL));
    }
}
