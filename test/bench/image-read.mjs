// Quick benchmark of the native image reader (not a test; run by hand after `npm run build`):
//   node test/bench/image-read.mjs [DIR]
// Builds a 1 GiB qcow2 (64 KiB clusters, every cluster allocated) and a zlib-compressed copy
// with qemu-img/qemu-io in DIR (default a temp dir), then measures through openImage:
// 1 MiB sequential reads of the whole image (queue depth 1 and 4) against the time of
// `qemu-img convert -O raw` to a file, and 4 KiB random reads at queue depth 16. The image
// is in the page cache for every run after the first (a warm-up pass reads it first).
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const addon = createRequire(import.meta.url)('node-gyp-build')(root);
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const RANDOM_READS = 200_000;

const dir = process.argv[2] ?? mkdtempSync(join(tmpdir(), 'mooring-image-bench-'));
mkdirSync(dir, { recursive: true });
const sh = (cmd, args) => execFileSync(cmd, args, { cwd: dir, stdio: ['ignore', 'pipe', 'inherit'] });
const seconds = (t0) => Number(process.hrtime.bigint() - t0) / 1e9;

function build() {
  sh('qemu-img', ['create', '-f', 'qcow2', 'plain.qcow2', '1G']);
  // Distinct patterns per 128 MiB so the data is not one repeated byte.
  const cmds = [];
  for (let i = 0; i < 8; i++) cmds.push('-c', `write -P ${0x10 + i} ${i * 128}M 128M`);
  sh('qemu-io', ['-f', 'qcow2', ...cmds, 'plain.qcow2']);
  sh('qemu-img', ['convert', '-c', '-O', 'qcow2', 'plain.qcow2', 'zlib.qcow2']);
}

async function sequential(path, depth) {
  const img = await addon.openImage(join(dir, path));
  const t0 = process.hrtime.bigint();
  let next = 0;
  const worker = async () => {
    while (next < img.sizeBytes) {
      const off = next;
      next += MiB;
      await img.read(off, MiB);
    }
  };
  await Promise.all(Array.from({ length: depth }, worker));
  const s = seconds(t0);
  await img.close();
  return { MiBps: Math.round(img.sizeBytes / MiB / s), seconds: Number(s.toFixed(2)) };
}

async function random4k(path, depth) {
  const img = await addon.openImage(join(dir, path));
  let x = 0x12345678;
  const blocks = img.sizeBytes / 4096;
  let done = 0;
  const t0 = process.hrtime.bigint();
  const worker = async () => {
    while (done < RANDOM_READS) {
      done++;
      x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
      await img.read((x % blocks) * 4096, 4096);
    }
  };
  await Promise.all(Array.from({ length: depth }, worker));
  const s = seconds(t0);
  await img.close();
  return { iops: Math.round(RANDOM_READS / s), MiBps: Math.round((RANDOM_READS * 4096) / MiB / s) };
}

// qemu-img convert to a raw file on disk (what `qemu-img convert` costs), and to QEMU's
// null driver (the same reads, nothing written: the comparison for reading alone).
function qemuConvert(path, toNull) {
  const t0 = process.hrtime.bigint();
  if (toNull) sh('qemu-img', ['convert', '-n', '-f', 'qcow2', '--target-image-opts', path, `driver=null-co,size=${GiB}`]);
  else sh('qemu-img', ['convert', '-O', 'raw', path, 'out.raw']);
  const s = seconds(t0);
  if (!toNull) rmSync(join(dir, 'out.raw'));
  return { MiBps: Math.round(GiB / MiB / s), seconds: Number(s.toFixed(2)) };
}

build();
for (const path of ['plain.qcow2', 'zlib.qcow2']) {
  await sequential(path, 4); // warm-up: the file into the page cache
  const result = {
    image: path,
    sequential1MiBqd1: await sequential(path, 1),
    sequential1MiBqd4: await sequential(path, 4),
    qemuImgConvertToRaw: qemuConvert(path, false),
    qemuImgConvertToNull: qemuConvert(path, true),
    random4KiBqd16: await random4k(path, 16),
  };
  console.log(JSON.stringify(result));
}
if (process.argv[2] === undefined) rmSync(dir, { recursive: true, force: true });
