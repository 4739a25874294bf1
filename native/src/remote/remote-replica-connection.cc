// RemoteReplica's connection (remote/remote-replica.h): callers sending their own calls,
// the connection loop reading the replies, and the reconnect after a GOAWAY.
#include "remote/remote-replica.h"

#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>
#include <system_error>

#include "net/reply-batch.h"
#include "util/thread-name.h"

namespace mooring {

using namespace rp;  // NOLINT: wire constants

// ---------------------------------------------------------------------------------------
// Sending: each caller its own calls, with whatever is queued.

bool RemoteReplica::CanSendLocked() const { return !sending_ && !goaway_ && dead_errno_ == 0 && !queue_.empty(); }

// A batch the socket did not take at once, finished by a worker (SendQueuedLocked without
// may_wait). The iovecs point into heads and into the calls' payloads, which move with it.
struct RemoteReplica::SendRest final : WorkerPool::Job {
  RemoteReplica* self = nullptr;
  std::vector<CallPtr> batch;
  std::vector<iovec> iov;
  std::vector<uint8_t> heads;
};

namespace {
// Where SendRest jobs run: threads that may wait for a socket, shared by every replica of
// the process (at most one job per replica at a time: it holds sending_). Never destroyed.
WorkerPool::Lane& SendRestLane() {
  static WorkerPool::Lane* lane = new WorkerPool::Lane(&WorkerPool::Nbd(), WorkerPool::kNbdThreadsMax);
  return *lane;
}
constexpr int kWouldWait = -EINPROGRESS;  // WriteAll's answer where a caller that may not wait stops
}  // namespace

void RemoteReplica::SendQueuedLocked(std::unique_lock<std::mutex>& lk, bool may_wait) {
  // Whoever finds calls queued and nobody sending writes them all, in seq order, as one batch
  // (several per system call); calls queued meanwhile go in the next round, by the same
  // caller. One sender at a time keeps the wire in seq order.
  std::vector<CallPtr> batch;
  std::vector<iovec> iov;
  std::vector<uint8_t> heads;
  // A full socket (a partitioned peer takes no data) blocks the write: past the oldest
  // outstanding call's deadline the connection is failed from here (the loop checks the
  // same deadlines by timer). A caller that may not wait leaves the rest to a worker.
  WaitFn wait = [this, may_wait](short want) -> int { return may_wait ? WaitToSend(want) : kWouldWait; };
  while (CanSendLocked()) {
    while (!queue_.empty()) {
      CallPtr c = queue_.front();
      queue_.pop_front();
      sent_[c->h.seq] = c;  // before sending: the reply may come back before send returns
      batch.push_back(std::move(c));
    }
    last_send_ms_ = MonotonicMs();
    sending_ = true;  // t_ stays until this batch is written
    lk.unlock();
    heads.resize(batch.size() * kRequestHeaderBytes);
    iov.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
      uint8_t* hb = heads.data() + i * kRequestHeaderBytes;
      EncodeRequest(batch[i]->h, hb);
      iov.push_back({hb, kRequestHeaderBytes});
      if (batch[i]->frame_size() > 0) iov.push_back({const_cast<uint8_t*>(batch[i]->frame_data()), batch[i]->frame_size()});
    }
    const int rc = WriteAll(t_.get(), iov.data(), static_cast<int>(iov.size()), wait);
    if (rc == kWouldWait) {
      // WriteAll left iov at what is still to go; moving the vectors keeps their buffers.
      std::unique_ptr<SendRest> rest;
      try {
        rest.reset(new SendRest());
        rest->batch = std::move(batch);
        rest->iov = std::move(iov);
        rest->heads = std::move(heads);
      } catch (...) {
        rest.reset();
      }
      lk.lock();
      if (!rest) {  // no memory to hand it over: the connection fails, as a write error would
        EndBatchLocked(lk, &batch, -ENOMEM);
        continue;
      }
      rest->self = this;
      rest->run = &RemoteReplica::RunSendRest;
      ++send_rests_;
      WorkerPool::Batch b;
      b.Push(rest.release());
      lk.unlock();
      SendRestLane().Submit(&b);
      lk.lock();
      return;  // sending_ stays set: the worker ends the batch
    }
    lk.lock();
    EndBatchLocked(lk, &batch, rc);
  }
}

