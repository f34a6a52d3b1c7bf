//! Test tiers (docs/TESTING.md, "Tiers"). The README's test command, which CI runs, is the CI
//! tier: every feature proven forward and backward against the f64 reference, each product of
//! cases (formats x families x shapes) in a sample that still meets every value of each factor.
//! The full tier (`bash scripts/test-full.sh`) adds the tests marked
//! `#[ignore = "full tier ..."]` and sets [`FULL_ENV`], which makes the sampled products whole:
//! on lavapipe a pipeline is seconds of LLVM, so the full products are for a GPU machine
//! (scripts/gpu-run.sh runs them) or an hour of CPU.

/// Set to 1 to run every product whole.
pub const FULL_ENV: &str = "FLASH_ATTN_TEST_FULL";

/// Whether this is the full tier.
pub fn full() -> bool {
    std::env::var(FULL_ENV).is_ok_and(|v| v == "1")
}

/// Whether `backend` runs a product whole: in the full tier, and always on CUDA, whose only
/// correctness suite is tests/gpu/backends.rs (the CI tier samples only wgpu's, which the
/// other modules cover family by family).
pub fn whole_on(backend: flash_attn_wgpu::Backend) -> bool {
    full() || backend != flash_attn_wgpu::Backend::Wgpu
}

/// Pairs each of `a` with one of `b` in turns (for the `i`-th of `a`, the first of
/// `b[i], b[i + 1], ...` (cyclic) that `ok` accepts), then each value of `b` no turn reached
/// with the first of `a` that accepts it: every value of both runs. In the full tier, every
/// accepted pair.
pub fn pairs<A: Clone, B: Clone>(a: &[A], b: &[B], ok: impl Fn(&A, &B) -> bool) -> Vec<(A, B)> {
    let mut taken = Vec::new();
    if full() {
        for (i, x) in a.iter().enumerate() {
            for (j, y) in b.iter().enumerate() {
                if ok(x, y) {
                    taken.push((i, j));
                }
            }
        }
    } else {
        for (i, x) in a.iter().enumerate() {
            if let Some(j) = (0..b.len())
                .map(|k| (i + k) % b.len())
                .find(|&j| ok(x, &b[j]))
            {
                taken.push((i, j));
            }
        }
        for (j, y) in b.iter().enumerate() {
            if !taken.iter().any(|&(_, t)| t == j) {
                if let Some(i) = a.iter().position(|x| ok(x, y)) {
                    taken.push((i, j));
                }
            }
        }
    }
    taken
        .into_iter()
        .map(|(i, j)| (a[i].clone(), b[j].clone()))
        .collect()
}

/// `items` in the full tier; in the CI tier the ones at `keep` (indices; those past the end
/// are left out).
pub fn sample<T: Clone>(items: &[T], keep: &[usize]) -> Vec<T> {
    if full() {
        return items.to_vec();
    }
    keep.iter().filter_map(|&i| items.get(i).cloned()).collect()
}
