#include "remote/remote-replica.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "remote/replica-auth.h"
#include "util/thread-name.h"

namespace mooring {

using namespace rp;  // NOLINT: wire constants

namespace {

// The process's one thread for failure listeners (mr-rr-lost), started on first use and never
// stopped: runs what is posted, one at a time, in order. A listener takes its engine's
// locks, so it never runs on a connection loop (whose holder may wait for a reply that loop
// must read) nor on a caller's thread (which may hold them).
void PostListener(std::function<void()> f) {
  struct Runner {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
  };
  static Runner* r = [] {
    Runner* n = new Runner();  // never destroyed, like the poller's
    std::thread([n] {
      NameThisThread("mr-rr-lost");
      for (;;) {
        std::function<void()> job;
        {
          std::unique_lock<std::mutex> lk(n->mu);
          n->cv.wait(lk, [n] { return !n->q.empty(); });
          job = std::move(n->q.front());
          n->q.pop_front();
        }
        job();
      }
    }).detach();
    return n;
  }();
  {
    std::lock_guard<std::mutex> lk(r->mu);
    r->q.push_back(std::move(f));
  }
  r->cv.notify_one();
}

// Waits for `t` to be ready until an absolute deadline (the handshake's bound).
WaitFn UntilDeadline(Transport* t, int64_t deadline_ms) {
  return [t, deadline_ms](short want) -> int {
    int64_t left = deadline_ms - MonotonicMs();
    if (left <= 0) return -ETIMEDOUT;
    int p = PollFdOrWake(t->fd(), want, -1, static_cast<int>(left));
    return p < 0 ? p : 0;
  };
}

// A handshake step's transport failure (rc: a negative errno).
Status StepFailed(const ReplicaEndpoint& ep, const char* what, int rc) {
  return Status::Error(Code::kUnavailable,
                       "replica " + ep.Id() + ": " + what + " failed: " + (rc == -ECONNRESET ? "connection closed" : strerror(-rc)),
                       -rc);
}

// Reads a reply header (seq 0) and, for an error reply, its message as a Status.
Status HandshakeReply(Transport* t, RecvBuffer* rbuf, const ReplicaEndpoint& ep, const WaitFn& wait, const char* what,
                      ReplyHeader* rh) {
  uint8_t rb[kReplyHeaderBytes];
  int rc = rbuf->ReadExact(t, rb, sizeof rb, wait);
  if (rc != 0) return StepFailed(ep, what, rc);
  if (!DecodeReply(rb, rh) || rh->seq != 0 || !ValidCode(rh->code))
    return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": not a replica server", EPROTO);
  if (rh->code != 0) {
    if (rh->payload_len > kMaxMessageBytes)
      return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": oversized error reply", EPROTO);
    std::string msg(rh->payload_len, '\0');
    if (rh->payload_len && rbuf->ReadExact(t, &msg[0], msg.size(), wait) != 0) msg = "(message lost)";
    return Status::Error(static_cast<Code>(rh->code), "replica " + ep.Id() + ": " + what + ": " + msg, rh->err);
  }
  return Status::Ok();
}

// Handshake on a connected transport: HELLO out, its reply in, before deadline_ms.
Status Hello(Transport* t, RecvBuffer* rbuf, const ReplicaEndpoint& ep, int64_t deadline_ms, ReplyHeader* rh,
             uint8_t* extra) {
  const WaitFn wait = UntilDeadline(t, deadline_ms);
  RequestHeader h;
  h.op = kOpHello;
  h.flags = ep.backing_file ? kFlagBackingFile : 0;
  h.seq = 0;
  h.payload_len = static_cast<uint32_t>(ep.name.size());
  uint8_t hb[kRequestHeaderBytes];
  EncodeRequest(h, hb);
  iovec iov[2] = {{hb, sizeof hb}, {const_cast<char*>(ep.name.data()), ep.name.size()}};
  int rc = WriteAll(t, iov, 2, wait);
  if (rc != 0) return StepFailed(ep, "handshake", rc);
  Status st = HandshakeReply(t, rbuf, ep, wait, "handshake", rh);
  if (!st.ok()) return st;
  if (rh->payload_len != kHelloReplyBytes || !(rh->state & kStateValid))
    return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": malformed HELLO reply", EPROTO);
  rc = rbuf->ReadExact(t, extra, kHelloReplyBytes, wait);
  if (rc != 0) return StepFailed(ep, "handshake", rc);
  return Status::Ok();
}

