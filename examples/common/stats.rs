//! Every bench reports the median of a point's repeats (the figure its tables, JSON and plots
//! use) with their min and max beside it: on a busy machine the best of the repeats flatters,
//! and the spread says how busy it was. Included by the examples as `mod stats`, each using
//! the part it needs.
#![allow(dead_code)]

/// Median, min and max of a point's timed repeats, in the unit they were given in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// Of `v` (NaN where it is empty); the median of an even count is the upper middle value.
    pub fn of(v: &[f64]) -> Stats {
        if v.is_empty() {
            return Stats {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        Stats {
            median: s[s.len() / 2],
            min: s[0],
            max: s[s.len() - 1],
        }
    }

    /// Each value times `k` (seconds to milliseconds: 1e3).
    pub fn scaled(self, k: f64) -> Stats {
        Stats {
            median: self.median * k,
            min: self.min * k,
            max: self.max * k,
        }
    }

    /// "min-max" with `prec` decimals, for a table cell beside the median.
    pub fn range(&self, prec: usize) -> String {
        format!("{:.prec$}-{:.prec$}", self.min, self.max)
    }
}

/// Wall milliseconds of `calls` calls timed side by side: `rounds` rounds, each running call 0,
/// 1, ... in turn, after one untimed round (it compiles the pipelines); `run(c)` runs call c
/// and waits for its results. One `Stats` a call.
pub fn interleaved_ms<E>(
    rounds: usize,
    calls: usize,
    mut run: impl FnMut(usize) -> Result<(), E>,
) -> Result<Vec<Stats>, E> {
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); calls];
    for round in 0..=rounds {
        for (c, times) in ms.iter_mut().enumerate() {
            let t = std::time::Instant::now();
            run(c)?;
            if round > 0 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(ms.iter().map(|v| Stats::of(v)).collect())
}
