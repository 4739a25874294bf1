// NbdServer: serves one BlockDevice to NBD clients (fixed newstyle, see
// docs/nbd-frontend.md) on a unix socket or TCP. No thread of its own: the process's poller
// accepts, a short-lived thread per connection runs its handshake, the process's connection
// loops read the connections (a TLS connection keeps its thread), and a shared pool of I/O
// workers calls the device and sends replies (out of order, under a per-connection send lock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block/block-device.h"
#include "block/replica-endpoint.h"
#include "nbd/nbd-handoff-record.h"
#include "util/status.h"

namespace mooring {

struct NbdServerOptions {
  std::string unix_path;         // listen here if set (stale socket file is replaced)
  std::string tcp_host;          // else TCP: host (default 127.0.0.1)
  int tcp_port = 0;              //           port (0 = ephemeral; see NbdServer::port())
  std::string export_name;       // name listed by NBD_OPT_LIST; "" is accepted as the default export
  std::string description;
  bool read_only = false;
  uint32_t max_request_bytes = 32u << 20;  // advertised max block size, and request cap
  uint32_t io_threads = 4;                 // worker pool size
  uint32_t max_connections = 64;
  uint32_t max_inflight_per_connection = 64;  // reader stops reading past this
  // READ and WRITE bytes in flight across all connections: past it a reader stops reading
  // until its own requests are answered; a connection with nothing in flight always gets
  // one request (net/memory-budget.h).
  uint64_t max_inflight_bytes_total = 128ull << 20;
  // Mutual TLS when enabled(): clients must negotiate NBD_OPT_STARTTLS before anything else
  // and present a certificate signed by tls.ca_pem (docs/nbd-frontend.md, "TLS"). Such an
  // export cannot be detached for a hand-off (TLS state cannot move to another process).
  TlsConfig tls;
};

// Latency buckets of NbdServerStats::ops: bucket i (0..kNbdLatencyBuckets-2) counts requests
// that took at most 2^i microseconds (1 us .. 2^(N-2) us, about 4.2 s); the last one the rest.
constexpr int kNbdLatencyBuckets = 24;

// Request kinds counted apart (docs/metrics.md): READ, WRITE, FLUSH, TRIM, WRITE_ZEROES, and
// the rest (CACHE, BLOCK_STATUS, unknown commands).
enum NbdOpKind : int { kNbdOpRead = 0, kNbdOpWrite, kNbdOpFlush, kNbdOpTrim, kNbdOpWriteZeroes, kNbdOpOther, kNbdOpKinds };

// Requests of one kind: how many, their time from a worker taking the request to its reply
// being queued for sending (device time; queueing before it and sending after are not in
// it), and that time in log2 buckets (not cumulative).
struct NbdOpStats {
  uint64_t count = 0;
  uint64_t errors = 0;
  uint64_t sum_ns = 0;
  uint64_t buckets[kNbdLatencyBuckets] = {};
};

struct NbdServerStats {
  uint64_t connections_total = 0;
  uint64_t connections_open = 0;
  uint64_t requests = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t protocol_errors = 0;  // connections dropped for malformed traffic
  std::vector<uint64_t> connection_ids;  // of the open connections, ascending; kept across hand-offs
  NbdOpStats ops[kNbdOpKinds];
  // The export's MemoryBudget of in-flight READ/WRITE bytes.
  uint64_t budget_limit_bytes = 0;
  uint64_t budget_used_bytes = 0;
  uint64_t budget_peak_bytes = 0;
  uint64_t budget_waits = 0;
  uint64_t inline_reads = 0;  // READs answered by the connection loop, without a worker
  uint64_t loop_writes = 0;   // WRITEs started by the connection loop, without a worker
  uint64_t grouped_requests = 0;  // READs and WRITEs handed to the device in groups of two or more
};

class NbdServer {
 public:
  virtual ~NbdServer() = default;

  // The device must outlive the server (Close before destroying the device).
  static Status Start(BlockDevice* device, const NbdServerOptions& opts, std::unique_ptr<NbdServer>* out);

  virtual int port() const = 0;  // bound TCP port, 0 for unix
  virtual NbdServerStats stats() const = 0;
  // Stops accepting, stops reading new requests, waits for in-flight requests to be
  // answered, flushes the device, closes every connection, removes the unix socket file.
  // Idempotent; blocks (call it off the JS thread).
  virtual Status Close() = 0;

  // --- Hand-off to another process (docs/nbd-frontend.md, "Hand-off of an export between
  // processes"). All of these block: call them off the JS thread.

  // Builds a server from a record received from another process: the listening socket and
  // the connections are taken over as they are (no handshake), the protocol-visible options
  // come from the record, io_threads/max_connections/max_inflight_per_connection from
  // `runtime`. The server starts frozen: it serves nothing until Unfreeze(), and until then
  // it only closes its fds if closed (the sender may still take the export back). Takes
  // rec->fds (closed on failure too). kProtocolError when it cannot keep what a connection
  // was promised.
  static Status Adopt(BlockDevice* device, const NbdServerOptions& runtime, NbdServerRecord* rec,
                      std::unique_ptr<NbdServer>* out);

  // Stops accepting (the listening socket stays open: new clients wait in its backlog) and
  // brings every connection to a request boundary with nothing in flight (see
  // NbdConnection::RequestFreeze). kBusy if one does not get there within timeout_ms (a
  // client that does not read its replies, a WRITE payload or a handshake that does not
  // arrive): everything then runs on as if never frozen. kInvalidState unless serving.
  // hold: frozen, each connection still answers the FLUSHes at the head of its stream
  // (NbdConnection::AnswerHeldFlush), for an export that holds its clients' requests while
  // its engine is a standby; not for a hand-off to another process (Detach), whose
  // device closes while the server is frozen.
  virtual Status Freeze(int timeout_ms, bool hold = false) = 0;
  // Frozen only: the record of the export, with dup()ed fds. The server stays frozen and
  // keeps its own fds, for Unfreeze (rollback), until Close(), which then releases them: it
  // closes its fds only (no reply, no shutdown(), no unlink of the socket file).
  // kUnsupported for an export served over TLS.
  virtual Status Detach(NbdServerRecord* out) = 0;
  // Frozen, detached or adopted: serve again exactly where it stopped (adopted: start), on
  // `device` if not null (the engine was closed and reopened meanwhile; it must be the same
  // volume, at least as large).
  virtual Status Unfreeze(BlockDevice* device) = 0;
  virtual bool detached() const = 0;
};

}  // namespace mooring
