// NbdServerContext: what every connection of one NbdServer shares (the device, the
// options, the worker pool and the counters behind NbdServer::stats()).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "block/block-device.h"
#include "nbd/nbd-server.h"
#include "nbd/worker-pool.h"
#include "net/transport.h"
#include "net/memory-budget.h"

namespace mooring {

struct NbdServerContext {
  BlockDevice* device = nullptr;
  NbdServerOptions opts;
  WorkerPool* pool = nullptr;
  std::shared_ptr<TlsContext> tls;       // set when opts.tls is enabled(): STARTTLS is required
  std::unique_ptr<MemoryBudget> budget;  // opts.max_inflight_bytes_total, across connections
  std::function<void()> reclaim;         // a reader the budget refused calls it (rate-limited by the server)
  int server_wake_fd = -1;  // a connection writes here when it has finished (to be reaped)
  std::atomic<uint64_t> next_connection_id{1};  // ids are never reused, across hand-offs too

  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> protocol_errors{0};
};

}  // namespace mooring
