//! How the ranks of a context-parallel call talk: a ring (each rank sends to the next and
//! receives from the one before) and an all-gather, over MPI (`MpiComm`, feature `mpi`) or
//! between threads of one process (`LocalRing`: the tests, and several GPUs of one machine
//! driven from one process). Every wait has a deadline ([`timeout`]), so that a rank that
//! died or never came makes the others fail with [`Error::Distributed`] instead of hanging.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use crate::error::{Error, Result};

/// `FLASH_ATTN_MPI_TIMEOUT_S`: seconds a rank waits for a message before it gives up with
/// [`Error::Distributed`] (default [`DEFAULT_TIMEOUT_S`]).
pub const TIMEOUT_ENV: &str = "FLASH_ATTN_MPI_TIMEOUT_S";

/// The default of [`TIMEOUT_ENV`].
pub const DEFAULT_TIMEOUT_S: u64 = 120;

/// How long a rank waits for one message ([`TIMEOUT_ENV`]).
pub fn timeout() -> Duration {
    let s = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(DEFAULT_TIMEOUT_S as f64);
    Duration::from_secs_f64(s)
}

/// The error a rank gives when a message does not come in time.
pub(crate) fn late(rank: usize, from: usize, what: &str, after: Duration) -> Error {
    Error::Distributed {
        rank,
        message: format!(
            "no {what} from rank {from} within {:.0} s ({TIMEOUT_ENV}): that rank died, left \
             the call, or is stuck; every rank must make the same calls in the same order",
            after.as_secs_f64()
        ),
    }
}

/// A rank of a context-parallel call: its place in the ring and the two exchanges the
/// algorithms use.
pub trait Comm {
    /// This rank, from 0.
    fn rank(&self) -> usize;
    /// The ranks in the ring.
    fn size(&self) -> usize;
    /// Sends `send` to rank `(rank + 1) % size` and receives the `recv_len` bytes rank
    /// `(rank + size - 1) % size` sends, running `during` while the messages travel (the
    /// overlap of communication with computation); returns what was received. Every rank
    /// calls it together. The buffers are the callee's, so that a transfer given up at its
    /// deadline cannot touch memory the caller frees.
    fn shift(
        &self,
        send: Vec<u8>,
        recv_len: usize,
        during: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u8>>;

    /// Every rank's `mine` (the same length on every rank), concatenated in rank order; by
    /// default `size - 1` shifts round the ring.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>> {
        let (n, size, rank) = (mine.len(), self.size(), self.rank());
        let mut all = vec![0u8; n * size];
        all[rank * n..(rank + 1) * n].copy_from_slice(mine);
        let mut cur = mine.to_vec();
        for s in 1..size {
            cur = self.shift(cur, n, &mut || Ok(()))?;
            let from = (rank + size - s) % size;
            all[from * n..(from + 1) * n].copy_from_slice(&cur);
        }
        Ok(all)
    }
}

/// A ring of threads in one process: `LocalRing::new(n)` gives n ranks, one per thread (and
/// context, where a machine has several GPUs). Messages are moved, not copied twice.
#[derive(Debug)]
pub struct LocalRing {
    rank: usize,
    size: usize,
    timeout: Duration,
    to_next: Sender<Vec<u8>>,
    from_prev: Receiver<Vec<u8>>,
}

impl LocalRing {
    /// The `n` ranks of a ring, in rank order.
    pub fn new(n: usize) -> Vec<LocalRing> {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        // rank r sends into r + 1's receiver
        let mut senders: Vec<Option<Sender<Vec<u8>>>> = senders.into_iter().map(Some).collect();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, from_prev)| LocalRing {
                rank,
                size: n,
                timeout: timeout(),
                to_next: senders[(rank + 1) % n].take().expect("one sender a rank"),
                from_prev,
            })
            .collect()
    }

    /// This rank with its own deadline for a message, in place of [`TIMEOUT_ENV`]'s.
    pub fn with_timeout(self, timeout: Duration) -> LocalRing {
        LocalRing { timeout, ..self }
    }
}

impl Comm for LocalRing {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn shift(
        &self,
        send: Vec<u8>,
        recv_len: usize,
        during: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u8>> {
        let prev = (self.rank + self.size - 1) % self.size;
        // a closed channel is a rank that left: the same error as one that is late
        let sent = self.to_next.send(send);
        let done = during();
        let wait = self.timeout;
        let got = match self.from_prev.recv_timeout(wait) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                return Err(late(self.rank, prev, "message", wait))
            }
        };
        if sent.is_err() {
            return Err(late(
                self.rank,
                (self.rank + 1) % self.size,
                "receiver",
                wait,
            ));
        }
        done?;
        if got.len() != recv_len {
            return Err(Error::Distributed {
                rank: self.rank,
                message: format!(
                    "rank {prev} sent {} bytes where {recv_len} were expected: the ranks \
                     disagree on the call",
                    got.len()
                ),
            });
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_ring_shifts_and_gathers_in_rank_order() {
        let ranks = LocalRing::new(3);
        let got: Vec<(Vec<u8>, Vec<u8>)> = std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut ran = false;
                        let shifted = c
                            .shift(vec![c.rank() as u8; 2], 2, &mut || {
                                ran = true;
                                Ok(())
                            })
                            .unwrap();
                        assert!(ran);
                        (shifted, c.all_gather(&[10 + c.rank() as u8]).unwrap())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got[0].0, vec![2, 2]);
        assert_eq!(got[1].0, vec![0, 0]);
        for (_, all) in &got {
            assert_eq!(all, &vec![10, 11, 12]);
        }
    }

    #[test]
    fn a_rank_that_never_comes_is_a_typed_error_in_bounded_time() {
        let mut ranks: Vec<LocalRing> = LocalRing::new(2)
            .into_iter()
            .map(|r| r.with_timeout(Duration::from_millis(500)))
            .collect();
        let gone = ranks.pop();
        // rank 1 sends nothing: rank 0 waits its deadline, then says who is missing
        let started = std::time::Instant::now();
        let e = ranks[0].shift(vec![1], 1, &mut || Ok(())).unwrap_err();
        drop(gone);
        assert!(started.elapsed() < Duration::from_secs(5));
        match e {
            Error::Distributed { rank, message } => {
                assert_eq!(rank, 0);
                assert!(message.contains("from rank 1"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
