#include "remote/replica-server-connection.h"

#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "remote/backing-file-replica.h"
#include "store/replica-registry.h"
#include "util/thread-name.h"

namespace mooring {

using namespace rp;  // NOLINT: wire constants

ReplicaServerConnection::ReplicaServerConnection(ReplicaServerContext* ctx, int fd) : ctx_(ctx), raw_fd_(fd) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ctx_->tls) {
    Status st = ctx_->tls->Wrap(fd, "", &t_);  // closes fd on failure
    (void)st;
  } else {
    t_ = MakePlainTransport(fd);
  }
}

ReplicaServerConnection::~ReplicaServerConnection() {
  Join();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ReplicaServerConnection::Start() {
  reader_ = std::thread([this] { Run(); });
}

void ReplicaServerConnection::RequestStop() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (wake_fd_ >= 0) {  // wakes the handshake
      uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof one);
      (void)n;
    }
  }
  Nudge();
}

void ReplicaServerConnection::Kill() {
  if (dead_.exchange(true)) return;
  Protocol("replies not taken while the server's memory budget is exhausted");
  if (t_) t_->Shutdown();  // wakes the handshake and the writer; the writer discards the rest
  {
    std::lock_guard<std::mutex> lk(mu_);
    out_cv_.notify_all();
  }
  Nudge();
}

void ReplicaServerConnection::Nudge() {
  const uint64_t id = loop_id_.load();
  if (id != 0) loop_->ArmTimer(id, Poller::NowMs());
}

void ReplicaServerConnection::Join() {
  if (reader_.joinable()) reader_.join();
  const uint64_t id = loop_id_.load();
  if (id == 0) return;
  {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return finished_.load(); });
  }
  loop_->Remove(id);  // returns once its handler has returned
  loop_id_.store(0);
}

void ReplicaServerConnection::Protocol(const std::string&) {
  ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
}

void ReplicaServerConnection::Run() {
  NameThisThread("mr-rs-hello");
  bool handed = false;
  try {
    if (t_ && wake_fd_ >= 0 && Handshake()) {
      handshaking_.store(false);
      handed = Register();
    }
    if (handed) {
      // Only the handshake waits on it: an fd fewer per connection served.
      std::lock_guard<std::mutex> lk(mu_);
      close(wake_fd_);
      wake_fd_ = -1;
    }
  } catch (...) {
    // Allocation failure: lose this one connection, keep the server.
    dead_.store(true);
    if (t_) t_->Shutdown();
  }
  if (!handed) Finish();  // nothing was ever in flight
}

bool ReplicaServerConnection::Register() {
  Poller& loop = Poller::ForConnection();
  Status st;
  const uint64_t id = loop.Add(t_->fd(), 0, [this](uint32_t) { OnLoop(); }, &st);
  if (id == 0) return false;
  loop_ = &loop;
  loop_id_.store(id);
  Nudge();  // the first turn: bytes may already be buffered (rbuf_, TLS)
  return true;
}

void ReplicaServerConnection::Finish() {
  if (writer_.joinable()) writer_.join();  // it has nothing to send: it exits at once
  if (replica_) replica_->Close();  // gives our share back to the registry
  replica_.reset();
  if (t_) t_->Shutdown();
  const int server_wake = ctx_->server_wake_fd;
  {
    std::lock_guard<std::mutex> lk(mu_);
    finished_.store(true);
  }
  done_cv_.notify_all();
  if (server_wake >= 0) {
    uint64_t one = 1;
    ssize_t n = write(server_wake, &one, sizeof one);
    (void)n;
  }
}

// ---------------------------------------------------------------------------------------
// Handshake: TLS, then one HELLO naming the replica, both before a deadline.