// AUTH, then AUTH_PROOF (remote/replica-auth.h): proves the cluster secret to the server
// after the server proved it to us. kUnauthenticated when the server cannot.
Status Authenticate(Transport* t, RecvBuffer* rbuf, const ReplicaEndpoint& ep, int64_t deadline_ms) {
  const WaitFn wait = UntilDeadline(t, deadline_ms);
  const ReplicaAuthKey key(ep.cluster_secret);
  uint8_t nc[kAuthNonceBytes];
  if (!AuthNonce(nc)) return Status::Error(Code::kIoError, "replica " + ep.Id() + ": no random bytes for the AUTH nonce");
  RequestHeader h;
  h.op = kOpAuth;
  h.payload_len = kAuthNonceBytes;
  uint8_t hb[kRequestHeaderBytes];
  EncodeRequest(h, hb);
  iovec iov[2] = {{hb, sizeof hb}, {nc, sizeof nc}};
  int rc = WriteAll(t, iov, 2, wait);
  if (rc != 0) return StepFailed(ep, "AUTH", rc);
  ReplyHeader rh;
  Status st = HandshakeReply(t, rbuf, ep, wait, "AUTH", &rh);
  if (!st.ok()) {
    // A server of a release without authentication answers AUTH as an unknown first frame.
    if (st.code == Code::kProtocolError)
      return Status::Error(Code::kUnauthenticated, st.message + " (a replica server without authentication?)", EACCES);
    return st;
  }
  uint8_t got[kAuthNonceBytes + kAuthProofBytes];
  if (rh.payload_len != sizeof got)
    return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": malformed AUTH reply", EPROTO);
  rc = rbuf->ReadExact(t, got, sizeof got, wait);
  if (rc != 0) return StepFailed(ep, "AUTH", rc);
  const uint8_t* ns = got;
  if (!key.Check(true, nc, ns, got + kAuthNonceBytes))
    return Status::Error(Code::kUnauthenticated, "replica " + ep.Id() + ": the server did not prove the cluster secret", EACCES);
  uint8_t proof[kAuthProofBytes];
  key.Proof(false, nc, ns, proof);
  h = RequestHeader();
  h.op = kOpAuthProof;
  h.payload_len = kAuthProofBytes;
  EncodeRequest(h, hb);
  iov[0] = {hb, sizeof hb};
  iov[1] = {proof, sizeof proof};
  rc = WriteAll(t, iov, 2, wait);
  if (rc != 0) return StepFailed(ep, "AUTH_PROOF", rc);
  st = HandshakeReply(t, rbuf, ep, wait, "AUTH_PROOF", &rh);
  if (!st.ok()) return st;
  if (rh.payload_len != 0) return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": malformed AUTH_PROOF reply", EPROTO);
  return Status::Ok();
}

int ErrnoOfReply(const ReplyHeader& r) {
  if (r.code == 0) return 0;
  if (r.err > 0 && r.err < 4096) return r.err;
  return ErrnoForCode(static_cast<Code>(r.code));
}

// CLIENT_FEATURES on a fresh connection (seq 0, like HELLO): announces `bits`, returns the
// bits both sides know in *agreed.
Status ClientFeatures(Transport* t, RecvBuffer* rbuf, const ReplicaEndpoint& ep, int64_t deadline_ms, uint64_t bits,
                      uint64_t* agreed) {
  const WaitFn wait = UntilDeadline(t, deadline_ms);
  RequestHeader h;
  h.op = kOpClientFeatures;
  h.seq = 0;
  h.length = bits;
  uint8_t hb[kRequestHeaderBytes];
  EncodeRequest(h, hb);
  iovec iov{hb, sizeof hb};
  int rc = WriteAll(t, &iov, 1, wait);
  uint8_t rb[kReplyHeaderBytes];
  if (rc == 0) rc = rbuf->ReadExact(t, rb, sizeof rb, wait);
  if (rc != 0) return Status::Error(Code::kUnavailable, "replica " + ep.Id() + ": handshake failed (CLIENT_FEATURES)", -rc);
  ReplyHeader rh;
  if (!DecodeReply(rb, &rh) || rh.seq != 0 || rh.code != 0 || rh.payload_len != 0)
    return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": CLIENT_FEATURES refused", EPROTO);
  *agreed = rh.value & bits;
  return Status::Ok();
}

}  // namespace

