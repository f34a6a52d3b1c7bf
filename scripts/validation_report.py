#!/usr/bin/env python3
"""Reads the Khronos validation layer's messages (the tests' stdout: scripts/validation-layer.sh)
and fails on any validation error that the allow-list does not name exactly, or where the
loader's log (stderr, VK_LOADER_DEBUG=layer) does not show the layer inserted. Prints each
kind of message with its count."""
import re
import sys

# Each entry: (VUID, the function, a regular expression the message's text must match, why).
# Only SPIR-V that naga writes is allowed, until issue 49 ships SPIR-V without it.
ALLOWED = [
    (
        "VUID-StandaloneSpirv-None-10684",
        "vkCreateShaderModule",
        r"Invalid explicit layout decorations on type '[^']*', the Workgroup storage class has "
        r"an explicit layout from the ArrayStride decoration",
        "naga decorates every array type with ArrayStride, also one that backs a var<workgroup> "
        "(gfx-rs/wgpu#7696; fix pending in gfx-rs/wgpu#9295; issue 49; reproduction in "
        "docs/TESTING.md, 'The validation layer')",
    ),
    (
        "VUID-StandaloneSpirv-None-10684",
        "vkCreateShaderModule",
        r"Invalid explicit layout decorations on type '[^']*', the (Private|Function) storage class has "
        r"an explicit layout from the (ArrayStride|Offset) decoration",
        "naga, writing SPIR-V 1.6 (wgpu's choice on a Vulkan 1.3 device), decorates the arrays "
        "and structs behind Private and Function variables too (issue 49; docs/TESTING.md, 'The "
        "validation layer')",
    ),
]


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
    allowed, errors, warnings = {}, {}, {}
    for block in blocks:
        head = block.splitlines()[0]
        vuid = re.search(r"\[ (\S+) \]", head)
        vuid = vuid.group(1) if vuid else "?"
        if not head.startswith("Validation Error"):
            warnings[vuid] = warnings.get(vuid, 0) + 1
            continue
        for entry in ALLOWED:
            if vuid == entry[0] and entry[1] in block and re.search(entry[2], block):
                key = f"{vuid}: {entry[3]}"
                allowed[key] = allowed.get(key, 0) + 1
                break
        else:
            errors.setdefault(vuid, []).append(block.strip())
    for what, n in sorted(allowed.items()):
        print(f"validation-layer: allowed {n} x {what}")
    for vuid, n in sorted(warnings.items()):
        print(f"validation-layer: warning {n} x {vuid}")
    if errors:
        for vuid, found in sorted(errors.items()):
            print(f"validation-layer: ERROR {len(found)} x {vuid}; the first:\n{found[0]}\n")
        sys.exit(f"validation-layer: {sum(map(len, errors.values()))} errors past the allow-list")
    print(f"validation-layer: {len(blocks)} messages, none past the allow-list")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
