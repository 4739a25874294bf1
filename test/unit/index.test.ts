// The public surface, pinned: the main entry exports classes, MooringError and its codes,
// and one `limits` object (types leave no trace at run time). Adding or removing a name is a
// deliberate act: change the list here, and docs/api.md with it.
import { describe, expect, it } from 'vitest';

import * as main from '../../src/index.js';
import * as internal from '../../src/internal.js';

describe('main entry', () => {
  it('exports exactly these runtime names', () => {
    expect(Object.keys(main).sort()).toEqual([
      'BackingImage',
      'DataEngineGrpcServer',
      'DataEngineMetrics',
      'Engine',
      'EtcdStateStore',
      'FileStateStore',
      'LivenessWatcher',
      'LocalDataEngine',
      'Lock',
      'LockedProcess',
      'Lockspace',
      'MemoryStateStore',
      'Migration',
      'Mooring',
      'MooringError',
      'MooringErrorCode',
      'MooringMetrics',
      'RemoteDataEngine',
      'UpgradeSession',
      'Volume',
      'generateClusterSecret',
      'isMooringError',
      'isMooringErrorCode',
      'limits',
      'readClusterSecretFile',
    ]);
  });

  it('gathers every public default and bound in `limits`', () => {
    expect(Object.keys(main.limits).sort()).toEqual([
      'ATTACHMENT_TICKETS_MAX',
      'BACKING_IMAGE_FILE_LIMITS',
      'BLOCK_SIZE_BYTES',
      'DATA_ENGINE_DEFAULTS',
      'DATA_ENGINE_LIMITS',
      'DEFAULT_BACKING_IMAGE_CLEANUP_WAIT_MS',
      'DEFAULT_IO_TIMEOUT_SECONDS',
      'DEFAULT_LEADER_LEASE_MS',
      'DEFAULT_REPAIR_INTERVAL_MS',
      'DEFAULT_REPLICA_COUNT',
      'DEFAULT_REPLICA_REPLACEMENT_WAIT_MS',
      'DEFAULT_TICKET_WAIT_TIMEOUT_MS',
      'DEFAULT_UPGRADE_STEP_TIMEOUT_MS',
      'DOWNLOAD_DEFAULTS',
      'DOWNLOAD_LIMITS',
      'EVENT_REPAIR_DELAY_MS',
      'EVENT_REPAIR_PENDING_MAX',
      'EXPORT_NAME_LENGTH_MAX',
      'GRPC_LIMITS',
      'HOST_ID_MAX',
      'HOST_RECHECK_INTERVAL_MS',
      'IO_LENGTH_MAX_BYTES',
      'IO_TIMEOUT_SECONDS_MAX',
      'IO_TIMEOUT_SECONDS_MIN',
      'LABEL_COUNT_MAX',
      'LABEL_KEY_PATTERN',
      'LABEL_VALUE_LENGTH_MAX',
      'LEADER_LEASE_MIN_MS',
      'LOCKS_PER_PROCESS_MAX',
      'LOCK_NAME_PATTERN',
      'MAX_LOCKS_MAX',
      'NAME_LENGTH_MAX',
      'NAME_PATTERN',
      'NBD_LIMITS',
      'PASS_DURATION_FACTOR',
      'QUORUM_HOLD_MS_DEFAULT',
      'QUORUM_HOLD_MS_MAX',
      'REMOTE_DATA_ENGINE_DEFAULTS',
      'REPLICA_COUNT_MAX',
      'REPLICA_COUNT_MIN',
      'STATE_DOCUMENT_BYTES_MAX',
      'STATE_KIND_PATTERN',
      'UNIX_SOCKET_PATH_BYTES_MAX',
      'UPGRADE_LEASE_MS',
      'UPGRADE_VOLUMES_PER_HOST_MAX',
      'UUID_PATTERN',
      'VOLUME_SIZE_MAX_BYTES',
      'VOLUME_SPEC_BYTES_MAX',
    ]);
  });

  it('shares no runtime name with mooring/internal', () => {
    const mainNames = new Set([...Object.keys(main), ...Object.keys(main.limits)]);
    expect(Object.keys(internal).filter((n) => mainNames.has(n))).toEqual([]);
  });
});
