// The controllers of src/cluster/ built directly over their shared state layer, fake data
// engines and an in-memory store, without the Mooring facade: what each controller's unit
// test starts from. Events are recorded as [event, ...args] (volume events as [event, volume, ...args]).
import { AttachmentController } from '../../../src/cluster/attachment-controller.js';
import { CLUSTER_SCHEMA_VERSION, KIND } from '../../../src/cluster/cluster-records.js';
import { ControlState, type ControlSettings } from '../../../src/cluster/control-state.js';
import { EngineLifecycle } from '../../../src/cluster/engine-lifecycle.js';
import { Hosts } from '../../../src/cluster/hosts.js';
import { MigrationController } from '../../../src/cluster/migration-controller.js';
import { RepairController } from '../../../src/cluster/repair-controller.js';
import { VolumeLifecycle } from '../../../src/cluster/volume-lifecycle.js';
import { MooringError } from '../../../src/errors.js';
import { MemoryStateStore } from '../../../src/state/memory-state-store.js';
import { FakeDataEngine } from '../fakes/fake-data-engine.js';

export const SIZE = 64 * 4096;
let seq = 0;

// Volumes here have no backing image: a call to the image controller is a bug in the test.
const noImages = {
  waitReady: () => Promise.reject(new MooringError('UNSUPPORTED', 'no backing images in controller unit tests')),
  acquire: () => Promise.reject(new MooringError('UNSUPPORTED', 'no backing images in controller unit tests')),
};

export async function controlFixture(hostIds = ['a', 'b', 'c'], settings: Partial<ControlSettings> = {}) {
  const fakes = hostIds.map((h) => new FakeDataEngine(h));
  const store = new MemoryStateStore();
  const events: unknown[][] = [];
  const hosts = new Hosts(() => undefined);
  for (const f of fakes) {
    hosts.set(f.hostId, f);
    await store.put(KIND.host, f.hostId, { schema: CLUSTER_SCHEMA_VERSION, hostId: f.hostId, replicaAddress: f.replicaAddress, lastSeenMs: Date.now() });
  }
  const state = new ControlState(
    store,
    hosts,
    { replacementWaitMs: 0, ticketWaitMs: 2000, engineIoTimeoutMs: undefined, ...settings },
    { cluster: (event, ...args) => events.push([event, ...args]), volume: (name, event, ...args) => events.push([event, name, ...args]) },
  );
  const engines = new EngineLifecycle(state);
  const migrations = new MigrationController(state, engines);
  const attachment = new AttachmentController(state, engines, migrations);
  const repair = new RepairController(state, noImages);
  const volumes = new VolumeLifecycle(state, attachment, noImages);
  const newVolume = async (accessMode: 'rwo' | 'migratable' = 'rwo', on?: string[]): Promise<string> => {
    const name = `v${++seq}`;
    await volumes.create({ name, sizeBytes: SIZE, accessMode, ...(on ? { hosts: on } : {}) });
    return name;
  };
  const eventNames = () => events.map((e) => e[0]);
  return { fakes, store, events, eventNames, state, engines, migrations, attachment, repair, volumes, newVolume };
}