int RemoteReplica::WaitToSend(short want) {
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (dead_errno_ != 0) return -ENOTCONN;
      if (DeadlinePassedLocked(MonotonicMs())) return -ETIMEDOUT;
    }
    int p = PollFdOrWake(t_->fd(), want, -1, kDeadlineCheckMs);
    if (p != 0) return p < 0 ? p : 0;
  }
}

void RemoteReplica::RunSendRest(WorkerPool::Job* job) {
  std::unique_ptr<SendRest> rest(static_cast<SendRest*>(job));
  RemoteReplica* self = rest->self;
  // t_ stays: sending_ is still set for this batch.
  const int rc = WriteAll(self->t_.get(), rest->iov.data(), static_cast<int>(rest->iov.size()),
                          [self](short want) { return self->WaitToSend(want); });
  std::unique_lock<std::mutex> lk(self->mu_);
  self->EndBatchLocked(lk, &rest->batch, rc);
  self->SendQueuedLocked(lk);  // what was queued meanwhile: this thread may wait
  rest.reset();
  --self->send_rests_;
  self->sending_cv_.notify_all();  // Close waits for the last job to let go of mu_
}

void RemoteReplica::EndBatchLocked(std::unique_lock<std::mutex>& lk, std::vector<CallPtr>* batch, int rc) {
  lk.unlock();
  // The payloads are on the wire (or the connection is gone): give them back now (a large
  // one to the pool, for the next write's copy).
  for (CallPtr& c : *batch) {
    BufferPool::Get().Give(std::move(c->payload));
    c->shared_payload.reset();
  }
  batch->clear();
  lk.lock();
  sending_ = false;
  sending_cv_.notify_all();
  if (rc != 0) {
    // Done sending first: Close() waits for that.
    lk.unlock();
    Teardown(rc == -ETIMEDOUT ? ETIMEDOUT : ECONNRESET);
    lk.lock();
  }
}

// ---------------------------------------------------------------------------------------
// The connection loop: each turn reads what the socket has, reply by reply, without waiting
// (a reply stays half-read in hb_/payload_ until the next turn), then checks deadlines and
// sends the keepalive or a refresh if due; its timer brings it back while calls are
// outstanding (every kDeadlineCheckMs) or when the keepalive is due.

Status RemoteReplica::RegisterLocked() {
  Status st;
  const uint64_t id = loop_->Add(t_->fd(), EPOLLIN, [this](uint32_t) { OnLoop(); }, &st);
  if (id == 0) return st;
  watched_ = EPOLLIN;
  read_want_ = 0;
  hb_got_ = 0;
  in_payload_ = false;
  loop_id_.store(id);
  ArmLocked(MonotonicMs());  // the first turn: bytes may already be buffered (rbuf_, TLS)
  return Status::Ok();
}

void RemoteReplica::ArmLocked(int64_t at_ms) {
  const uint64_t id = loop_id_.load();
  if (id != 0) loop_->ArmTimer(id, at_ms);
}

void RemoteReplica::Watch(uint32_t events) {
  if (events == watched_) return;
  loop_->Modify(loop_id_.load(), events);
  watched_ = events;
}

void RemoteReplica::StopLoopLocked() {
  Watch(0);
  loop_->SetTimer(loop_id_.load(), 0);
}

void RemoteReplica::OnLoop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (reconnecting_) return;  // Redial has the socket
    if (dead_errno_ != 0) return StopLoopLocked();
  }
  int err;
  try {
    // The NBD replies the answers of this turn finish go out together at its end.
    ReplyBatch replies;
    err = ReadReplies();
  } catch (const std::bad_alloc&) {
    err = ENOMEM;  // a reply's payload: lose this connection, keep the process
  }
  if (err == kRedial) return StartRedial();
  std::unique_lock<std::mutex> lk(mu_);
  if (dead_errno_ != 0) return StopLoopLocked();
  if (err == 0) err = HousekeepLocked();
  if (err == 0) return;
  StopLoopLocked();
  lk.unlock();
  Teardown(err);
}