bool ReplicaServerConnection::Handshake() {
  const int64_t deadline = MonotonicMs() + ctx_->opts.handshake_timeout_ms;
  Status st = t_->Handshake(deadline, wake_fd_);
  if (!st.ok()) {
    if (st.sys_errno == EPROTO) Protocol("TLS handshake");
    return false;
  }
  WaitFn wait = [&](short want) -> int {
    if (stop_.load()) return -ESHUTDOWN;
    int64_t left = deadline - MonotonicMs();
    if (left <= 0) return -ETIMEDOUT;
    int p = PollFdOrWake(t_->fd(), want, wake_fd_, static_cast<int>(left));
    return p < 0 ? p : 0;
  };
  uint8_t hb[kRequestHeaderBytes];
  bool eof = false;
  int rc = rbuf_.ReadExact(t_.get(), hb, sizeof hb, wait, &eof);
  if (rc != 0) {
    if (!eof) Protocol("truncated HELLO");
    return false;
  }
  RequestHeader h;
  auto reply_ok = [&](const uint8_t* payload, size_t n) {
    ReplyHeader rh;
    rh.seq = h.seq;
    rh.payload_len = static_cast<uint32_t>(n);
    uint8_t out[kReplyHeaderBytes];
    EncodeReply(rh, out);
    iovec iov[2] = {{out, sizeof out}, {const_cast<uint8_t*>(payload), n}};
    return WriteAll(t_.get(), iov, n ? 2 : 1, wait) == 0;
  };
  auto refuse = [&](Code code, const std::string& msg, bool protocol) {
    if (protocol) Protocol(msg);
    ReplyHeader rh;
    rh.code = static_cast<uint16_t>(code);
    rh.seq = h.seq;
    rh.err = ErrnoForCode(code);
    std::string m = msg.substr(0, kMaxMessageBytes);
    rh.payload_len = static_cast<uint32_t>(m.size());
    uint8_t out[kReplyHeaderBytes];
    EncodeReply(rh, out);
    iovec iov[2] = {{out, sizeof out}, {const_cast<char*>(m.data()), m.size()}};
    WriteAll(t_.get(), iov, 2, wait);  // best effort: the connection closes either way
    return false;
  };
  if (!DecodeRequest(hb, &h)) {
    Protocol("bad magic");
    return false;  // not our protocol: no reply
  }
  if (h.version != kVersion) return refuse(Code::kProtocolError, "unsupported protocol version " + std::to_string(h.version), true);
  // Authentication (remote/replica-auth.h): with a secret, AUTH and AUTH_PROOF must come
  // first; a client that does not prove the secret is refused before it names a replica.
  auto deny = [&](const std::string& msg) {
    ctx_->auth_failures.fetch_add(1, std::memory_order_relaxed);
    return refuse(Code::kUnauthenticated, msg, false);
  };
  auto next_header = [&](const char* what) {
    if (rbuf_.ReadExact(t_.get(), hb, sizeof hb, wait) != 0) {
      Protocol(std::string("truncated ") + what);
      return false;
    }
    if (!DecodeRequest(hb, &h)) {
      Protocol("bad magic");
      return false;
    }
    return true;
  };
  if (ctx_->auth.enabled()) {
    if (h.op != kOpAuth) return deny("this replica server requires the cluster secret (AUTH before " + std::string(OpName(h.op)) + ")");
    if (h.payload_len != kAuthNonceBytes || h.flags != 0 || h.reserved != 0) return refuse(Code::kProtocolError, "malformed AUTH", true);
    uint8_t nc[kAuthNonceBytes], reply[kAuthNonceBytes + kAuthProofBytes];
    if (rbuf_.ReadExact(t_.get(), nc, sizeof nc, wait) != 0) {
      Protocol("truncated AUTH");
      return false;
    }
    uint8_t* ns = reply;
    if (!AuthNonce(ns)) return refuse(Code::kIoError, "no random bytes for the AUTH nonce", false);
    ctx_->auth.Proof(true, nc, ns, reply + kAuthNonceBytes);
    if (!reply_ok(reply, sizeof reply)) return false;
    if (!next_header("AUTH_PROOF")) return false;
    if (h.version != kVersion || h.op != kOpAuthProof || h.payload_len != kAuthProofBytes || h.flags != 0 || h.reserved != 0)
      return deny(std::string("expected AUTH_PROOF, got ") + OpName(h.op));
    uint8_t proof[kAuthProofBytes];
    if (rbuf_.ReadExact(t_.get(), proof, sizeof proof, wait) != 0) {
      Protocol("truncated AUTH_PROOF");
      return false;
    }
    if (!ctx_->auth.Check(false, nc, ns, proof)) return deny("wrong cluster secret");
    if (!reply_ok(nullptr, 0)) return false;
    if (!next_header("HELLO")) return false;
    if (h.version != kVersion) return refuse(Code::kProtocolError, "unsupported protocol version " + std::to_string(h.version), true);
  } else if (h.op == kOpAuth) {
    return deny("this replica server has no cluster secret: it cannot prove one");
  }
  if (h.op != kOpHello) return refuse(Code::kProtocolError, std::string("expected HELLO, got ") + OpName(h.op), true);
  // Only a server with a backing-files root knows the flag (without one it is malformed).
  const bool backing_file = h.flags == kFlagBackingFile && !ctx_->opts.backing_files_root.empty();
  const size_t max_name = backing_file ? kMaxBackingFileKeyBytes : kMaxReplicaNameBytes;
  if (h.payload_len == 0 || h.payload_len > max_name || h.reserved != 0 || (h.flags != 0 && !backing_file))
    return refuse(Code::kProtocolError, "malformed HELLO", true);
  char name[kMaxBackingFileKeyBytes];
  if (rbuf_.ReadExact(t_.get(), name, h.payload_len, wait) != 0) {
    Protocol("truncated HELLO");
    return false;
  }
  if (backing_file) {
    // A backing image file, read-only (the same checks of the name and of where it resolves).
    name_.assign(name, h.payload_len);
    std::shared_ptr<ReplicaBackend> file;
    st = OpenBackingFileReplica(ctx_->opts.backing_files_root, name_, &file);
    if (!st.ok()) return refuse(st.code, st.message, st.code == Code::kInvalidArgument);
    replica_ = std::move(file);
  } else {
    if (!ValidReplicaName(name, h.payload_len))
      return refuse(Code::kInvalidArgument, "replica names are [A-Za-z0-9._-]{1,63}, not . or ..", true);
    name_.assign(name, h.payload_len);

    // The replica must resolve inside root (a symlink pointing elsewhere is refused).
    const std::string path = ctx_->root_real + "/" + name_;
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) {
      int err = errno;
      if (err == ENOENT) return refuse(Code::kNotFound, "no replica named " + name_, false);
      return refuse(CodeFromErrno(-err), "resolving replica " + name_ + ": " + strerror(err), false);
    }
    const std::string prefix = ctx_->root_real == "/" ? "/" : ctx_->root_real + "/";
    if (std::string(real).compare(0, prefix.size(), prefix) != 0 || std::string(real).size() == prefix.size())
      return refuse(Code::kInvalidArgument, "replica " + name_ + " resolves outside the server's root", true);

    std::shared_ptr<ReplicaBackend> rep;
    st = ReplicaRegistry::Global().Acquire(real, &rep);
    if (!st.ok()) return refuse(st.code, "opening replica " + name_ + ": " + st.message, false);
    replica_ = std::move(rep);
  }
  const uint64_t features = kFeaturesKnown | (ctx_->opts.backing_files_root.empty() ? 0 : kFeatureBackingFiles);

  ReplyHeader rh;
  rh.seq = h.seq;
  rh.value = replica_->size();
  rh.epoch = replica_->epoch();
  rh.state = kStateValid | (replica_->clean() ? kStateClean : 0) | (replica_->rebuilding() ? kStateRebuilding : 0);
  rh.payload_len = kHelloReplyBytes;
  uint8_t out[kReplyHeaderBytes + kHelloReplyBytes] = {};
  EncodeReply(rh, out);
  Put32(out + kReplyHeaderBytes, ctx_->opts.max_inflight_per_connection);
  Put32(out + kReplyHeaderBytes + 4, kMaxIoBytes);
  Put64(out + kReplyHeaderBytes + 8, features);
  iovec iov{out, sizeof out};
  if (WriteAll(t_.get(), &iov, 1, wait) != 0) return false;
  last_rx_ms_.store(MonotonicMs());
  return true;
}

