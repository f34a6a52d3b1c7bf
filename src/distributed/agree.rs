//! The ranks' agreement on a call, before any work. Each rank brings its [`Terms`] (the call's
//! fields in the caller's words, what is its own, or why it refused its inputs); one exchange
//! under the deadline gives every rank every rank's terms, and every rank reaches the same
//! verdict from them: the first rank that refused, with its reason; else the first field in
//! which a rank differs from rank 0, both values named; else every rank's terms.
//!
//! A refusal is an agreement round like any other (the same messages), so a rank that cannot
//! even build the call (a wrapper's own checks: the Python package's) still takes part in the
//! round the others make, and they fail at once with its reason rather than at the deadline.

use std::hash::{Hash, Hasher};

use super::comm::Comm;
use crate::error::{Error, Result};

/// What one rank brings to the agreement on a call ([`agree`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    /// The call's fields, `(name, value)` in the caller's words (`("causal", "true")`), in
    /// the order a difference is looked for: every rank must bring the same.
    pub call: Vec<(String, String)>,
    /// What is this rank's own (its rows, its shard), for the others to read.
    pub own: Vec<u64>,
    /// Why this rank refused its own inputs (its error's message); `None` where it took them.
    pub refused: Option<String>,
}

impl Terms {
    /// The terms of a rank that refused its inputs for `reason`.
    pub fn refusal(reason: impl Into<String>) -> Terms {
        Terms {
            refused: Some(reason.into()),
            ..Terms::default()
        }
    }
}

/// Longest value sent as it is; a longer one (a tensor's data) goes as its start and a digest.
const LONGEST: usize = 4096;

