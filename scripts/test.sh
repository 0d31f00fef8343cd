#!/usr/bin/env bash
# `make test`: every test tier, each stage timed, a table of the stages at the end.
#
#   scripts/test.sh            (JOBS, FUZZ_SHORT_SECONDS, PYTHON and VENV come from make)
#
# One debug build serves the cargo tests, the pytest suite (its `stoker` processes) and the
# Python package (a debug wheel: its dependencies are the ones the test build already compiled).
# The fuzz targets need their own instrumented build; it and the short fuzz runs, the container
# images and the pytest suite go on beside the cargo tests, which spend much of their time
# waiting on sockets and timers.
#
# A failing stage does not stop the next: the table shows every stage's result, and the script
# exits non-zero if any failed. cargo-nextest runs the Rust tests when it is installed (each
# test in its own process, all binaries at once, one failure hiding nothing); otherwise
# `cargo test --no-fail-fast`.
set -uo pipefail
cd "$(dirname "$0")/.."

JOBS=${JOBS:-2}
FUZZ_SHORT_SECONDS=${FUZZ_SHORT_SECONDS:-15}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-$PWD/$VENV/bin/python}
LOGS=target/test-logs
mkdir -p "$LOGS"
script_start=$(date +%s)

names=()
seconds=()
results=()
failed=0

# record NAME START STATUS: one row of the table.
record() {
    names+=("$1")
    seconds+=("$(($(date +%s) - $2))")
    if [[ $3 -eq 0 ]]; then results+=("ok"); else results+=("FAILED (exit $3)"); failed=1; fi
}

# stage NAME COMMAND...: run, log to target/test-logs/NAME.log and the terminal, time it.
stage() {
    local name=$1 start status
    shift
    echo "==> $name: $*"
    start=$(date +%s)
    "$@" 2>&1 | tee "$LOGS/$name.log"
    status=${PIPESTATUS[0]}
    record "$name" "$start" "$status"
    return "$status"
}

stage deps make --no-print-directory deps test-deps venv || { echo "test: cannot install what the tests need" >&2; exit 1; }

if cargo nextest --version >/dev/null 2>&1; then
    build=(cargo nextest run --build-jobs "$JOBS" --workspace --no-run)
    # Benchmarks (tests in modules named `*_bench`, ignored for `cargo test`) are run by name for
    # BENCHMARKS.md, never here: they measure, they do not check.
    run=(cargo nextest run --build-jobs "$JOBS" --workspace --no-fail-fast --run-ignored all --test-threads "$JOBS"
        --failure-output final --success-output never --status-level fail --final-status-level slow
        -E 'not test(/^[a-z_]+_bench::/)')
else
    echo "test: cargo-nextest not installed; running cargo test (slower: one binary at a time)"
    build=(cargo test -j"$JOBS" --workspace --no-run)
    run=(cargo test -j"$JOBS" --workspace --no-fail-fast -- --include-ignored --skip _bench::)
fi
stage build "${build[@]}"

# The fuzz build and runs go on beside the cargo tests.
fuzz_start=$(date +%s)
(JOBS=1 scripts/fuzz.sh "$FUZZ_SHORT_SECONDS" >"$LOGS/fuzz.log" 2>&1) &
fuzz_pid=$!

# The container images of deploy/ (python/tests/test_compose.py) are made beside the cargo
# tests too, from the debug `stoker` the build made: the debootstrap base and Prometheus's
# Debian packages are mostly downloads. The test finds them built (or builds what is missing).
images_start=$(date +%s)
rm -f "$LOGS/images.status"
if docker info >/dev/null 2>&1; then
    (deploy/build-images --binary target/debug/stoker >"$LOGS/images.log" 2>&1; echo $? >"$LOGS/images.status") &
    images_pid=$!
else
    echo "no Docker engine answers: the compose tests will skip (fail under CI)" >"$LOGS/images.log"
    echo 0 >"$LOGS/images.status"
    images_pid=""
