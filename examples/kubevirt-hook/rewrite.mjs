// The pure half of the KubeVirt hook: given the domain XML virt-launcher is about to define
// and the VMI (JSON), point the disks the VMI's `mooring.io/volumes` annotation names at
// Mooring NBD exports. No I/O here, so it is tested on its own; hook.mjs is the gRPC shell.
//
//   mooring.io/volumes: '{"rootdisk":"vm1-root"}'
//   <disk type="file" device="disk">…<alias name="ua-rootdisk"/></disk>
//     becomes
//   <disk type="network" device="disk">
//     <driver name="qemu" type="raw" cache="none" …/>
//     <source protocol="nbd"><host transport="unix" socket="/var/run/mooring/nbd/vm1-root.sock"/><reconnect delay="20"/></source>
//     <shareable/> …target, alias, boot order, serial, address kept…
//   </disk>
import { DOMParser, XMLSerializer } from '@xmldom/xmldom';

export const VOLUMES_ANNOTATION = 'mooring.io/volumes';
export const DEFAULT_SOCKET_PATH_TEMPLATE = '/var/run/mooring/nbd/{volume}.sock';
// QEMU's NBD client re-sends requests in flight across a reconnect for this long, so a
// Mooring engine restart or hand-over is a pause, not a guest I/O error.
export const DEFAULT_RECONNECT_DELAY_S = 20;
const RECONNECT_DELAY_S_MAX = 3600;
// KubeVirt names the <disk> of VMI disk NAME with <alias name="ua-NAME"/>
// (pkg/virt-launcher/virtwrap/api/schema.go, UserAliasPrefix).
const USER_ALIAS_PREFIX = 'ua-';
// Mooring's rule for volume names (src/util/validate.ts); they become socket file names.
const VOLUME_NAME_PATTERN = /^[A-Za-z0-9._-]{1,63}$/;
const DISK_NAME_LENGTH_MAX = 253;
// sun_path holds 108 bytes, the terminating NUL included.
const SOCKET_PATH_BYTES_MAX = 107;

/** A refusal with the gRPC status name hook.mjs answers it with. */
export class HookError extends Error {
  /** @param {'INVALID_ARGUMENT' | 'FAILED_PRECONDITION'} code */
  constructor(code, message) {
    super(message);
    this.name = 'HookError';
    this.code = code;
  }
}

const invalid = (message) => new HookError('INVALID_ARGUMENT', message);
const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Checks the options once (hook.mjs at startup) and fills in the defaults. */
export function checkOptions(opts = {}) {
  const socketPathTemplate = opts.socketPathTemplate ?? DEFAULT_SOCKET_PATH_TEMPLATE;
  const reconnectDelayS = opts.reconnectDelayS ?? DEFAULT_RECONNECT_DELAY_S;
  if (!socketPathTemplate.startsWith('/') || !socketPathTemplate.includes('{volume}')) {
    throw new Error(`the socket path template must be an absolute path containing {volume} (got ${JSON.stringify(socketPathTemplate)})`);
  }
  if (!Number.isInteger(reconnectDelayS) || reconnectDelayS < 0 || reconnectDelayS > RECONNECT_DELAY_S_MAX) {
    throw new Error(`the reconnect delay must be an integer from 0 to ${RECONNECT_DELAY_S_MAX} seconds (got ${reconnectDelayS})`);
  }
  return { socketPathTemplate, reconnectDelayS };
}

/**
 * Reads the VMI's annotation: which VMI disk goes to which volume, on which socket.
 * Returns `{ vmi: 'namespace/name', disks: [{ disk, volume, socket, cache }] }`; `disks` is
 * empty when the VMI has no annotation. Throws HookError(INVALID_ARGUMENT) on bad input.
 */
export function planVolumes(vmiJson, opts = {}) {
  const { socketPathTemplate } = checkOptions(opts);
  let vmi;
  try {
    vmi = JSON.parse(vmiJson);
  } catch (err) {
    throw invalid(`the VMI is not JSON: ${err.message}`);
  }
  if (!isObject(vmi)) throw invalid('the VMI is not a JSON object');
  const id = `${vmi.metadata?.namespace ?? '?'}/${vmi.metadata?.name ?? '?'}`;
  const raw = vmi.metadata?.annotations?.[VOLUMES_ANNOTATION];
  if (raw === undefined) return { vmi: id, disks: [] };
  let map;
  try {
    map = JSON.parse(raw);
  } catch (err) {
    throw invalid(`annotation ${VOLUMES_ANNOTATION} of VMI ${id} is not JSON: ${err.message}`);
  }
  if (!isObject(map)) throw invalid(`annotation ${VOLUMES_ANNOTATION} of VMI ${id} must be a JSON object mapping a VMI disk name to a Mooring volume name, e.g. {"rootdisk":"vm1-root"}`);
  const vmiDisks = Array.isArray(vmi.spec?.domain?.devices?.disks) ? vmi.spec.domain.devices.disks : [];
  const byVolume = new Map();
  const disks = Object.entries(map).map(([disk, volume]) => {
    if (disk.length === 0 || disk.length > DISK_NAME_LENGTH_MAX) throw invalid(`annotation ${VOLUMES_ANNOTATION} of VMI ${id}: bad disk name ${JSON.stringify(disk)}`);
    if (typeof volume !== 'string' || !VOLUME_NAME_PATTERN.test(volume) || volume === '.' || volume === '..') {
      throw invalid(`annotation ${VOLUMES_ANNOTATION} of VMI ${id}: volume name for disk ${disk} must match [A-Za-z0-9._-]{1,63} and not be "." or ".." (got ${JSON.stringify(volume)})`);
    }
    // One export has one writer: two disks on one volume would corrupt it.
    if (byVolume.has(volume)) throw invalid(`annotation ${VOLUMES_ANNOTATION} of VMI ${id}: disks ${byVolume.get(volume)} and ${disk} both name volume ${volume}`);
    byVolume.set(volume, disk);
    const socket = socketPathTemplate.replaceAll('{volume}', volume);
    if (Buffer.byteLength(socket) > SOCKET_PATH_BYTES_MAX) throw invalid(`socket path ${socket} for volume ${volume} is longer than ${SOCKET_PATH_BYTES_MAX} bytes, too long for a unix socket`);
    const spec = vmiDisks.find((d) => isObject(d) && d.name === disk);
    return { disk, volume, socket, cache: typeof spec?.cache === 'string' ? spec.cache : undefined };
  });
  return { vmi: id, disks };
}

