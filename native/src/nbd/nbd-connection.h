// NbdConnection: one NBD client. A short-lived thread (mr-nbd-hello) runs the handshake;
// once the client is in the transmission phase its socket is registered with one of the
// process's connection loops (Poller::ForConnection, net/poller.h), which reads and parses
// requests without waiting (a half-read header or WRITE payload stays until the next turn)
// and hands them to the shared WorkerPool; workers call the device and send replies
// (possibly out of order) under the connection's send lock. A small READ of bytes a
// replica in this process holds in the page cache is answered by the loop itself
// (TryReadInline), without the hand-off. A WRITE, and a READ not split
// by holes, go through BlockDevice::WriteAsync / ReadAsync: the reply is sent by whichever
// thread the device answers on
// (for an engine over remote replicas, the loop that read the last replica's answer), so
// no worker waits for the network. Sends never block a worker: a
// reply the socket cannot take yet is queued and the loop finishes it when the socket is
// writable, so a client that stops reading stalls only itself. A connection costs no thread
// once in transmission (docs/architecture.md, "Threads").
//
// Hand-off (docs/nbd-frontend.md, "Hand-off of an export between processes"): a freeze
// brings the connection to a request boundary with nothing in flight and parks it (a loop
// state: its socket unwatched); from there it resumes (Unfreeze), or gives its state away
// (Snapshot) and leaves the socket to another process (Release). A connection built from
// such a state (the adopting constructor) skips the handshake and goes to a loop at once.
// None of this ever shutdown()s the socket: shutdown acts on the socket, not on this
// process's fd, so it would cut the connection in the new owner.
//
// TLS (NBD_OPT_STARTTLS, required when the server has a TlsContext): from the handshake on,
// every byte goes through tls_ (net/transport.h) instead of the socket, on the loop too (a
// TLS read may wait for the socket to be writable); such a connection cannot be snapshotted
// for a hand-off.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nbd/nbd-handoff-record.h"
#include "nbd/nbd-request.h"
#include "nbd/nbd-server-context.h"
#include "net/poller.h"
#include "net/reply-batch.h"
#include "net/transport.h"

namespace mooring {

class NbdConnection final : private ReplyBatch::Sender {
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
  static constexpr int kBudgetRetryMs = 20;                    // re-try for the export's memory budget
  static constexpr uint32_t kPreferredBlockBytes = 4096;
  static constexpr uint32_t kInlineReadMaxBytes = 64u << 10;   // larger READs always go to a worker
  static constexpr size_t kGatherIovMax = 64;                // iovecs in one sendmsg of queued replies
  static constexpr uint32_t kGroupMax = 32;                  // READs and WRITEs in one group at most
  static constexpr uint32_t kGroupMaxBytes = 64u << 10;      // larger ones are never grouped
  static constexpr uint32_t kLoopWriteMaxBytes = 256u << 10; // WRITE bytes one turn starts on the loop (their copy)

  enum class FreezeResult { kFrozen, kFailed, kFinished };

  // An accepted client: the handshake comes first.
  NbdConnection(NbdServerContext* ctx, int fd, uint64_t id);
  // A client adopted from another process: no handshake; `rec.pending` is parsed before
  // anything is read from fd. Check Honours(rec) first.
  NbdConnection(NbdServerContext* ctx, int fd, const NbdConnectionRecord& rec);
  ~NbdConnection();
  NbdConnection(const NbdConnection&) = delete;
  NbdConnection& operator=(const NbdConnection&) = delete;

  // Accepted: starts the handshake thread. Adopted: registers with a connection loop.
  void Start();
  // Stop reading new requests; answer those in flight; then close. Returns at once.
  void RequestStop();
  bool finished() const { return finished_.load(); }
  // Until the client entered the transmission phase: Acceptor's per-peer limit.
  bool handshaking() const { return handshaking_.load(); }
  void Join();
  uint64_t id() const { return id_; }