Status RemoteReplica::Dial(const ReplicaEndpoint& ep, int64_t deadline, Dialed* d) {
  int fd = -1;
  Status st = ConnectTcp(ep.host, ep.port, deadline, &fd);
  if (!st.ok()) return Status::Error(st.code, "replica " + ep.Id() + ": " + st.message, st.sys_errno);
  if (ep.tls.enabled()) {
    std::shared_ptr<TlsContext> tls;
    st = TlsContext::Create(ep.tls, false, &tls);
    if (!st.ok()) {
      close(fd);
      return st;
    }
    st = tls->Wrap(fd, ep.tls.server_name, &d->t);  // the SSL object keeps what it needs of the context
    if (!st.ok()) return st;
    st = d->t->Handshake(deadline, -1);
    if (!st.ok()) return Status::Error(st.code, "replica " + ep.Id() + ": " + st.message, st.sys_errno);
  } else {
    d->t = MakePlainTransport(fd);
  }
  if (!ep.cluster_secret.empty()) {
    st = Authenticate(d->t.get(), &d->rbuf, ep, deadline);
    if (!st.ok()) return st;
  }
  uint8_t extra[kHelloReplyBytes];
  st = Hello(d->t.get(), &d->rbuf, ep, deadline, &d->hello, extra);
  if (!st.ok()) return st;  // the caller's Dialed closes the socket
  d->depth = std::max<uint32_t>(1, std::min<uint32_t>(kMaxInflight, Get32(extra)));
  d->max_io = std::min<uint32_t>(kMaxIoBytes, Get32(extra + 4));
  d->features = Get64(extra + 8);
  if (d->max_io < 4096) return Status::Error(Code::kProtocolError, "replica " + ep.Id() + ": server I/O limit too small", EPROTO);
  d->goaway = false;
  if (d->features & kFeatureGoAway) {  // only such a server knows CLIENT_FEATURES
    uint64_t agreed = 0;
    st = ClientFeatures(d->t.get(), &d->rbuf, ep, deadline, kFeatureGoAway, &agreed);
    if (!st.ok()) return st;
    d->goaway = (agreed & kFeatureGoAway) != 0;
  }
  return Status::Ok();
}

Status RemoteReplica::Connect(const ReplicaEndpoint& ep, std::shared_ptr<ReplicaBackend>* out) {
  const int64_t deadline = MonotonicMs() + ep.io_timeout_ms;
  if (ep.backing_file ? !ValidBackingFileKey(ep.name.data(), ep.name.size()) : !ValidReplicaName(ep.name.data(), ep.name.size()))
    return Status::Error(Code::kInvalidArgument, (ep.backing_file ? "backing image file key " : "replica name ") + ep.name +
                                                     (ep.backing_file ? " is not [A-Za-z0-9._-]{1,255}" : " is not [A-Za-z0-9._-]{1,63}"));
  Dialed d;
  Status st = Dial(ep, deadline, &d);
  if (!st.ok()) return st;
  std::shared_ptr<RemoteReplica> r(new RemoteReplica(ep, &d));
  {
    std::lock_guard<std::mutex> lk(r->mu_);
    r->last_send_ms_ = MonotonicMs();
    r->loop_ = &Poller::ForConnection();
    st = r->RegisterLocked();
  }
  if (!st.ok()) {
    r->Close();
    return Status::Error(st.code, "replica " + ep.Id() + ": " + st.message, st.sys_errno);
  }
  r->AllocatedBytes();  // first refresh
  *out = std::move(r);
  return Status::Ok();
}

RemoteReplica::RemoteReplica(const ReplicaEndpoint& ep, Dialed* d)
    : ep_(ep), id_(ep.Id()), io_timeout_ms_(ep.io_timeout_ms), t_(std::move(d->t)) {
  rbuf_ = std::move(d->rbuf);
  size_ = d->hello.value;
  epoch_.store(d->hello.epoch);
  clean_.store(d->hello.state & kStateClean);
  rebuilding_.store(d->hello.state & kStateRebuilding);
  depth_ = d->depth;
  max_io_ = d->max_io;
  features_ = d->features;
  goaway_ok_ = d->goaway;
}

RemoteReplica::~RemoteReplica() { Close(); }

