#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain (ARCHITECTURE.md, "Fuzzing").
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Builds the libFuzzer targets of fuzz/ with the sanitizer-coverage flags cargo-fuzz passes
# (all stable rustc flags; no sanitizer runtime) into target/fuzz, then runs each target for
# SECONDS_PER_TARGET seconds (default 60) on its committed seed corpus fuzz/corpus/<target>/,
# read-only: new inputs go to a temporary folder, so a run never dirties the work tree.
# Exits non-zero at the first input that panics, grows the process past the 2 GiB RSS limit or
# runs over 20 s, naming the artifact that reproduces it (under target/fuzz/artifacts/<target>/):
# `target/fuzz/<triple>/fuzz/<target> <artifact>` runs it again.
set -euo pipefail

SECONDS_PER_TARGET=${1:-60}
shift $(($# > 0 ? 1 : 0))
ALL_TARGETS=(wire_frames tar_reader index_loader manifest jpeg_restart transform_spec npy)
TARGETS=("${@:-${ALL_TARGETS[@]}}")
JOBS=${JOBS:-2}

cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET_DIR=$ROOT/target/fuzz
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
BIN_DIR=$TARGET_DIR/$TRIPLE/fuzz
ARTIFACTS=$TARGET_DIR/artifacts
LOGS=$TARGET_DIR/logs

# Coverage instrumentation (edges, 8-bit counters, the PC table libFuzzer reports with, and
# comparison tracing that lets it solve magic numbers and lengths), `cfg(fuzzing)`, and the
# checks a release build drops. `--target` keeps these flags off build scripts and proc macros.
# Not `--locked`: when a crate the targets use gains a dependency, cargo adds it to fuzz/Cargo.lock
# (commit that change with them).
RUSTFLAGS_FUZZ="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
RUSTFLAGS_FUZZ+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
RUSTFLAGS_FUZZ+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"

max_len() {
    case $1 in
        wire_frames) echo 8192 ;;
        tar_reader) echo 32768 ;;
        index_loader) echo 65536 ;;
        manifest) echo 4096 ;;
        jpeg_restart) echo 16384 ;;
        transform_spec) echo 2048 ;;
        npy) echo 4096 ;;
        *) echo "unknown fuzz target $1" >&2; exit 2 ;;
    esac
}

if ! command -v c++ >/dev/null 2>&1; then
    echo "fuzz: libFuzzer is C++ and needs a C++ compiler: apt-get install g++" >&2
    exit 2
fi

start=$(date +%s)
echo "fuzz: building ${#TARGETS[@]} targets into $BIN_DIR"
bins=()
for target in "${TARGETS[@]}"; do
    max_len "$target" >/dev/null
    bins+=(--bin "$target")
done
env -u CARGO_ENCODED_RUSTFLAGS RUSTFLAGS="$RUSTFLAGS_FUZZ" CARGO_TARGET_DIR="$TARGET_DIR" \
    cargo build --manifest-path fuzz/Cargo.toml --profile fuzz --target "$TRIPLE" -j"$JOBS" "${bins[@]}"
built=$(date +%s)
echo "fuzz: built in $((built - start)) s; ${SECONDS_PER_TARGET} s per target"

mkdir -p "$ARTIFACTS" "$LOGS"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/stoker-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for target in "${TARGETS[@]}"; do
    corpus=$ROOT/fuzz/corpus/$target
    new=$scratch/$target
    mkdir -p "$new" "$ARTIFACTS/$target"
    log=$LOGS/$target.log
    echo "fuzz: $target for ${SECONDS_PER_TARGET} s ($(ls "$corpus" | wc -l) seeds, max_len $(max_len "$target"))"
    # A dictionary where the target has one (the index target reads tar shards too).
    dict=$ROOT/fuzz/dict/${target/index_loader/tar_reader}.dict
    dict_args=()
    [[ -f $dict ]] && dict_args=(-dict="$dict")
    target_start=$(date +%s)
    status=0
    "$BIN_DIR/$target" "$new" "$corpus" "${dict_args[@]}" \
        -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -max_len="$(max_len "$target")" -timeout=20 \
        -artifact_prefix="$ARTIFACTS/$target/" -print_final_stats=1 >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [[ $status -ne 0 ]]; then
        tail -n 60 "$log"
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "fuzz: $target FAILED (exit $status) after $(($(date +%s) - target_start)) s; log: $log"
        if [[ -n $artifact ]]; then
            echo "fuzz: reproduce with: $BIN_DIR/$target $artifact"
        fi
        exit 1
    fi
    echo "fuzz: $target ok: ${runs:-?} runs in $(($(date +%s) - target_start)) s, $(ls "$new" | wc -l) new inputs (discarded)"
done
echo "fuzz: all ${#TARGETS[@]} targets passed in $(($(date +%s) - start)) s (build $((built - start)) s)"
