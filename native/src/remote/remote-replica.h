// RemoteReplica: a ReplicaBackend on another host, reached over the replica protocol
// (remote/replica-protocol.h) through a ReplicaServer.
//
// One connection per replica: the server runs requests concurrently and answers them in
// any order, so a long control operation (a snapshot, a layer digest) does not hold up the
// writes pipelined behind it; a second connection would only add a second way to fail.
// The calling thread writes its request itself (with whatever else is queued, several per
// system call; one writer at a time, in seq order). The connection costs no thread of its
// own: one of the process's connection loops (Poller::ForConnection, net/poller.h) reads
// it, matches replies to callers by seq, checks deadlines by timer, and while idle sends
// the keepalive and the AllocatedBytes refresh without waiting (what the socket does not
// take at once goes on at the loop's next turn). At most `depth` requests are outstanding
// (callers block beyond that; a caller that must not wait, the NBD loop starting a write,
// reserves its slot first, TryReserveWrite, and leaves what its socket does not take at
// once to a worker, SendRest). A request outstanding longer than the endpoint's
// io_timeout_ms fails with -ETIMEDOUT and tears the connection down: every outstanding and
// later call fails (-ENOTCONN), so the engine marks the replica ERR. There is no silent
// reconnect, which could replay writes out of order; the control plane adds a fresh backend
// instead. When idle the loop pings every kKeepaliveMs, so a dead peer is noticed without
// I/O. The failure listener runs on the process's one mr-rr-lost thread, never on a loop:
// it takes the engine's locks, whose holder may be waiting for a reply that loop must read.
//
// GOAWAY (docs/replica-protocol.md): with a server that announces kFeatureGoAway the client
// announces it too (CLIENT_FEATURES right after HELLO). On GOAWAY it stops sending (new
// calls wait in the queue, their callers held), lets every request already sent be answered,
// half-closes, waits for the server to close, then (on a short-lived mr-rr-redial thread, so
// the loop never waits) connects again to the same address with back-off and redoes exactly what Connect does (TLS, HELLO, CLIENT_FEATURES; the cached
// epoch, state and size from the new HELLO reply) and sends what was queued. Nothing is
// resent: only requests that never reached the wire travel on the new connection. If that
// does not succeed within io_timeout_ms of the GOAWAY (or a request sent before it fails),
// the connection is lost as above.
//
// epoch(), clean(), rebuilding() and size() answer from values the HELLO reply gave,
// updated by the replies of the control operations that change them (size: only from
// servers that announce kFeatureGrow; an older server's replicas never change size). AllocatedBytes()
// answers from a cached value and refreshes it in the background (it is asked for on the
// JS thread, which must not wait for a network round trip).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "block/replica-endpoint.h"
#include "remote/replica-protocol.h"
#include "net/poller.h"
#include "net/transport.h"
#include "net/buffer-pool.h"
#include "nbd/worker-pool.h"

namespace mooring {

class RemoteReplica final : public ReplicaBackend {
 public:
  static constexpr uint32_t kMaxInflight = 64;        // requests outstanding per replica
  static constexpr int kKeepaliveMs = 2000;           // ping after this long without sending
  static constexpr int kDeadlineCheckMs = 100;        // how often outstanding requests are checked
  static constexpr int kAllocatedRefreshMs = 1000;    // AllocatedBytes() refreshes at most this often
  static constexpr int kReconnectFirstMs = 5;         // GOAWAY reconnect back-off: first wait...
  static constexpr int kReconnectMaxMs = 500;         // ...doubling up to this
  static constexpr int kReconnectAttemptMs = 1000;    // one connect + handshake attempt at most

  // Connects, handshakes, starts the threads. kUnavailable if the server cannot be reached
  // (or the TLS handshake fails) within ep.io_timeout_ms; the server's code otherwise
  // (kNotFound: it serves no such replica).
  static Status Connect(const ReplicaEndpoint& ep, std::shared_ptr<ReplicaBackend>* out);

  ~RemoteReplica() override;

  std::string id() const override { return id_; }
  bool remote() const override { return true; }
  uint64_t size() const override { return size_.load(); }
  bool CanGrow() const override { return (features_.load() & rp::kFeatureGrow) != 0; }
  // Connections made again after a GOAWAY (for tests and stats).
  uint64_t reconnects() const { return reconnects_.load(); }
  uint64_t epoch() const override { return epoch_.load(); }
  bool clean() const override { return clean_.load(); }
  bool rebuilding() const override { return rebuilding_.load(); }