int RemoteReplica::ReadReplies() {
  more_ = false;
  for (int replies = 0;;) {
    if (!in_payload_ && hb_got_ == 0) {
      std::lock_guard<std::mutex> lk(mu_);
      if (dead_errno_ != 0) return 0;
      if (goaway_ && sent_.empty()) return kRedial;  // every request sent before the GOAWAY answered
      if (replies == kRepliesPerTurn) {
        more_ = true;
        return 0;
      }
    }
    uint8_t* dst = in_payload_ ? payload_.data() + payload_got_ : hb_ + hb_got_;
    const size_t n = in_payload_ ? payload_.size() - payload_got_ : sizeof hb_ - hb_got_;
    short want = 0;
    const ssize_t r = rbuf_.ReadSome(t_.get(), dst, n, &want);
    if (r == -EAGAIN) {
      read_want_ = want;
      return 0;
    }
    if (r == 0 && !in_payload_ && hb_got_ == 0) {
      // The server closed at a reply boundary: after a GOAWAY, once everything sent is
      // answered, that is its part of the half-close (Reconnect sees the EOF again).
      std::lock_guard<std::mutex> lk(mu_);
      if (goaway_ && sent_.empty()) return kRedial;
    }
    if (r <= 0) return r == -EPROTO ? EPROTO : ECONNRESET;
    if (in_payload_) {
      payload_got_ += static_cast<size_t>(r);
      if (payload_got_ < payload_.size()) continue;
      in_payload_ = false;
      FinishReply();
      ++replies;
      continue;
    }
    hb_got_ += static_cast<size_t>(r);
    if (hb_got_ < sizeof hb_) continue;
    hb_got_ = 0;
    if (int rc = StartReply(); rc != 0) return rc;
    if (!in_payload_) ++replies;
  }
}

int RemoteReplica::StartReply() {
  ReplyHeader rh;
  if (!DecodeReply(hb_, &rh)) return EPROTO;
  if (rh.seq == 0 && rh.code == kCodeGoAway) {
    // GOAWAY: only on a connection that announced it, once, without a payload.
    std::lock_guard<std::mutex> lk(mu_);
    if (!goaway_ok_ || goaway_ || rh.payload_len != 0) return EPROTO;
    goaway_ = true;
    goaway_deadline_ms_ = MonotonicMs() + io_timeout_ms_;
    return 0;
  }
  if (!ValidCode(rh.code)) return EPROTO;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sent_.find(rh.seq);
    if (it == sent_.end()) {
      // A reply to nothing we asked (the stream cannot be trusted); or the connection was
      // torn down meanwhile, which the next turn sees.
      return dead_errno_ != 0 ? 0 : EPROTO;
    }
    const uint32_t limit = rh.code == 0 ? it->second->max_reply : kMaxMessageBytes;
    if (rh.payload_len > limit) return EPROTO;
    cur_ = it->second;
  }
  rh_ = rh;
  if (rh.payload_len == 0) {
    FinishReply();
    return 0;
  }
  payload_ = BufferPool::Get().Take(rh.payload_len);
  payload_got_ = 0;
  in_payload_ = true;
  return 0;
}

void RemoteReplica::FinishReply() {
  ByteBuffer payload = std::move(payload_);
  payload_ = ByteBuffer();
  CallPtr c = std::move(cur_);
  cur_.reset();
  if (!c) return;
  Waker* wake = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (sent_.erase(rh_.seq) == 1) {
      c->reply = rh_;
      c->reply_payload = std::move(payload);
      if (c->internal && c->h.op == kOpAllocatedBytes && rh_.code == 0) allocated_.store(rh_.value);
      wake = CompleteLocked(c);
    }
  }
  if (wake) wake->Wake();
}