/**
 * The domain XML with every disk the VMI's annotation names turned into an NBD disk on its
 * Mooring socket; everything else as it was. Without the annotation, `domainXml` itself.
 * Throws HookError(INVALID_ARGUMENT) for a bad domain, VMI or annotation.
 */
export function rewriteDomain(domainXml, vmiJson, opts = {}) {
  const options = checkOptions(opts);
  const plan = planVolumes(vmiJson, options);
  if (plan.disks.length === 0) return domainXml;
  const doc = parseDomain(domainXml);
  const devices = children(doc.documentElement, 'devices')[0];
  const domainDisks = devices ? children(devices, 'disk') : [];
  for (const item of plan.disks) {
    const alias = USER_ALIAS_PREFIX + item.disk;
    const disk = domainDisks.find((d) => children(d, 'alias').some((a) => a.getAttribute('name') === alias));
    if (!disk) throw invalid(`VMI ${plan.vmi}: the domain has no <disk> with <alias name="${alias}"/> for disk ${item.disk} named in ${VOLUMES_ANNOTATION}`);
    const device = disk.getAttribute('device') || 'disk';
    if (device !== 'disk') throw invalid(`VMI ${plan.vmi}: disk ${item.disk} is a ${device}; only a device="disk" can be a Mooring volume`);
    toNbd(doc, disk, item, options.reconnectDelayS);
  }
  return new XMLSerializer().serializeToString(doc);
}

function parseDomain(xml) {
  let doc;
  try {
    doc = new DOMParser({
      onError: (level, message) => {
        throw new Error(`${level}: ${message}`);
      },
    }).parseFromString(xml, 'text/xml');
  } catch (err) {
    throw invalid(`the domain XML does not parse: ${err.message}`);
  }
  if (doc.documentElement?.tagName !== 'domain') throw invalid(`the domain XML's root element is <${doc.documentElement?.tagName}>, not <domain>`);
  return doc;
}

function children(el, tagName) {
  return Array.from(el.childNodes).filter((n) => n.nodeType === 1 && n.tagName === tagName);
}

// Removes an element with the indentation before it, so the output keeps its layout.
function remove(el) {
  const prev = el.previousSibling;
  if (prev && prev.nodeType === 3 && prev.data.trim() === '') prev.parentNode.removeChild(prev);
  el.parentNode.removeChild(el);
}

function toNbd(doc, disk, item, reconnectDelayS) {
  disk.setAttribute('type', 'network');
  const source = doc.createElement('source');
  source.setAttribute('protocol', 'nbd');
  const host = doc.createElement('host');
  host.setAttribute('transport', 'unix');
  host.setAttribute('socket', item.socket);
  source.appendChild(host);
  // Newer libvirt passes this to QEMU's reconnect-delay; libvirt 9.0 (Debian 12) predates it
  // and drops the element on define (its schema rejects it under validation).
  if (reconnectDelayS > 0) {
    const reconnect = doc.createElement('reconnect');
    reconnect.setAttribute('delay', String(reconnectDelayS));
    source.appendChild(reconnect);
  }
  const old = children(disk, 'source')[0];
  if (old) disk.replaceChild(source, old);
  else disk.insertBefore(source, disk.firstChild);
  // The placeholder's backing chain (a containerDisk's) has no meaning over NBD.
  for (const el of children(disk, 'backingStore')) remove(el);

  let driver = children(disk, 'driver')[0];
  if (!driver) {
    driver = doc.createElement('driver');
    disk.insertBefore(driver, source.nextSibling);
  }
  if (!driver.getAttribute('name')) driver.setAttribute('name', 'qemu');
  // The export is the volume's raw bytes, whatever format the placeholder had (emptyDisk: qcow2).
  driver.setAttribute('type', 'raw');
  // KubeVirt picks writethrough when the placeholder's filesystem lacks O_DIRECT, a fact about
  // the placeholder, not the export: keep only a cache mode the VMI asked for.
  driver.setAttribute('cache', item.cache ?? 'none');
  // io= selects the AIO engine of libvirt's file backend; an NBD source has none.
  driver.removeAttribute('io');

  // libvirt copies every non-shareable disk in a storage migration (qemuMigrationAnyCopyDisk)
  // when KubeVirt lists none, which it does when another local volume (the placeholder
  // emptyDisk, cloud-init) makes it a block migration: that would mirror the volume onto itself.
  if (children(disk, 'shareable').length === 0) disk.insertBefore(doc.createElement('shareable'), source.nextSibling);
}
