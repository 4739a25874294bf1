/**
 * Downloads one backing image file over HTTP or HTTPS into a partial file on disk (seed
 * 003's download data source), with node's own http/https: streamed to disk (memory bounded
 * by one socket chunk), SHA-512 computed as bytes are written, a start timeout per attempt,
 * a stall timeout mid-body, retries with exponential back-off, resume with `Range` where the
 * server honours it, bounded redirects and cancel. Rules and defaults: docs/data-engine.md,
 * "Backing image files".
 *
 * @packageDocumentation
 */
import type { Hash } from 'node:crypto';
import { open, stat, type FileHandle } from 'node:fs/promises';
import { request as httpRequest, type IncomingMessage, type RequestOptions } from 'node:http';
import { request as httpsRequest } from 'node:https';

import { MooringError, toMooringError } from '../errors.js';
import { sleepUnlessAborted } from '../util/async.js';
import { PRIVATE_FILE_MODE } from '../util/files.js';
import { VOLUME_SIZE_MAX_BYTES } from '../util/limits.js';
import { checkIntIn, describe } from '../util/validate.js';
import { proxyAuthHeaders, proxyFor, tunnelThrough } from './proxy.js';
import { hashFileInto, newSha512 } from './sha512.js';

/** Defaults of the download settings ({@link DownloadSettings}). */
export const DOWNLOAD_DEFAULTS = {
  /** Each attempt: the response headers must arrive within this time (30 s, as in Longhorn). */
  startTimeoutMs: 30_000,
  /** Mid-body: an attempt fails when no byte arrives for this long. */
  stallTimeoutMs: 60_000,
  /** Attempts after the first failed one. */
  retries: 5,
  /** Delay before the first retry; it doubles per retry up to {@link DOWNLOAD_DEFAULTS.retryMaxDelayMs}. */
  retryFirstDelayMs: 1000,
  /** Largest delay between retries. */
  retryMaxDelayMs: 30_000,
  /** Redirects followed per attempt. */
  redirectsMax: 5,
} as const;

/** Bounds of the download settings ({@link DownloadSettings}) and of downloads. */
export const DOWNLOAD_LIMITS = {
  /** Shortest start or stall timeout. */
  timeoutMsMin: 10,
  /** Longest start or stall timeout, and longest back-off delay. */
  timeoutMsMax: 3_600_000,
  /** Most retries one download may ask for. */
  retriesMax: 100,
  /** Most redirects one download may allow per attempt. */
  redirectsMax: 20,
  /** Longest URL accepted. */
  urlLengthMax: 8192,
  /** Largest file (the largest volume). */
  sizeBytesMax: VOLUME_SIZE_MAX_BYTES,
} as const;

/** Timing and retry settings of a download (every field optional). */
export interface DownloadSettings {
  /** Response headers must arrive within this time, per attempt (default 30,000 ms). */
  startTimeoutMs?: number;
  /** No byte for this long mid-body fails the attempt (default 60,000 ms). */
  stallTimeoutMs?: number;
  /** Attempts after the first failed one (default 5). */
  retries?: number;
  /** First back-off delay (default 1000 ms), doubling per retry. */
  retryFirstDelayMs?: number;
  /** Largest back-off delay (default 30,000 ms). */
  retryMaxDelayMs?: number;
  /** Redirects followed per attempt (default 5). */
  redirectsMax?: number;
  /**
   * Extra trusted CA certificates (PEM) for https URLs, added to Node's defaults. Node also
   * honours `NODE_EXTRA_CA_CERTS` when the process starts.
   */
  ca?: string;
}

/** Options of {@link download}. */
export interface DownloadOptions extends DownloadSettings {
  /** http:// or https:// URL. */
  url: string;
  /** The partial file: created if missing; an existing one is resumed from its end. */
  path: string;
  /** Stops the download: it rejects with CANCELLED; the partial file stays. */
  signal?: AbortSignal;
  /** Response headers arrived (the download started sending). */
  onStart?: () => void;
  /** Bytes on disk so far, of `totalBytes` (0 while unknown). */
  onProgress?: (receivedBytes: number, totalBytes: number) => void;
}