// ---------------------------------------------------------------------------------------
// Reading, on the connection loop: each turn reads what the socket has, frame by frame,
// without waiting; a frame stays half-read (hb_, cur_) until the next turn.

void ReplicaServerConnection::OnLoop() {
  if (finished_.load()) return;
  try {
    if (!reading_done_) {
      if (stop_.load() || dead_.load()) EndReading();
      else ReadFrames();
    }
  } catch (...) {
    // Allocation failure: lose this one connection, keep the server.
    dead_.store(true);
    if (t_) t_->Shutdown();
    if (!reading_done_) EndReading();
  }
  SendCorked();  // before TryFinish: it waits for every reply to be sent
  if (reading_done_) TryFinish();
}

void ReplicaServerConnection::Watch(uint32_t events) {
  if (events == watched_) return;
  loop_->Modify(loop_id_.load(), events);
  watched_ = events;
}

void ReplicaServerConnection::ReadFrames() {
  const ReplicaServerOptions& o = ctx_->opts;
  for (int frames = 0;;) {
    if (stop_.load() || dead_.load()) return EndReading();
    if (rstate_ == ReadState::kHeader && hb_got_ == 0) {
      if (frames == kFramesPerTurn) {
        Nudge();  // more next turn, after the loop's other connections
        return;
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (inflight_ >= o.max_inflight_per_connection || inflight_bytes_ >= o.max_inflight_bytes_per_connection) {
        paused_ = true;  // a reply sent clears it and nudges the loop
        Watch(0);
        return;
      }
    }
    if (rstate_ == ReadState::kBudget) {
      if (!TakeBudget()) return;
      ++frames;
      continue;
    }
    uint8_t* dst;
    size_t want_bytes;
    if (rstate_ == ReadState::kHeader) {
      dst = hb_ + hb_got_;
      want_bytes = sizeof hb_ - hb_got_;
    } else {
      dst = cur_->payload.data() + payload_got_;
      want_bytes = cur_->payload.size() - payload_got_;
    }
    short want = 0;
    const ssize_t r = rbuf_.ReadSome(t_.get(), dst, want_bytes, &want);
    if (r == -EAGAIN) return WaitInput(want);
    if (r <= 0) {
      // End of stream at a frame boundary is a client going away; anything else is not.
      const bool clean = r == 0 && rstate_ == ReadState::kHeader && hb_got_ == 0;
      if (!clean) Protocol(rstate_ == ReadState::kHeader ? "connection lost mid-frame" : "connection lost mid-payload");
      return EndReading();
    }
    last_rx_ms_.store(MonotonicMs());
    if (rstate_ == ReadState::kHeader) {
      hb_got_ += static_cast<size_t>(r);
      if (hb_got_ < sizeof hb_) continue;
      hb_got_ = 0;
      if (!StartFrame()) return;
    } else {
      payload_got_ += static_cast<size_t>(r);
      if (payload_got_ < cur_->payload.size()) continue;
      Deliver();
      ++frames;
    }
  }
}

bool ReplicaServerConnection::StartFrame() {
  std::unique_ptr<Request> r(new Request());
  r->conn = this;
  if (!DecodeRequest(hb_, &r->h)) {
    Protocol("bad magic");  // the stream is out of step: nothing after this can be trusted
    EndReading();
    return false;
  }
  const RequestHeader& h = r->h;
  if (h.version != kVersion || h.payload_len > kMaxPayloadBytes) {
    // Cannot be skipped safely: answer, then drop the connection once it is sent.
    Protocol("bad version or payload length");
    r->early_code = Code::kProtocolError;
    r->early_message = h.version != kVersion ? "unsupported protocol version " + std::to_string(h.version)
                                              : "payload length " + std::to_string(h.payload_len) + " exceeds " +
                                                    std::to_string(kMaxPayloadBytes);
    r->budget_bytes = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++inflight_;
    }
    Execute(r.release());
    stop_.store(true);
    EndReading();
    return false;
  }
  // The request's bytes (payload in, reply out) come out of the server's budget before
  // the payload is read: past the budget this connection is not read (back-pressure).
  const uint64_t reply_bytes = (h.op == kOpRead || h.op == kOpReadLayer) ? std::min<uint64_t>(h.length, kMaxIoBytes) : 0;
  cur_need_ = h.op == kOpClientFeatures ? 0 : h.payload_len + reply_bytes + kRequestHeaderBytes;
  cur_ = std::move(r);
  rstate_ = ReadState::kBudget;
  return true;
}

