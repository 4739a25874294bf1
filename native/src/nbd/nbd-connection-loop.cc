// NbdConnection's transmission phase on a connection loop (Poller::ForConnection), as a
// handler that never waits. Each turn parses what is buffered, reads what the socket (or
// TLS) has (a half-read header or WRITE payload stays in rbuf_/cur_ until the next turn),
// flushes the replies the socket could not take, and then says what it waits for: the
// socket (EPOLLIN while it may read, or what a TLS read wants; EPOLLOUT while replies are
// queued) and a timer (the drain, freeze and memory-budget deadlines). Whatever changes the
// connection's state from another thread (a completion it waits for, RequestStop, a freeze,
// Kill) nudges the loop (Signal). Reading on as long as there are bytes also covers what TLS
// has decrypted and poll() cannot see (Transport::Pending).
#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include <algorithm>

#include "nbd/nbd-connection.h"
#include "nbd/nbd-protocol.h"

namespace mooring {

using namespace nbd;  // NOLINT: wire constants

namespace {
// recv() calls one connection makes per turn before letting the loop's others go.
constexpr int kReadsPerTurn = 16;
// Asked for a unix socket's send buffer (the kernel doubles it, within net.core.wmem_max).
constexpr int kUnixSendBufferBytes = 2 << 20;

// A unix socket sends 208 KiB at most by default: a 1 MiB READ reply then takes five sends,
// four of them from the loop as the client drains it. A TCP socket keeps its autotuning.
void RaiseUnixSendBuffer(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || ss.ss_family != AF_UNIX) return;
  int want = kUnixSendBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);  // best effort
}
}  // namespace

bool NbdConnection::Register() {
  deadline_ms_ = 0;
  RaiseUnixSendBuffer(fd_);
  if (!rbuf_) rbuf_.reset(new uint8_t[kRecvBufferBytes]);
  Poller& loop = Poller::ForConnection();
  Status st;
  const uint64_t id = loop.Add(fd_, 0, [this](uint32_t) { OnLoop(); }, &st);
  if (id == 0) return false;
  loop_ = &loop;
  loop_id_.store(id);
  Nudge();  // the first turn: requests may already be buffered (adopted: rec.pending)
  return true;
}

void NbdConnection::Nudge() {
  const uint64_t id = loop_id_.load();
  if (id != 0) loop_->ArmTimer(id, Poller::NowMs());
}

void NbdConnection::Watch(uint32_t events) {
  if (events == watched_) return;
  loop_->Modify(loop_id_.load(), events);
  watched_ = events;
}

void NbdConnection::OnLoop() {
  if (finished_.load()) return;
  try {
    if (!ending_) Turn();
  } catch (...) {
    // Allocation: lose this one connection.
    if (!ending_) EndTransmission(false);
  }
  if (ending_) TryFinishLoop();
}