/// `value` as a term of the call: itself, or where it is longer than [`LONGEST`] its start and
/// a digest (SipHash with its fixed keys: the same on every rank of one build).
pub(crate) fn term(name: &str, value: impl std::fmt::Display) -> (String, String) {
    let value = value.to_string();
    if value.len() <= LONGEST {
        return (name.to_string(), value);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    let start: String = value.chars().take(64).collect();
    (
        name.to_string(),
        format!(
            "{start}... ({} chars, digest {:016x})",
            value.len(),
            h.finish()
        ),
    )
}

/// Every rank's terms, in rank order, where every rank took its inputs and all bring the same
/// call. Otherwise [`Error::Distributed`] on every rank alike: `rank r refused its inputs:
/// <its reason>` (the first that did), or `the ranks disagree on the call: rank r calls with
/// <field> = <value>, rank 0 with <field> = <value>` (the first rank and field that differ).
/// Every rank calls it together; a rank that does not answer within the deadline
/// ([`super::TIMEOUT_ENV`]) is an error naming it, as in any exchange.
pub fn agree(comm: &dyn Comm, mine: &Terms) -> Result<Vec<Terms>> {
    agree_counted(comm, mine).map(|(all, _)| all)
}

/// [`agree`], with the bytes this rank sent.
pub(crate) fn agree_counted(comm: &dyn Comm, mine: &Terms) -> Result<(Vec<Terms>, usize)> {
    let me = comm.rank();
    let (all, sent) = gather_varied(comm, &encode(mine))?;
    let all: Vec<Terms> = all
        .iter()
        .enumerate()
        .map(|(r, bytes)| {
            decode(bytes).ok_or_else(|| Error::Distributed {
                rank: me,
                message: format!("rank {r} sent terms of the call this build cannot read"),
            })
        })
        .collect::<Result<_>>()?;
    let failed = |message: String| Error::Distributed { rank: me, message };
    if let Some((r, reason)) = all
        .iter()
        .enumerate()
        .find_map(|(r, t)| t.refused.as_ref().map(|why| (r, why)))
    {
        return Err(failed(format!("rank {r} refused its inputs: {reason}")));
    }
    for (r, theirs) in all.iter().enumerate().skip(1) {
        let first = &all[0].call;
        let differs = theirs.call.iter().zip(first).find(|(a, b)| a != b);
        if let Some(((name, value), (name0, value0))) = differs {
            let (value, value0) = around_difference(value, value0);
            return Err(failed(format!(
                "the ranks disagree on the call: rank {r} calls with {name} = {value}, rank 0 \
                 with {name0} = {value0}"
            )));
        }
        if theirs.call.len() != first.len() {
            return Err(failed(format!(
                "the ranks disagree on the call: rank {r} brings {} of its fields, rank 0 {}",
                theirs.call.len(),
                first.len()
            )));
        }
    }
    Ok((all, sent))
}

/// Two values as a message shows them: whole where short, else the stretch around their first
/// difference (a long vector of slopes that differs in one head).
fn around_difference(a: &str, b: &str) -> (String, String) {
    const SHORT: usize = 60;
    if a.chars().count() <= SHORT && b.chars().count() <= SHORT {
        return (a.to_string(), b.to_string());
    }
    let at = a
        .chars()
        .zip(b.chars())
        .take_while(|(x, y)| x == y)
        .count()
        .saturating_sub(SHORT / 3);
    let cut = |s: &str| {
        let n = s.chars().count();
        let part: String = s.chars().skip(at).take(SHORT).collect();
        format!(
            "{}{part}{}",
            if at > 0 { "..." } else { "" },
            if at + SHORT < n { "..." } else { "" }
        )
    };
    (cut(a), cut(b))
}

/// Every rank's `mine`, of any length: the lengths first, then every rank's bytes padded to
/// the longest. Returns them in rank order, and the bytes this rank sent.
fn gather_varied(comm: &dyn Comm, mine: &[u8]) -> Result<(Vec<Vec<u8>>, usize)> {
    let size = comm.size();
    let lens = comm.all_gather(&(mine.len() as u64).to_le_bytes())?;
    let lens: Vec<usize> = lens
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .collect();
    let widest = lens.iter().copied().max().unwrap_or(0);
    let mut padded = mine.to_vec();
    padded.resize(widest, 0);
    let all = comm.all_gather(&padded)?;
    let each = (0..size)
        .map(|r| all[r * widest..r * widest + lens[r]].to_vec())
        .collect();
    Ok((each, (8 + widest) * size.saturating_sub(1)))
}

/// The terms as bytes: the refusal (a flag, then its text), the call's fields, the own words;
/// each text its length (u32) and UTF-8, each count a u32.
fn encode(t: &Terms) -> Vec<u8> {
    let mut out = Vec::new();
    let text = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    out.push(t.refused.is_some() as u8);
    if let Some(why) = &t.refused {
        text(&mut out, why);
    }
    out.extend_from_slice(&(t.call.len() as u32).to_le_bytes());
    for (name, value) in &t.call {
        text(&mut out, name);
        text(&mut out, value);
    }
    out.extend_from_slice(&(t.own.len() as u32).to_le_bytes());
    for w in &t.own {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// A reader of [`encode`]'s bytes.
struct Reader<'b>(&'b [u8]);

impl<'b> Reader<'b> {
    fn bytes(&mut self, n: usize) -> Option<&'b [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn count(&mut self) -> Option<usize> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?) as usize)
    }

    fn text(&mut self) -> Option<String> {
        let n = self.count()?;
        String::from_utf8(self.bytes(n)?.to_vec()).ok()
    }
}

fn decode(bytes: &[u8]) -> Option<Terms> {
    let mut r = Reader(bytes);
    let refused = match r.bytes(1)?[0] {
        0 => None,
        _ => Some(r.text()?),
    };
    let call = (0..r.count()?)
        .map(|_| Some((r.text()?, r.text()?)))
        .collect::<Option<_>>()?;
    let own = (0..r.count()?)
        .map(|_| Some(u64::from_le_bytes(r.bytes(8)?.try_into().ok()?)))
        .collect::<Option<_>>()?;
    r.0.is_empty().then_some(Terms { call, own, refused })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::LocalRing;

    /// `agree` over a ring of threads, rank r bringing `terms(r)`: every rank's result.
    fn over(n: usize, terms: impl Fn(usize) -> Terms + Sync) -> Vec<Result<Vec<Terms>>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = LocalRing::new(n)
                .into_iter()
                .map(|c| {
                    let terms = &terms;
                    s.spawn(move || agree(&c, &terms(c.rank())))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn message(r: &Result<Vec<Terms>>) -> String {
        match r {
            Err(Error::Distributed { message, .. }) => message.clone(),
            other => panic!("expected a distributed error, got {other:?}"),
        }
    }

    fn call(fields: &[(&str, &str)]) -> Terms {
        Terms {
            call: fields.iter().map(|(n, v)| term(n, v)).collect(),
            ..Terms::default()
        }
    }

    #[test]
    fn terms_read_back_as_they_were_sent() {
        let t = Terms {
            call: vec![term("causal", true), term("window", "(8, None)")],
            own: vec![3, u64::MAX],
            refused: Some("q holds 4 rows — not 2".into()),
        };
        assert_eq!(decode(&encode(&t)), Some(t.clone()));
        assert_eq!(decode(&encode(&Terms::default())), Some(Terms::default()));
        let bytes = encode(&t);
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
    }

    #[test]
    fn ranks_that_agree_read_each_others_own_words() {
        let got = over(3, |r| Terms {
            own: vec![10 + r as u64],
            ..call(&[("causal", "true")])
        });
        for all in got {
            let own: Vec<u64> = all.unwrap().iter().map(|t| t.own[0]).collect();
            assert_eq!(own, vec![10, 11, 12]);
        }
    }

    #[test]
    fn a_difference_names_the_rank_the_field_and_both_values_on_every_rank() {
        let got = over(3, |r| {
            call(&[
                ("heads_q", "4"),
                ("window", if r == 2 { "(8, 0)" } else { "(None, 0)" }),
            ])
        });
        for m in got.iter().map(message) {
            assert_eq!(
                m,
                "the ranks disagree on the call: rank 2 calls with window = (8, 0), rank 0 with \
                 window = (None, 0)"
            );
        }
    }

    #[test]
    fn a_refusal_carries_its_reason_to_every_rank_before_any_difference() {
        let got = over(3, |r| match r {
            1 => Terms::refusal("d_out holds 5 rows where out has 6"),
            _ => call(&[("causal", "true")]),
        });
        for m in got.iter().map(message) {
            assert_eq!(
                m,
                "rank 1 refused its inputs: d_out holds 5 rows where out has 6"
            );
        }
    }

    #[test]
    fn long_values_go_as_a_digest_and_show_around_their_difference() {
        let slopes = |x: f32| {
            format!(
                "{:?}",
                (0..40)
                    .map(|h| if h == 30 { x } else { 0.5 })
                    .collect::<Vec<f32>>()
            )
        };
        let got = over(2, |r| Terms {
            call: vec![term(
                "alibi_slopes",
                slopes(if r == 1 { 0.25 } else { 0.5 }),
            )],
            ..Terms::default()
        });
        let m = message(&got[0]);
        assert!(
            m.contains("rank 1 calls with alibi_slopes = ...") && m.contains("0.25"),
            "{m}"
        );
        let (name, long) = term("score_mod", "x".repeat(LONGEST + 1));
        assert_eq!(name, "score_mod");
        assert!(long.len() < 200 && long.contains("digest"), "{long}");
        assert_ne!(long, term("score_mod", "y".repeat(LONGEST + 1)).1);
    }
}
