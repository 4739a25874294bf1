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
  WorkerPool::Lane* pool = nullptr;  // the export's lane in WorkerPool::Nbd()
  std::shared_ptr<TlsContext> tls;       // set when opts.tls is enabled(): STARTTLS is required
  std::unique_ptr<MemoryBudget> budget;  // opts.max_inflight_bytes_total, across connections
  std::function<void()> reclaim;         // a reader the budget refused calls it (rate-limited by the server)
  int server_wake_fd = -1;  // a connection writes here when it has finished (to be reaped)
  std::atomic<uint64_t> next_connection_id{1};  // ids are never reused, across hand-offs too

  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> grouped_requests{0};  // READs and WRITEs started together (NbdConnection::ExecuteGroup)
  std::atomic<uint64_t> inline_reads{0};  // READs the connection loop answered itself (TryReadInline)
  std::atomic<uint64_t> loop_writes{0};   // WRITEs the connection loop started itself (StartWritesHere)
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> protocol_errors{0};

  // Per request kind (NbdServerStats::ops): relaxed increments by the worker that ran it.
  struct OpCounters {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> sum_ns{0};
    std::atomic<uint64_t> buckets[kNbdLatencyBuckets];
    OpCounters() {
      for (auto& b : buckets) b.store(0, std::memory_order_relaxed);
    }
  };
  OpCounters ops[kNbdOpKinds];

  void CountOp(int kind, uint64_t ns, bool error) {
    OpCounters& c = ops[kind];
    c.count.fetch_add(1, std::memory_order_relaxed);
    c.sum_ns.fetch_add(ns, std::memory_order_relaxed);
    if (error) c.errors.fetch_add(1, std::memory_order_relaxed);
    // ceil(log2(us)): bucket i holds latencies <= 2^i us.
    const uint64_t us = (ns + 999) / 1000;
    int i = us <= 1 ? 0 : 64 - __builtin_clzll(us - 1);
    if (i > kNbdLatencyBuckets - 1) i = kNbdLatencyBuckets - 1;
    c.buckets[i].fetch_add(1, std::memory_order_relaxed);
  }

  void ReadOps(NbdServerStats* s) const {
    for (int k = 0; k < kNbdOpKinds; ++k) {
      // Not one snapshot: a request finishing meanwhile may be in `count` and not yet in
      // its bucket (the metrics collector takes a histogram's count from its buckets).
      for (int i = 0; i < kNbdLatencyBuckets; ++i) s->ops[k].buckets[i] = ops[k].buckets[i].load(std::memory_order_relaxed);
      s->ops[k].sum_ns = ops[k].sum_ns.load(std::memory_order_relaxed);
      s->ops[k].errors = ops[k].errors.load(std::memory_order_relaxed);
      s->ops[k].count = ops[k].count.load(std::memory_order_relaxed);
    }
  }
};

}  // namespace mooring