  // Whether this server can keep what `rec` promised its client (same flags, limits, ids).
  static Status Honours(const NbdServerContext& ctx, const NbdConnectionRecord& rec);

  // Asks the connection to stop at a request boundary: it reads nothing more from the socket
  // except the rest of a WRITE payload already begun (exactly that many bytes), parses
  // what it holds, and parks once nothing is in flight and no reply is queued. Past
  // deadline_ms it gives up and carries on as if never asked. Returns at once.
  // hold: parked, it answers FLUSHes at the head of the stream (AnswerHeldFlush); only for a
  // device that outlives the freeze (not a hand-off, whose engine closes while frozen).
  void RequestFreeze(int64_t deadline_ms, bool hold = false);
  // Waits (until until_ms) for the connection's answer; on kFailed it runs normally again.
  FreezeResult WaitFreeze(int64_t until_ms);
  // Frozen, or a freeze under way: carry on exactly where it stopped, on `device` if given.
  void Unfreeze(BlockDevice* device);
  // Frozen only: its state, with a dup of its socket in *fd.
  Status Snapshot(NbdConnectionRecord* out, int* fd) const;
  // Frozen only: the connection ends without touching the socket (no reply, no shutdown).
  void Release();
  // How long replies have waited for a client that takes none of them (0: none waiting).
  int64_t RepliesStalledMs(int64_t now_ms) const {
    const int64_t since = send_stalled_since_ms_.load();
    return since == 0 ? 0 : now_ms - since;
  }
  // Drops the connection at once (the export's memory budget is exhausted and this client
  // does not read its replies): queued replies are discarded, their budget given back.
  void Kill();
  // Whether this client takes its replies: it has taken one, and none has waited longer than
  // kResponsiveStallMs. Only such a client may use the budget's reserve.
  bool Responsive(int64_t now_ms) const { return replied_.load() && RepliesStalledMs(now_ms) < kResponsiveStallMs; }

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
  // STARTTLS acknowledged: the TLS handshake, within the NBD handshake's deadline.
  bool StartTls();
  // One recv() of at most n bytes, or one TLS read: >0, 0 at EOF, -EAGAIN, or -errno.
  ssize_t RecvRaw(void* buf, size_t n);
  static bool IsBareFlush(const uint8_t* h);
  void HeldFlushReply(uint64_t cookie, uint8_t* reply);
  bool NameMatches(const uint8_t* name, uint32_t len) const;
  uint16_t TransmissionFlags() const;
  static uint16_t TransmissionFlags(const NbdServerOptions& o, bool structured);

  bool FreezeRequested() const { return freeze_requested_.load(); }
  void FreezeFailed();

  // A connection that never reached a loop (handshake failed, stopped or refused): nothing
  // was in flight.
  void FinishThread();
  // shutdown (unless released), finished_, the server's wake.
  void MarkFinished();

  // --- On a connection loop (nbd-connection-loop.cc); the handler's state below. ---
  bool Register();
  void OnLoop();
  void Turn();
  // Parked (frozen) on the loop: false once it is no longer parked (carry on with Turn).
  bool ParkedTurn();
  // Parked in a hold: a FLUSH at the head of the stream is read and handed to a worker.
  void AnswerHeldFlush();
  // The event(s) a TLS read that could not go on waits for (EPOLLIN without TLS).
  uint32_t ReadEvents() const;
  // Reading ended (clean: answered everything; else the connection is dropped).
  void EndTransmission(bool clean);
  void TryFinishLoop();
  void Watch(uint32_t events);
  void Nudge();

