#!/usr/bin/env bash
# MPI for context parallelism (issue 63): Debian's MPICH (mpiexec, libmpich-dev) and what the
# `mpi` crate (rsmpi) needs to build its bindings (libclang-dev, for bindgen). mpi4py's
# wheels (the Python package's distributed tests) load the MPICH ABI's libmpi.so.12, which
# Debian names libmpich.so.12: a link by that name is made where there is none.
# Idempotent: installs nothing the second time.
set -euo pipefail
log() { echo "ensure-mpi: $*" >&2; }
if [ "$(uname -s)" != Linux ]; then
    log "not Linux: install an MPI (MPICH or Open MPI) by hand"
    exit 0
fi
missing=()
command -v mpiexec >/dev/null || missing+=(mpich)
dpkg-query -W -f='${Status}' libmpich-dev 2>/dev/null | grep -q 'ok installed' || missing+=(libmpich-dev)
dpkg-query -W -f='${Status}' libclang-dev 2>/dev/null | grep -q 'ok installed' || missing+=(libclang-dev)
if [ ${#missing[@]} -gt 0 ]; then
    bash "$(dirname "$0")/apt-install.sh" ensure-mpi "${missing[@]}"
fi
lib=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libmpich\.so\.12 / { print $NF; exit }')")")
if [ -n "$lib" ] && [ -e "$lib/libmpich.so.12" ] && ! ldconfig -p | grep -q 'libmpi\.so\.12 '; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    log "linking $lib/libmpi.so.12 -> libmpich.so.12 (the MPICH ABI's name, which mpi4py loads)"
    $SUDO ln -sf libmpich.so.12 "$lib/libmpi.so.12"
    $SUDO ldconfig
fi
log "$(mpiexec --version 2>/dev/null | awk '/Version:/ { print "MPICH " $2; exit }') present"