// One turn: parse, read, flush; where a thread would wait, the handler says what for (Watch,
// a timer) and returns.
void NbdConnection::Turn() {
  if (parked_ && ParkedTurn()) return;
  bool drained = false;  // the socket gave less than asked: nothing more to read this turn
  for (int reads = 0;;) {
    const bool stopping = eof_ || disc_ || stop_requested_.load();
    ParseResult pr = ParseResult::kNeedMore;
    if (!eof_ && !disc_ && !abandoned_) {
      // After a stop request, requests already buffered are still parsed, and answered
      // with ESHUTDOWN. While freezing they are parsed and executed as usual: only the
      // socket stops being read.
      WorkerPool::Batch batch;
      try {
        pr = Parse(&batch);
      } catch (...) {
        ctx_->pool->Submit(&batch);  // what was parsed is answered before the connection ends
        throw;
      }
      ctx_->pool->Submit(&batch);
      if (pr == ParseResult::kProtocolError) {
        ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
        return EndTransmission(false);
      }
      if (pr == ParseResult::kDisc) {
        disc_ = true;
        continue;
      }
    }
    if (dead_.load()) return EndTransmission(false);
    if (stopping) {
      if (cur_) {  // a WRITE whose payload will never arrive
        ReleaseUnsent(cur_);
        cur_ = nullptr;
        abandoned_ = true;
      }
      if (drain_deadline_ == 0) drain_deadline_ = Poller::NowMs() + kDrainTimeoutMs;
    }

    // Freezing: done at a request boundary (no WRITE payload pending, less than a header
    // buffered) with nothing in flight and nothing queued to send.
    const bool freezing = !stopping && FreezeRequested();
    int64_t freeze_deadline = 0;
    if (freezing) {
      if (!cur_ && rend_ - rpos_ < kRequestHeaderBytes && inflight_.load() == 0 && !out_pending_.load()) {
        {
          std::lock_guard<std::mutex> lock(freeze_mu_);
          if (freeze_state_ == FreezeState::kRequested) {  // else cancelled meanwhile: look again
            freeze_state_ = FreezeState::kFrozen;
            freeze_requested_.store(false);
            parked_ = true;
            hold_answering_ = freeze_hold_;
          }
        }
        if (!parked_) continue;
        freeze_cv_.notify_all();
        if (ParkedTurn()) return;
        continue;  // resumed or stopping already: look again
      }
      {
        std::lock_guard<std::mutex> lock(freeze_mu_);
        freeze_deadline = freeze_deadline_ms_;
      }
      if (Poller::NowMs() >= freeze_deadline) {
        FreezeFailed();
        continue;
      }
    }

    // Publish that we wait on in-flight work before re-checking it, so a completion racing
    // with us either is seen here or nudges the loop.
    const bool paused = pr == ParseResult::kPaused;
    waiting_.store(stopping || paused || freezing);
    if (paused && CanAcceptMore() && !budget_blocked_) continue;
    if (freezing && inflight_.load() == 0 && !out_pending_.load() && !cur_ && !paused &&
        rend_ - rpos_ < kRequestHeaderBytes) {
      continue;  // raced with the last completion: look again rather than wait
    }
    if (out_pending_.load()) {
      std::lock_guard<std::mutex> lock(send_mu_);
      FlushPendingLocked();  // without waiting: what the socket does not take waits for EPOLLOUT
    }
    if (dead_.load()) return EndTransmission(false);
    const bool want_write = out_pending_.load();
    if (stopping && inflight_.load() == 0 && !want_write) return EndTransmission(true);
    const bool want_read = !stopping && !paused && (!freezing || cur_ != nullptr);

    int64_t wake_at = 0;
    auto wake_by = [&wake_at](int64_t at) {
      if (at != 0 && (wake_at == 0 || at < wake_at)) wake_at = at;
    };
    if (stopping) {
      if (Poller::NowMs() >= drain_deadline_) return EndTransmission(false);  // the client does not take its replies
      wake_by(drain_deadline_);
    } else if (freezing) {
      wake_by(freeze_deadline);
    }
    // Waiting for the export's budget with nothing of its own in flight: other connections'
    // completions free it but do not nudge this one, so look again shortly.
    if (budget_blocked_) wake_by(Poller::NowMs() + kBudgetRetryMs);

    if (want_read && !drained) {
      if (reads == kReadsPerTurn) {
        wake_by(Poller::NowMs());  // more at the next turn, after the loop's other connections
      } else {
        ++reads;
        const int r = RecvSome(freezing, &drained);
        if (r > 0 || r == -EINTR) continue;
        if (r == 0) {
          eof_ = true;
          if (cur_ || rend_ != rpos_) {  // the client vanished mid-request
            ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
            return EndTransmission(false);
          }
          continue;
        }
        if (r != -EAGAIN) return EndTransmission(false);
      }
    }
    Watch((want_read ? ReadEvents() : 0u) | (want_write ? uint32_t{EPOLLOUT} : 0u));
    if (wake_at != 0) loop_->ArmTimer(loop_id_.load(), wake_at);
    return;
  }
}

// Parked: nothing is read (except held FLUSHes) until Unfreeze, Release or RequestStop.
// True while still parked; false when it is over (the turn carries on: resumed or stopping).
bool NbdConnection::ParkedTurn() {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    if (freeze_state_ == FreezeState::kFrozen && !stop_requested_.load()) {
      waiting_.store(true);  // a held FLUSH's completion nudges the loop
    } else {
      parked_ = false;
      hold_answering_ = false;
      if (freeze_state_ == FreezeState::kReleased) {
        released_ = true;
      } else if (freeze_state_ == FreezeState::kFrozen) {
        freeze_state_ = FreezeState::kNone;  // stopping while frozen
      }
    }
  }
  if (released_) {
    // The socket is another process's now: no reply, no shutdown; held FLUSHes still in
    // flight are waited for (TryFinishLoop) before the connection is finished.
    ending_ = true;
    Watch(0);
    return true;
  }
  if (!parked_) return false;
  AnswerHeldFlush();
  return true;
}