  // Parses what rbuf_ holds into batch (ParseRequests), READs and WRITEs grouped (group_io_).
  ParseResult Parse(WorkerPool::Batch* batch);
  ParseResult ParseRequests(WorkerPool::Batch* batch);
  // A READ or a WRITE whose payload is in: into the group, or the batch where requests are
  // not grouped (or it is neither, too large, or answered with an error).
  void PushGroupable(NbdRequest* r, WorkerPool::Batch* batch);
  void EndGroup(WorkerPool::Batch* batch);  // the group, as one job, into the batch
  // The group's leading WRITEs (at most kLoopWriteMaxBytes together) that the device starts
  // without waiting (BlockDevice::TryWriteAsyncMany) start here, on the loop: no hand-off
  // to a worker, whose wake-up costs more than the start. Returns the rest of the group
  // (for a worker), or nullptr.
  NbdRequest* StartWritesHere(NbdRequest* head);
  uint32_t Validate(const NbdRequest* r) const;
  // >0 bytes, 0 EOF, -EAGAIN, or another negative errno. `exact`: of a WRITE payload begun,
  // receive no byte past its end.
  // *drained: a plain socket gave less than asked, so it has nothing more now (level-triggered
  // epoll reports what comes next; TLS may hold decrypted bytes, so never set for it).
  int RecvSome(bool exact, bool* drained);
  bool CanAcceptMore() const;

  static void RunJob(WorkerPool::Job* job);
  void Execute(NbdRequest* r);
  // A READ's or WRITE's answer from the device (NbdRequest::IoDone): builds and sends its
  // reply.
  friend struct NbdRequest;
  void FinishIo(NbdRequest* r, int rc);
  void BuildSimple(NbdRequest* r, uint32_t error, bool with_data);
  void BuildChunkError(NbdRequest* r, uint32_t error);
  // An OFFSET_DATA chunk for r's bytes [pos, pos + len): its 28-byte header written at hdr,
  // header and bytes appended to r->iov. Returns the header's size.
  size_t AppendDataChunk(NbdRequest* r, uint8_t* hdr, uint16_t flags, uint64_t pos, uint32_t len);
  // On the loop, for a READ just parsed: answers it at once if the device can without
  // waiting (BlockDevice::TryRead: bytes in the page cache of a replica in this process),
  // as one data chunk or a simple reply. False: it goes to a worker as usual.
  bool TryReadInline(NbdRequest* r);
  // A group of READs and WRITEs (r, then r->next_grouped...): to the device together
  // (WriteAsyncMany, ReadAsyncMany).
  void ExecuteGroup(NbdRequest* r, uint64_t started_ns);
  // A grouped request out of its group, ready for the device (no reply built yet, its
  // latency counted from started_ns).
  static void Unlink(NbdRequest* g, uint64_t started_ns);
  static BlockDevice::AsyncWriteReq WriteReqOf(NbdRequest* g);  // a WRITE as the device takes it
  // True when the device answers later (FinishIo); else r's reply is built.
  bool ExecuteRead(NbdRequest* r, uint64_t started_ns);
  void ExecuteStructuredRead(NbdRequest* r);
  void ExecuteBlockStatus(NbdRequest* r);

  void SendReply(NbdRequest* r);
  void QueueOutLocked(NbdRequest* r);  // at the tail of the output queue (send_mu_ held)
  int SendIov(NbdRequest* r);  // 1 sent, 0 would block, -1 connection broken
  // Advances r's iovecs past up to *left bytes sent (less what it takes); true once all of
  // r is sent.
  static bool ConsumeSent(NbdRequest* r, size_t* left);
  // Plain socket: the queued replies in one sendmsg (as many as kGatherIovMax iovecs take),
  // again until none is left; those sent whole are completed. As SendIov returns.
  int SendQueuedLocked();
  // The replies queued while registered with the thread's ReplyBatch (net/reply-batch.h).
  void SendBatched() noexcept override;
  void FlushPendingLocked();
  void MarkDeadLocked();
  void CompleteLocked(NbdRequest* r);
  void ReleaseUnsent(NbdRequest* r);

  NbdRequest* Acquire();
  void Recycle(NbdRequest* r);
  void Signal();
  // Registered with a loop: the handshake's wake fd is not needed any more.
  void CloseWakeFd();