bool ReplicaServerConnection::TakeBudget() {
  if (cur_need_ > 0) {
    MemoryBudget* budget = ctx_->budget.get();
    bool got = budget->TryAcquire(cur_need_, Responsive(MonotonicMs()));
    if (!got && ctx_->reclaim) {
      ctx_->reclaim();  // drops the peers that hold budget without taking their replies
      got = budget->TryAcquire(cur_need_, Responsive(MonotonicMs()), false);
    }
    if (!got) {
      Watch(0);
      loop_->ArmTimer(loop_id_.load(), Poller::NowMs() + MemoryBudget::kWaitSliceMs);
      return false;
    }
  }
  cur_take_ = cur_need_;
  cur_need_ = 0;
  if (cur_->h.payload_len > 0) {
    cur_->payload = BufferPool::Get().Take(cur_->h.payload_len);
    payload_got_ = 0;
    rstate_ = ReadState::kPayload;
  } else {
    Deliver();
  }
  return true;
}

void ReplicaServerConnection::Deliver() {
  std::unique_ptr<Request> r = std::move(cur_);
  rstate_ = ReadState::kHeader;
  BudgetHold hold(ctx_->budget.get(), cur_take_);  // given back unless the request is queued
  cur_take_ = 0;
  if (r->h.op == kOpClientFeatures) return ClientFeatures(std::move(r));
  r->budget_bytes = hold.Transfer();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++inflight_;
    inflight_bytes_ += r->budget_bytes;
  }
  if (TryInlineWrite(r.get()) || TryInlineRead(r.get())) {
    r.release();  // answered, and freed once its reply is sent
    return;
  }
  r->pooled = true;
  pooled_.fetch_add(1);
  WorkerPool::Batch b;
  b.Push(r.get());
  r->run = &ReplicaServerConnection::RunJob;
  r.release();
  ctx_->pool->Submit(&b);
}