int RemoteReplica::HousekeepLocked() {
  const int64_t now = MonotonicMs();
  if (DeadlinePassedLocked(now)) return ETIMEDOUT;
  if (loop_sending_) {
    if (int rc = LoopSendLocked(); rc != 0) return rc;
  } else if (!goaway_ && !sending_ && dead_errno_ == 0) {
    if (outstanding_ == 0 && now - last_send_ms_ >= kKeepaliveMs) {
      CallPtr ping = NewCall(kOpPing, 0, 0, 0);
      ping->internal = true;
      ping->h.seq = next_seq_++;
      ping->deadline_ms = now + io_timeout_ms_;
      queue_.push_back(ping);
      ++outstanding_;
    }
    // Only internal calls (a ping, an AllocatedBytes refresh: a header each); callers' calls
    // are sent by their callers (Submit, Wait).
    bool internal_only = !queue_.empty();
    for (const CallPtr& c : queue_) internal_only = internal_only && c->internal;
    if (internal_only) {
      loop_out_.resize(queue_.size() * kRequestHeaderBytes);
      loop_out_pos_ = 0;
      size_t i = 0;
      for (const CallPtr& c : queue_) {
        EncodeRequest(c->h, loop_out_.data() + kRequestHeaderBytes * i++);
        sent_[c->h.seq] = c;
      }
      queue_.clear();
      last_send_ms_ = now;
      sending_ = loop_sending_ = true;
      if (int rc = LoopSendLocked(); rc != 0) return rc;
    }
  }
  // TLS may need to write to read; the loop's own write waits for room.
  const bool out = (read_want_ & POLLOUT) || (loop_sending_ && (loop_send_want_ & POLLOUT));
  Watch(EPOLLIN | (out ? uint32_t{EPOLLOUT} : 0u));
  const int64_t at = more_ ? now : (outstanding_ > 0 || goaway_) ? now + kDeadlineCheckMs : last_send_ms_ + kKeepaliveMs;
  loop_->SetTimer(loop_id_.load(), at);
  return 0;
}

int RemoteReplica::LoopSendLocked() {
  while (loop_out_pos_ < loop_out_.size()) {
    iovec iov{loop_out_.data() + loop_out_pos_, loop_out_.size() - loop_out_pos_};
    short want = 0;
    const ssize_t n = t_->Writev(&iov, 1, &want);
    if (n == -EAGAIN) {
      loop_send_want_ = want;  // the rest at a later turn; the deadlines still hold
      return 0;
    }
    if (n < 0) return ECONNRESET;
    loop_out_pos_ += static_cast<size_t>(n);
  }
  loop_out_.clear();
  loop_sending_ = false;
  sending_ = false;
  sending_cv_.notify_all();
  for (const CallPtr& c : queue_) c->cv.notify_all();  // their callers may send now (Wait)
  return 0;
}

void RemoteReplica::StartRedial() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (dead_errno_ != 0 || reconnecting_) return;
    reconnecting_ = true;
    StopLoopLocked();
  }
  // The previous Redial has ended: it cleared reconnecting_ as its last step.
  if (redial_.joinable()) redial_.join();
  bool started = true;
  {
    // Under mu_, which Redial takes first: Close reads redial_ only once Redial is done.
    std::lock_guard<std::mutex> lk(mu_);
    try {
      redial_ = std::thread([this] { Redial(); });
    } catch (const std::system_error&) {
      started = false;
      reconnecting_ = false;
      redial_cv_.notify_all();
    }
  }
  if (!started) Teardown(EAGAIN);
}

