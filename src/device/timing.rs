//! What a call's GPU time is kept as: a type of its own, below the context that holds the last
//! one and the recording that measures it (record.rs).

/// GPU time of the last `run`, from timestamp queries where the adapter has them.
/// Non-exhaustive: the library makes it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct GpuTiming {
    /// Seconds between the first dispatch's start and the last one's end.
    pub seconds: f64,
    /// True when measured with timestamp queries; false when it is wall-clock around a wait.
    pub from_timestamps: bool,
    /// With timestamps: seconds per kernel, summed over its dispatches, in order of first
    /// dispatch (where a call's time goes: the forward, or dK/dV against dQ). Empty without.
    pub per_kernel: Vec<(&'static str, f64)>,
}

/// The last call's time: measured with timestamps (read back when the call ran), or, without
/// them, pending until asked for.
pub(crate) enum LastTiming {
    Measured(GpuTiming),
    /// The wall clock from the call's start until its submission finished, taken when
    /// `last_gpu_timing` waits for it.
    Pending {
        start: super::clock::Instant,
        submission: wgpu::SubmissionIndex,
    },
}
