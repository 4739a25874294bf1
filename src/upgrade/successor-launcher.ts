/**
 * The launcher an upgrade uses when the embedder gave none: each host's data engine, started
 * with `mooring data-engine --allow-successor-exec PREFIX`, is asked over gRPC to stop and
 * start the new version's `command` in its place, with its own arguments (src/cli/successor.ts).
 *
 * @packageDocumentation
 */
import { RemoteDataEngine } from '../data-engine/grpc/remote-data-engine.js';
import { MooringError } from '../errors.js';
import type { DataEngineLauncher } from './upgrade-session.js';

/** See the module comment. */
export const successorLauncher: DataEngineLauncher = {
  async replace(hostId, dataEngine, { engine }) {
    if (!dataEngine.command) throw new MooringError('INVALID_ARGUMENT', `host ${hostId} starts its successor itself, from a command; dataEngine has none`);
    if (!(engine instanceof RemoteDataEngine)) throw new MooringError('UNSUPPORTED', `host ${hostId}'s data engine is not reached over gRPC, so it cannot start its successor`);
    await engine.replaceProcess(dataEngine.command);
  },
};
