// The hand-off record of an NBD export: what a frozen NbdServer gives away (Detach) and
// what NbdServer::Adopt builds the same export from in another process. It carries what
// the clients were promised, never requests: a frozen server has nothing in flight.
//
// Fds travel beside the bytes (HandOffChannel, SCM_RIGHTS) in a fixed order: the listening
// socket first, then one per connection in record order. Decode trusts nothing: the
// bytes, the fd count and every fd's socket type are checked, and a bad record is
// kProtocolError with its fds closed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "handoff/handoff-channel.h"
#include "util/status.h"

namespace mooring {

// HandOffRecord::kind of an NBD export.
constexpr uint16_t kHandOffKindNbdServer = 1;

struct NbdConnectionRecord {
  uint64_t id = 0;                  // kept for the connection's life
  uint64_t size = 0;                // the export size of *its* handshake
  uint32_t max_request_bytes = 0;   // advertised maximum block size
  uint16_t transmission_flags = 0;  // as sent in its handshake
  bool no_zeroes = false;
  bool structured = false;
  bool meta_base_allocation = false;
  uint32_t meta_context_id = 0;     // of base:allocation, when selected
  std::vector<uint8_t> pending;     // received, not parsed yet: less than one request header
};

struct NbdServerRecord {
  // The export as clients know it.
  std::string unix_path;  // "" for TCP
  int tcp_port = 0;
  std::string export_name;
  std::string description;
  bool read_only = false;
  uint32_t max_request_bytes = 0;
  // The socket file: only a server whose record says so unlinks it, and only this inode.
  bool own_socket_file = false;
  uint64_t sock_dev = 0;
  uint64_t sock_ino = 0;
  // Counters continue across the hand-off; ids are never reused.
  uint64_t next_connection_id = 1;
  uint64_t connections_total = 0;
  uint64_t requests = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t protocol_errors = 0;
  std::vector<NbdConnectionRecord> connections;
  HandOffFds fds;  // [0] listening socket, [1 + i] connection i
};

class NbdHandOffRecords {
 public:
  static constexpr uint32_t kConnectionsMax = 4096;  // NbdServer's max_connections limit
  static constexpr uint32_t kPendingBytesMax = 4096;  // far above one header: room, not a target

  // Moves rec->fds into out->fds.
  static Status Encode(NbdServerRecord* rec, HandOffRecord* out);
  // Moves in->fds into out->fds on success; closes them on failure.
  static Status Decode(HandOffRecord* in, NbdServerRecord* out);
};

}  // namespace mooring
