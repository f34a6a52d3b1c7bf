//! The driver canary: Mesa lavapipe older than 25 silently stops shader loops after about
//! 65,535 iterations, which would corrupt long attention rows. `Context::new` refuses it.

use super::Context;
use crate::error::{Error, Result};
use crate::kernels::{Kernel, KernelKey, Params};
use crate::record::Dispatch;

/// Iterations of the driver canary loop: well past the 65,535 where old lavapipe stops.
pub const CANARY_ITERATIONS: u32 = 200_000;

impl Context {
    /// Runs a loop of `CANARY_ITERATIONS` in one shader invocation and checks the count.
    /// Mesa lavapipe older than 25 stops such loops after ~65,535 iterations with no error.
    pub fn driver_canary(&self) -> Result<()> {
        self.blocking("the driver canary", self.driver_canary_async())?
    }

    /// [`driver_canary`](Context::driver_canary) as a future (`Context::new_async` awaits
    /// it, so context creation never blocks in a browser).
    pub async fn driver_canary_async(&self) -> Result<()> {
        let counter = self.create_storage(2 * 4, "canary")?;
        let key = KernelKey::plain(Kernel::Canary);
        let seed = 12345u32;
        let params = Params {
            total_items: CANARY_ITERATIONS,
            slice_base: seed,
            ..Default::default()
        };
        self.run(&[Dispatch {
            key,
            params,
            buffers: vec![&counter.buffer],
            windows: Vec::new(),
            workgroups: 1,
        }])?;
        let got: Vec<u32> = self.read_buffer_at_async(&counter.buffer, 0, 2).await?;
        let mut hash = seed;
        for _ in 0..CANARY_ITERATIONS {
            hash = hash.wrapping_mul(1664525).wrapping_add(1013904223);
        }
        if got[0] != CANARY_ITERATIONS || got[1] != hash {
            return Err(Error::DriverCanary {
                expected: CANARY_ITERATIONS,
                got: got[0],
            });
        }
        Ok(())
    }
}
