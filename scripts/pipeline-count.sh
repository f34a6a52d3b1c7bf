#!/usr/bin/env bash
# Counts the distinct pipelines a test run compiled, from the logs FLASH_ATTN_PIPELINE_LOG=DIR
# made (src/kernels/cache.rs): distinct sources (what lavapipe compiles: its shader cache
# serves a repeat) and distinct labels, and the kernels they are. With a budget, fails past it.
#
#   bash scripts/pipeline-count.sh DIR [BUDGET]
set -euo pipefail
dir=${1:?usage: pipeline-count.sh DIR [BUDGET]}
budget=${2:-}
files=("$dir"/pipelines-*.txt)
[ -e "${files[0]}" ] || { echo "pipeline-count: no logs in $dir" >&2; exit 2; }
distinct=$(cut -f1 "${files[@]}" | sort -u | wc -l)
labels=$(cut -f2 "${files[@]}" | sort -u | wc -l)
echo "pipeline-count: $distinct distinct pipelines ($labels distinct keys) in ${#files[@]} processes"
# `sed -n` reads to the end where `head` would stop early: under pipefail, a sort still writing
# when head exits fails the script with SIGPIPE (141)
cut -f2 "${files[@]}" | sort -u | awk '{print $1}' | sort | uniq -c | sort -rn | sed -n '1,40p'
# Which tests cost pipelines of their own (compiled by no other test: what leaving the test out
# would save), from the test name each line carries (the creating thread's: libtest names it).
echo "pipeline-count: pipelines only one test compiles, by test (the 25 with most)"
awk -F'\t' 'NF >= 4 { if (!(($1, $4) in seen)) { seen[$1, $4] = 1; n[$1]++; who[$1] = $4 } }
    END { for (h in n) if (n[h] == 1) own[who[h]]++; for (t in own) print own[t] "\t" t }' \
    "${files[@]}" | sort -rn | sed -n '1,25p'
if [ -n "$budget" ] && [ "$distinct" -gt "$budget" ]; then
    echo "pipeline-count: $distinct distinct pipelines, the budget is $budget" >&2
    exit 1
fi