void RemoteReplica::Redial() {
  NameThisThread("mr-rr-redial");
  const uint64_t old_id = loop_id_.load();
  const bool ok = Reconnect();
  // The old socket is closed and out of the epoll set: its registration goes (its handler
  // returns at once meanwhile: reconnecting_), the new socket's comes, unless the
  // connection was closed meanwhile.
  if (ok) loop_->Remove(old_id);
  bool failed = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (ok) {
      loop_id_.store(0);
      if (dead_errno_ == 0) failed = !RegisterLocked().ok();
    }
    reconnecting_ = false;
    redial_cv_.notify_all();
  }
  // Close joins this thread before the object goes.
  if (failed) return Teardown(ECONNRESET);
  if (!ok) return;
  // Calls queued during the GOAWAY: a waiting caller sends its own, but an async one
  // (WriteAsync, ReadAsync) has nobody waiting, so they go now, from here.
  std::unique_lock<std::mutex> lk(mu_);
  SendQueuedLocked(lk);
}

bool RemoteReplica::Reconnect() {
  int64_t deadline;
  {
    std::unique_lock<std::mutex> lk(mu_);
    while (sending_ && dead_errno_ == 0) sending_cv_.wait(lk);  // the last batch's write returning
    if (dead_errno_ != 0) return false;
    deadline = goaway_deadline_ms_;
  }
  // Half-close: the server has answered everything we sent and closes once it reads EOF.
  t_->ShutdownWrite();
  {
    WaitFn wait = [&](short want) -> int {
      for (;;) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          if (dead_errno_ != 0) return -ENOTCONN;
        }
        const int64_t left = deadline - MonotonicMs();
        if (left <= 0) return -ETIMEDOUT;
        int p = PollFdOrWake(t_->fd(), want, -1, static_cast<int>(std::min<int64_t>(left, kDeadlineCheckMs)));
        if (p != 0) return p < 0 ? p : 0;
      }
    };
    uint8_t b;
    int rc = rbuf_.ReadExact(t_.get(), &b, 1, wait);
    if (rc != -ECONNRESET) {  // anything but the server's close
      Teardown(rc == 0 ? EPROTO : rc == -ETIMEDOUT ? ETIMEDOUT : ECONNRESET);
      return false;
    }
  }
  // Connect again, as Connect does, until the deadline.
  int backoff = kReconnectFirstMs;
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (dead_errno_ != 0) return false;  // closed meanwhile
    }
    const int64_t now = MonotonicMs();
    if (now >= deadline) break;
    Dialed d;
    if (Dial(ep_, std::min<int64_t>(deadline, now + kReconnectAttemptMs), &d).ok()) {
      // The same replica, never older: its durable epoch and its size only grow, and the
      // frames already split for this connection must still fit.
      if (d.hello.epoch < epoch_.load() || d.hello.value < size_.load() || d.max_io < max_io_) {
        Teardown(EPROTO);
        return false;
      }
      std::unique_ptr<Transport> old;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (dead_errno_ != 0) return false;
        old = std::move(t_);
        t_ = std::move(d.t);
        rbuf_ = std::move(d.rbuf);
        // What Connect takes from a HELLO reply, taken again.
        size_.store(d.hello.value);
        epoch_.store(d.hello.epoch);
        clean_.store(d.hello.state & kStateClean);
        rebuilding_.store(d.hello.state & kStateRebuilding);
        depth_ = d.depth;
        features_.store(d.features);
        goaway_ok_ = d.goaway;
        goaway_ = false;
        const int64_t t = MonotonicMs();
        for (const CallPtr& c : queue_) c->deadline_ms = t + io_timeout_ms_;  // never sent: their time starts now
        last_send_ms_ = t;
        reconnects_.fetch_add(1);
        // Sent by Redial once the new socket is registered, or by a waiting caller first
        // (Wait); internal ones go with the loop's HousekeepLocked.
        for (const CallPtr& c : queue_) c->cv.notify_all();
        slot_cv_.notify_all();
      }
      return true;  // `old` closes its socket here
    }
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t wait_ms = std::min<int64_t>(backoff, deadline - MonotonicMs());
    if (wait_ms > 0) reconnect_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [this] { return dead_errno_ != 0; });
    backoff = std::min(backoff * 2, kReconnectMaxMs);
  }
  Teardown(ETIMEDOUT);  // not connected again in time, whatever the last attempt said
  return false;
}

}  // namespace mooring
