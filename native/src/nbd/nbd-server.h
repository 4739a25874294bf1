// NbdServer: serves one BlockDevice to NBD clients (fixed newstyle, see
// docs/nbd-frontend.md) on a unix socket or TCP. Own threads: one accept thread, one
// reader thread per connection, and a shared pool of I/O workers that call the device
// and send replies (out of order, under a per-connection send lock).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "block/block-device.h"
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
};

struct NbdServerStats {
  uint64_t connections_total = 0;
  uint64_t connections_open = 0;
  uint64_t requests = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t protocol_errors = 0;  // connections dropped for malformed traffic
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
};

}  // namespace mooring
