"""What the Python tests share: the run's seed, random arrays, tolerances and the
comparison against the float64 reference."""

import os

import numpy as np

SEED = int(os.environ.get("FA_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
# tolerances: f32 results to f32 rounding; halves to their rounding of inputs and outputs
TOL = {np.float32: 2e-5, np.float16: 4e-3, "bfloat16": 3e-2}


def dtypes():
    out = [np.float32, np.float16]
    try:
        import ml_dtypes

        out.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return out


def tol(dtype):
    return TOL.get(dtype, TOL["bfloat16"])


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def close(got, want, atol, what):
    got = np.asarray(got, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0)))
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), f"{what}: infinities differ (seed {SEED})"
    assert np.array_equal(got[~fin], want[~fin]), f"{what}: infinities differ (seed {SEED})"
    err = float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))
    assert err <= atol * scale, f"{what}: max error {err:.3e} > {atol * scale:.3e} (seed {SEED})"