/** What a finished download produced. */
export interface DownloadResult {
  /** Bytes of the file. */
  sizeBytes: number;
  /** SHA-512 (hex) of the file's bytes. */
  checksum: string;
  /** Attempts made (1 when the first succeeded). */
  attempts: number;
}

/** Checks the settings; returns them with defaults filled in. */
export function checkDownloadSettings(s: DownloadSettings | undefined, what = 'download'): Required<Omit<DownloadSettings, 'ca'>> & { ca?: string } {
  const o = s ?? {};
  if (typeof o !== 'object' || o === null) throw new MooringError('INVALID_ARGUMENT', `${what} settings must be an object (got ${describe(o)})`);
  const { timeoutMsMin: lo, timeoutMsMax: hi } = DOWNLOAD_LIMITS;
  const d = DOWNLOAD_DEFAULTS;
  if (o.ca !== undefined && (typeof o.ca !== 'string' || o.ca.length === 0)) throw new MooringError('INVALID_ARGUMENT', `${what}.ca must be PEM text`);
  const out = {
    startTimeoutMs: checkIntIn(`${what}.startTimeoutMs`, o.startTimeoutMs, lo, hi, d.startTimeoutMs),
    stallTimeoutMs: checkIntIn(`${what}.stallTimeoutMs`, o.stallTimeoutMs, lo, hi, d.stallTimeoutMs),
    retries: checkIntIn(`${what}.retries`, o.retries, 0, DOWNLOAD_LIMITS.retriesMax, d.retries),
    retryFirstDelayMs: checkIntIn(`${what}.retryFirstDelayMs`, o.retryFirstDelayMs, 0, hi, d.retryFirstDelayMs),
    retryMaxDelayMs: checkIntIn(`${what}.retryMaxDelayMs`, o.retryMaxDelayMs, 0, hi, d.retryMaxDelayMs),
    redirectsMax: checkIntIn(`${what}.redirectsMax`, o.redirectsMax, 0, DOWNLOAD_LIMITS.redirectsMax, d.redirectsMax),
    ...(o.ca !== undefined ? { ca: o.ca } : {}),
  };
  return out;
}

/**
 * Checks a download URL: http: or https:, no credentials, at most
 * {@link DOWNLOAD_LIMITS.urlLengthMax} characters.
 *
 * @throws MooringError INVALID_ARGUMENT
 */
export function checkDownloadUrl(value: unknown): URL {
  if (typeof value !== 'string' || value.length === 0 || value.length > DOWNLOAD_LIMITS.urlLengthMax) {
    throw new MooringError('INVALID_ARGUMENT', `url must be an http:// or https:// URL of at most ${DOWNLOAD_LIMITS.urlLengthMax} characters (got ${describe(value)})`);
  }
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new MooringError('INVALID_ARGUMENT', `url is not a valid URL (got ${describe(value)})`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new MooringError('INVALID_ARGUMENT', `url must be http:// or https:// (got ${describe(url.protocol)})`);
  }
  return url;
}

// An attempt's failure: retryable ones are retried after a back-off, resuming the bytes on disk.
class AttemptError extends MooringError {
  constructor(
    readonly retryable: boolean,
    message: string,
    code: 'DOWNLOAD_FAILED' | 'CANCELLED' = 'DOWNLOAD_FAILED',
    /** The bytes on disk cannot be trusted as a prefix: the next attempt starts at 0. */
    readonly restart = false,
  ) {
    super(code, message);
  }
}

/**
 * Downloads `url` into `path`, resuming a partial file already there.
 *
 * @throws MooringError INVALID_ARGUMENT (url, settings), DOWNLOAD_FAILED (an HTTP error
 *   status, too many redirects, a server that sent more than it declared, or the last
 *   attempt's failure after the retries), CANCELLED, IO_ERROR / NO_SPACE (the disk)
 */
