#!/usr/bin/env bash
# Sum the `test result:` lines of a cargo test log, and the closing line of a pytest log if
# given, into one line, so the last line of `make test` states the whole run ("tests: N passed,
# N failed") rather than the last crate's doc-tests. Fails when nothing ran.
set -euo pipefail
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) passed += $(i-1); if ($i ~ /^failed;?$/) failed += $(i-1); if ($i ~ /^ignored;?$/) ignored += $(i-1) } }
     /^(=+ )?[0-9]+ (passed|failed|skipped).* in [0-9.]+s/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) passed += $(i-1); if ($i ~ /^failed,?$/) failed += $(i-1); if ($i ~ /^skipped,?$/) ignored += $(i-1); if ($i ~ /^errors?,?$/) failed += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored; if (passed == 0 || failed > 0) exit 1 }' "$@"
