# Sourced by the checks that run under the Khronos validation layer (validation-layer.sh,
# gpu-rehearse.sh): `validation_env DIR` writes the layer's manifest into DIR (Debian's chromium
# ships the layer's library without one) and exports what puts the layer in every Vulkan
# instance the process and its children make: synchronization validation on, every message
# (no limit of ten a kind) printed to the process's stdout, which libtest does not capture and
# a step's log keeps, and the loader's note that it inserted the layer (stderr).
# validation_report.py reads both. Needs LIB, the layer's library.
validation_env() {
    local dir=$1
    cat >"$dir/VkLayer_khronos_validation.json" <<JSON
{
  "file_format_version": "1.2.0",
  "layer": {
    "name": "VK_LAYER_KHRONOS_validation",
    "type": "GLOBAL",
    "library_path": "$LIB",
    "api_version": "1.3.0",
    "implementation_version": "1",
    "description": "Khronos validation layer (Debian's chromium package)"
  }
}
JSON
    export VK_LAYER_PATH=$dir VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation
    export VK_KHRONOS_VALIDATION_VALIDATE_SYNC=true
    export VK_KHRONOS_VALIDATION_DEBUG_ACTION=VK_DBG_LAYER_ACTION_LOG_MSG
    export VK_LOADER_DEBUG=layer
    export VK_KHRONOS_VALIDATION_ENABLE_MESSAGE_LIMIT=false
}
