//! A missing NVRTC is a typed error that says how to get one, not a panic (cudarc panics when
//! asked for a library it cannot find). Its own test binary, so that no other test has loaded
//! NVRTC into the process first.
#![cfg(feature = "cuda")]

use flash_attn_wgpu::cuda::nvrtc::Nvrtc;
use flash_attn_wgpu::Error;

#[test]
fn a_missing_nvrtc_is_a_typed_error_not_a_panic() {
    let empty = std::env::temp_dir().join(format!("no-nvrtc-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let got = std::panic::catch_unwind(|| Nvrtc::load_from(Some(&empty)).map(|n| n.version()));
    std::fs::remove_dir_all(&empty).unwrap();
    match got {
        Ok(Err(Error::CudaUnavailable { missing, fix })) => {
            assert!(
                missing.contains("NVRTC") && missing.contains("no-nvrtc"),
                "{missing}"
            );
            assert!(fix.contains("ensure-cuda.sh"), "{fix}");
        }
        Ok(other) => panic!("expected CudaUnavailable, got {other:?}"),
        Err(_) => panic!("loading NVRTC from an empty folder panicked"),
    }
}

/// The test binaries' NVRTC folder is fixed where they were built (tests/common/nvrtc.rs) and
/// absent on a machine they were carried to: a context asked to take NVRTC from a folder that
/// does not exist is a typed error (the driver's absence where there is none, as here; NVRTC's
/// beside a device), never a panic.
#[test]
fn a_context_with_an_nvrtc_folder_that_does_not_exist_is_a_typed_error() {
    use flash_attn_wgpu::cuda::CudaContext;
    let gone = std::env::temp_dir().join(format!("no-such-folder-{}/lib", std::process::id()));
    let got = std::panic::catch_unwind(|| CudaContext::with_nvrtc_dir(0, Some(&gone)).map(|_| ()));
    match got {
        Ok(Err(Error::CudaUnavailable { missing, .. })) => {
            // no driver: the driver named; a driver and a device: the folder named
            assert!(
                missing.contains("driver")
                    || missing.contains("CUDA device")
                    || missing.contains("no-such-folder"),
                "{missing}"
            );
        }
        Ok(other) => panic!("expected CudaUnavailable, got {other:?}"),
        Err(_) => panic!("a context with a missing NVRTC folder panicked"),
    }
}
