#!/usr/bin/env bash
# Builds and runs the libFuzzer harness of the image reader (image-reader-fuzzer.cc).
#
#   native/fuzz/fuzz.sh build            compile build/fuzz/image-reader-fuzzer
#   native/fuzz/fuzz.sh run [ARGS...]    fuzz, growing build/fuzz/work from the corpus
#                                        (ARGS go to libFuzzer, e.g. -runs=1000000 or
#                                        -max_total_time=600); one worker, niced
#   native/fuzz/fuzz.sh replay           run every corpus file once (regression check)
#   native/fuzz/fuzz.sh merge            minimise build/fuzz/work into native/fuzz/corpus
#   native/fuzz/fuzz.sh coverage         line/branch coverage of native/src/image by the corpus
#
# Needs clang with libFuzzer (Debian 12: clang-14 libclang-rt-14-dev) and zlib1g-dev.
# CI does not build this: test/native/image-corpus.test.ts replays the corpus through the
# real addon instead.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)
FUZZ_DIR=$ROOT/native/fuzz
OUT=$ROOT/build/fuzz
BIN=$OUT/image-reader-fuzzer
CXX=${CXX:-$(command -v clang++-14 || command -v clang++ || true)}
# Largest input generated (seeds are kept below it: 4 KiB and 16 KiB cluster images).
MAX_LEN=${MAX_LEN:-200000}

build() {
  [[ -n "$CXX" ]] || { echo "fuzz.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
  mkdir -p "$OUT"
  "$CXX" -std=c++17 -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$ROOT/native/src" "$FUZZ_DIR/image-reader-fuzzer.cc" "$ROOT"/native/src/image/*.cc \
    -lz -ldl -lpthread -o "$BIN"
  echo "fuzz.sh: built $BIN" >&2
}

case "${1:-}" in
  build) build ;;
  run)
    shift
    [[ -x "$BIN" ]] || build
    mkdir -p "$OUT/work" "$OUT/artifacts"
    # With -jobs, libFuzzer runs the campaign in a child and logs to ./fuzz-0.log: keep it in $OUT.
    cd "$OUT"
    exec nice -n 10 "$BIN" -workers=1 -jobs=1 -reload=0 -max_len="$MAX_LEN" -timeout=10 -rss_limit_mb=2048 \
      -dict="$FUZZ_DIR/qcow2.dict" -artifact_prefix="$OUT/artifacts/" -print_final_stats=1 \
      "$@" "$OUT/work" "$FUZZ_DIR/corpus"
    ;;
  replay)
    [[ -x "$BIN" ]] || build
    exec "$BIN" -runs=0 "$FUZZ_DIR/corpus"
    ;;
  merge)
    [[ -x "$BIN" ]] || build
    mkdir -p "$OUT/merged"
    "$BIN" -merge=1 -max_len="$MAX_LEN" "$OUT/merged" "$FUZZ_DIR/corpus" "$OUT/work"
    echo "fuzz.sh: minimised corpus in $OUT/merged; review and copy into $FUZZ_DIR/corpus" >&2
    ;;
  coverage)
    # Source coverage of the reader by the committed corpus (llvm-cov, no sanitizers).
    mkdir -p "$OUT/cov"
    "$CXX" -std=c++17 -O1 -fprofile-instr-generate -fcoverage-mapping -fsanitize=fuzzer \
      -I"$ROOT/native/src" "$FUZZ_DIR/image-reader-fuzzer.cc" "$ROOT"/native/src/image/*.cc \
      -lz -ldl -lpthread -o "$OUT/cov/image-reader-cov"
    LLVM_PROFILE_FILE="$OUT/cov/corpus.profraw" "$OUT/cov/image-reader-cov" -runs=0 "$FUZZ_DIR/corpus" >/dev/null 2>&1
    llvm-profdata-14 merge -sparse "$OUT/cov/corpus.profraw" -o "$OUT/cov/corpus.profdata"
    llvm-cov-14 report "$OUT/cov/image-reader-cov" -instr-profile="$OUT/cov/corpus.profdata" "$ROOT"/native/src/image/*.cc
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