  NbdServerContext* const ctx_;
  BlockDevice* dev_;  // changed only while frozen (Unfreeze), when nothing is in flight
  const int fd_;
  std::unique_ptr<Transport> tls_;  // set once STARTTLS completed (on a dup of fd_)
  short tls_read_wants_ = 0;         // a TLS read that could not go on waits for these events
  const uint64_t id_;
  const bool adopted_ = false;
  std::mutex wake_mu_;  // Signal's write against CloseWakeFd
  int wake_fd_ = -1;  // wakes the handshake thread; closed once on a loop (Signal nudges it)
  std::thread thread_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> handshaking_{true};
  std::atomic<bool> stop_requested_{false};

  // Handshake state.
  int64_t deadline_ms_ = 0;  // 0: none
  bool no_zeroes_ = false;
  bool structured_ = false;
  bool meta_base_allocation_ = false;
  uint64_t size_ = 0;

  // Reader state (the connection's loop only).
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rpos_ = 0;
  size_t rend_ = 0;
  NbdRequest* cur_ = nullptr;  // WRITE whose payload is being received
  size_t cur_got_ = 0;
  bool disc_ = false;
  // READs and WRITEs parsed in one turn, handed to one worker together, where the device
  // sends them to other hosts (BlockDevice::GroupsRequests): one message per replica for the lot.
  bool group_io_ = false;
  NbdRequest* group_head_ = nullptr;
  NbdRequest* group_tail_ = nullptr;
  uint32_t group_n_ = 0;

  // Shared between the reader and the workers.
  std::atomic<uint32_t> inflight_{0};       // parsed, reply not yet fully sent
  std::atomic<uint64_t> inflight_bytes_{0};
  bool budget_blocked_ = false;  // reader only: Parse paused for the export's memory budget
  std::atomic<bool> waiting_{false};        // the reader sleeps until in-flight work finishes
  std::atomic<bool> out_pending_{false};
  std::atomic<bool> dead_{false};
  std::atomic<int64_t> send_stalled_since_ms_{0};  // queued replies made no progress since (0: none queued)
  std::atomic<bool> replied_{false};               // a reply went out whole

  std::mutex send_mu_;  // the socket's write side, the output queue, completion
  // Under send_mu_: registered with a thread's ReplyBatch; replies queue until it closes.
  // Counted in inflight_ meanwhile, so the connection outlives the batch.
  bool batched_ = false;
  NbdRequest* out_head_ = nullptr;
  NbdRequest* out_tail_ = nullptr;

  std::mutex free_mu_;
  NbdRequest* free_ = nullptr;
  size_t pooled_bytes_ = 0;

  // Freeze, between the connection's loop and the server.
  enum class FreezeState { kNone, kRequested, kFrozen, kFailed, kReleased };
  mutable std::mutex freeze_mu_;
  std::condition_variable freeze_cv_;
  FreezeState freeze_state_ = FreezeState::kNone;  // guarded by freeze_mu_
  int64_t freeze_deadline_ms_ = 0;                 // guarded by freeze_mu_
  bool freeze_hold_ = false;                        // guarded by freeze_mu_
  std::atomic<bool> freeze_requested_{false};      // freeze_state_ == kRequested, lock-free
  bool released_ = false;                          // the connection's loop only

  // The connection loop (set by Register before loop_id_; read by any thread after).
  Poller* loop_ = nullptr;
  std::atomic<uint64_t> loop_id_{0};
  // The loop handler's own state (the loop's thread only).
  uint32_t watched_ = 0;
  bool eof_ = false;
  bool abandoned_ = false;   // a half-received WRITE was dropped: the buffer is not framed
  int64_t drain_deadline_ = 0;
  bool parked_ = false;      // frozen, the handler set kFrozen
  bool hold_answering_ = false;  // parked in a hold: answering FLUSHes at the head
  bool ending_ = false;      // reading ended: waiting for in-flight work, then finished
};

}  // namespace mooring
