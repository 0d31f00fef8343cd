#!/usr/bin/env bash
# Sum a Rust test log (cargo test's `test result:` lines, or nextest's `Summary` line) and the
# closing line of a pytest log into one line, so the last line of `make test` states the whole
# run ("tests: N passed, N failed, N skipped"). Fails when nothing ran or anything failed.
set -euo pipefail
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) passed += $(i-1); if ($i ~ /^failed;?$/) failed += $(i-1); if ($i ~ /^ignored;?$/) ignored += $(i-1) } }
     /^ *Summary \[/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) passed += $(i-1); if ($i ~ /^failed,?$/) failed += $(i-1); if ($i ~ /^skipped,?$/) ignored += $(i-1); if ($i == "timed" && $(i+1) ~ /^out,?$/) failed += $(i-1) } }
     /^(=+ )?[0-9]+ (passed|failed|skipped).* in [0-9.]+s/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed,?$/) passed += $(i-1); if ($i ~ /^failed,?$/) failed += $(i-1); if ($i ~ /^skipped,?$/) ignored += $(i-1); if ($i ~ /^errors?,?$/) failed += $(i-1) } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored; if (passed == 0 || failed > 0) exit 1 }' "$@"
