/**
 * The package's `limits` object: every named default and bound a user of the public API may
 * need (sizes, names, option defaults and their ranges), in one place. Each value is declared
 * once, next to the code it governs, and only re-exported here; `import { limits } from
 * 'mooring'`. docs/api.md groups them with the reasons behind them.
 *
 * @packageDocumentation
 */

// Volumes, names, labels, I/O (src/util/limits.ts).
export * from './util/limits.js';
export { DEFAULT_REPLICA_COUNT } from './cluster/volume-lifecycle.js';
export { NBD_LIMITS } from './nbd/nbd-export.js';

// Mooring options and tickets.
export {
  DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS,
  DEFAULT_REPAIR_INTERVAL_MS,
  DEFAULT_REPLICA_REPLACEMENT_WAIT_MS,
  DEFAULT_TICKET_WAIT_TIMEOUT_MS,
  EVENT_REPAIR_DELAY_MS,
  EVENT_REPAIR_PENDING_MAX,
  HOST_RECHECK_INTERVAL_MS,
  PASS_DURATION_FACTOR,
} from './mooring.js';
export { ATTACHMENT_TICKETS_MAX } from './cluster/cluster-records.js';
export { DEFAULT_LEADER_LEASE_MS, LEADER_LEASE_MIN_MS } from './cluster/leader-lease.js';

// Data engines, gRPC, backing image files and downloads.
export { DATA_ENGINE_DEFAULTS, DATA_ENGINE_LIMITS } from './data-engine/local-data-engine.js';
export { REMOTE_DATA_ENGINE_DEFAULTS } from './data-engine/grpc/remote-data-engine.js';
export { GRPC_LIMITS } from './data-engine/grpc/data-engine-grpc-server.js';
export { BACKING_IMAGE_FILE_LIMITS } from './data-engine/backing-image-files.js';
export { DOWNLOAD_DEFAULTS, DOWNLOAD_LIMITS } from './backing-image/download.js';

// Upgrades of the data engines.
export { DEFAULT_UPGRADE_STEP_TIMEOUT_MS, UPGRADE_LEASE_MS } from './upgrade/upgrade-controller.js';
export { UPGRADE_VOLUMES_PER_HOST_MAX } from './upgrade/upgrade-records.js';

// State store documents.
export { STATE_DOCUMENT_BYTES_MAX, STATE_KIND_PATTERN } from './state/state-keys.js';

// Locks (sanlock).
export {
  DEFAULT_IO_TIMEOUT_SECONDS,
  HOST_ID_MAX,
  IO_TIMEOUT_SECONDS_MAX,
  IO_TIMEOUT_SECONDS_MIN,
  LOCK_NAME_PATTERN,
  MAX_LOCKS_MAX,
} from './locks/lockspace.js';
export { LOCKS_PER_PROCESS_MAX } from './locks/lock.js';