export async function download(options: DownloadOptions): Promise<DownloadResult> {
  const first = checkDownloadUrl(options.url);
  const s = checkDownloadSettings(options);
  const { signal } = options;
  const fh = await open(options.path, 'a+', PRIVATE_FILE_MODE).catch((err: unknown) => Promise.reject(toMooringError(err, `opening ${options.path}`)));
  try {
    // The bytes already on disk are the prefix of this file (same name and uuid): hash them
    // once, then only what arrives.
    const st = { received: (await fh.stat()).size, hash: newSha512() };
    if (st.received > 0) await hashFileInto(options.path, st.hash, st.received, signal);
    let attempt = 0;
    let delayMs = s.retryFirstDelayMs;
    for (;;) {
      attempt++;
      if (signal?.aborted) throw cancelled(options.url);
      try {
        const r = await runAttempt({ url: first, fh, st, s, options, signal });
        // Durable before anyone adopts it as the image.
        await fh.sync();
        return { sizeBytes: r, checksum: st.hash.digest('hex'), attempts: attempt };
      } catch (err) {
        const e = err instanceof AttemptError ? err : toMooringError(err);
        if (e.code === 'CANCELLED' || !(e instanceof AttemptError)) throw plain(e);
        // What is on disk is what was hashed: writes and hash updates go together.
        if (e.restart) {
          await fh.truncate(0);
          st.received = 0;
          st.hash = newSha512();
        }
        if (!e.retryable || attempt > s.retries) {
          throw new MooringError('DOWNLOAD_FAILED', attempt > 1 ? `${e.message} (attempt ${attempt} of ${s.retries + 1})` : e.message, {
            details: { url: options.url, attempts: attempt, receivedBytes: st.received },
          });
        }
        await sleepUnlessAborted(delayMs, signal ?? NEVER_ABORTED).catch(() => Promise.reject(cancelled(options.url)));
        delayMs = Math.min(delayMs * 2, s.retryMaxDelayMs);
      }
    }
  } finally {
    await fh.close().catch(() => undefined);
  }
}

/** Size in bytes of the partial file at `path` (0 if missing). */
export async function partialSize(path: string): Promise<number> {
  try {
    return (await stat(path)).size;
  } catch {
    return 0;
  }
}

interface AttemptInput {
  url: URL;
  fh: FileHandle;
  /** Bytes on disk and their hash, carried across attempts. */
  st: { received: number; hash: Hash };
  s: ReturnType<typeof checkDownloadSettings>;
  options: DownloadOptions;
  signal: AbortSignal | undefined;
}