// A small WRITE (no FUA) done here on the connection loop when the replica can take it
// without waiting (ReplicaBackend::TryWrite) and no earlier request of the connection is
// still waiting for a worker: no hand-off to a worker and back, half of a replica host's
// CPU per 4 KiB write. Anything unusual (a malformed frame, an early error, FUA, a replica
// that would wait) goes to a worker as before.
bool ReplicaServerConnection::TryInlineWrite(Request* r) {
  const RequestHeader& h = r->h;
  if (h.op != kOpWrite || h.length == 0 || h.length > ctx_->opts.inline_max_bytes || h.flags != 0 ||
      h.reserved != 0 || h.length != h.payload_len || r->early_code != Code::kOk || pooled_.load() != 0)
    return false;
  const int rc = replica_->TryWrite(h.epoch, h.offset, static_cast<uint32_t>(h.length), r->payload.data());
  if (rc == -EWOULDBLOCK) return false;
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  ctx_->inline_writes.fetch_add(1, std::memory_order_relaxed);
  r->reply = ReplyHeader();
  r->reply.seq = h.seq;
  r->reply_payload.clear();
  if (rc == 0) ctx_->bytes_written.fetch_add(h.length, std::memory_order_relaxed);
  SetRc(r, rc);
  BufferPool::Get().Give(std::move(r->payload));
  Enqueue(r, false);  // sent at the end of this turn, with the turn's other replies
  return true;
}

