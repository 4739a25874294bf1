// ReplicaServerConnection: one client of a ReplicaServer. A short-lived thread runs the
// handshake (TLS, then HELLO naming the replica) and hands the socket to one of the
// process's connection loops (Poller::ForConnection), which reads requests as they come,
// without a thread per connection, and hands them to the server's WorkerPool; workers run
// them against the replica and send the replies in the order they complete, without
// blocking; a writer thread, started only once a reply did not fit the socket, waits for a
// client that is slow to take them. The loop stops reading a connection while it has too
// many requests or bytes in flight, or while the server's memory budget is exhausted, so a
// fast client cannot make the server buffer without bound.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "block/replica-backend.h"
#include "nbd/worker-pool.h"
#include "net/memory-budget.h"
#include "net/poller.h"
#include "remote/replica-auth.h"
#include "remote/replica-protocol.h"
#include "remote/replica-server.h"
#include "net/transport.h"
#include "net/buffer-pool.h"

namespace mooring {

// What every connection of one server shares.
struct ReplicaServerContext {
  ReplicaServerOptions opts;
  std::string root_real;  // realpath(opts.root)
  std::shared_ptr<TlsContext> tls;  // null: plain TCP
  ReplicaAuthKey auth;              // enabled: clients must authenticate before HELLO
  WorkerPool::Lane* pool = nullptr;  // the server's lane in its worker pool
  std::unique_ptr<MemoryBudget> budget;  // opts.max_inflight_bytes_total, across connections
  std::function<void()> reclaim;         // while a reader waits for budget: drop stalled peers
  int server_wake_fd = -1;  // a connection writes here when it has finished (to be reaped)

  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> stale_epoch_refusals{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> auth_failures{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> inline_writes{0};
  std::atomic<uint64_t> inline_reads{0};
};

class ReplicaServerConnection {
 public:
  // How long replies may wait for a client that does not read them before the connection
  // is dropped (also while draining at close).
  static constexpr int kDrainTimeoutMs = 10000;
  // How often the loop re-checks the idle rule of a quiet connection with requests in flight.
  static constexpr int kReaderPollMs = 1000;
  // Frames one connection reads per turn of its loop before letting the others' go.
  static constexpr int kFramesPerTurn = 64;

  ReplicaServerConnection(ReplicaServerContext* ctx, int fd);
  ~ReplicaServerConnection();
  ReplicaServerConnection(const ReplicaServerConnection&) = delete;
  ReplicaServerConnection& operator=(const ReplicaServerConnection&) = delete;

  void Start();
  // Stop reading new requests; answer those in flight; then close. Returns at once.
  void RequestStop();
  bool finished() const { return finished_.load(); }
  // Until HELLO has been answered (TLS and authentication included): Acceptor's per-peer limit.
  bool handshaking() const { return handshaking_.load(); }
  void Join();
  // Sends GOAWAY if the client announced kFeatureGoAway (CLIENT_FEATURES) and returns true:
  // the connection keeps reading and answering until the client half-closes, then closes.
  // False (nothing sent) for a client that did not announce it.
  bool GoAway();
  // How long the writer has waited on a socket that takes no bytes (0: it is not waiting).
  int64_t RepliesStalledMs(int64_t now_ms) const {
    const int64_t since = write_stalled_since_ms_.load();
    return since == 0 ? 0 : now_ms - since;
  }
  // Drops the connection at once: its replies are discarded and its budget given back.
  void Kill();
  // Whether this peer takes its replies: it has taken one, and none is stuck on a full socket
  // now. Only such connections may use the budget's reserve, so peers that never read cannot
  // take it (a fresh connection waits for the budget proper).
  bool Responsive(int64_t now_ms) const {
    return replied_.load() && RepliesStalledMs(now_ms) < kResponsiveStallMs;
  }

 private:
  struct Request : WorkerPool::Job {
    ReplicaServerConnection* conn = nullptr;
    rp::RequestHeader h;
    ByteBuffer payload;
    Code early_code = Code::kOk;  // answer with this without running (set by the reader)
    bool pooled = false;          // handed to a worker (counted in pooled_)
    std::string early_message;
    rp::ReplyHeader reply;
    uint8_t reply_head[rp::kReplyHeaderBytes];
    ByteBuffer reply_payload;
    uint64_t budget_bytes = 0;
    // Large payloads go back to the BufferPool for the next request.
    ~Request() {
      BufferPool::Get().Give(std::move(payload));
      BufferPool::Get().Give(std::move(reply_payload));
    }
  };

  // The handshake thread: Handshake, then Register (or Finish).
  void Run();
  bool Handshake();
  bool Register();
  // The connection loop's handler and what it calls, one at a time on the loop's thread.
  void OnLoop();
  void ReadFrames();
  bool StartFrame();  // a header was read: false when reading ends
  bool TakeBudget();  // false: waiting for the server's memory budget
  void Deliver();
  bool TryInlineWrite(Request* r);  // on the loop: done and queued, or false
  bool TryInlineRead(Request* r);   // the same for a READ from the page cache
    // the frame is whole: to the workers (or answered here)
  void WaitInput(short want);  // the socket has nothing more now: the idle rule, the timer
  void Watch(uint32_t events);
  void EndReading();
  void TryFinish();
  // Once nothing is in flight: releases the replica, marks the connection finished.
  void Finish();
  // Any thread: has the loop look at this connection again now.
  void Nudge();
  void WriterLoop();
  // Under mu_ (lk): sends what is queued unless another thread is sending (SendRounds).
  void SendLocked(std::unique_lock<std::mutex>& lk);
  // Under mu_, with sending_ set: sends rounds of replies until none is queued; without
  // may_block, a full socket hands the rest to the writer thread.
  void SendRounds(std::unique_lock<std::mutex>& lk, bool may_block);
  void Protocol(const std::string& why);

  static void RunJob(WorkerPool::Job* job);
  void Execute(Request* r);
  void Dispatch(Request* r);
  void SetError(Request* r, Code code, const std::string& msg, int err = 0);
  void SetRc(Request* r, int rc);
  void SetStatus(Request* r, const Status& st);
  void SetState(Request* r);
  // Queues r's reply and sends it with whatever else is queued; the loop's inline replies
  // (send_now false) wait for the end of its turn, so one system call takes them all.
  void Enqueue(Request* r, bool send_now = true);
  void SendCorked();  // the loop, at the end of a turn: the inline replies it queued
  // CLIENT_FEATURES, on the reader thread: records the bits and queues the reply under the
  // same lock GoAway() takes, so a GOAWAY never overtakes that reply.
  void ClientFeatures(std::unique_ptr<Request> r);

  ReplicaServerContext* const ctx_;
  std::unique_ptr<Transport> t_;
  int raw_fd_;
  int wake_fd_ = -1;
  std::thread reader_;  // the handshake's
  std::thread writer_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> handshaking_{true};
  std::atomic<bool> stop_{false};
  std::atomic<bool> dead_{false};
  std::atomic<int64_t> last_rx_ms_{0};
  std::atomic<int64_t> write_stalled_since_ms_{0};
  std::atomic<bool> replied_{false};  // the writer has sent a batch of replies whole

  std::shared_ptr<ReplicaBackend> replica_;  // set by the handshake
  std::string name_;
  RecvBuffer rbuf_;

  // The connection loop (set by Register before loop_id_; read by any thread after).
  Poller* loop_ = nullptr;
  std::atomic<uint64_t> loop_id_{0};
  // The frame being read, on the loop's thread only.
  enum class ReadState { kHeader, kBudget, kPayload };
  ReadState rstate_ = ReadState::kHeader;
  uint8_t hb_[rp::kRequestHeaderBytes];
  size_t hb_got_ = 0;
  std::unique_ptr<Request> cur_;
  uint64_t cur_need_ = 0;  // its budget bytes (kBudget)
  uint64_t cur_take_ = 0;  // held for it (kPayload), released unless it is queued
  size_t payload_got_ = 0;
  uint32_t watched_ = 0;   // the events the loop watches now
  bool reading_done_ = false;
  bool corked_ = false;    // inline replies queued this turn and not sent yet

  std::mutex mu_;
  std::condition_variable done_cv_;  // Join: finished
  std::condition_variable out_cv_;   // writer: handed the sending, or exit
  bool paused_ = false;    // under mu_: the loop stopped reading for capacity
  bool draining_ = false;  // under mu_: reading ended, waiting for inflight_ to reach 0
  std::vector<Request*> out_;
  bool sending_ = false;      // under mu_: a thread owns the write side (wbatch_, wiov_)
  bool writer_owns_ = false;  // under mu_: handed to the writer thread
  std::vector<Request*> wbatch_;  // the round being sent, by the owner of sending_
  std::vector<iovec> wiov_;
  uint32_t inflight_ = 0;
  // Requests of this connection handed to a worker and not yet run. A request runs on the
  // loop (TryInlineWrite/Read) only while this is 0, so it never overtakes an earlier one
  // that is still queued (a CLAIM_EPOCH pipelined just before a WRITE of its epoch, say).
  // The workers themselves may still run two queued requests in either order, as before.
  std::atomic<uint32_t> pooled_{0};
  uint64_t inflight_bytes_ = 0;
  bool writer_exit_ = false;
  uint64_t client_features_ = 0;     // under mu_: what CLIENT_FEATURES announced
  bool client_features_seen_ = false;  // under mu_
  bool goaway_sent_ = false;           // under mu_
};

}  // namespace mooring
