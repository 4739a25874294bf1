// proxyFor: which proxy a URL goes through under the environment's HTTP(S)_PROXY and
// NO_PROXY, as curl reads them.
import { describe, expect, it } from 'vitest';

import { proxyAuthHeaders, proxyFor } from '../../../src/backing-image/proxy.js';

const at = (u: string, env: Record<string, string>): string | null => proxyFor(new URL(u), env)?.href ?? null;

describe('proxyFor', () => {
  it('takes https_proxy for https and http_proxy for http, the lower-case name first', () => {
    const env = { HTTPS_PROXY: 'http://upper:3128', https_proxy: 'http://lower:3128', HTTP_PROXY: 'proxy.example:8080' };
    expect(at('https://images.example/a.qcow2', env)).toBe('http://lower:3128/');
    expect(at('http://images.example/a.qcow2', env)).toBe('http://proxy.example:8080/');
    expect(at('https://images.example/a.qcow2', {})).toBeNull();
    expect(at('http://images.example/a.qcow2', { HTTPS_PROXY: 'http://p:1' })).toBeNull();
  });

  it('goes direct for NO_PROXY hosts: exact, subdomains, .domain, host:port, *; and ignores malformed or non-http proxies', () => {
    const env = { HTTPS_PROXY: 'http://p:3128', NO_PROXY: 'localhost, .internal,example.org ,10.0.0.7:8443' };
    expect(at('https://localhost/x', env)).toBeNull();
    expect(at('https://a.b.internal/x', env)).toBeNull();
    expect(at('https://internal/x', env)).toBeNull();
    expect(at('https://example.org/x', env)).toBeNull();
    expect(at('https://cdn.example.org/x', env)).toBeNull();
    expect(at('https://notexample.org/x', env)).toBe('http://p:3128/');
    expect(at('https://10.0.0.7:8443/x', env)).toBeNull();
    expect(at('https://10.0.0.7/x', env)).toBe('http://p:3128/');
    expect(at('https://anything/x', { HTTPS_PROXY: 'http://p:3128', no_proxy: '*' })).toBeNull();
    expect(at('https://a/x', { HTTPS_PROXY: 'socks5://p:1080' })).toBeNull();
    expect(at('https://a/x', { HTTPS_PROXY: 'http://' })).toBeNull();
  });

  it('sends credentials of the proxy URL as Basic proxy-authorization', () => {
    expect(proxyAuthHeaders(new URL('http://us%40er:p%3Ass@p:1'))).toEqual({ 'proxy-authorization': `Basic ${Buffer.from('us@er:p:ss').toString('base64')}` });
    expect(proxyAuthHeaders(new URL('http://p:1'))).toEqual({});
  });
});