Status RemoteReplica::Close() {
  std::lock_guard<std::mutex> cl(close_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
  }
  Teardown(EBADF);
  {
    // A caller may still be writing a batch (it returns once the transport is shut down);
    // a Redial thread ends at its next check (dead: it registers nothing).
    std::unique_lock<std::mutex> lk(mu_);
    while (sending_ || send_rests_ > 0) sending_cv_.wait(lk);
    while (reconnecting_) redial_cv_.wait(lk);
  }
  // Dead and not reconnecting: the loop starts nothing more, so loop_id_ and redial_ stay.
  const uint64_t id = loop_id_.load();
  if (id != 0) loop_->Remove(id);  // returns once its handler has returned
  loop_id_.store(0);
  if (redial_.joinable()) redial_.join();
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// Calls.

RemoteReplica::CallPtr RemoteReplica::NewCall(uint8_t op, uint64_t epoch, uint64_t off, uint64_t len, uint16_t flags) {
  CallPtr c = std::make_shared<Call>();
  c->h.op = op;
  c->h.epoch = epoch;
  c->h.offset = off;
  c->h.length = len;
  c->h.flags = flags;
  return c;
}

int RemoteReplica::Submit(const CallPtr& c, Send send, bool* queued) {
  const bool block = send == Send::kNow || send == Send::kDeferred;
  std::unique_lock<std::mutex> lk(mu_);
  // Its slot, whatever comes next. A second part of a reserved write (max_io_ shrank on a
  // reconnect) takes another's, whose owner then goes past depth_ rather than wait: the
  // count stays whole.
  if (send == Send::kReserved && reserved_ > 0) --reserved_;
  if (c->frame_size() > kMaxPayloadBytes) return -EOVERFLOW;
  c->h.payload_len = static_cast<uint32_t>(c->frame_size());
  if (send == Send::kByLoop && dead_errno_ == 0 && FullLocked()) return -EAGAIN;
  while (block && dead_errno_ == 0 && FullLocked()) {
    // The slots may be held by deferred calls nobody is sending yet (this caller's own).
    if (CanSendLocked()) {
      SendQueuedLocked(lk);
      continue;
    }
    slot_cv_.wait(lk);
  }
  if (dead_errno_ != 0) return closed_ ? -EBADF : -ENOTCONN;
  c->h.seq = next_seq_++;
  const int64_t now = MonotonicMs();
  c->deadline_ms = now + io_timeout_ms_;
  queue_.push_back(c);
  if (queued) *queued = true;
  ++outstanding_;
  // The loop checks deadlines while anything is outstanding (its timer); an internal call
  // waits for the loop to send it.
  if (send == Send::kByLoop) ArmLocked(now);
  else if (outstanding_ == 1) ArmLocked(now + kDeadlineCheckMs);
  // A caller that may block sends it now, itself; the others' calls wait for the next
  // sender, SendDeferred or the connection loop (HousekeepLocked).
  if (send == Send::kNow) SendQueuedLocked(lk);
  return 0;
}

void RemoteReplica::SendDeferred(bool may_wait) {
  std::unique_lock<std::mutex> lk(mu_);
  SendQueuedLocked(lk, may_wait);  // nothing if another thread is sending: it takes them along
}

// One slot, for a write of one frame (a larger one would need several: false).
bool RemoteReplica::TryReserveWrite(uint32_t len) {
  std::lock_guard<std::mutex> lk(mu_);
  if (dead_errno_ != 0 || len > max_io_ || FullLocked()) return false;
  ++reserved_;
  return true;
}

void RemoteReplica::CancelReservedWrite() {
  std::lock_guard<std::mutex> lk(mu_);
  if (reserved_ > 0) --reserved_;
  slot_cv_.notify_one();
}

void RemoteReplica::Wait(const CallPtr& c) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!c->done) {
    // Queued and nobody sending (a GOAWAY's reconnect wakes the callers of queued calls):
    // this caller sends.
    if (CanSendLocked()) {
      SendQueuedLocked(lk);
      continue;
    }
    c->cv.wait(lk);
  }
}

int RemoteReplica::Run(const CallPtr& c) {
  int rc = Submit(c);
  if (rc < 0) return rc;
  Wait(c);
  if (c->fail_errno) return -c->fail_errno;
  return -ErrnoOfReply(c->reply);
}

Status RemoteReplica::RunStatus(const CallPtr& c, const char* what) {
  int rc = Submit(c);
  if (rc == 0) {
    Wait(c);
    rc = c->fail_errno ? -c->fail_errno : 0;
  }
  if (rc < 0) {
    if (rc == -EBADF) return Status::Error(Code::kClosed, "replica " + id_ + " is closed", EBADF);
    return Status::FromErrno(rc, std::string(what) + " on replica " + id_ + ": " + strerror(-rc));
  }
  TakeState(c);
  if (c->reply.code == 0) return Status::Ok();
  std::string msg(c->reply_payload.begin(), c->reply_payload.end());
  return Status::Error(static_cast<Code>(c->reply.code), "replica " + id_ + ": " + msg, ErrnoOfReply(c->reply));
}

void RemoteReplica::TakeState(const CallPtr& c) {
  if (c->fail_errno || !(c->reply.state & kStateValid)) return;
  epoch_.store(c->reply.epoch);
  if (CanGrow() && c->reply.value != 0) size_.store(c->reply.value);
  clean_.store(c->reply.state & kStateClean);
  rebuilding_.store(c->reply.state & kStateRebuilding);
}

RemoteReplica::Waker* RemoteReplica::CompleteLocked(const CallPtr& c) {
  c->done = true;
  --outstanding_;
  slot_cv_.notify_one();
  c->cv.notify_all();
  PendingIo* g = c->group;
  c->group = nullptr;
  return g && g->unfinished.fetch_sub(1) == 1 ? g->waker : nullptr;
}

void RemoteReplica::SetFailureListener(FailureListener l) {
  std::lock_guard<std::mutex> lk(listener_->mu);
  listener_->fn = std::move(l);
}

