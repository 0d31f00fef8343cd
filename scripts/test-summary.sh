#!/usr/bin/env bash
# Sum the `test result:` lines of a cargo test log into one closing line, so the last line of
# `make test` states the whole run ("tests: N passed, N failed") rather than the last crate's
# doc-tests. Fails when nothing ran.
set -euo pipefail
log="$1"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) passed += $(i-1); if ($i ~ /^failed;?$/) failed += $(i-1); if ($i ~ /^ignored;?$/) ignored += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored; if (passed == 0 || failed > 0) exit 1 }' "$log"
