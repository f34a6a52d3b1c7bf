//! Rotary position embedding (RoPE), as flash-attn's `flash_attn_with_kvcache` fuses it into a
//! decode step (`rotary_cos`, `rotary_sin`, `rotary_interleaved`): q is rotated at its
//! positions and the new keys before the cache appends them, so the caller makes no pass of
//! its own over either.
//!
//! The first `rotary_dim` dims of every head turn in pairs by an angle per (position, pair),
//! given as tables `cos` and `sin` of `[table_rows, rotary_dim / 2]`: a pair `(x0, x1)` at
//! position p and pair index f becomes `(x0 c - x1 s, x1 c + x0 s)` with `c = cos[p][f]`,
//! `s = sin[p][f]`. Pairs are `(2f, 2f + 1)` when interleaved (GPT-J) and
//! `(f, f + rotary_dim / 2)` otherwise (GPT-NeoX, Llama); dims past `rotary_dim` are kept.
//!
//! Positions in a KV-cache call ([`Positions::for_kvcache`]): new key i of batch b at
//! `cache_seqlens[b] + i`; query row i at `cache_seqlens[b] + i` with a causal mask or a
//! window, else every query row of batch b at `cache_seqlens[b]` (flash-attn's rule).
//!
//! This module is the spec: the checks and the positions, for every backend. The wgpu call is
//! [`Context::forward_with_kvcache_rotary`](crate::Context::forward_with_kvcache_rotary) (and
//! [`Context::apply_rotary`](crate::Context::apply_rotary) alone); the f64 reference is
//! [`reference::rotary`](crate::unstable::reference::rotary).

use crate::config::AttentionConfig;
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRole};

/// The tables of a rotary embedding and how it pairs dims; `T` is a backend's tensor type.
#[derive(Debug)]
pub struct Rotary<'a, T> {
    /// `[table_rows, rotary_dim / 2]` in q's dtype: `cos(theta(p, f))` at row p, column f.
    pub cos: &'a T,
    /// `sin(theta(p, f))`, the shape and dtype of `cos`.
    pub sin: &'a T,
    /// Pairs `(2f, 2f + 1)` when true (GPT-J); `(f, f + rotary_dim / 2)` when false (GPT-NeoX).
    pub interleaved: bool,
}

impl<T> Clone for Rotary<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Rotary<'_, T> {}

/// Where the rows of a `[batch, rows, heads, head_dim]` tensor sit: row i of batch b at
/// `start[b] + i * step` (`step` 0 or 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Positions {
    /// The position of each batch's first row.
    pub start: Vec<usize>,
    /// 1: consecutive rows at consecutive positions; 0: a batch's rows at one position.
    pub step: usize,
}

impl Positions {
    /// Consecutive positions from each batch's `start`.
    pub fn from_starts(start: Vec<usize>) -> Positions {
        Positions { start, step: 1 }
    }

    /// The positions of a KV-cache call's queries and new keys (flash-attn's rule, in the
    /// module's doc): `(q, k_new)`.
    pub fn for_kvcache(cfg: &AttentionConfig, cache_seqlens: &[usize]) -> (Positions, Positions) {
        let step = usize::from(cfg.causal || cfg.window.is_active());
        (
            Positions {
                start: cache_seqlens.to_vec(),
                step,
            },
            Positions::from_starts(cache_seqlens.to_vec()),
        )
    }

    /// The position of row i of batch b.
    pub fn at(&self, b: usize, i: usize) -> usize {
        self.start[b] + i * self.step
    }
}

/// What the kernels need of the tables, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryDims {
    /// The dims turned: twice the tables' columns.
    pub rotary_dim: usize,
    /// The positions the tables hold.
    pub table_rows: usize,
}

/// Checks the tables' shapes (`cos` as `(shape, dtype)`, `sin` likewise) against `head_dim`
/// and `dtype` (the tensor they rotate): 2-d, at least one column, at most `head_dim / 2`
/// columns, `sin` shaped as `cos`, both in `dtype`.
pub fn check_tables(
    (cos, cos_dtype): (&[usize], DType),
    (sin, sin_dtype): (&[usize], DType),
    head_dim: usize,
    dtype: DType,
) -> Result<RotaryDims> {
    let fits = matches!(*cos, [rows, cols] if rows > 0 && cols > 0 && 2 * cols <= head_dim);
    if !fits {
        return Err(Error::invalid(format!(
            "rotary_cos must be [table_rows, rotary_dim / 2] with table_rows >= 1 and \
             1 <= rotary_dim / 2 <= head_dim / 2 = {}, got shape {cos:?}",
            head_dim / 2
        )));
    }
    if sin != cos {
        return Err(Error::Shape {
            tensor: TensorRole::RotarySin,
            expected: cos.to_vec(),
            got: sin.to_vec(),
        });
    }
    for (role, got) in [
        (TensorRole::RotaryCos, cos_dtype),
        (TensorRole::RotarySin, sin_dtype),
    ] {
        if got != dtype {
            return Err(Error::DType {
                tensor: role.to_string(),
                expected: dtype,
                got,
            });
        }
    }
    Ok(RotaryDims {
        rotary_dim: 2 * cos[1],
        table_rows: cos[0],
    })
}