void RemoteReplica::Teardown(int err) {
  bool notify = false;
  std::vector<Waker*> wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (dead_errno_ != 0) return;
    notify = !closed_;
    TeardownLocked(err, &wake);
  }
  for (Waker* w : wake) w->Wake();
  // The calls failed above are answered first, as before; the listener follows on the
  // mr-rr-lost thread (the engine handles either order: an I/O failure marks the replica
  // ERR itself, and the listener finds it ERR already).
  if (notify) {
    PostListener([cell = listener_, err] {
      std::lock_guard<std::mutex> lk(cell->mu);
      if (cell->fn) cell->fn(-err);
    });
  }
}

void RemoteReplica::TeardownLocked(int err, std::vector<Waker*>* wake) {
  dead_errno_ = err;
  for (const CallPtr& c : queue_) {
    c->fail_errno = err;
    if (Waker* w = CompleteLocked(c)) wake->push_back(w);
  }
  queue_.clear();
  for (auto& kv : sent_) {
    kv.second->fail_errno = err;
    if (Waker* w = CompleteLocked(kv.second)) wake->push_back(w);
  }
  sent_.clear();
  if (loop_sending_) {  // the loop's write is abandoned with its calls
    loop_sending_ = false;
    sending_ = false;
    loop_out_.clear();
  }
  t_->Shutdown();  // wakes a blocked sender; the loop stops at its next turn
  ArmLocked(MonotonicMs());
  slot_cv_.notify_all();
  sending_cv_.notify_all();
  reconnect_cv_.notify_all();
}

bool RemoteReplica::DeadlinePassedLocked(int64_t now) const {
  // Deadlines grow with seq: the oldest queued or sent call decides.
  if (!sent_.empty() && sent_.begin()->second->deadline_ms <= now) return true;
  // After a GOAWAY, queued calls wait for the new connection; goaway_deadline_ms_ bounds that.
  if (goaway_) return now >= goaway_deadline_ms_;
  return !queue_.empty() && queue_.front()->deadline_ms <= now;
}

// ---------------------------------------------------------------------------------------
// ReplicaBackend.

Status RemoteReplica::ClaimEpoch(uint64_t epoch, ReplicaSet* stored, bool* was_clean) {
  CallPtr c = NewCall(kOpClaimEpoch, epoch, 0, 0);
  c->max_reply = 64 * 1024;  // a replica set: at most 32 + 32 names of 63 bytes
  Status st = RunStatus(c, "CLAIM_EPOCH");
  if (!st.ok()) return st;
  ReplicaSet set;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  if (!DecodeReplicaSet(&in, &set) || !in.done())
    return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed replica set in the CLAIM_EPOCH reply", EPROTO);
  if (stored) *stored = std::move(set);
  if (was_clean) *was_clean = (c->reply.state & kStateValid) && (c->reply.state & kStateWasClean);
  return Status::Ok();
}

Status RemoteReplica::PeekReplicaSet(ReplicaSet* out) {
  CallPtr c = NewCall(kOpPeekReplicaSet, 0, 0, 0);
  c->max_reply = 64 * 1024;
  Status st = RunStatus(c, "PEEK_REPLICA_SET");
  if (!st.ok()) return st;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  if (!DecodeReplicaSet(&in, out) || !in.done())
    return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed replica set in the PEEK_REPLICA_SET reply", EPROTO);
  return Status::Ok();
}

Status RemoteReplica::LastRw(ReplicaSetId* out) {
  if (!(features_.load() & kFeatureLastRw))
    return Status::Error(Code::kUnsupported, "replica " + id_ + " is served by a release that does not record its last RW replica set", ENOTSUP);
  CallPtr c = NewCall(kOpLastRw, 0, 0, 0);
  c->max_reply = 16;
  Status st = RunStatus(c, "LAST_RW");
  if (!st.ok()) return st;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  ReplicaSetId last{in.U64(), in.U64()};
  if (!in.ok() || !in.done() || (last.epoch == 0) != (last.generation == 0))
    return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed LAST_RW reply", EPROTO);
  *out = last;
  return Status::Ok();
}

Status RemoteReplica::SetReplicaSet(const ReplicaSet& set, bool self_rw) {
  const std::string bad = set.Invalid();
  if (!bad.empty()) return Status::Error(Code::kInvalidArgument, bad, EINVAL);
  CallPtr c = NewCall(kOpSetReplicaSet, set.epoch, 0, 0);
  // An older server refuses the flag: it stores the set without the record.
  if (self_rw && (features_.load() & kFeatureLastRw)) c->h.flags |= kFlagSelfRw;
  PayloadWriter w(&c->payload);
  EncodeReplicaSet(set, &w);
  return RunStatus(c, "SET_REPLICA_SET");
}

