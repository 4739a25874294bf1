// NbdConnection: one NBD client. Its own thread runs the handshake, then reads requests
// and hands them to the shared WorkerPool; workers call the device and send replies
// (possibly out of order) under the connection's send lock. Sends never block a worker: a
// reply the socket cannot take yet is queued and the connection thread finishes it when
// the socket is writable, so a client that stops reading stalls only itself.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nbd/nbd-request.h"
#include "nbd/nbd-server-context.h"

namespace mooring {

class NbdConnection {
 public:
  // Limits (see docs/nbd-frontend.md).
  static constexpr int kHandshakeTimeoutMs = 10000;            // whole handshake, greeting to GO
  static constexpr uint32_t kHandshakeOptionsMax = 64;         // options per handshake
  static constexpr uint32_t kOptionPayloadMax = 64u << 10;     // larger: ERR_TOO_BIG
  static constexpr uint32_t kOptionDiscardMax = 1u << 20;      // larger still: drop
  static constexpr uint32_t kNameMax = 4096;                   // export names, context queries
  static constexpr size_t kRecvBufferBytes = 128u << 10;
  static constexpr size_t kDirectRecvMinBytes = 16u << 10;     // payload tail read straight into the request
  static constexpr uint64_t kInflightBytesMax = 64ull << 20;   // reader pauses past this (plus one request)
  static constexpr size_t kPooledBufferMaxBytes = 4u << 20;    // larger buffers are freed on recycle
  static constexpr size_t kPooledBytesMax = 32u << 20;         // idle buffer memory kept per connection
  static constexpr uint32_t kReadExtentsMax = 64;              // extents looked up per structured READ
  static constexpr uint32_t kBlockStatusExtentsMax = 8192;     // descriptors per BLOCK_STATUS reply
  static constexpr int kDrainTimeoutMs = 10000;                // waiting for a client to take its replies
  static constexpr uint32_t kPreferredBlockBytes = 4096;

  NbdConnection(NbdServerContext* ctx, int fd);
  ~NbdConnection();
  NbdConnection(const NbdConnection&) = delete;
  NbdConnection& operator=(const NbdConnection&) = delete;

  void Start();
  // Stop reading new requests; answer those in flight; then close. Returns at once.
  void RequestStop();
  bool finished() const { return finished_.load(); }
  void Join();

 private:
  enum class ParseResult { kNeedMore, kPaused, kDisc, kProtocolError };
  enum class WaitResult { kReady, kTimeout, kStopped, kError };

  void Run();
  // Handshake; true when the client entered the transmission phase.
  bool Handshake();
  bool HandleInfo(uint32_t opt, const uint8_t* p, uint32_t len, bool* go);
  bool HandleMetaContext(uint32_t opt, const uint8_t* p, uint32_t len);
  bool SendOptReply(uint32_t opt, uint32_t type, const void* data, size_t len);
  bool SendOptError(uint32_t opt, uint32_t type, const char* msg);
  bool RecvExact(void* buf, size_t n);
  bool Discard(size_t n);
  bool SendAll(const void* buf, size_t n);
  WaitResult WaitFd(short events);
  bool NameMatches(const uint8_t* name, uint32_t len) const;
  uint16_t TransmissionFlags() const;

  void Transmission();
  ParseResult Parse(WorkerPool::Batch* batch);
  uint32_t Validate(const NbdRequest* r) const;
  int RecvSome();  // >0 bytes, 0 EOF, -EAGAIN, or another negative errno
  bool CanAcceptMore() const;

  static void RunJob(WorkerPool::Job* job);
  void Execute(NbdRequest* r);
  void BuildSimple(NbdRequest* r, uint32_t error, bool with_data);
  void BuildChunkError(NbdRequest* r, uint32_t error);
  void ExecuteRead(NbdRequest* r);
  void ExecuteStructuredRead(NbdRequest* r);
  void ExecuteBlockStatus(NbdRequest* r);

  void SendReply(NbdRequest* r);
  int SendIov(NbdRequest* r);  // 1 sent, 0 would block, -1 connection broken
  void FlushPendingLocked();
  void MarkDeadLocked();
  void CompleteLocked(NbdRequest* r);
  void ReleaseUnsent(NbdRequest* r);

  NbdRequest* Acquire();
  void Recycle(NbdRequest* r);
  void Signal();

  NbdServerContext* const ctx_;
  BlockDevice* const dev_;
  const int fd_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> stop_requested_{false};

  // Handshake state.
  int64_t deadline_ms_ = 0;  // 0: none
  bool no_zeroes_ = false;
  bool structured_ = false;
  bool meta_base_allocation_ = false;
  uint64_t size_ = 0;

  // Reader state (connection thread only).
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rpos_ = 0;
  size_t rend_ = 0;
  NbdRequest* cur_ = nullptr;  // WRITE whose payload is being received
  size_t cur_got_ = 0;
  bool disc_ = false;

  // Shared between the reader and the workers.
  std::atomic<uint32_t> inflight_{0};       // parsed, reply not yet fully sent
  std::atomic<uint64_t> inflight_bytes_{0};
  std::atomic<bool> waiting_{false};        // the reader sleeps until in-flight work finishes
  std::atomic<bool> out_pending_{false};
  std::atomic<bool> dead_{false};

  std::mutex send_mu_;  // the socket's write side, the output queue, completion
  NbdRequest* out_head_ = nullptr;
  NbdRequest* out_tail_ = nullptr;

  std::mutex free_mu_;
  NbdRequest* free_ = nullptr;
  size_t pooled_bytes_ = 0;
};

}  // namespace mooring
