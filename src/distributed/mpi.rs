//! The ranks over MPI (feature `mpi`: the `mpi` crate, rsmpi, on the system's MPICH or Open
//! MPI): any communicator of a program that initialized MPI. A shift is a non-blocking send
//! to the next rank and receive from the one before, posted before the block's work and
//! completed after it, tested (MPI progresses large messages inside its calls) until its
//! deadline. A transfer given up at its deadline leaks its buffers on purpose: MPI may still
//! touch them.

use std::time::{Duration, Instant};

use mpi::point_to_point::{Destination, Source};
use mpi::request::{LocalScope, Request};
use mpi::topology::Communicator;

use super::comm::{late, timeout, Comm};
use crate::error::Result;

/// Our messages' tag, apart from the caller's own traffic on the communicator.
const TAG: i32 = 0x5a11;

/// A rank of an MPI communicator (`world`, or one the program split off).
pub struct MpiComm<'c, C: Communicator> {
    comm: &'c C,
    timeout: Duration,
}

impl<C: Communicator> std::fmt::Debug for MpiComm<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<'c, C: Communicator> MpiComm<'c, C> {
    /// This process's rank of `comm`, with the deadline of `FLASH_ATTN_MPI_TIMEOUT_S`.
    pub fn new(comm: &'c C) -> Self {
        MpiComm {
            comm,
            timeout: timeout(),
        }
    }

    /// This rank with its own deadline for a message.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        MpiComm { timeout, ..self }
    }
}

/// Tests `req` until it completes (`true`) or `deadline` passes (`false`: the request is
/// given up, unregistered from its scope, its buffer left to MPI).
fn finish<'a, D: ?Sized>(req: Request<'a, D, &LocalScope<'a>>, deadline: Instant) -> bool {
    let mut req = req;
    loop {
        match req.test() {
            Ok(_) => return true,
            Err(r) if Instant::now() >= deadline => {
                // SAFETY: the buffers are leaked by the caller, so MPI may finish with them
                // whenever it does
                unsafe {
                    let _ = r.into_raw();
                }
                return false;
            }
            Err(r) => {
                req = r;
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

impl<C: Communicator> Comm for MpiComm<'_, C> {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn shift(
        &self,
        send: Vec<u8>,
        recv_len: usize,
        during: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<u8>> {
        let (rank, size) = (self.rank(), self.size());
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let mut recv = vec![0u8; recv_len];
        let (done, sent, received) = mpi::request::scope(|scope| {
            let r = self
                .comm
                .process_at_rank(prev as i32)
                .immediate_receive_into_with_tag(scope, &mut recv[..], TAG);
            let s = self
                .comm
                .process_at_rank(next as i32)
                .immediate_send_with_tag(scope, &send[..], TAG);
            let done = during();
            // the deadline counts from the end of the work: the block's calls take what they
            // take; a missing rank is known within the deadline after them
            let deadline = Instant::now() + self.timeout;
            let sent = finish(s, deadline);
            let received = finish(r, deadline);
            (done, sent, received)
        });
        if !(sent && received) {
            std::mem::forget(recv);
            std::mem::forget(send);
            let from = if received { next } else { prev };
            return Err(late(rank, from, "message", self.timeout));
        }
        done?;
        Ok(recv)
    }
}