// One attempt: follows redirects, checks the answer, appends the body. Resolves with the
// file's total size once every declared byte is on disk.
async function runAttempt(a: AttemptInput): Promise<number> {
  let url = a.url;
  let res: IncomingMessage | undefined;
  for (let redirects = 0; ; redirects++) {
    res = await requestHeaders(url, a.st.received, a.s, a.signal, a.options.url);
    const location = res.headers.location;
    if (res.statusCode !== undefined && [301, 302, 303, 307, 308].includes(res.statusCode) && typeof location === 'string') {
      res.destroy();
      if (redirects >= a.s.redirectsMax) throw new AttemptError(false, `${a.options.url}: more than ${a.s.redirectsMax} redirects`);
      let next: URL;
      try {
        next = new URL(location, url);
      } catch {
        throw new AttemptError(false, `${a.options.url}: redirect to an invalid URL ${describe(location)}`);
      }
      if (next.protocol !== 'http:' && next.protocol !== 'https:') throw new AttemptError(false, `${a.options.url}: redirect to a non-HTTP URL ${describe(next.href)}`);
      // A redirect must not quietly drop TLS.
      if (url.protocol === 'https:' && next.protocol === 'http:') throw new AttemptError(false, `${a.options.url}: refused a redirect from https to http (${describe(next.href)})`);
      url = next;
      continue;
    }
    break;
  }
  a.options.onStart?.();
  const status = res.statusCode ?? 0;
  let total = 0;
  if (status === 206 && a.st.received > 0) {
    // Resumed: the range must start exactly where our bytes end.
    const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(String(res.headers['content-range'] ?? ''));
    if (!m || Number(m[1]) !== a.st.received || Number(m[2]) < Number(m[1])) {
      res.destroy();
      throw new AttemptError(true, `${a.options.url}: answered ${describe(res.headers['content-range'])} to a request for bytes ${a.st.received}-; starting over`, 'DOWNLOAD_FAILED', true);
    }
    total = m[3] === '*' ? 0 : Number(m[3]);
    if (total !== 0 && Number(m[2]) + 1 !== total) {
      res.destroy();
      throw new AttemptError(true, `${a.options.url}: sent a partial range ${m[1]}-${m[2]} of ${total}; starting over`, 'DOWNLOAD_FAILED', true);
    }
  } else if (status === 200) {
    // The server ignored Range (or nothing was on disk): the body is the whole file.
    if (a.st.received > 0) {
      await a.fh.truncate(0);
      a.st.received = 0;
      a.st.hash = newSha512();
    }
    const len = res.headers['content-length'];
    total = len !== undefined && /^\d+$/.test(len) ? Number(len) : 0;
  } else if (status === 416 && a.st.received > 0) {
    res.destroy();
    // `bytes */N` with N = what we hold: the partial file is the whole file already (e.g. a
    // crash between the last byte and the rename).
    const m = /^bytes \*\/(\d+)$/.exec(String(res.headers['content-range'] ?? ''));
    if (m && Number(m[1]) === a.st.received) {
      a.options.onProgress?.(a.st.received, a.st.received);
      return a.st.received;
    }
    throw new AttemptError(true, `${a.options.url}: range ${a.st.received}- not satisfiable; starting over`, 'DOWNLOAD_FAILED', true);
  } else {
    res.destroy();
    // Server trouble and throttling may pass; any other status will not.
    const retryable = status >= 500 || status === 408 || status === 429;
    throw new AttemptError(retryable, `${a.options.url}: HTTP ${status}${res.statusMessage ? ` ${res.statusMessage}` : ''}`);
  }
  if (total > DOWNLOAD_LIMITS.sizeBytesMax) {
    res.destroy();
    throw new AttemptError(false, `${a.options.url}: declares ${total} bytes, more than the ${DOWNLOAD_LIMITS.sizeBytesMax} allowed`);
  }
  a.options.onProgress?.(a.st.received, total);
  await receiveBody(res, a, total);
  if (total !== 0 && a.st.received < total) {
    throw new AttemptError(true, `${a.options.url}: connection ended after ${a.st.received} of ${total} bytes`);
  }
  return a.st.received;
}

// Appends the body to the file as it arrives (one chunk in memory at a time), failing the
// attempt when nothing arrives for stallTimeoutMs or more arrives than declared.
async function receiveBody(res: IncomingMessage, a: AttemptInput, total: number): Promise<void> {
  let stalled = false;
  let timer: NodeJS.Timeout | undefined;
  const arm = (): void => {
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      stalled = true;
      res.destroy();
    }, a.s.stallTimeoutMs);
  };
  const onAbort = (): void => void res.destroy();
  a.signal?.addEventListener('abort', onAbort);
  arm();
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      arm();
      if (total !== 0 && a.st.received + chunk.length > total) {
        throw new AttemptError(false, `${a.options.url}: sent more than the ${total} bytes it declared`, 'DOWNLOAD_FAILED', true);
      }
      if (a.st.received + chunk.length > DOWNLOAD_LIMITS.sizeBytesMax) {
        throw new AttemptError(false, `${a.options.url}: sent more than ${DOWNLOAD_LIMITS.sizeBytesMax} bytes`, 'DOWNLOAD_FAILED', true);
      }
      // A slow disk is not a stalled server: the clock stops while we write.
      if (timer) clearTimeout(timer);
      await writeFull(a.fh, chunk);
      arm();
      a.st.hash.update(chunk);
      a.st.received += chunk.length;
      a.options.onProgress?.(a.st.received, total);
    }
  } catch (err) {
    if (err instanceof AttemptError) throw err;
    if (a.signal?.aborted) throw cancelled(a.options.url);
    if (stalled) throw new AttemptError(true, `${a.options.url}: no data for ${a.s.stallTimeoutMs} ms after ${a.st.received} bytes`);
    if (err instanceof MooringError) throw err;
    const code = (err as { code?: string }).code;
    if (typeof code === 'string' && /^E(NOSPC|IO|ROFS|DQUOT)$/.test(code)) throw toMooringError(err, `writing ${a.options.path}`);
    throw new AttemptError(true, `${a.options.url}: connection broke after ${a.st.received} bytes (${(err as Error).message ?? String(err)})`);
  } finally {
    if (timer) clearTimeout(timer);
    a.signal?.removeEventListener('abort', onAbort);
    res.destroy();
  }
  if (stalled) throw new AttemptError(true, `${a.options.url}: no data for ${a.s.stallTimeoutMs} ms after ${a.st.received} bytes`);
  if (a.signal?.aborted) throw cancelled(a.options.url);
}

