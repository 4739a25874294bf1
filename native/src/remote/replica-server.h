// ReplicaServer: serves the replicas under one root directory to engines on other hosts
// over the replica protocol (remote/replica-protocol.h, docs/replica-protocol.md).
//
// `root` is the directory whose subdirectories are replicas, named by the client in its
// HELLO (the data engine's DIR/replicas). Names that are not plain [A-Za-z0-9._-]{1,63}, or
// that resolve outside root (a symlink), are refused. A connection opens its replica
// through ReplicaRegistry::Global() (shared with local engines of this process) and gives
// it back when it closes.
//
// Threads: one accept thread; per connection a reader thread (handshake, then reads and
// queues requests, bounded by in-flight count and bytes) and a writer thread (sends replies
// in completion order); a shared WorkerPool runs the requests against the replica. Writer
// epochs are never looked at here: each request's epoch goes to the replica, which checks
// it under its own lock (invariant 2).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "block/replica-endpoint.h"
#include "util/status.h"

namespace mooring {

struct ReplicaServerOptions {
  std::string root;                  // absolute; must exist
  // Not empty: HELLO with rp::kFlagBackingFile may name a ready backing image file under
  // this directory (<key>/image), served read-only (remote/backing-file-replica.h). Need not
  // exist yet.
  std::string backing_files_root;
  std::string host = "127.0.0.1";
  int port = 0;                      // 0: any free port (see ReplicaServer::port())
  TlsConfig tls;                     // mutual TLS when enabled()
  // Not empty: every client must prove it before HELLO (remote/replica-auth.h), and the
  // server proves it back. Empty: clients are not authenticated (and AUTH is refused).
  std::string cluster_secret;
  uint32_t max_connections = 256;
  // A peer's (IP address's) share of connections still before their HELLO reply: on a full
  // server, the oldest connection of a peer over its share is dropped for a new one first
  // (net/acceptor.h). Connections past HELLO are never dropped for another, nor capped per peer.
  uint32_t max_handshaking_per_peer = 64;
  uint32_t io_threads = 16;          // shared worker pool (requests block on disk I/O)
  // WRITE requests up to this size (without FUA) run on the connection loop that read them
  // when the replica can take them without waiting (ReplicaBackend::TryWrite), and READs up
  // to this size when every byte is in the page cache (TryRead); larger ones, and any that
  // would wait, go to the worker pool. 0: always the pool.
  uint32_t inline_max_bytes = 16u << 10;
  uint32_t max_inflight_per_connection = 128;          // reader stops reading past this
  uint64_t max_inflight_bytes_per_connection = 64ull << 20;  // ...or past this (plus one request)
  // All connections together: a reader waits (reads nothing) while its request does not fit,
  // unless its connection has nothing in flight (net/memory-budget.h).
  uint64_t max_inflight_bytes_total = 256ull << 20;
  uint32_t handshake_timeout_ms = 10000;  // connect to HELLO answered
  // A connection with nothing in flight that sends nothing for this long is dropped
  // (clients ping every 2 s when idle), releasing its replica.
  uint32_t idle_timeout_ms = 30000;
};

struct ReplicaServerStats {
  uint64_t connections_total = 0;
  uint64_t connections_open = 0;
  uint64_t requests = 0;
  uint64_t stale_epoch_refusals = 0;
  uint64_t protocol_errors = 0;  // bad frames answered with PROTOCOL_ERROR, or dropped connections
  uint64_t auth_failures = 0;    // connections refused UNAUTHENTICATED (no proof, or a wrong one)
  uint64_t connections_refused = 0;  // closed at accept: server full, nothing it could drop
  uint64_t handshakes_dropped = 0;   // dropped while in their handshake, for a new connection
  uint64_t bytes_read = 0;       // data read from replicas for clients
  uint64_t bytes_written = 0;    // data written to replicas for clients
  uint64_t inline_writes = 0;    // WRITEs done on the connection loop (inline_max_bytes)
  uint64_t inline_reads = 0;     // READs answered on the connection loop from the page cache
  uint64_t buffer_bytes = 0;       // request and reply bytes held now, across connections
  uint64_t buffer_bytes_peak = 0;  // the most held at once
  uint64_t buffer_waits = 0;       // requests that waited for the budget (back-pressure)
};

// What GoAway() did, by connection.
struct ReplicaServerGoAway {
  uint64_t goaway = 0;     // sent GOAWAY; the client half-closed within the timeout
  uint64_t timed_out = 0;  // sent GOAWAY; closed by the server when the timeout passed
  uint64_t closed = 0;     // client without the feature (or mid-handshake): closed as by Close()
};

class ReplicaServer {
 public:
  virtual ~ReplicaServer() = default;

  static Status Start(const ReplicaServerOptions& opts, std::unique_ptr<ReplicaServer>* out);

  virtual int port() const = 0;
  virtual ReplicaServerStats stats() const = 0;
  // Stops accepting, stops reading requests, lets those in flight finish and be answered
  // (bounded by a drain timeout), closes every connection and releases its replica.
  // Idempotent; blocks (call it off the JS thread).
  virtual Status Close() = 0;
  // Graceful hand-over of the clients (docs/replica-protocol.md, "GOAWAY"): stops accepting
  // (the listening socket stays open: new connects wait in its backlog until Close(), which
  // resets them, or a successor takes the socket); sends GOAWAY to every connection whose
  // client announced kFeatureGoAway and answers everything it receives until that client
  // half-closes; closes the other connections as Close() does. After timeout_ms, connections
  // still open are closed as Close() does. Returns once every connection has closed and
  // released its replica. The server accepts nothing afterwards: Close() it. Blocks.
  virtual Status GoAway(uint32_t timeout_ms, ReplicaServerGoAway* out) = 0;
};

}  // namespace mooring