Status RemoteReplica::MarkClean(uint64_t epoch) { return RunStatus(NewCall(kOpMarkClean, epoch, 0, 0), "MARK_CLEAN"); }

Status RemoteReplica::Grow(uint64_t size_bytes) {
  if (!CanGrow())
    return Status::Error(Code::kUnsupported, "replica " + id_ + " is served by a release without GROW: upgrade its data engine to resize the volume", ENOTSUP);
  return RunStatus(NewCall(kOpGrow, 0, 0, size_bytes), "GROW");
}

int RemoteReplica::Read(uint64_t off, uint32_t len, uint8_t* buf) { return ReadData(kOpRead, nullptr, off, len, buf); }

int RemoteReplica::ReadData(uint8_t op, const std::string* layer_id, uint64_t off, uint32_t len, uint8_t* buf) {
  PendingIo p;
  SubmitParts(op, 0, off, len, nullptr, 0, layer_id, &p);
  return FinishRead(&p, buf);
}

void RemoteReplica::StartRead(uint64_t off, uint32_t len, uint8_t* buf, PendingIo* p) {
  (void)buf;  // filled by FinishRead, from the replies
  SubmitParts(kOpRead, 0, off, len, nullptr, 0, nullptr, p);
}

int RemoteReplica::FinishRead(PendingIo* p, uint8_t* buf) {
  // Collected in order, each frame's bytes where they belong.
  int rc = p->rc;
  uint64_t pos = 0;
  for (const std::shared_ptr<void>& v : p->calls) {
    const CallPtr c = std::static_pointer_cast<Call>(v);
    Wait(c);
    int r = c->fail_errno ? -c->fail_errno : -ErrnoOfReply(c->reply);
    if (r == 0 && c->reply_payload.size() != c->h.length) r = -EPROTO;
    if (r == 0) memcpy(buf + pos, c->reply_payload.data(), c->h.length);
    if (rc == 0) rc = r;
    pos += c->h.length;
  }
  p->calls.clear();
  return rc;
}

int RemoteReplica::Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) {
  PendingIo p;
  StartWrite(epoch, off, len, buf, fua, &p);
  return FinishWrite(&p);
}

void RemoteReplica::StartWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua, PendingIo* p) {
  SubmitParts(kOpWrite, epoch, off, len, buf, fua ? kFlagFua : 0, nullptr, p);
}

void RemoteReplica::SubmitParts(uint8_t op, uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* data,
                                uint16_t flags, const std::string* layer_id, PendingIo* p) {
  p->rc = 0;
  p->calls.clear();
  // One count per part in flight, plus this loop's own until it is done: a part may be
  // answered before the next one is sent.
  p->unfinished.store(1);
  // Never throws (Engine::WriteAsync/ReadAsync count on it): an allocation that fails ends
  // the loop with ENOMEM, and what was queued before it is collected as usual.
  try {
    SubmitPartsLoop(op, epoch, off, len, data, flags, layer_id, p);
  } catch (...) {
    if (p->rc == 0) p->rc = -ENOMEM;
  }
  if (p->reserved) {  // failed before its first Submit took the slot
    CancelReservedWrite();
    p->reserved = false;
  }
  if (p->waker && p->unfinished.fetch_sub(1) == 1) p->waker->Wake();
}

void RemoteReplica::SubmitPartsLoop(uint8_t op, uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* data,
                                    uint16_t flags, const std::string* layer_id, PendingIo* p) {
  // A reserved write never waits, in any of its parts; its first Submit takes the slot.
  const Send send = !p->defer_send ? Send::kNow : p->reserved ? Send::kReserved : Send::kDeferred;
  for (uint64_t done = 0; done < len || (len == 0 && p->calls.empty()); done += max_io_) {
    uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(max_io_, len - done));
    CallPtr c = NewCall(op, epoch, off + done, n, flags);
    const size_t prefix = layer_id ? 2 + layer_id->size() : 0;
    if (data && !layer_id && p->shared_bytes && p->shared_bytes->size() == len) {
      c->shared_payload = p->shared_bytes;  // its part of the write's buffer: no copy of its own
      c->shared_off = done;
      c->shared_len = n;
    } else if (data) {
      // The frame's payload from the pool: a large write reuses pages already mapped rather
      // than faulting in and zeroing fresh ones for every copy (one per replica).
      c->payload = BufferPool::Get().Take(prefix + n);
      c->payload.clear();
    } else {
      c->max_reply = n;
    }
    PayloadWriter w(&c->payload);
    if (layer_id) w.Str(*layer_id);
    if (data && !c->shared_payload) w.Bytes(data + done, n);
    p->calls.reserve(p->calls.size() + 1);  // so a queued call is always collected
    if (p->waker) {
      c->group = p;
      p->unfinished.fetch_add(1);
    }
    bool queued = false;
    p->reserved = false;
    try {
      p->rc = Submit(c, send, &queued);
    } catch (...) {
      if (queued) p->calls.push_back(c);                   // answered later, as any other
      else if (p->waker) p->unfinished.fetch_sub(1);      // never answered
      throw;
    }
    if (p->rc < 0) {
      if (p->waker) p->unfinished.fetch_sub(1);  // never queued, so never answered
      break;
    }
    p->calls.push_back(c);
    if (len == 0) break;
  }
}

