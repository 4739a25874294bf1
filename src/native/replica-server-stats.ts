// The replica server's counters, as the addon reports them and the public API passes them on
// (LocalDataEngine.ioStats, metrics): one definition for both.

/** Counters of a data engine's replica server (connections, requests, bytes, buffer budget), as the native side reports them. */
export interface ReplicaServerStats {
  /** Connections accepted. */
  connectionsTotal: number;
  /** Connections open now. */
  connectionsOpen: number;
  /** Requests served. */
  requests: number;
  /** Requests refused because they carried an older writer epoch. */
  staleEpochRefusals: number;
  /** Connections dropped for protocol violations. */
  protocolErrors: number;
  /** Connections refused UNAUTHENTICATED: no proof of the cluster secret, or a wrong one. */
  authFailures: number;
  /** Connections closed at accept: the server was full and had no connection in its handshake to drop. */
  connectionsRefused: number;
  /** Connections dropped while in their handshake to admit a new one on a full server. */
  handshakesDropped: number;
  /** Bytes read from replicas for peers. */
  bytesRead: number;
  /** Bytes written to replicas by peers. */
  bytesWritten: number;
  /** Small writes done on the connection loop that read them, without a hand-off to a worker (the replica could take them without waiting). */
  inlineWrites: number;
  /** Small reads answered on the connection loop that read them, every byte from the page cache. */
  inlineReads: number;
  /** Request and reply bytes held now, across connections. */
  bufferBytes: number;
  /** The most held at once since the server started. */
  bufferBytesPeak: number;
  /** Requests that waited for the budget (back-pressure). */
  bufferWaits: number;
  /** Spare large payload buffers the process keeps for reuse (all its replica connections, both ends; at most 32 MiB). */
  spareBufferBytes: number;
  /** Large payloads (replica reads, rebuild windows) that reused a spare buffer instead of fresh memory, since the process started. */
  spareBufferHits: number;
}
