// `mooring image import`: a raw or qcow2 file becomes a backing image (uploaded from the
// file, SHA-512 checked, format read natively) and a new volume on top of it, with progress
// lines of the upload on stderr.
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { resolve } from 'node:path';

import { MooringError, toMooringError } from '../errors.js';
import { formatBytes } from '../util/size.js';
import { UsageError, parseCommandArgs, parseNameOption, parseReplicasOption, parseSizeOption, printJson, type CliContext } from './common.js';
import { EMBEDDED_HELP, EMBEDDED_OPTIONS, closeEmbedded, openEmbedded, pickVolume, type Embedded } from './embedded.js';
import { logOf, logSettingsOf } from './log.js';
import { ProgressReporter } from './progress.js';

/** A progress line at most once per this many bytes read (as the native copies report). */
const IMPORT_PROGRESS_STEP_BYTES = 64 * 1024 * 1024;
/** Read size of the upload stream. */
const IMPORT_READ_BYTES = 1024 * 1024;

/** Help text of `mooring image`. */
export const IMAGE_HELP = `Usage: mooring image import --dir DIR FILE [--volume NEW] [--image NAME] [--size SIZE]
                            [--replicas N] [--checksum SHA512] [--host ADDRESS ...] [--json]

Import a raw or qcow2 image file: it becomes backing image NAME in DIR's store (uploaded to
this host's data engine, SHA-512 computed or checked, the format read natively; no
conversion) and volume NEW is created on top of it, detached (mooring serve serves it).
Reads go to the image wherever the volume has not been written; writes land in the
volume's replicas. Progress lines of the upload go to stderr (--no-progress silences them).

Options:
${EMBEDDED_HELP}
  --image NAME         the backing image's name (default: the volume's)
  --size SIZE          the volume's size (default: the image's virtual size rounded up to
                       4 KiB; never less than it)
  --replicas N         1..16, one per host (default: 3, or one per host when fewer hosts
                       are given); the image is copied to each replica's host
  --checksum SHA512    the SHA-512 (hex) the file must have (CHECKSUM_MISMATCH otherwise)
  --json               machine-readable result
  -h, --help           show this help
`;

/** Runs `mooring image ...`. */
export async function runImage(argv: string[], ctx: CliContext): Promise<number> {
  const sub = argv[0];
  if (sub === undefined) {
    ctx.stderr(IMAGE_HELP);
    return 2;
  }
  if (sub === '--help' || sub === '-h' || sub === 'help') {
    ctx.stdout(IMAGE_HELP);
    return 0;
  }
  if (sub !== 'import') throw new UsageError('image', `unknown image command ${JSON.stringify(sub)} (expected import)`);
  const { values, positionals } = parseCommandArgs(
    'image',
    argv.slice(1),
    {
      ...EMBEDDED_OPTIONS,
      image: { type: 'string' },
      size: { type: 'string' },
      replicas: { type: 'string' },
      checksum: { type: 'string' },
      json: { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    { min: 0, max: 1 },
  );
  if (values.help) {
    ctx.stdout(IMAGE_HELP);
    return 0;
  }
  const file = positionals[0];
  if (file === undefined) throw new UsageError('image', 'image import needs the image FILE');
  if (values.image !== undefined) parseNameOption('image', '--image', values.image);
  const sizeBytes = values.size === undefined ? undefined : parseSizeOption('image', values.size);
  const replicas = values.replicas === undefined ? undefined : parseReplicasOption('image', values.replicas);
  if (values.checksum !== undefined && !/^[0-9a-fA-F]{128}$/.test(values.checksum)) {
    throw new UsageError('image', `--checksum must be a SHA-512 in hex, 128 digits (got ${JSON.stringify(values.checksum)})`);
  }
  const path = resolve(ctx.cwd ?? process.cwd(), file);
  const st = await stat(path).catch((err: unknown) => {
    throw toMooringError(err, `image file ${path}`);
  });
  if (!st.isFile()) throw new MooringError('INVALID_ARGUMENT', `image file ${path} is not a regular file`);

  let embedded: Embedded | null = null;
  try {
    embedded = await openEmbedded('image', values, ctx, { repairIntervalMs: 0 });
    const m = embedded.mooring;
    const { name, exists } = await pickVolume('image', m, embedded.dir, values.volume, true);
    if (exists) throw new MooringError('ALREADY_EXISTS', `${embedded.dir} holds a volume ${name} already`);
    const imageName = values.image ?? name;
    const image = await m.createBackingImage({
      name: imageName,
      source: { type: 'upload', sizeBytes: st.size },
      ...(values.checksum !== undefined ? { expectedChecksum: values.checksum.toLowerCase() } : {}),
    });
    let volumeStatus;
    let imageStatus;
    try {
      const settings = logSettingsOf(ctx);
      const progress = settings.progress
        ? new ProgressReporter(logOf(ctx), `import of ${file} into backing image ${imageName}`, { fields: { image: imageName, volume: name }, intervalMs: settings.progressIntervalMs })
        : null;
      imageStatus = await image.upload(counted(createReadStream(path, { highWaterMark: IMPORT_READ_BYTES }), (done) => progress?.update(done, st.size)));
      progress?.finish(st.size, st.size);
      const volume = await m.createVolume({ name, backingImage: imageName, ...(sizeBytes !== undefined ? { sizeBytes } : {}), ...(replicas !== undefined ? { replicas } : {}) });
      volumeStatus = await volume.status();
    } catch (err) {
      // Nothing half-made stays behind: the image goes with the failed import.
      await image.delete().catch((e: unknown) => logOf(ctx).warn({ code: toMooringError(e).code }, `deleting backing image ${imageName} of the failed import: ${toMooringError(e).message}`));
      throw err;
    }
    if (values.json) {
      printJson(ctx, {
        imported: path,
        image: imageName,
        format: imageStatus.format,
        fileBytes: imageStatus.sizeBytes,
        virtualSizeBytes: imageStatus.virtualSizeBytes,
        checksum: imageStatus.currentChecksum,
        volume: name,
        sizeBytes: volumeStatus.sizeBytes,
        replicaCount: volumeStatus.replicaCount,
      });
    } else {
      ctx.stdout(
        `imported ${path} (${imageStatus.format ?? 'unknown format'}, ${formatBytes(imageStatus.virtualSizeBytes)} virtual, ${formatBytes(imageStatus.sizeBytes)} file) as backing image ${imageName}; ` +
          `created volume ${name} on it (${formatBytes(volumeStatus.sizeBytes)}, ${volumeStatus.replicaCount} replica${volumeStatus.replicaCount === 1 ? '' : 's'})\n`,
      );
    }
  } finally {
    await closeEmbedded(embedded, ctx);
  }
  return 0;
}

/** `source` as it is, calling `onStep` with the bytes read so far each time another step's worth went by. */
async function* counted(source: AsyncIterable<Uint8Array>, onStep: (doneBytes: number) => void): AsyncGenerator<Uint8Array> {
  let done = 0;
  let next = IMPORT_PROGRESS_STEP_BYTES;
  for await (const chunk of source) {
    yield chunk;
    done += chunk.byteLength;
    if (done >= next) {
      onStep(done);
      next = (Math.floor(done / IMPORT_PROGRESS_STEP_BYTES) + 1) * IMPORT_PROGRESS_STEP_BYTES;
    }
  }
}
