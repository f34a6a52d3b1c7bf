# Sourced by the checks that use a part of Debian's chromium package (scripts/ensure-web.sh
# installs it): `chromium_part FILE REQUIRE_VAR LABEL` returns where FILE exists; where it does
# not, it ends the calling script: failing when the variable named REQUIRE_VAR is set (CI's
# run-tests.sh sets it), else skipping with a message.
chromium_part() {
    local file=$1 require=$2 label=$3
    [ -f "$file" ] && return 0
    if [ -n "${!require:-}" ]; then
        echo "$label: $file not found (scripts/ensure-web.sh installs chromium)" >&2
        exit 1
    fi
    echo "$label: $file not found; skipped (scripts/ensure-web.sh installs it)" >&2
    exit 0
}