// A small READ answered here on the connection loop when the replica has every byte in
// the page cache and its lock free (ReplicaBackend::TryRead); else a worker's, as before.
bool ReplicaServerConnection::TryInlineRead(Request* r) {
  const RequestHeader& h = r->h;
  if (h.op != kOpRead || h.length == 0 || h.length > ctx_->opts.inline_max_bytes || h.flags != 0 ||
      h.reserved != 0 || h.payload_len != 0 || r->early_code != Code::kOk || pooled_.load() != 0)
    return false;
  r->reply_payload.resize(h.length);
  if (replica_->TryRead(h.offset, static_cast<uint32_t>(h.length), r->reply_payload.data()) != 0) {
    r->reply_payload.clear();
    return false;
  }
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  ctx_->inline_reads.fetch_add(1, std::memory_order_relaxed);
  ctx_->bytes_read.fetch_add(h.length, std::memory_order_relaxed);
  r->reply = ReplyHeader();
  r->reply.seq = h.seq;
  Enqueue(r, false);
  return true;
}

void ReplicaServerConnection::WaitInput(short want) {
  Watch(EPOLLIN | ((want & POLLOUT) ? uint32_t{EPOLLOUT} : 0u));  // TLS may need to write to read
  // Idle: nothing received for idle_timeout_ms, and either nothing in flight (a client that
  // is alive pings) or stuck in the middle of a frame.
  const int64_t now = MonotonicMs();
  const int64_t idle_at = last_rx_ms_.load() + static_cast<int64_t>(ctx_->opts.idle_timeout_ms);
  if (now < idle_at) {
    loop_->ArmTimer(loop_id_.load(), idle_at);
    return;
  }
  bool idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    idle = inflight_ == 0;
  }
  if (idle || rstate_ != ReadState::kHeader || hb_got_ > 0) {
    Protocol("connection idle past its timeout");
    return EndReading();
  }
  loop_->ArmTimer(loop_id_.load(), now + kReaderPollMs);
}

void ReplicaServerConnection::EndReading() {
  reading_done_ = true;
  Watch(0);
  cur_.reset();
  if (cur_take_ > 0) ctx_->budget->Release(cur_take_);
  cur_take_ = 0;
}

void ReplicaServerConnection::TryFinish() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Every request must be finished before the connection goes away: workers hold
    // pointers to it until their reply is sent (or discarded).
    if (inflight_ > 0) {
      draining_ = true;  // the last reply sent nudges the loop
      return;
    }
    writer_exit_ = true;
    out_cv_.notify_all();
  }
  Finish();
}

void ReplicaServerConnection::ClientFeatures(std::unique_ptr<Request> r) {
  const RequestHeader& h = r->h;
  r->reply = ReplyHeader();
  r->reply.seq = h.seq;
  r->budget_bytes = 0;
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lk(mu_);
  if (h.flags != 0 || h.reserved != 0 || h.payload_len != 0 || h.offset != 0 || h.epoch != 0) {
    SetError(r.get(), Code::kProtocolError, "CLIENT_FEATURES: malformed");
  } else if (client_features_seen_) {
    SetError(r.get(), Code::kProtocolError, "CLIENT_FEATURES: sent twice");
  } else {
    client_features_seen_ = true;
    client_features_ = h.length & kFeaturesKnown;  // bits we do not know are ignored
    r->reply.value = client_features_;
  }
  BufferPool::Get().Give(std::move(r->payload));
  r->reply.payload_len = static_cast<uint32_t>(r->reply_payload.size());
  EncodeReply(r->reply, r->reply_head);
  ++inflight_;
  out_.push_back(r.release());
  SendLocked(lk);
}

