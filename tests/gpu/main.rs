//! The suite that runs on an adapter (lavapipe in CI, whatever `Context::new` picks
//! elsewhere): one test binary with a module per behaviour family, so that the suite links
//! once and the GPU check carries one executable. Every module checks its calls against the
//! f64 reference on fresh random data. The compiler checks (`portability`, `shaders`,
//! `cuda_compile`), the Dawn replays (`dawn`) and the NVRTC-less process (`cuda_missing`)
//! are binaries of their own.

#[path = "../common/mod.rs"]
mod common;

mod backends;
mod backward;
mod bias;
mod call_blocks;
mod combinations;
mod concurrency;
mod context_parallel;
mod coop;
mod decode;
mod driver;
mod dtypes;
mod errors;
mod forward;
mod fuzz;
mod head_dims;
mod hidden;
mod interop;
mod kvcache;
mod latent;
mod limits;
mod merge;
mod nonfinite;
mod paged;
mod score_mod;
mod split;
mod trainable;
mod variants;
mod views;