async function writeFull(fh: FileHandle, chunk: Buffer): Promise<void> {
  let off = 0;
  while (off < chunk.length) {
    // 'a+' appends: the position argument is ignored on Linux, so writes land at the end.
    const { bytesWritten } = await fh.write(chunk, off, chunk.length - off);
    off += bytesWritten;
  }
}

// Sends the request and waits for the response headers, at most startTimeoutMs.
function requestHeaders(url: URL, from: number, s: AttemptInput['s'], signal: AbortSignal | undefined, original: string): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(cancelled(original));
      return;
    }
    const headers: Record<string, string> = { 'accept-encoding': 'identity', 'user-agent': 'mooring-backing-image' };
    if (from > 0) headers.range = `bytes=${from}-`;
    const proxy = proxyFor(url);
    const opts = { method: 'GET', headers, ...(url.protocol === 'https:' && s.ca !== undefined ? { ca: s.ca } : {}) };
    let settled = false;
    const done = (err: Error | undefined, res?: IncomingMessage): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      if (err) reject(err);
      else resolve(res!);
    };
    let req: ReturnType<typeof httpRequest>;
    let tunnelRequest: ReturnType<typeof httpRequest> | undefined; // the CONNECT of a proxied https request
    try {
      const onResponse = (res: IncomingMessage): void => done(undefined, res);
      if (proxy === null) req = (url.protocol === 'https:' ? httpsRequest : httpRequest)(url, opts, onResponse);
      else if (url.protocol === 'https:') {
        const tunnel = tunnelThrough(proxy, url, s.ca, (connect) => (tunnelRequest = connect));
        req = httpsRequest(url, { ...opts, createConnection: tunnel } as RequestOptions, onResponse);
      }
      else {
        // Plain http through a proxy: the request line carries the absolute URL.
        req = httpRequest(
          { host: proxy.hostname.replace(/^\[|\]$/g, ''), port: proxy.port || 80, path: url.href, method: 'GET', headers: { ...headers, host: url.host, ...proxyAuthHeaders(proxy) } },
          onResponse,
        );
      }
    } catch (err) {
      reject(new AttemptError(false, `${original}: ${(err as Error).message ?? String(err)}`));
      return;
    }
    const timer = setTimeout(() => {
      tunnelRequest?.destroy();
      req.destroy();
      done(new AttemptError(true, `${original}: no response within ${s.startTimeoutMs} ms`));
    }, s.startTimeoutMs);
    const onAbort = (): void => {
      tunnelRequest?.destroy();
      req.destroy();
      done(cancelled(original));
    };
    signal?.addEventListener('abort', onAbort);
    req.on('error', (err: Error & { code?: string }) => {
      // A certificate the CAs do not vouch for will not pass on a retry.
      const tlsRefused = typeof err.code === 'string' && /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS/.test(err.code);
      done(new AttemptError(!tlsRefused, `${original}: ${err.message}${err.code ? ` (${err.code})` : ''}`));
    });
    req.end();
  });
}

/** The signal of a download nobody can cancel. */
const NEVER_ABORTED = new AbortController().signal;

function cancelled(url: string): MooringError {
  return new MooringError('CANCELLED', `download of ${url} was cancelled`);
}

// An AttemptError leaves as a plain MooringError (its retry bookkeeping is internal).
function plain(e: MooringError): MooringError {
  return e instanceof AttemptError ? new MooringError(e.code, e.message) : e;
}
