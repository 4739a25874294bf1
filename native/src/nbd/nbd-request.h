// NbdRequest: one NBD request from header parse to reply sent. Owned by its connection,
// recycled through the connection's free list so the hot path does not allocate: the data
// buffer, extent vector and reply scratch keep their capacity between requests.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "block/block-device.h"
#include "nbd/worker-pool.h"

namespace mooring {

class NbdConnection;

struct NbdRequest final : WorkerPool::Job, IoCompletion {
  NbdConnection* conn = nullptr;

  // From the wire.
  uint16_t flags = 0;
  uint16_t type = 0;
  uint64_t cookie = 0;
  uint64_t offset = 0;
  uint32_t length = 0;

  // Non-zero: reply with this NBD error without calling the device (validation failed,
  // or the server is shutting down).
  uint32_t early_error = 0;
  // A FLUSH read while the connection is parked in a hold (NbdConnection::AnswerHeldFlush).
  bool held_flush = false;
  // The NBD error the reply carries (0: success); set by Execute, read by its counters.
  uint32_t reply_error = 0;
  // Bytes charged against the connection's in-flight byte budget.
  uint64_t budget_bytes = 0;
  // When Execute began (a WRITE's latency is counted when the device answers).
  uint64_t started_ns = 0;

  // Payload (WRITE) or read data. Grown without zero-filling; capacity kept when recycled
  // unless it exceeds the pooled-buffer limit.
  std::unique_ptr<uint8_t[]> data;
  size_t data_cap = 0;

  std::vector<Extent> extents;

  // Reply: a small inline header for the common case, a scratch area for multi-chunk
  // replies, and the iovec list being sent (advanced in place on partial sends).
  uint8_t head[32];
  std::vector<uint8_t> scratch;
  std::vector<iovec> iov;
  size_t iov_pos = 0;

  NbdRequest* next_out = nullptr;  // link in the connection's pending-output queue
  NbdRequest* next_grouped = nullptr;  // the rest of a group of READs and WRITEs (NbdConnection::ExecuteGroup)
  NbdRequest* next_free = nullptr;  // link in the connection's free list

  // A WRITE's answer from the device (BlockDevice::WriteAsync): the reply goes out.
  void IoDone(int rc) override;

  // False when the buffer cannot be allocated.
  bool EnsureData(size_t n) {
    if (n <= data_cap) return true;
    std::unique_ptr<uint8_t[]> p(new (std::nothrow) uint8_t[n]);
    if (!p) return false;
    data = std::move(p);
    data_cap = n;
    return true;
  }
};

}  // namespace mooring
