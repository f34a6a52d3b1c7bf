#!/usr/bin/env python3
"""Reads the Khronos validation layer's messages (the tests' stdout: scripts/validation-layer.sh;
the GPU run's step logs: scripts/gpu-rehearse.sh) and fails on any validation error, or where
the loader's log (VK_LOADER_DEBUG=layer) does not show the layer inserted. Prints each kind of
message with its count. There is no allow-list: the one naga made us keep (explicit layouts on
Workgroup, Private and Function types) is gone since Vulkan gets our own SPIR-V (issue 49,
src/device/spirv.rs)."""
import re
import sys


def main(stdout, stderr):
    text = open(stdout, encoding="utf-8", errors="replace").read()
    loader = open(stderr, encoding="utf-8", errors="replace").read()
    inserted = len(re.findall(r"Insert instance layer \"?VK_LAYER_KHRONOS_validation", loader))
    if not inserted:
        sys.exit("validation-layer: the loader never inserted VK_LAYER_KHRONOS_validation")
    print(f"validation-layer: the layer was inserted in {inserted} instances")
    # a message starts at "Validation Error:" / "Validation Warning:" / "Validation Performance"
    starts = [m.start() for m in re.finditer(r"^Validation (Error|Warning|Performance Warning|Information)", text, re.M)]
    blocks = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    errors, warnings = {}, {}
    for block in blocks:
        head = block.splitlines()[0]
        vuid = re.search(r"\[ (\S+) \]", head)
        vuid = vuid.group(1) if vuid else "?"
        if not head.startswith("Validation Error"):
            warnings[vuid] = warnings.get(vuid, 0) + 1
            continue
        errors.setdefault(vuid, []).append(block.strip())
    for vuid, n in sorted(warnings.items()):
        print(f"validation-layer: warning {n} x {vuid}")
    if errors:
        for vuid, found in sorted(errors.items()):
            print(f"validation-layer: ERROR {len(found)} x {vuid}; the first:\n{found[0]}\n")
        sys.exit(f"validation-layer: {sum(map(len, errors.values()))} validation errors")
    print(f"validation-layer: {len(blocks)} messages, no validation error")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
