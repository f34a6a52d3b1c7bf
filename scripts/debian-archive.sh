#!/usr/bin/env bash
# Prints the URI of the main Debian archive this machine's apt sources already use (deb822
# .sources files first, then sources.list), for the ensure-* scripts that add a suite of it
# (bookworm-backports, a trixie root): no host name is written in the repository.
# Usage: bash scripts/debian-archive.sh [CODENAME]   (default: this machine's release)
set -euo pipefail
codename=${1:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
[ -n "$codename" ] || { echo "debian-archive: cannot tell the Debian release" >&2; exit 1; }
uri=""
for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    uri=$(awk -v cn="$codename" '
        /^[[:space:]]*$/ { if (u != "" && s ~ ("(^| )" cn "( |$)")) { print u; exit } u=""; s=""; next }
        /^URIs:/   { u=$2 }
        /^Suites:/ { $1=""; s=$0 }
        END { if (u != "" && s ~ ("(^| )" cn "( |$)")) print u }' "$f" | head -n1)
    [ -n "$uri" ] && break
done
if [ -z "$uri" ] && [ -e /etc/apt/sources.list ]; then
    uri=$(awk -v cn="$codename" '$1=="deb" && $3==cn { print $2; exit }' /etc/apt/sources.list)
fi
[ -n "$uri" ] || { echo "debian-archive: no Debian archive for ${codename} in the apt sources" >&2; exit 1; }
echo "$uri"