int RemoteReplica::FinishWrite(PendingIo* p) {
  int rc = p->rc;
  for (const std::shared_ptr<void>& v : p->calls) {
    const CallPtr c = std::static_pointer_cast<Call>(v);
    Wait(c);
    int r = c->fail_errno ? -c->fail_errno : -ErrnoOfReply(c->reply);
    if (rc == 0) rc = r;
  }
  p->calls.clear();
  return rc;
}

int RemoteReplica::Trim(uint64_t epoch, uint64_t off, uint64_t len) { return Run(NewCall(kOpTrim, epoch, off, len)); }

int RemoteReplica::WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim, bool fast_only, bool fua) {
  uint16_t f = (may_trim ? kFlagMayTrim : 0) | (fast_only ? kFlagFastOnly : 0) | (fua ? kFlagFua : 0);
  return Run(NewCall(kOpWriteZeroes, epoch, off, len, f));
}

int RemoteReplica::Flush() { return Run(NewCall(kOpFlush, 0, 0, 0)); }

int RemoteReplica::BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) {
  CallPtr c = NewCall(kOpBlockStatus, 0, off, len);
  PayloadWriter(&c->payload).U32(max_extents);
  c->max_reply = 4 + 12 * kMaxExtentsPerReply;
  int rc = Run(c);
  if (rc < 0) return rc;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  uint32_t n = in.U32();
  if (!in.ok() || n > kMaxExtentsPerReply || uint64_t{n} * 12 != in.left()) return -EPROTO;
  out->clear();
  for (uint32_t i = 0; i < n; ++i) {
    Extent e;
    e.length = in.U64();
    e.flags = in.U32();
    out->push_back(e);
  }
  return 0;
}

Status RemoteReplica::ListLayers(std::vector<LayerInfo>* out) {
  CallPtr c = NewCall(kOpListLayers, 0, 0, 0);
  c->max_reply = kMaxPayloadBytes;
  Status st = RunStatus(c, "LIST_LAYERS");
  if (!st.ok()) return st;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  if (!DecodeLayers(&in, out) || !in.done())
    return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed layer list", EPROTO);
  return Status::Ok();
}

Status RemoteReplica::LayerExtents(const std::string& layer_id, std::vector<Range>* out) {
  if (layer_id.size() > kMaxWireStringBytes) return Status::Error(Code::kInvalidArgument, "layer id too long");
  out->clear();
  uint64_t from = 0;
  for (;;) {
    CallPtr c = NewCall(kOpLayerExtents, 0, from, 0);
    PayloadWriter(&c->payload).Str(layer_id);
    c->max_reply = 5 + 16 * kMaxRangesPerReply;
    Status st = RunStatus(c, "LAYER_EXTENTS");
    if (!st.ok()) return st;
    PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
    uint8_t more = in.U8();
    uint32_t n = in.U32();
    if (!in.ok() || more > 1 || n > kMaxRangesPerReply || uint64_t{n} * 16 != in.left())
      return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed extent list", EPROTO);
    for (uint32_t i = 0; i < n; ++i) {
      Range r;
      r.off = in.U64();
      r.len = in.U64();
      // Pages must move forward, or a hostile server could keep us here forever.
      if (r.off < from || r.len == 0 || r.off + r.len < r.off)
        return Status::Error(Code::kProtocolError, "replica " + id_ + ": extent list out of order", EPROTO);
      // A range split across two pages is joined again.
      if (!out->empty() && out->back().off + out->back().len == r.off) out->back().len += r.len;
      else out->push_back(r);
      from = r.off + r.len;
    }
    if (!more) return Status::Ok();
    if (n == 0) return Status::Error(Code::kProtocolError, "replica " + id_ + ": empty extent page", EPROTO);
  }
}

int RemoteReplica::ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) {
  if (layer_id.size() > kMaxWireStringBytes) return -EINVAL;
  return ReadData(kOpReadLayer, &layer_id, off, len, buf);
}