/// Checks that every row of a `[positions.start.len(), rows, ..]` tensor has a position the
/// tables hold.
pub fn check_positions(dims: RotaryDims, positions: &Positions, rows: usize) -> Result<()> {
    for (b, &s) in positions.start.iter().enumerate() {
        let last = s + rows.saturating_sub(1) * positions.step;
        if last >= dims.table_rows {
            let rows_at = if positions.step == 0 {
                format!("{rows} rows at one position")
            } else {
                format!("{rows} rows from position {s}")
            };
            return Err(Error::invalid(format!(
                "the rotary tables hold positions 0..{}, but batch {b}'s rows reach position \
                 {last} ({rows_at}): give tables of at least {} rows",
                dims.table_rows,
                last + 1
            )));
        }
        if u32::try_from(last).is_err() {
            return Err(Error::invalid(format!(
                "rotary position {last} of batch {b} does not fit 32 bits"
            )));
        }
    }
    Ok(())
}

/// Every check of a rotation on any backend: `x` (`role` names it) is `[batch, rows, heads,
/// head_dim]`, `positions` holds one start per batch, the tables fit `x` ([`check_tables`])
/// and hold every position it reaches ([`check_positions`]). Returns `x`'s shape and the
/// tables' dims.
pub(crate) fn check_rotation(
    (role, shape, dtype): (TensorRole, &[usize], DType),
    cos: (&[usize], DType),
    sin: (&[usize], DType),
    positions: &Positions,
) -> Result<([usize; 4], RotaryDims)> {
    let shape = <[usize; 4]>::try_from(shape).map_err(|_| {
        Error::invalid(format!(
            "{role} must be [batch, rows, heads, head_dim] to be rotated, got shape {shape:?}"
        ))
    })?;
    if positions.start.len() != shape[0] {
        return Err(Error::invalid(format!(
            "rotary positions must hold one start per batch ([batch] = [{}]), got {}",
            shape[0],
            positions.start.len()
        )));
    }
    let dims = check_tables(cos, sin, shape[3], dtype)?;
    check_positions(dims, positions, shape[1])?;
    Ok((shape, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_and_positions_are_checked_with_what_was_expected() {
        let f = DType::F32;
        let d = check_tables((&[10, 4], f), (&[10, 4], f), 8, f).unwrap();
        assert_eq!((d.rotary_dim, d.table_rows), (8, 10));
        // too wide for the head, 1-d, empty, sin shaped otherwise, another dtype
        for cos in [&[10usize, 5][..], &[10], &[10, 0], &[0, 2]] {
            let e = check_tables((cos, f), (cos, f), 8, f);
            assert!(
                matches!(&e, Err(Error::InvalidConfig(m)) if m.contains("rotary_cos")),
                "{e:?}"
            );
        }
        let e = check_tables((&[10, 4], f), (&[9, 4], f), 8, f);
        assert!(matches!(
            e,
            Err(Error::Shape {
                tensor: TensorRole::RotarySin,
                ..
            })
        ));
        let e = check_tables((&[10, 4], DType::F16), (&[10, 4], f), 8, f);
        assert!(matches!(e, Err(Error::DType { .. })));
        // rows 0..3 of batch 1 from 7: positions 7, 8, 9 fit 10 rows; from 8 they do not
        check_positions(d, &Positions::from_starts(vec![0, 7]), 3).unwrap();
        let e = check_positions(d, &Positions::from_starts(vec![0, 8]), 3);
        assert!(
            matches!(&e, Err(Error::InvalidConfig(m)) if m.contains("batch 1") && m.contains("position 10")),
            "{e:?}"
        );
        // one position per batch: any row count
        let one = Positions {
            start: vec![9],
            step: 0,
        };
        check_positions(d, &one, 100).unwrap();
        assert_eq!(one.at(0, 50), 9);
    }

    #[test]
    fn kvcache_positions_follow_flash_attn() {
        let mut cfg = AttentionConfig::new(2, 3, 16, 2, 1, 8);
        let (q, k) = Positions::for_kvcache(&cfg, &[4, 9]);
        assert_eq!((q.at(1, 2), k.at(1, 2)), (9, 11));
        cfg.causal = true;
        let (q, _) = Positions::for_kvcache(&cfg, &[4, 9]);
        assert_eq!(q.at(1, 2), 11);
    }
}
