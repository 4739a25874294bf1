/**
 * HTTP(S)_PROXY and NO_PROXY for the backing-image downloader, as curl and most tools read
 * them: `https_proxy`/`HTTPS_PROXY` for https URLs, `http_proxy`/`HTTP_PROXY` for http ones
 * (the lower-case name first), `no_proxy`/`NO_PROXY` a list of hosts that go direct. An http
 * URL is fetched from the proxy by its absolute form; an https URL through a CONNECT tunnel,
 * with TLS (and the certificate check) end to end to the origin. Node 20's http client reads
 * none of these by itself.
 */
import { request as httpRequest, type ClientRequest, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';

/** Environment variables the proxy settings are read from (default: process.env). */
export type ProxyEnv = Readonly<Record<string, string | undefined>>;

/** The proxy to reach `url` through, or null to go direct. A malformed proxy URL is ignored. */
export function proxyFor(url: URL, env: ProxyEnv = process.env): URL | null {
  const names = url.protocol === 'https:' ? ['https_proxy', 'HTTPS_PROXY'] : ['http_proxy', 'HTTP_PROXY'];
  const raw = names.map((n) => env[n]).find((v) => v !== undefined && v.trim() !== '');
  if (raw === undefined || bypassed(url, env.no_proxy ?? env.NO_PROXY ?? '')) return null;
  try {
    const p = new URL(raw.includes('://') ? raw : `http://${raw}`);
    return p.protocol === 'http:' && p.hostname !== '' ? p : null;
  } catch {
    return null;
  }
}

// NO_PROXY entries: `*` (everything), a host or IP (that host and, for a name, its
// subdomains), `.domain` (its subdomains), each optionally with `:port`.
function bypassed(url: URL, noProxy: string): boolean {
  const host = stripBrackets(url.hostname.toLowerCase());
  const port = url.port || (url.protocol === 'https:' ? '443' : '80');
  for (const entry of noProxy.split(/[\s,]+/).filter((e) => e !== '')) {
    if (entry === '*') return true;
    const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(entry.toLowerCase());
    if (!m) continue;
    if (m[2] !== undefined && m[2] !== port) continue;
    const name = stripBrackets(m[1]!).replace(/^\*?\./, '.');
    if (name.startsWith('.') ? host.endsWith(name) || host === name.slice(1) : host === name || host.endsWith(`.${name}`)) return true;
  }
  return false;
}

function stripBrackets(h: string): string {
  return h.startsWith('[') && h.endsWith(']') ? h.slice(1, -1) : h;
}

/** A `proxy-authorization` header for a proxy URL with credentials, or none. */
export function proxyAuthHeaders(proxy: URL): Record<string, string> {
  if (proxy.username === '') return {};
  const creds = `${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`;
  return { 'proxy-authorization': `Basic ${Buffer.from(creds).toString('base64')}` };
}

/**
 * A `createConnection` for https.request that opens a CONNECT tunnel through `proxy` to the
 * URL's host and starts TLS over it (servername and `ca` as for a direct connection).
 * Errors (a refused CONNECT, a proxy that cannot be reached) go to the request's callback.
 * `onConnect` gets the CONNECT request, for the caller's timeout and cancel to destroy.
 */
export function tunnelThrough(
  proxy: URL,
  url: URL,
  ca: string | undefined,
  onConnect: (req: ClientRequest) => void,
): (opts: unknown, cb: (err: Error | null, socket?: TLSSocket) => void) => undefined {
  return (_opts, cb) => {
    const target = `${url.hostname.includes(':') && !url.hostname.startsWith('[') ? `[${url.hostname}]` : url.hostname}:${url.port || 443}`;
    const req = httpRequest({
      host: stripBrackets(proxy.hostname),
      port: proxy.port || 80,
      method: 'CONNECT',
      path: target,
      headers: { host: target, ...proxyAuthHeaders(proxy) },
    });
    req.once('connect', (res: IncomingMessage, socket: Socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        cb(new Error(`proxy ${proxy.host} refused CONNECT ${target}: HTTP ${res.statusCode}`));
        return;
      }
      const servername = stripBrackets(url.hostname);
      const tls = tlsConnect({ socket, servername: /^[\d.]+$|:/.test(servername) ? '' : servername, host: servername, ...(ca !== undefined ? { ca } : {}) });
      cb(null, tls);
    });
    req.once('error', (err) => cb(new Error(`proxy ${proxy.host}: ${err.message}`)));
    onConnect(req);
    req.end();
    return undefined;
  };
}
