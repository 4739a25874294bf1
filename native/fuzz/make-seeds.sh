#!/usr/bin/env bash
# Builds the seed corpus of the image reader fuzzer with real qemu-img / qemu-io: one seed
# per variant the reader supports, small enough to fuzz (512 B to 16 KiB clusters, virtual
# sizes of a few hundred KiB). A seed is the files of one directory joined by the
# harness's separator: "image" first, then "b1", "b2" (backing or data files it names).
#
#   native/fuzz/make-seeds.sh [OUT_DIR]     (default native/fuzz/corpus)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${1:-$ROOT/native/fuzz/corpus}"
SEP=$'\n--mooring-fuzz-file--\n'
WORK="$(mktemp -d /tmp/mooring-seeds-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"

q() { qemu-img "$@" >/dev/null; }
io() { local f="$1"; shift; local args=(); for c in "$@"; do args+=(-c "$c"); done; qemu-io -f qcow2 "${args[@]}" "$f" >/dev/null; }
# Deterministic bytes: a repeating counter pattern mixed with a fixed text (compressible in places).
data() { python3 -c "import sys; n=int(sys.argv[1]); s=int(sys.argv[2]); sys.stdout.buffer.write(bytes(((i*s)^(i>>7))&255 for i in range(n)))" "$1" "$2"; }

# seed NAME FILES... : joins the files into OUT/seed-NAME
seed() {
  local name="$1"; shift
  local first=1
  : > "$OUT/seed-$name"
  for f in "$@"; do
    if [[ $first -eq 0 ]]; then printf '%s' "$SEP" >> "$OUT/seed-$name"; fi
    cat "$f" >> "$OUT/seed-$name"
    first=0
  done
}

new() { rm -rf "$WORK/d"; mkdir -p "$WORK/d"; cd "$WORK/d"; }

# raw: a short odd-sized file, and one with a hole.
new; data 1000 3 > image; seed raw-odd image
new; data 3000 5 > image; truncate -s 9000 image; seed raw-sparse image

# qcow2 v3, 512 B clusters: data, a zero cluster, an unmapped zero range, a discard.
new; q create -f qcow2 -o cluster_size=512 image 256K
io image 'write -P 0x11 0 1500' 'write -z 4k 1k' 'write -z -u 8k 512' 'write -P 0x22 100k 2k' 'discard 101k 512'
seed v3-512 image

# qcow2 v2, 4 KiB clusters.
new; q create -f qcow2 -o compat=0.10,cluster_size=4k image 256K
io image 'write -P 0x33 0 10k' 'write -P 0x34 200k 4k'
seed v2-4k image

# Compressed, 4 KiB and 512 B clusters: deflate and zstd.
new; data 65536 7 > src; q convert -c -f raw -O qcow2 -o cluster_size=4k src image; seed zlib-4k image
new; data 65536 9 > src; q convert -c -f raw -O qcow2 -o cluster_size=4k,compression_type=zstd src image; seed zstd-4k image
new; data 16384 11 > src; q convert -c -f raw -O qcow2 -o cluster_size=512,compression_type=zstd src image; seed zstd-512 image

# Extended L2 (16 KiB clusters, 512 B subclusters) over a raw backing file.
new; data 65536 13 > b1
q create -f qcow2 -o extended_l2=on,cluster_size=16k -b b1 -F raw image 64K
io image 'write -P 0x41 1k 1k' 'write -z 3k 512' 'write -P 0x42 20k 3k' 'write -z 32k 16k'
seed ext-l2-16k image b1

# A chain of 3: qcow2 (4 KiB clusters) on qcow2 (512 B) on raw, sizes growing upwards.
new; data 20000 15 > b2
q create -f qcow2 -o cluster_size=512 -b b2 -F raw b1 32K
io b1 'write -P 0x51 1k 2k' 'write -z 8k 1k'
q create -f qcow2 -o cluster_size=4k -b b1 -F qcow2 image 48K
io image 'write -P 0x52 0 512' 'write -P 0x53 40k 4k'
seed chain-3 image b1 b2

# A backing file without a format extension (probed).
new; data 8192 17 > b1
q create -f qcow2 -o cluster_size=4k -u -b b1 -F raw image 16K
python3 - image <<'PY'
import sys, struct
p = sys.argv[1]; b = bytearray(open(p, 'rb').read())
hl = struct.unpack('>I', b[100:104])[0]; o = hl
while o + 8 <= 4096:
    t, n = struct.unpack('>II', b[o:o+8])
    if t == 0: break
    if t == 0xe2792aca: b[o:o+4] = b'\x12\x34\x56\x78'  # unknown type: skipped
    o += 8 + ((n + 7) & ~7)
open(p, 'wb').write(b)
PY
seed backing-probed image b1

# External data file, raw and not raw.
new; q create -f qcow2 -o cluster_size=4k,data_file=b1,data_file_raw=on image 32K
io image 'write -P 0x61 0 5k' 'write -z 12k 4k'
seed data-file-raw image b1
new; q create -f qcow2 -o cluster_size=4k,data_file=b1 image 32K
io image 'write -P 0x62 4k 4k'
seed data-file image b1

# Lazy refcounts (compatible feature) and a dirty image.
new; q create -f qcow2 -o cluster_size=4k,lazy_refcounts=on image 32K
io image 'write -P 0x71 0 4k'
printf '\x01' | dd of=image bs=1 seek=79 conv=notrunc status=none
seed dirty image

echo "make-seeds: $(ls "$OUT" | grep -c '^seed-') seeds in $OUT, $(du -sh "$OUT" | cut -f1)" >&2