Status RemoteReplica::Snapshot(const std::string& name, int64_t created_ms, const Labels& labels, bool user_created) {
  if (name.size() > kMaxWireStringBytes) return Status::Error(Code::kInvalidArgument, "snapshot name too long");
  CallPtr c = NewCall(kOpSnapshot, 0, 0, 0, user_created ? kFlagUserCreated : 0);
  PayloadWriter w(&c->payload);
  w.Str(name);
  w.U64(static_cast<uint64_t>(created_ms));
  if (!EncodeLabels(labels, &w)) return Status::Error(Code::kInvalidArgument, "labels exceed the protocol's limits");
  return RunStatus(c, "SNAPSHOT");
}

Status RemoteReplica::DeleteSnapshot(const std::string& name) {
  if (name.size() > kMaxWireStringBytes) return Status::Error(Code::kInvalidArgument, "snapshot name too long");
  CallPtr c = NewCall(kOpDeleteSnapshot, 0, 0, 0);
  PayloadWriter(&c->payload).Str(name);
  return RunStatus(c, "DELETE_SNAPSHOT");
}

Status RemoteReplica::Revert(const std::string& name, int64_t created_ms) {
  if (name.size() > kMaxWireStringBytes) return Status::Error(Code::kInvalidArgument, "snapshot name too long");
  CallPtr c = NewCall(kOpRevert, 0, 0, 0);
  PayloadWriter w(&c->payload);
  w.Str(name);
  w.U64(static_cast<uint64_t>(created_ms));
  return RunStatus(c, "REVERT");
}

Status RemoteReplica::AdoptChain(const std::vector<LayerInfo>& layers, uint64_t epoch) {
  CallPtr c = NewCall(kOpAdoptChain, epoch, 0, 0);
  if (!EncodeLayers(layers, &c->payload)) return Status::Error(Code::kOutOfRange, "layer list exceeds the protocol's limits");
  return RunStatus(c, "ADOPT_CHAIN");
}

Status RemoteReplica::LayerDigest(const std::string& layer_id, uint64_t off, uint64_t len, DigestDetail detail,
                                  std::vector<UnitDigest>* out) {
  if (layer_id.size() > kMaxWireStringBytes) return Status::Error(Code::kInvalidArgument, "layer id too long");
  if (len > kMaxDigestRangeBytes)
    return Status::Error(Code::kInvalidArgument, "digest range exceeds " + std::to_string(kMaxDigestRangeBytes));
  // An older server refuses the flag: it computes the hashes too, which cost only time.
  const bool masks_only = detail == DigestDetail::kMasksOnly && (features_.load() & kFeatureDigestMasks);
  CallPtr c = NewCall(kOpLayerDigest, 0, off, len, masks_only ? kFlagMasksOnly : 0);
  PayloadWriter(&c->payload).Str(layer_id);
  c->max_reply = 4 + 42 * kMaxDigestsPerReply;
  Status st = RunStatus(c, "LAYER_DIGEST");
  if (!st.ok()) return st;
  PayloadReader in(c->reply_payload.data(), c->reply_payload.size());
  uint32_t n = in.U32();
  if (!in.ok() || n > kMaxDigestsPerReply || uint64_t{n} * 42 != in.left())
    return Status::Error(Code::kProtocolError, "replica " + id_ + ": malformed digest list", EPROTO);
  out->clear();
  for (uint32_t i = 0; i < n; ++i) {
    UnitDigest d;
    d.off = in.U64();
    d.mask = in.U16();
    memcpy(d.sha256, in.Take(32), 32);
    out->push_back(d);
  }
  return Status::Ok();
}

int RemoteReplica::WriteLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint32_t len, const uint8_t* buf) {
  if (layer_id.size() > kMaxWireStringBytes) return -EINVAL;
  PendingIo p;
  SubmitParts(kOpWriteLayer, epoch, off, len, buf, 0, &layer_id, &p);
  return FinishWrite(&p);
}

int RemoteReplica::UnmapLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint64_t len) {
  if (layer_id.size() > kMaxWireStringBytes) return -EINVAL;
  CallPtr c = NewCall(kOpUnmapLayer, epoch, off, len);
  PayloadWriter(&c->payload).Str(layer_id);
  return Run(c);
}

Status RemoteReplica::FinishRebuild() { return RunStatus(NewCall(kOpFinishRebuild, 0, 0, 0), "FINISH_REBUILD"); }

uint64_t RemoteReplica::AllocatedBytes() {
  // Asked on the JS thread (engine Replicas()): answer from the cache, refresh behind it.
  const int64_t now = MonotonicMs();
  int64_t asked = allocated_asked_ms_.load();
  if (now - asked >= kAllocatedRefreshMs && allocated_asked_ms_.compare_exchange_strong(asked, now)) {
    CallPtr c = NewCall(kOpAllocatedBytes, 0, 0, 0);
    c->internal = true;
    Submit(c, Send::kByLoop);  // skipped when the pipeline is full or the connection gone
  }
  return allocated_.load();
}

}  // namespace mooring