fi

# A debug wheel: the same dependency builds as the tests; `make wheel` makes the release one.
wheel() {
    rm -f target/wheels/stoker-*.whl
    (cd python && VIRTUAL_ENV=$(dirname "$(dirname "$PYTHON")") CARGO_BUILD_JOBS=$JOBS \
        "$(dirname "$PYTHON")/maturin" build --quiet --out "$PWD/../target/wheels") &&
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall target/wheels/stoker-*.whl
}

pytest_run() {
    local wheel_file
    wheel_file=$(ls "$PWD"/target/wheels/stoker-*.whl 2>/dev/null | head -n 1)
    (cd python && STOKER_BIN=$PWD/../target/debug/stoker STOKER_WHEEL=$wheel_file "$PYTHON" -m pytest -q -rfEs --durations=15)
}

# The wheel's build takes the build folder's lock: it goes before the cargo tests, which would
# wait for it anyway.
stage wheel wheel

# The pytest suite against real `stoker` processes goes on beside the cargo tests: both mostly
# wait on sockets, timers and child processes; one after the other they made `make test` about
# 6 minutes longer. It starts once the images are built (its compose tests would otherwise
# build them a second time), and writes its log, exit status and seconds for the table.
pytest_beside() {
    for _ in $(seq 1 1200); do
        [[ -f $LOGS/images.status ]] && break
        sleep 1
    done
    local start
    start=$(date +%s)
    pytest_run >"$LOGS/pytest.log" 2>&1
    echo $? >"$LOGS/pytest.status"
    echo $(($(date +%s) - start)) >"$LOGS/pytest.seconds"
}
rm -f "$LOGS"/pytest.{status,seconds}
pytest_beside &
pytest_pid=$!

STOKER_PYTHON=$PYTHON stage cargo-tests "${run[@]}"

echo "==> fuzz: waiting for the fuzz build and runs (log: $LOGS/fuzz.log)"
wait "$fuzz_pid"
fuzz_status=$?
tail -n 3 "$LOGS/fuzz.log"
[[ $fuzz_status -eq 0 ]] || tail -n 40 "$LOGS/fuzz.log"
record "fuzz (beside)" "$fuzz_start" "$fuzz_status"

if [[ -n $images_pid ]]; then
    wait "$images_pid"
    images_status=$?
    tail -n 3 "$LOGS/images.log"
    record "images (beside)" "$images_start" "$images_status"
fi

echo "==> pytest: waiting for it (log: $LOGS/pytest.log)"
wait "$pytest_pid"
pytest_status=$(cat "$LOGS/pytest.status" 2>/dev/null || echo 1)
if [[ $pytest_status -eq 0 ]]; then
    tail -n 3 "$LOGS/pytest.log"
else
    # The tracebacks first (bounded), then the names of what failed last, where a reader of only
    # the output's tail (CI keeps a part) still sees them.
    sed -n '/^=* FAILURES =*$/,/^=* slowest/p' "$LOGS/pytest.log" | head -n 200
    grep -E '^(FAILED|ERROR) ' "$LOGS/pytest.log" | head -n 20
    tail -n 1 "$LOGS/pytest.log"
fi
names+=("pytest (beside)")
seconds+=("$(cat "$LOGS/pytest.seconds" 2>/dev/null || echo 0)")
if [[ $pytest_status -eq 0 ]]; then results+=("ok"); else results+=("FAILED (exit $pytest_status)"); failed=1; fi

echo
echo "stage            seconds  result"
for i in "${!names[@]}"; do
    printf "%-16s %7d  %s\n" "${names[$i]}" "${seconds[$i]}" "${results[$i]}"
done
# The stages marked "(beside)" overlap the cargo tests: the total is the wall clock.
printf "%-16s %7d\n" "total" "$(($(date +%s) - script_start))"
echo
scripts/test-summary.sh "$LOGS/cargo-tests.log" "$LOGS/pytest.log" || failed=1
exit "$failed"