bool ReplicaServerConnection::GoAway() {
  std::unique_ptr<Request> r(new Request());
  r->conn = this;
  r->reply.seq = 0;
  r->reply.code = kCodeGoAway;
  EncodeReply(r->reply, r->reply_head);
  std::unique_lock<std::mutex> lk(mu_);
  if (!(client_features_ & kFeatureGoAway) || writer_exit_ || dead_.load()) return false;
  if (goaway_sent_) return true;
  goaway_sent_ = true;
  ++inflight_;  // freed like a reply once sent
  out_.push_back(r.release());
  SendLocked(lk);
  return true;
}

// ---------------------------------------------------------------------------------------
// Workers.

void ReplicaServerConnection::RunJob(WorkerPool::Job* job) {
  Request* r = static_cast<Request*>(job);
  r->conn->Execute(r);
}

void ReplicaServerConnection::SetError(Request* r, Code code, const std::string& msg, int err) {
  r->reply.code = static_cast<uint16_t>(code);
  r->reply.err = err != 0 ? (err < 0 ? -err : err) : ErrnoForCode(code);
  r->reply_payload.assign(msg.begin(), msg.begin() + std::min<size_t>(msg.size(), kMaxMessageBytes));
  if (code == Code::kStaleEpoch) ctx_->stale_epoch_refusals.fetch_add(1, std::memory_order_relaxed);
  if (code == Code::kProtocolError) Protocol(msg);
}

void ReplicaServerConnection::SetRc(Request* r, int rc) {
  if (rc >= 0) return;
  SetError(r, CodeFromErrno(rc), std::string(OpName(r->h.op)) + " on replica " + name_ + ": " + strerror(-rc), rc);
}

void ReplicaServerConnection::SetStatus(Request* r, const Status& st) {
  if (st.ok()) return;
  SetError(r, st.code, st.message, st.sys_errno);
}

void ReplicaServerConnection::SetState(Request* r) {
  // The size rides along (kFeatureGrow): a grow or an adopted chain changes it.
  r->reply.value = replica_->size();
  r->reply.epoch = replica_->epoch();
  r->reply.state = kStateValid | (replica_->clean() ? kStateClean : 0) | (replica_->rebuilding() ? kStateRebuilding : 0);
}

void ReplicaServerConnection::Execute(Request* r) {
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  r->reply = ReplyHeader();
  r->reply.seq = r->h.seq;
  r->reply_payload.clear();
  try {
    if (r->early_code != Code::kOk) SetError(r, r->early_code, r->early_message);
    else Dispatch(r);
  } catch (...) {
    r->reply_payload.clear();
    SetError(r, Code::kIoError, "internal error running " + std::string(OpName(r->h.op)));
  }
  BufferPool::Get().Give(std::move(r->payload));  // the request's memory is not needed while the reply waits
  if (r->pooled) pooled_.fetch_sub(1);  // run: later requests may go on the loop again
  Enqueue(r);
}

void ReplicaServerConnection::Enqueue(Request* r, bool send_now) {
  r->reply.payload_len = static_cast<uint32_t>(r->reply_payload.size());
  EncodeReply(r->reply, r->reply_head);
  std::unique_lock<std::mutex> lk(mu_);
  out_.push_back(r);
  if (send_now) return SendLocked(lk);
  corked_ = true;  // a worker's reply sent meanwhile takes it along
}

void ReplicaServerConnection::SendCorked() {
  if (!corked_) return;
  corked_ = false;
  std::unique_lock<std::mutex> lk(mu_);
  SendLocked(lk);
}