  Status ClaimEpoch(uint64_t epoch, ReplicaSet* stored, bool* was_clean) override;
  Status SetReplicaSet(const ReplicaSet& set, bool self_rw) override;
  Status PeekReplicaSet(ReplicaSet* out) override;
  Status LastRw(ReplicaSetId* out) override;
  Status MarkClean(uint64_t epoch) override;
  Status Grow(uint64_t size_bytes) override;
  int Read(uint64_t off, uint32_t len, uint8_t* buf) override;
  int Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) override;
  void StartWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua, PendingIo* p) override;
  int FinishWrite(PendingIo* p) override;
  bool TryReserveWrite(uint32_t len) override;
  void CancelReservedWrite() override;
  void SendDeferred(bool may_wait = true) override;
  void StartRead(uint64_t off, uint32_t len, uint8_t* buf, PendingIo* p) override;
  int FinishRead(PendingIo* p, uint8_t* buf) override;
  int Trim(uint64_t epoch, uint64_t off, uint64_t len) override;
  int WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim, bool fast_only, bool fua) override;
  int Flush() override;
  int BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) override;
  Status ListLayers(std::vector<LayerInfo>* out) override;
  Status LayerExtents(const std::string& layer_id, std::vector<Range>* out) override;
  int ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) override;
  Status Snapshot(const std::string& name, int64_t created_ms, const Labels& labels, bool user_created) override;
  Status DeleteSnapshot(const std::string& name) override;
  Status Revert(const std::string& name, int64_t created_ms) override;
  Status AdoptChain(const std::vector<LayerInfo>& layers, uint64_t epoch) override;
  Status LayerDigest(const std::string& layer_id, uint64_t off, uint64_t len, DigestDetail detail,
                     std::vector<UnitDigest>* out) override;
  int WriteLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint32_t len, const uint8_t* buf) override;
  int UnmapLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint64_t len) override;
  Status FinishRebuild() override;
  uint64_t AllocatedBytes() override;
  void SetFailureListener(FailureListener l) override;
  Status Close() override;

 private:
  struct Call {
    rp::RequestHeader h;
    ByteBuffer payload;      // a large one comes from the BufferPool (SubmitParts) and goes back to it
    // Instead of payload: this frame's bytes [shared_off, +shared_len) of a write's buffer
    // shared with the other replicas' frames (PendingIo::shared_bytes), held until sent.
    std::shared_ptr<const ByteBuffer> shared_payload;
    size_t shared_off = 0;
    size_t shared_len = 0;
    const uint8_t* frame_data() const { return shared_payload ? shared_payload->data() + shared_off : payload.data(); }
    size_t frame_size() const { return shared_payload ? shared_len : payload.size(); }
    uint32_t max_reply = 0;  // largest reply payload accepted on success
    bool internal = false;   // ping / refresh: nobody waits
    ReplicaBackend::PendingIo* group = nullptr;  // a part of a write whose caller wants a Wake
    int64_t deadline_ms = 0;
    // Completion, under mu_.
    bool done = false;
    int fail_errno = 0;      // local failure: timeout, connection lost, closed
    rp::ReplyHeader reply;
    ByteBuffer reply_payload;  // a large one goes back to the BufferPool with the call
    std::condition_variable cv;
    ~Call() {
      BufferPool::Get().Give(std::move(payload));
      BufferPool::Get().Give(std::move(reply_payload));
    }
  };
  using CallPtr = std::shared_ptr<Call>;

  // A connection made and handshaken (TLS, HELLO, CLIENT_FEATURES).
  struct Dialed {
    std::unique_ptr<Transport> t;
    RecvBuffer rbuf;
    rp::ReplyHeader hello;
    uint32_t depth = 0;
    uint32_t max_io = 0;
    uint64_t features = 0;
    bool goaway = false;  // both sides announced kFeatureGoAway
  };
  static Status Dial(const ReplicaEndpoint& ep, int64_t deadline_ms, Dialed* d);

  RemoteReplica(const ReplicaEndpoint& ep, Dialed* d);

  static CallPtr NewCall(uint8_t op, uint64_t epoch, uint64_t off, uint64_t len, uint16_t flags = 0);
  // READ / READ_LAYER (with layer_id): SubmitParts, then FinishRead.
  int ReadData(uint8_t op, const std::string* layer_id, uint64_t off, uint32_t len, uint8_t* buf);
  // Queues op over [off, off + len) in calls of at most max_io_ bytes, all in flight at
  // once (p->calls); each call's payload is the layer id (when given) then, for a
  // data-carrying op (WRITE, WRITE_LAYER: `data` given), its share of the data. With
  // p->waker, the answer to the last call wakes it. FinishWrite / FinishRead collect them.
  void SubmitParts(uint8_t op, uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* data, uint16_t flags,
                   const std::string* layer_id, PendingIo* p);
  void SubmitPartsLoop(uint8_t op, uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* data, uint16_t flags,
                       const std::string* layer_id, PendingIo* p);
  // Who sends a submitted call: the caller, now (kNow); the caller, later, with others
  // (kDeferred: SendDeferred); the connection loop (kByLoop: internal calls, a header each).
  // kReserved: as kDeferred, in a slot TryReserveWrite took (never waits).
  enum class Send { kNow, kDeferred, kReserved, kByLoop };
  // Queues c; 0 or -errno. kNow and kDeferred wait while `depth_` are outstanding or
  // reserved (sending what is queued, if nobody is, to make room); kByLoop returns -EAGAIN
  // then. *queued: c went into the queue (so it will be answered or failed), even if a
  // later step throws.
  int Submit(const CallPtr& c, Send send = Send::kNow, bool* queued = nullptr);
  void Wait(const CallPtr& c);
  // Submit + Wait; then 0 or -errno (the reply's, or the local failure).
  int Run(const CallPtr& c);
  Status RunStatus(const CallPtr& c, const char* what);
  void TakeState(const CallPtr& c);
  // Fails every outstanding call with `err` and shuts the transport; then (unless it was
  // Close) tells the failure listener.
  void Teardown(int err);
  // Under mu_; the wakers of the writes it finished go to *wake (run them once mu_ is let go).
  void TeardownLocked(int err, std::vector<Waker*>* wake);
  // Under mu_: c is answered (or failed). The waker to run once mu_ is let go if c was the
  // last part of a write that has one, else null.
  Waker* CompleteLocked(const CallPtr& c);
  bool DeadlinePassedLocked(int64_t now) const;

  // Under mu_ (lk): nothing is being written, calls are queued and may go on this connection.
  bool CanSendLocked() const;
  // Under mu_: every slot is taken, by calls outstanding or reserved.
  bool FullLocked() const { return outstanding_ + reserved_ >= depth_; }
  // Under mu_ (lk, released while writing): writes what is queued, until nothing is.
  // Without may_wait, a batch the socket does not take at once is finished by a worker
  // (SendRest), which then sends what was queued meanwhile; sending_ stays set until then.
  void SendQueuedLocked(std::unique_lock<std::mutex>& lk, bool may_wait = true);
  struct SendRest;
  // A sender's wait for its socket to take more (sending_ set, mu_ not held): 0, or the
  // error to fail the connection with (it died, or the oldest call's deadline passed).
  int WaitToSend(short want);
  static void RunSendRest(WorkerPool::Job* job);
  // After a batch's write (rc: WriteAll's): its payloads given back, sending_ cleared, and
  // on failure the connection torn down. Under mu_ (lk), released and taken again.
  void EndBatchLocked(std::unique_lock<std::mutex>& lk, std::vector<CallPtr>* batch, int rc);

  // The connection loop's side, one turn at a time on the loop's thread, never waiting.
  // Under mu_: t_'s socket read by the loop (Connect, and after a reconnect).
  Status RegisterLocked();
  void OnLoop();
  // Reads what the socket has, reply by reply: 0, kRedial (a GOAWAY is drained), or the
  // errno to tear the connection down with.
  int ReadReplies();
  int StartReply();   // a header was read
  void FinishReply(); // its payload too
  // Under mu_: deadlines, the keepalive, queued internal calls, then what to wait for.
  int HousekeepLocked();
  // Under mu_: writes what the socket takes of loop_out_ (the loop's own calls).
  int LoopSendLocked();
  void Watch(uint32_t events);
  void StopLoopLocked();
  // Under mu_: the loop looks again by at_ms (any thread; only ever earlier).
  void ArmLocked(int64_t at_ms);
  // After a GOAWAY, once nothing sent is unanswered: Redial on a short-lived thread.
  void StartRedial();
  void Redial();
  // Half-close, connect again, resume. False when the connection is lost instead (torn
  // down, or closed).
  bool Reconnect();
  static constexpr int kRedial = -1;
  static constexpr int kRepliesPerTurn = 64;  // then the loop's other connections get a turn

  const ReplicaEndpoint ep_;
  const std::string id_;
  const uint32_t io_timeout_ms_;
  std::unique_ptr<Transport> t_;  // replaced only by Reconnect, under mu_, with nothing being sent
  std::atomic<uint64_t> size_{0};  // from HELLO, then from the `value` of state replies
  std::atomic<uint64_t> features_{0};  // kFeature* the server announced in HELLO
  std::atomic<uint64_t> reconnects_{0};
  uint32_t depth_ = kMaxInflight;
  uint32_t max_io_ = rp::kMaxIoBytes;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> clean_{false};
  std::atomic<bool> rebuilding_{false};
  std::atomic<uint64_t> allocated_{0};
  std::atomic<int64_t> allocated_asked_ms_{0};

  std::mutex mu_;
  std::condition_variable slot_cv_;
  std::deque<CallPtr> queue_;                // not yet sent
  std::map<uint64_t, CallPtr> sent_;         // sent, awaiting the reply, by seq
  uint32_t outstanding_ = 0;                 // queue_ + sent_
  uint32_t reserved_ = 0;                    // calls TryReserveWrite made room for, not yet queued
  uint32_t send_rests_ = 0;                  // SendRest jobs not yet ended (Close waits for them)
  uint64_t next_seq_ = 1;
  int dead_errno_ = 0;                       // set once: the connection is gone
  bool closed_ = false;
  int64_t last_send_ms_ = 0;
  bool goaway_ok_ = false;         // this connection may carry a GOAWAY (both announced it)
  bool goaway_ = false;            // GOAWAY received: send nothing more on this connection
  int64_t goaway_deadline_ms_ = 0; // connected again by then, or the connection is lost
  bool sending_ = false;           // a caller is writing a batch (SendQueuedLocked)
  std::condition_variable sending_cv_;
  std::condition_variable reconnect_cv_;
  std::mutex close_mu_;
  // The failure listener, shared with the runs queued for it (they may outlive us): its
  // mutex is held while it runs and by Set.
  struct ListenerCell {
    std::mutex mu;
    FailureListener fn;
  };
  const std::shared_ptr<ListenerCell> listener_ = std::make_shared<ListenerCell>();

  RecvBuffer rbuf_;  // read by the loop, or by Reconnect while the loop leaves it alone

  // The connection loop: loop_ chosen once; loop_id_ set under mu_ (0: not registered).
  Poller* loop_ = nullptr;
  std::atomic<uint64_t> loop_id_{0};
  bool reconnecting_ = false;      // under mu_: a Redial thread runs; the loop leaves t_ alone
  std::condition_variable redial_cv_;  // reconnecting_ went false
  std::thread redial_;             // started by the loop, joined by the next start or Close
  bool loop_sending_ = false;      // under mu_: the loop holds sending_ for loop_out_
  std::vector<uint8_t> loop_out_;  // under mu_: the loop's calls' headers, loop_out_pos_ on
  size_t loop_out_pos_ = 0;
  short loop_send_want_ = 0;       // under mu_: what its write waits for
  // The reply being read, on the loop's thread only.
  uint8_t hb_[rp::kReplyHeaderBytes];
  size_t hb_got_ = 0;
  rp::ReplyHeader rh_;
  CallPtr cur_;
  ByteBuffer payload_;
  size_t payload_got_ = 0;
  bool in_payload_ = false;
  bool more_ = false;       // stopped at kRepliesPerTurn: another turn at once
  short read_want_ = 0;     // what the last read waits for
  uint32_t watched_ = 0;    // the events the loop watches now
};

}  // namespace mooring