uint32_t NbdConnection::ReadEvents() const {
  if (!tls_ || tls_read_wants_ == 0) return EPOLLIN;
  return ((tls_read_wants_ & POLLIN) ? uint32_t{EPOLLIN} : 0u) | ((tls_read_wants_ & POLLOUT) ? uint32_t{EPOLLOUT} : 0u);
}

// Parked in a hold: a FLUSH at the head of the stream, with nothing buffered before it, is
// read and handed to a worker (the device's flush may wait; an engine that handed over, a
// standby, answers EPERM and flushed everything it acknowledged at the hand-over, so that
// counts as done: HeldFlushReply); its reply is sent as any other. The next is looked at
// once it has been answered. A client that only flushes and leaves (QEMU quitting after a
// completed migration) is then not held. Answering ends for good once the head is anything
// else, the client left, the socket failed or a reply did not go out at once: the connection
// then waits, unwatched, until unfrozen. The first bytes read decide, so the stream stays
// framed: without TLS the header is peeked at; over TLS, where nothing can be peeked at, it
// is read into the receive buffer (where the parser finds it once unfrozen), one header at
// most (what follows stays in TLS's buffer).
void NbdConnection::AnswerHeldFlush() {
  if (out_pending_.load()) {
    hold_answering_ = false;
    std::lock_guard<std::mutex> lock(send_mu_);
    FlushPendingLocked();
  }
  if (out_pending_.load()) return Watch(EPOLLOUT);
  if (!hold_answering_ || inflight_.load() > 0 || dead_.load()) return Watch(0);
  auto stop_answering = [this] {
    hold_answering_ = false;
    Watch(0);
  };
  if (cur_ || (!tls_ && rend_ != rpos_)) return stop_answering();
  uint8_t h[kRequestHeaderBytes];
  if (!tls_) {
    ssize_t n = recv(fd_, h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Watch(EPOLLIN);
    if (n != static_cast<ssize_t>(sizeof h) || !IsBareFlush(h) ||
        recv(fd_, h, sizeof h, MSG_DONTWAIT) != static_cast<ssize_t>(sizeof h)) {
      return stop_answering();
    }
  } else {
    while (rend_ - rpos_ < kRequestHeaderBytes) {
      if (rpos_ > 0) {
        memmove(rbuf_.get(), rbuf_.get() + rpos_, rend_ - rpos_);
        rend_ -= rpos_;
        rpos_ = 0;
      }
      const ssize_t n = RecvRaw(rbuf_.get() + rend_, kRequestHeaderBytes - rend_);
      if (n == -EAGAIN) return Watch(ReadEvents());
      if (n == -EINTR) continue;
      if (n <= 0) return stop_answering();
      rend_ += static_cast<size_t>(n);
    }
    if (!IsBareFlush(rbuf_.get() + rpos_)) return stop_answering();
    memcpy(h, rbuf_.get() + rpos_, sizeof h);
    rpos_ += kRequestHeaderBytes;
  }
  NbdRequest* r = Acquire();
  r->held_flush = true;
  r->flags = 0;
  r->type = kCmdFlush;
  r->cookie = Load64(h + 8);
  r->offset = 0;
  r->length = 0;
  inflight_.fetch_add(1);
  Watch(0);  // the completion nudges the loop (waiting_)
  WorkerPool::Batch batch;
  batch.Push(r);
  ctx_->pool->Submit(&batch);
}

void NbdConnection::EndTransmission(bool clean) {
  ending_ = true;
  Watch(0);
  if (cur_) {
    ReleaseUnsent(cur_);
    cur_ = nullptr;
  }
  if (!clean) {
    std::lock_guard<std::mutex> lock(send_mu_);
    MarkDeadLocked();
  }
}

// Every request charged to this connection must be finished before it can go away: workers
// hold pointers to it until their reply is completed. Each completion nudges the loop.
void NbdConnection::TryFinishLoop() {
  waiting_.store(true);
  if (inflight_.load() != 0) return;
  Watch(0);
  MarkFinished();
}

}  // namespace mooring