// ---------------------------------------------------------------------------------------
// Sending: whoever queues a reply (a worker, mostly) sends it at once, without blocking,
// with whatever else is queued (several per system call); replies queued while another
// thread sends go with that thread's next round. Only when the socket is full does the
// connection's writer thread (started then, once) take over and wait for the client, so a
// client that stops reading stalls only itself and no worker waits on it. One sender at a
// time (sending_) keeps each reply whole on the wire.

void ReplicaServerConnection::SendLocked(std::unique_lock<std::mutex>& lk) {
  if (sending_) return;  // the current sender takes it in its next round
  sending_ = true;
  SendRounds(lk, false);
}

void ReplicaServerConnection::SendRounds(std::unique_lock<std::mutex>& lk, bool may_block) {
  // A client that takes none of our bytes for this long is gone or hostile.
  const int stall_ms = std::max<int>(kDrainTimeoutMs, static_cast<int>(ctx_->opts.idle_timeout_ms));
  WaitFn wait = [&](short want) -> int {
    // Seen by the server's reclaim while the memory budget is exhausted (RepliesStalledMs).
    if (write_stalled_since_ms_.load() == 0) write_stalled_since_ms_.store(MonotonicMs());
    if (!may_block) return -EAGAIN;
    int p = PollFdOrWake(t_->fd(), want, -1, stall_ms);
    if (p < 0) return p;
    return p == 0 ? -ETIMEDOUT : 0;
  };
  for (;;) {
    if (wbatch_.empty()) {
      if (out_.empty()) {
        sending_ = false;
        return;
      }
      wbatch_.swap(out_);
      wiov_.clear();
      for (Request* r : wbatch_) {
        wiov_.push_back({r->reply_head, kReplyHeaderBytes});
        if (!r->reply_payload.empty()) wiov_.push_back({r->reply_payload.data(), r->reply_payload.size()});
      }
    }
    lk.unlock();
    int rc = 0;
    if (!dead_.load()) rc = WriteAll(t_.get(), wiov_.data(), static_cast<int>(wiov_.size()), wait);
    if (rc == -EAGAIN) {
      // The socket is full: the writer thread goes on from where this stopped (wiov_ was
      // advanced in place), waiting for the client.
      lk.lock();
      writer_owns_ = true;
      if (!writer_.joinable()) {
        try {
          writer_ = std::thread([this] { WriterLoop(); });
        } catch (const std::system_error&) {
          writer_owns_ = false;
          lk.unlock();
          Kill();  // no thread to wait for this client: drop it rather than block a worker
          lk.lock();
          continue;
        }
      }
      out_cv_.notify_all();
      return;
    }
    write_stalled_since_ms_.store(0);
    if (rc == 0 && !dead_.load() && !replied_.load()) replied_.store(true);
    if (rc != 0) {
      dead_.store(true);
      t_->Shutdown();
      Nudge();  // the loop stops reading it
    }
    lk.lock();
    for (Request* r : wbatch_) {
      inflight_bytes_ -= r->budget_bytes;
      ctx_->budget->Release(r->budget_bytes);
      --inflight_;
      delete r;
    }
    wbatch_.clear();
    const ReplicaServerOptions& o = ctx_->opts;
    if (paused_ && inflight_ < o.max_inflight_per_connection && inflight_bytes_ < o.max_inflight_bytes_per_connection) {
      paused_ = false;
      Nudge();  // the loop reads this connection again
    }
    if (draining_ && inflight_ == 0) Nudge();
  }
}

// The writer thread: started the first time a reply did not fit the socket; sends, waiting
// for the client, whenever a sender hands over (writer_owns_), until the connection ends.
void ReplicaServerConnection::WriterLoop() {
  NameThisThread("mr-rs-send");
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    while (!writer_owns_ && !writer_exit_) out_cv_.wait(lk);
    if (!writer_owns_) return;
    SendRounds(lk, true);  // sending_ stays set until it is done
    writer_owns_ = false;
  }
}

}  // namespace mooring
