#!/usr/bin/env bash
# rustdoc with the stable toolchain's unstable flags unlocked (RUSTC_BOOTSTRAP), for
# scripts/public-api.sh's JSON: given to cargo as RUSTDOC, so that only rustdoc sees the
# variable. Set for the whole cargo, it also reruns the build scripts that watch it
# (proc-macro2's), and every build sharing their outputs rebuilds (docs/log/ci-time.md).
RUSTC_BOOTSTRAP=1 exec rustdoc "$@"
