#include "nbd/nbd-connection.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "nbd/nbd-protocol.h"
#include "util/thread-name.h"

namespace mooring {

using namespace nbd;  // NOLINT: wire constants

namespace {

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

int OpKind(uint16_t type) {
  switch (type) {
    case kCmdRead: return kNbdOpRead;
    case kCmdWrite: return kNbdOpWrite;
    case kCmdFlush: return kNbdOpFlush;
    case kCmdTrim: return kNbdOpTrim;
    case kCmdWriteZeroes: return kNbdOpWriteZeroes;
    default: return kNbdOpOther;
  }
}

}  // namespace

NbdConnection::NbdConnection(NbdServerContext* ctx, int fd, uint64_t id)
    : ctx_(ctx), dev_(ctx->device), fd_(fd), id_(id) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

NbdConnection::NbdConnection(NbdServerContext* ctx, int fd, const NbdConnectionRecord& rec)
    : ctx_(ctx), dev_(ctx->device), fd_(fd), id_(rec.id), adopted_(true) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  no_zeroes_ = rec.no_zeroes;
  structured_ = rec.structured;
  meta_base_allocation_ = rec.meta_base_allocation;
  size_ = rec.size;
  rbuf_.reset(new uint8_t[kRecvBufferBytes]);
  // Honours() bounded it. Usually empty: then data() may be null, and memcpy from null is
  // undefined even for 0 bytes.
  if (!rec.pending.empty()) memcpy(rbuf_.get(), rec.pending.data(), rec.pending.size());
  rend_ = rec.pending.size();
}

NbdConnection::~NbdConnection() {
  Join();
  while (free_) {
    NbdRequest* r = free_;
    free_ = r->next_free;
    delete r;
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  close(fd_);
}

void NbdConnection::Start() {
  // An adopted client is past its handshake: straight to a loop (if none takes it, the
  // thread below drops it).
  if (adopted_ && wake_fd_ >= 0) {
    handshaking_.store(false);
    if (Register()) return CloseWakeFd();
  }
  thread_ = std::thread([this] { Run(); });
}

void NbdConnection::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);  // a parked connection checks it under this lock
    stop_requested_.store(true);
  }
  freeze_cv_.notify_all();
  Signal();
}

void NbdConnection::Join() {
  if (thread_.joinable()) thread_.join();
  const uint64_t id = loop_id_.load();
  if (id == 0) return;
  {
    std::unique_lock<std::mutex> lock(freeze_mu_);
    freeze_cv_.wait(lock, [this] { return finished_.load(); });
  }
  loop_->Remove(id);  // returns once its handler has returned
  loop_id_.store(0);
}

void NbdConnection::CloseWakeFd() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  close(wake_fd_);
  wake_fd_ = -1;
}

void NbdConnection::Signal() {
  if (loop_id_.load() == 0) {
    std::lock_guard<std::mutex> lock(wake_mu_);
    // Before Register: the handshake thread waits on the wake fd. Closed: it has been
    // registered (loop_id_ is set), and the loop looks at everything on its first turn.
    if (wake_fd_ >= 0) {
      uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof one);
      (void)n;  // EAGAIN means the counter is already non-zero: the thread will wake anyway
      return;
    }
  }
  Nudge();
}

void NbdConnection::Run() {
  NameThisThread("mr-nbd-hello");
  try {
    if (wake_fd_ >= 0 && (adopted_ || Handshake())) {
      handshaking_.store(false);
      // In transmission: a connection loop reads it from here on; the thread ends, and its
      // wake fd with it (an fd fewer per connection served).
      if (Register()) return CloseWakeFd();
      std::lock_guard<std::mutex> lock(send_mu_);  // no loop took it: lose this one connection
      MarkDeadLocked();
    }
  } catch (...) {
    // Allocation, or a device exception during the handshake: lose this one connection.
    std::lock_guard<std::mutex> lock(send_mu_);
    MarkDeadLocked();
  }
  FinishThread();
}

void NbdConnection::FinishThread() {
  // Nothing was ever in flight: the connection never reached a loop.
  MarkFinished();
}

void NbdConnection::MarkFinished() {
  { std::lock_guard<std::mutex> lock(send_mu_); }  // the last completer has left the lock
  // A released socket belongs to another process now: closing our fd (the destructor) is
  // all we may do with it.
  if (!released_) {
    if (tls_ && !dead_.load()) tls_->ShutdownWrite();  // close_notify, best effort
    shutdown(fd_, SHUT_RDWR);
  }
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    finished_.store(true);
  }
  freeze_cv_.notify_all();
  if (ctx_->server_wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t n = write(ctx_->server_wake_fd, &one, sizeof one);
    (void)n;
  }
}

// ---------------------------------------------------------------------------------------
// Freeze and hand-off. The server side calls RequestFreeze/WaitFreeze/Unfreeze/Snapshot/
// Release; the connection's loop answers (nbd-connection-loop.cc: Turn, ParkedTurn).
// freeze_state_ is the one source of truth, under freeze_mu_.

Status NbdConnection::Honours(const NbdServerContext& ctx, const NbdConnectionRecord& rec) {
  auto refuse = [&](const std::string& why) {
    return Status::Error(Code::kProtocolError, "NBD connection " + std::to_string(rec.id) + ": " + why, EPROTO);
  };
  if (rec.transmission_flags != TransmissionFlags(ctx.opts, rec.structured)) {
    return refuse("was promised transmission flags this server would not advertise");
  }
  if (rec.max_request_bytes != ctx.opts.max_request_bytes) return refuse("was promised another maximum block size");
  if (rec.meta_base_allocation && rec.meta_context_id != kMetaBaseAllocationId) {
    return refuse("base:allocation has context id " + std::to_string(rec.meta_context_id) + ", this build serves it as " +
                  std::to_string(kMetaBaseAllocationId));
  }
  // Engines only grow: a size past the device's means the record is for another volume.
  if (rec.size > ctx.device->size()) return refuse("its export size is larger than the device");
  if (rec.pending.size() >= kRecvBufferBytes) return refuse("too many pending bytes");
  return Status::Ok();
}

void NbdConnection::RequestFreeze(int64_t deadline_ms, bool hold) {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    if (freeze_state_ != FreezeState::kNone) return;
    freeze_state_ = FreezeState::kRequested;
    freeze_deadline_ms_ = deadline_ms;
    freeze_hold_ = hold;
    freeze_requested_.store(true);
  }
  Signal();
}

NbdConnection::FreezeResult NbdConnection::WaitFreeze(int64_t until_ms) {
  std::unique_lock<std::mutex> lock(freeze_mu_);
  for (;;) {
    if (finished_.load()) return FreezeResult::kFinished;
    if (freeze_state_ == FreezeState::kFrozen) return FreezeResult::kFrozen;
    if (freeze_state_ == FreezeState::kFailed) break;
    int64_t left = until_ms - NowMs();
    if (left <= 0) break;  // still in its handshake, most likely: give up on it
    freeze_cv_.wait_for(lock, std::chrono::milliseconds(left));
  }
  freeze_state_ = FreezeState::kNone;
  freeze_requested_.store(false);
  lock.unlock();
  Signal();
  return FreezeResult::kFailed;
}

void NbdConnection::FreezeFailed() {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    if (freeze_state_ == FreezeState::kRequested) freeze_state_ = FreezeState::kFailed;
    freeze_requested_.store(false);
  }
  freeze_cv_.notify_all();
}

void NbdConnection::Unfreeze(BlockDevice* device) {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    if (freeze_state_ == FreezeState::kReleased) return;
    // Nothing is in flight while frozen, and the loop reads dev_ only after this lock.
    if (device && freeze_state_ == FreezeState::kFrozen) dev_ = device;
    freeze_state_ = FreezeState::kNone;
    freeze_requested_.store(false);
  }
  freeze_cv_.notify_all();
  Signal();
}

Status NbdConnection::Snapshot(NbdConnectionRecord* out, int* fd) const {
  std::lock_guard<std::mutex> lock(freeze_mu_);
  if (freeze_state_ != FreezeState::kFrozen) {
    return Status::Error(Code::kInvalidState, "NBD connection " + std::to_string(id_) + " is not frozen");
  }
  if (tls_) {
    return Status::Error(Code::kUnsupported, "NBD connection " + std::to_string(id_) +
                                                 " is over TLS: its state cannot move to another process");
  }
  // The parked loop last touched these before taking freeze_mu_ to park.
  out->id = id_;
  out->size = size_;
  out->max_request_bytes = ctx_->opts.max_request_bytes;
  out->transmission_flags = TransmissionFlags();
  out->no_zeroes = no_zeroes_;
  out->structured = structured_;
  out->meta_base_allocation = meta_base_allocation_;
  out->meta_context_id = meta_base_allocation_ ? kMetaBaseAllocationId : 0;
  out->pending.assign(rbuf_.get() + rpos_, rbuf_.get() + rend_);
  *fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (*fd < 0) return Status::FromErrno(errno, "dup of NBD connection " + std::to_string(id_) + ": " + strerror(errno));
  return Status::Ok();
}

void NbdConnection::Release() {
  {
    std::lock_guard<std::mutex> lock(freeze_mu_);
    if (freeze_state_ != FreezeState::kFrozen) return;
    freeze_state_ = FreezeState::kReleased;
  }
  freeze_cv_.notify_all();
  Signal();
}

// A FLUSH with no flags, offset or length. Anything unusual is left to the parser once
// released.
bool NbdConnection::IsBareFlush(const uint8_t* h) {
  return Load32(h) == kMagicRequest && Load16(h + 6) == kCmdFlush && Load16(h + 4) == 0 && Load64(h + 16) == 0 &&
         Load32(h + 24) == 0;
}

// Flushes the device for a held FLUSH and fills its reply. A standby's EPERM counts as done:
// it flushed everything it acknowledged at the hand-over.
void NbdConnection::HeldFlushReply(uint64_t cookie, uint8_t* reply) {
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  int rc;
  try {
    rc = dev_->Flush();
  } catch (...) {
    rc = -EIO;
  }
  PutSimpleReply(reply, rc == -EPERM ? 0 : ErrorFromErrno(rc), cookie);
}

ssize_t NbdConnection::RecvRaw(void* buf, size_t n) {
  if (tls_) {
    short want = 0;
    ssize_t r = tls_->Read(buf, n, &want);
    tls_read_wants_ = r == -EAGAIN ? want : 0;
    return r;
  }
  for (;;) {
    ssize_t r = recv(fd_, buf, n, 0);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  }
}

// ---------------------------------------------------------------------------------------
// Handshake. Blocking style on a non-blocking socket: every wait polls the socket and the
// wake fd against the handshake deadline, so Close() and slow or silent clients cannot
// hold the thread.

NbdConnection::WaitResult NbdConnection::WaitFd(short events) {
  for (;;) {
    if (stop_requested_.load()) return WaitResult::kStopped;
    int timeout = -1;
    if (deadline_ms_ != 0) {
      int64_t left = deadline_ms_ - NowMs();
      if (left <= 0) return WaitResult::kTimeout;
      timeout = static_cast<int>(left);
    }
    pollfd p[2] = {{fd_, events, 0}, {wake_fd_, POLLIN, 0}};
    int n = poll(p, 2, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      return WaitResult::kError;
    }
    if (p[1].revents) {
      uint64_t v;
      ssize_t r = read(wake_fd_, &v, sizeof v);
      (void)r;
    }
    if (p[0].revents) return WaitResult::kReady;
  }
}

bool NbdConnection::RecvExact(void* buf, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t r = RecvRaw(p, n);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r != -EAGAIN) return false;
    WaitResult w = WaitFd(tls_ && tls_read_wants_ ? tls_read_wants_ : POLLIN);
    if (w == WaitResult::kTimeout) {
      ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (w != WaitResult::kReady) return false;
  }
  return true;
}

bool NbdConnection::Discard(size_t n) {
  uint8_t tmp[4096];
  while (n > 0) {
    size_t k = std::min(n, sizeof tmp);
    if (!RecvExact(tmp, k)) return false;
    n -= k;
  }
  return true;
}

bool NbdConnection::SendAll(const void* buf, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    short want = POLLOUT;
    ssize_t r;
    if (tls_) {
      iovec v{const_cast<uint8_t*>(p), n};
      r = tls_->Writev(&v, 1, &want);
      if (r < 0 && r != -EAGAIN) return false;
    } else {
      r = send(fd_, p, n, MSG_NOSIGNAL);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      }
    }
    if (r >= 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (WaitFd(want) != WaitResult::kReady) return false;
  }
  return true;
}

bool NbdConnection::SendOptReply(uint32_t opt, uint32_t type, const void* data, size_t len) {
  uint8_t h[20];
  Store64(h, kMagicOptReply);
  Store32(h + 8, opt);
  Store32(h + 12, type);
  Store32(h + 16, static_cast<uint32_t>(len));
  if (!SendAll(h, sizeof h)) return false;
  return len == 0 || SendAll(data, len);
}

bool NbdConnection::SendOptError(uint32_t opt, uint32_t type, const char* msg) {
  return SendOptReply(opt, type, msg, strlen(msg));
}

bool NbdConnection::NameMatches(const uint8_t* name, uint32_t len) const {
  // "" is the default export; the configured name is its canonical name.
  if (len == 0) return true;
  const std::string& want = ctx_->opts.export_name;
  return len == want.size() && memcmp(name, want.data(), len) == 0;
}

uint16_t NbdConnection::TransmissionFlags() const { return TransmissionFlags(ctx_->opts, structured_); }

uint16_t NbdConnection::TransmissionFlags(const NbdServerOptions& o, bool structured) {
  uint16_t f = kTxHasFlags | kTxSendFlush | kTxSendFua | kTxSendCache | kTxCanMultiConn;
  if (o.read_only) {
    f |= kTxReadOnly;
  } else {
    f |= kTxSendTrim | kTxSendWriteZeroes | kTxSendFastZero;
  }
  // DF only means something with structured replies.
  if (structured) f |= kTxSendDf;
  return f;
}

bool NbdConnection::Handshake() {
  deadline_ms_ = NowMs() + kHandshakeTimeoutMs;
  auto protocol_error = [this] {
    ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  };

  uint8_t greet[18];
  Store64(greet, kMagicNbd);
  Store64(greet + 8, kMagicIHaveOpt);
  Store16(greet + 16, kFlagFixedNewstyle | kFlagNoZeroes);
  if (!SendAll(greet, sizeof greet)) return false;

  uint8_t cf[4];
  if (!RecvExact(cf, 4)) return false;
  uint32_t client_flags = Load32(cf);
  if (client_flags & ~kClientFlagsKnown) return protocol_error();
  no_zeroes_ = (client_flags & kClientFlagNoZeroes) != 0;

  std::vector<uint8_t> payload;
  const bool tls_required = ctx_->tls != nullptr;
  for (uint32_t count = 0;; ++count) {
    if (count >= kHandshakeOptionsMax) return protocol_error();
    uint8_t h[16];
    if (!RecvExact(h, sizeof h)) return false;
    if (Load64(h) != kMagicIHaveOpt) return protocol_error();
    uint32_t opt = Load32(h + 8);
    uint32_t len = Load32(h + 12);

    if (len > kOptionPayloadMax) {
      // EXPORT_NAME has no error reply; anything this large that we cannot skip cheaply
      // is not a real client.
      if (opt == kOptExportName || len > kOptionDiscardMax) return protocol_error();
      if (!Discard(len)) return false;
      if (!SendOptError(opt, kRepErrTooBig, "option payload too large")) return false;
      continue;
    }
    payload.resize(len);
    if (len > 0 && !RecvExact(payload.data(), len)) return false;
    const uint8_t* p = payload.data();

    // TLS required: in the clear, only STARTTLS and ABORT (EXPORT_NAME has no error reply).
    if (tls_required && !tls_ && opt != kOptStartTls && opt != kOptAbort) {
      if (opt == kOptExportName) return protocol_error();
      if (!SendOptError(opt, kRepErrTlsReqd, "this export requires TLS: negotiate STARTTLS first")) return false;
      continue;
    }

    switch (opt) {
      case kOptExportName: {
        if (!NameMatches(p, len)) return false;  // no error path in this option: just close
        size_ = dev_->size();
        uint8_t r[10 + 124];
        memset(r, 0, sizeof r);
        Store64(r, size_);
        Store16(r + 8, TransmissionFlags());
        return SendAll(r, no_zeroes_ ? 10 : sizeof r);
      }
      case kOptAbort:
        SendOptReply(opt, kRepAck, nullptr, 0);  // the client may already be gone
        return false;
      case kOptList: {
        if (len != 0) {
          if (!SendOptError(opt, kRepErrInvalid, "LIST takes no data")) return false;
          break;
        }
        // u32 name length, name, then (free-form, clients show it) the description.
        const std::string& name = ctx_->opts.export_name;
        const std::string& desc = ctx_->opts.description;
        std::vector<uint8_t> r(4 + name.size() + desc.size());
        Store32(r.data(), static_cast<uint32_t>(name.size()));
        memcpy(r.data() + 4, name.data(), name.size());
        memcpy(r.data() + 4 + name.size(), desc.data(), desc.size());
        if (!SendOptReply(opt, kRepServer, r.data(), r.size())) return false;
        if (!SendOptReply(opt, kRepAck, nullptr, 0)) return false;
        break;
      }
      case kOptInfo:
      case kOptGo: {
        bool go = false;
        if (!HandleInfo(opt, p, len, &go)) return false;
        if (go) return true;
        break;
      }
      case kOptStartTls:
        if (len != 0) {
          if (!SendOptError(opt, kRepErrInvalid, "STARTTLS takes no data")) return false;
          break;
        }
        if (!tls_required) {
          if (!SendOptError(opt, kRepErrUnsup, "this export is not served over TLS")) return false;
          break;
        }
        if (tls_) {
          if (!SendOptError(opt, kRepErrInvalid, "TLS is already negotiated")) return false;
          break;
        }
        if (!SendOptReply(opt, kRepAck, nullptr, 0)) return false;
        if (!StartTls()) return protocol_error();
        // Nothing negotiated in the clear carries over (the spec's rule).
        structured_ = false;
        meta_base_allocation_ = false;
        break;
      case kOptStructuredReply:
        if (len != 0) {
          if (!SendOptError(opt, kRepErrInvalid, "STRUCTURED_REPLY takes no data")) return false;
          break;
        }
        structured_ = true;
        if (!SendOptReply(opt, kRepAck, nullptr, 0)) return false;
        break;
      case kOptListMetaContext:
      case kOptSetMetaContext:
        if (!HandleMetaContext(opt, p, len)) return false;
        break;
      default:
        if (!SendOptError(opt, kRepErrUnsup, "option not supported")) return false;
        break;
    }
  }
}

bool NbdConnection::StartTls() {
  // The TLS object gets a dup of the socket: fd_ stays this connection's own (freeze, close).
  int dup_fd = fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return false;
  std::unique_ptr<Transport> t;
  if (!ctx_->tls->Wrap(dup_fd, "", &t).ok()) return false;  // Wrap closed dup_fd
  for (;;) {
    if (stop_requested_.load()) return false;
    Status s = t->Handshake(deadline_ms_, wake_fd_);
    if (s.ok()) break;
    if (s.code != Code::kClosed) return false;  // failed, timed out: the client is not served
    // Woken (a freeze request, say): carry on where the handshake stopped.
  }
  tls_ = std::move(t);
  return true;
}

bool NbdConnection::HandleInfo(uint32_t opt, const uint8_t* p, uint32_t len, bool* go) {
  // u32 name length, name, u16 n, n x u16 info type; all of it, nothing more.
  if (len < 6) return SendOptError(opt, kRepErrInvalid, "truncated INFO/GO request");
  uint32_t name_len = Load32(p);
  if (name_len > len - 6 || name_len > kNameMax) return SendOptError(opt, kRepErrInvalid, "bad name length");
  const uint8_t* name = p + 4;
  uint32_t n = Load16(p + 4 + name_len);
  if (uint64_t{len} != 6ull + name_len + 2ull * n) return SendOptError(opt, kRepErrInvalid, "bad info request count");
  if (!NameMatches(name, name_len)) return SendOptError(opt, kRepErrUnknown, "unknown export");

  bool want_name = false, want_desc = false;
  for (uint32_t i = 0; i < n; ++i) {
    uint16_t t = Load16(p + 6 + name_len + 2 * i);
    if (t == kInfoName) want_name = true;
    if (t == kInfoDescription) want_desc = true;
  }

  size_ = dev_->size();
  uint8_t e[12];
  Store16(e, kInfoExport);
  Store64(e + 2, size_);
  Store16(e + 10, TransmissionFlags());
  if (!SendOptReply(opt, kRepInfo, e, sizeof e)) return false;

  auto send_string = [&](uint16_t type, const std::string& s) {
    std::vector<uint8_t> r(2 + s.size());
    Store16(r.data(), type);
    memcpy(r.data() + 2, s.data(), s.size());
    return SendOptReply(opt, kRepInfo, r.data(), r.size());
  };
  if (want_name && !send_string(kInfoName, ctx_->opts.export_name)) return false;
  if (want_desc && !ctx_->opts.description.empty() && !send_string(kInfoDescription, ctx_->opts.description)) {
    return false;
  }
  // Sent even when not asked for: it tells every client the largest request we accept.
  uint8_t b[14];
  Store16(b, kInfoBlockSize);
  Store32(b + 2, 1);
  Store32(b + 6, kPreferredBlockBytes);
  Store32(b + 10, ctx_->opts.max_request_bytes);
  if (!SendOptReply(opt, kRepInfo, b, sizeof b)) return false;
  if (!SendOptReply(opt, kRepAck, nullptr, 0)) return false;
  *go = (opt == kOptGo);
  return true;
}

bool NbdConnection::HandleMetaContext(uint32_t opt, const uint8_t* p, uint32_t len) {
  // u32 export name length, name, u32 query count, count x (u32 length, query).
  if (len < 8) return SendOptError(opt, kRepErrInvalid, "truncated meta context request");
  uint32_t name_len = Load32(p);
  if (name_len > len - 8 || name_len > kNameMax) return SendOptError(opt, kRepErrInvalid, "bad name length");
  const uint8_t* name = p + 4;
  uint32_t nq = Load32(p + 4 + name_len);
  size_t pos = 8 + size_t{name_len};
  bool list = (opt == kOptListMetaContext);
  bool match = list && nq == 0;  // LIST with no queries: every context we have
  static const size_t kBaseLen = strlen(kMetaBaseAllocation);
  for (uint32_t i = 0; i < nq; ++i) {
    if (len - pos < 4) return SendOptError(opt, kRepErrInvalid, "truncated query");
    uint32_t ql = Load32(p + pos);
    pos += 4;
    if (ql > len - pos || ql > kNameMax) return SendOptError(opt, kRepErrInvalid, "bad query length");
    const char* q = reinterpret_cast<const char*>(p + pos);
    if (ql == kBaseLen && memcmp(q, kMetaBaseAllocation, ql) == 0) match = true;
    if (list && ql == 5 && memcmp(q, "base:", 5) == 0) match = true;  // whole namespace
    pos += ql;  // unknown namespaces and contexts are ignored, as the spec asks
  }
  if (pos != len) return SendOptError(opt, kRepErrInvalid, "trailing bytes in meta context request");
  if (!list && !structured_) return SendOptError(opt, kRepErrInvalid, "structured replies not negotiated");
  if (!NameMatches(name, name_len)) return SendOptError(opt, kRepErrUnknown, "unknown export");
  if (!list) meta_base_allocation_ = match;
  if (match) {
    uint8_t r[4 + 32];
    Store32(r, kMetaBaseAllocationId);
    memcpy(r + 4, kMetaBaseAllocation, kBaseLen);
    if (!SendOptReply(opt, kRepMetaContext, r, 4 + kBaseLen)) return false;
  }
  return SendOptReply(opt, kRepAck, nullptr, 0);
}

// ---------------------------------------------------------------------------------------
// Transmission: the reader side.

bool NbdConnection::CanAcceptMore() const {
  return inflight_.load() < ctx_->opts.max_inflight_per_connection && inflight_bytes_.load() < kInflightBytesMax;
}

NbdRequest* NbdConnection::Acquire() {
  NbdRequest* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(free_mu_);
    if (free_) {
      r = free_;
      free_ = r->next_free;
      pooled_bytes_ -= r->data_cap;
    }
  }
  if (!r) {
    r = new NbdRequest();
    r->conn = this;
    r->run = &NbdConnection::RunJob;
    // Room for any single-chunk reply, so building an error reply never allocates.
    r->iov.reserve(4);
  }
  r->early_error = 0;
  r->held_flush = false;
  r->budget_bytes = 0;
  r->iov.clear();
  r->iov_pos = 0;
  r->next_out = nullptr;
  r->next_free = nullptr;
  return r;
}

void NbdConnection::Recycle(NbdRequest* r) {
  std::lock_guard<std::mutex> lock(free_mu_);
  if (r->data_cap > kPooledBufferMaxBytes || pooled_bytes_ + r->data_cap > kPooledBytesMax) {
    r->data.reset();
    r->data_cap = 0;
  }
  pooled_bytes_ += r->data_cap;
  r->next_free = free_;
  free_ = r;
}

uint32_t NbdConnection::Validate(const NbdRequest* r) const {
  const NbdServerOptions& o = ctx_->opts;
  uint16_t allowed = kCmdFlagFua;  // FUA is accepted on every command (a no-op where meaningless)
  switch (r->type) {
    case kCmdRead: allowed |= structured_ ? kCmdFlagDf : 0; break;
    case kCmdWrite:
    case kCmdFlush:
    case kCmdTrim:
    case kCmdCache: break;
    case kCmdWriteZeroes: allowed |= kCmdFlagNoHole | kCmdFlagFastZero; break;
    case kCmdBlockStatus: allowed |= kCmdFlagReqOne; break;
    default: return kErrInval;
  }
  if (r->flags & ~allowed) return kErrInval;
  switch (r->type) {
    case kCmdRead:
      if (r->length > o.max_request_bytes) return kErrOverflow;
      return InRange(r->offset, r->length, size_) ? 0 : kErrInval;
    case kCmdWrite:
      if (o.read_only) return kErrPerm;
      return InRange(r->offset, r->length, size_) ? 0 : kErrNoSpc;
    case kCmdFlush:
      return 0;
    case kCmdTrim:
      if (o.read_only) return kErrPerm;
      return InRange(r->offset, r->length, size_) ? 0 : kErrInval;
    case kCmdWriteZeroes:
      if (o.read_only) return kErrPerm;
      return InRange(r->offset, r->length, size_) ? 0 : kErrNoSpc;
    case kCmdCache:
      return InRange(r->offset, r->length, size_) ? 0 : kErrInval;
    case kCmdBlockStatus:
      if (!meta_base_allocation_ || r->length == 0) return kErrInval;
      return InRange(r->offset, r->length, size_) ? 0 : kErrInval;
  }
  return kErrInval;
}

NbdConnection::ParseResult NbdConnection::Parse(WorkerPool::Batch* batch) {
  group_io_ = dev_->GroupsRequests();
  ParseResult pr;
  try {
    pr = ParseRequests(batch);
  } catch (...) {
    EndGroup(batch);  // parsed requests still run (and are answered)
    throw;
  }
  EndGroup(batch);
  return pr;
}

void NbdConnection::PushGroupable(NbdRequest* r, WorkerPool::Batch* batch) {
  if (!group_io_ || (r->type != kCmdWrite && r->type != kCmdRead) || r->early_error != 0 || r->length == 0 ||
      r->length > kGroupMaxBytes) {
    batch->Push(r);
    return;
  }
  r->next_grouped = nullptr;
  if (group_tail_) group_tail_->next_grouped = r; else group_head_ = r;
  group_tail_ = r;
  if (++group_n_ == kGroupMax) EndGroup(batch);
}

void NbdConnection::EndGroup(WorkerPool::Batch* batch) {
  if (!group_head_) return;
  if (NbdRequest* rest = StartWritesHere(group_head_)) batch->Push(rest);
  group_head_ = group_tail_ = nullptr;
  group_n_ = 0;
}

NbdRequest* NbdConnection::StartWritesHere(NbdRequest* head) {
  BlockDevice::AsyncWriteReq wq[kGroupMax];
  NbdRequest* rq[kGroupMax];
  size_t n = 0;
  uint64_t bytes = 0;
  NbdRequest* after = head;  // the first request past the leading WRITEs taken
  for (; after && n < kGroupMax && after->type == kCmdWrite && bytes + after->length <= kLoopWriteMaxBytes;
       after = after->next_grouped) {
    bytes += after->length;
    rq[n++] = after;
  }
  if (n == 0) return head;
  const uint64_t started_ns = NowNs();
  for (size_t k = 0; k < n; ++k) {
    Unlink(rq[k], started_ns);  // a started one may be answered and recycled at once
    wq[k] = WriteReqOf(rq[k]);
  }
  const size_t started = dev_->TryWriteAsyncMany(wq, n);  // rq[0..started) are not touched again
  ctx_->requests.fetch_add(started, std::memory_order_relaxed);
  ctx_->loop_writes.fetch_add(started, std::memory_order_relaxed);
  if (started > 1) ctx_->grouped_requests.fetch_add(started, std::memory_order_relaxed);
  if (started == n) return after;
  for (size_t k = started; k + 1 < n; ++k) rq[k]->next_grouped = rq[k + 1];  // the rest, a group again
  rq[n - 1]->next_grouped = after;
  return rq[started];
}

NbdConnection::ParseResult NbdConnection::ParseRequests(WorkerPool::Batch* batch) {
  for (;;) {
    if (cur_) {
      size_t need = cur_->length - cur_got_;
      size_t n = std::min(need, rend_ - rpos_);
      if (n > 0) {
        memcpy(cur_->data.get() + cur_got_, rbuf_.get() + rpos_, n);
        rpos_ += n;
        cur_got_ += n;
      }
      if (cur_got_ < cur_->length) return ParseResult::kNeedMore;
      PushGroupable(cur_, batch);
      cur_ = nullptr;
    }
    if (!CanAcceptMore()) return ParseResult::kPaused;
    if (rend_ - rpos_ < kRequestHeaderBytes) return ParseResult::kNeedMore;

    const uint8_t* h = rbuf_.get() + rpos_;
    if (Load32(h) != kMagicRequest) return ParseResult::kProtocolError;
    uint16_t flags = Load16(h + 4);
    uint16_t type = Load16(h + 6);
    uint32_t length = Load32(h + 24);
    // The data a READ or WRITE will hold comes out of the export's budget before the
    // request is taken: past it this reader stops (the header stays unread) and looks again
    // as requests complete (net/memory-budget.h).
    const uint64_t need = (type == kCmdWrite || type == kCmdRead) && length <= ctx_->opts.max_request_bytes ? length : 0;
    // The reserve is for clients that take their replies (QEMU's connection gets its
    // requests through while others hold the budget without reading).
    budget_blocked_ = need > 0 && !ctx_->budget->TryAcquire(need, Responsive(NowMs()));
    if (budget_blocked_) {
      if (ctx_->reclaim) ctx_->reclaim();  // drops the connections that hold it without reading
      return ParseResult::kPaused;
    }
    rpos_ += kRequestHeaderBytes;
    if (type == kCmdDisc) return ParseResult::kDisc;  // need is 0 for it, as for an oversized WRITE
    // The payload of an oversized WRITE cannot be skipped without trusting the length.
    if (type == kCmdWrite && length > ctx_->opts.max_request_bytes) return ParseResult::kProtocolError;

    NbdRequest* r = Acquire();
    r->flags = flags;
    r->type = type;
    r->cookie = Load64(h + 8);
    r->offset = Load64(h + 16);
    r->length = length;
    r->early_error = Validate(r);
    if (r->early_error == 0 && stop_requested_.load()) r->early_error = kErrShutdown;
    r->budget_bytes = need;  // given back to the budget when the request completes
    inflight_bytes_.fetch_add(r->budget_bytes);
    inflight_.fetch_add(1);
    if (type == kCmdWrite) {
      if (!r->EnsureData(length)) {
        ReleaseUnsent(r);
        return ParseResult::kProtocolError;
      }
      cur_ = r;
      cur_got_ = 0;
      continue;
    }
    if (TryReadInline(r)) continue;  // answered already
    PushGroupable(r, batch);
  }
}

int NbdConnection::RecvSome(bool exact, bool* drained) {
  ssize_t n;
  size_t asked;
  if (cur_ && rpos_ == rend_ && (exact || cur_->length - cur_got_ >= kDirectRecvMinBytes)) {
    // Straight into the request: skips the copy for a large payload, and while freezing it
    // is what keeps the next request's bytes in the socket (never past this payload).
    asked = cur_->length - cur_got_;
    n = RecvRaw(cur_->data.get() + cur_got_, asked);
    if (n > 0) cur_got_ += static_cast<size_t>(n);
  } else {
    if (rpos_ > 0) {
      memmove(rbuf_.get(), rbuf_.get() + rpos_, rend_ - rpos_);
      rend_ -= rpos_;
      rpos_ = 0;
    }
    // Parse() leaves less than one header unconsumed, so there is always room; a zero-size
    // recv would read as EOF, so refuse rather than trust that.
    if (rend_ == kRecvBufferBytes) return -ENOBUFS;
    asked = kRecvBufferBytes - rend_;
    n = RecvRaw(rbuf_.get() + rend_, asked);
    if (n > 0) rend_ += static_cast<size_t>(n);
  }
  *drained = !tls_ && n > 0 && static_cast<size_t>(n) < asked;
  return n >= 0 ? static_cast<int>(std::min<ssize_t>(n, INT_MAX)) : static_cast<int>(n);
}

void NbdConnection::ReleaseUnsent(NbdRequest* r) {
  std::lock_guard<std::mutex> lock(send_mu_);
  CompleteLocked(r);
}

// ---------------------------------------------------------------------------------------
// Transmission: the worker side.

void NbdConnection::RunJob(WorkerPool::Job* job) {
  NbdRequest* r = static_cast<NbdRequest*>(job);
  r->conn->Execute(r);
}

void NbdConnection::BuildSimple(NbdRequest* r, uint32_t error, bool with_data) {
  r->reply_error = error;
  PutSimpleReply(r->head, error, r->cookie);
  r->iov.push_back({r->head, kSimpleReplyBytes});
  if (with_data && r->length > 0) r->iov.push_back({r->data.get(), r->length});
}

size_t NbdConnection::AppendDataChunk(NbdRequest* r, uint8_t* hdr, uint16_t flags, uint64_t pos, uint32_t len) {
  PutChunkHeader(hdr, flags, kChunkOffsetData, r->cookie, 8 + len);
  Store64(hdr + 20, r->offset + pos);
  r->iov.push_back({hdr, 28});
  r->iov.push_back({r->data.get() + pos, len});
  return 28;
}

void NbdConnection::BuildChunkError(NbdRequest* r, uint32_t error) {
  r->reply_error = error;
  PutChunkHeader(r->head, kChunkFlagDone, kChunkError, r->cookie, 6);
  Store32(r->head + 20, error);
  Store16(r->head + 24, 0);  // no message
  r->iov.push_back({r->head, kChunkHeaderBytes + 6});
}

void NbdConnection::Execute(NbdRequest* r) {
  if (r->held_flush) {  // read by the loop while parked in a hold (counted by HeldFlushReply)
    r->iov.clear();
    r->iov_pos = 0;
    HeldFlushReply(r->cookie, r->head);
    r->iov.push_back({r->head, kSimpleReplyBytes});
    SendReply(r);
    return;
  }
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  const uint64_t started_ns = NowNs();
  bool failed = r->early_error != 0;
  r->reply_error = 0;
  r->iov.clear();
  r->iov_pos = 0;
  // READ errors must be chunks once structured replies are on; other commands may use a
  // simple reply either way.
  bool chunked_errors = structured_ && (r->type == kCmdRead || r->type == kCmdBlockStatus);
  try {
    if (r->early_error != 0) {
      if (chunked_errors) BuildChunkError(r, r->early_error); else BuildSimple(r, r->early_error, false);
    } else {
      const bool fua = (r->flags & kCmdFlagFua) != 0;
      int rc = 0;
      if (r->next_grouped) {
        ExecuteGroup(r, started_ns);  // each answered by FinishIo
        return;
      }
      switch (r->type) {
        case kCmdRead:
          if (ExecuteRead(r, started_ns)) return;  // answered by FinishIo
          break;
        case kCmdWrite:
          if (r->length > 0) {
            // Answered by FinishIo, maybe on another thread, maybe already: r is not
            // touched again here.
            r->started_ns = started_ns;
            dev_->WriteAsync(r->offset, r->length, r->data.get(), fua, r);
            return;
          }
          BuildSimple(r, 0, false);
          break;
        case kCmdFlush:
          rc = dev_->Flush();
          BuildSimple(r, ErrorFromErrno(rc), false);
          break;
        case kCmdTrim:
          if (r->length > 0) rc = dev_->Trim(r->offset, r->length, fua);
          BuildSimple(r, ErrorFromErrno(rc), false);
          break;
        case kCmdWriteZeroes:
          if (r->length > 0) {
            rc = dev_->WriteZeroes(r->offset, r->length, (r->flags & kCmdFlagNoHole) == 0,
                                   (r->flags & kCmdFlagFastZero) != 0, fua);
          }
          BuildSimple(r, ErrorFromErrno(rc), false);
          break;
        case kCmdCache:
          if (r->length > 0) rc = dev_->Cache(r->offset, r->length);
          BuildSimple(r, ErrorFromErrno(rc), false);
          break;
        case kCmdBlockStatus:
          ExecuteBlockStatus(r);
          break;
        default:
          BuildSimple(r, kErrInval, false);
          break;
      }
    }
  } catch (...) {
    // Whatever the device threw, the client gets EIO and the worker lives on.
    r->iov.clear();
    if (chunked_errors) BuildChunkError(r, kErrIo); else BuildSimple(r, kErrIo, false);
    failed = true;
  }
  ctx_->CountOp(OpKind(r->type), NowNs() - started_ns, failed || r->reply_error != 0);
  SendReply(r);
}

void NbdRequest::IoDone(int rc) { conn->FinishIo(this, rc); }

void NbdConnection::Unlink(NbdRequest* g, uint64_t started_ns) {
  g->next_grouped = nullptr;
  g->reply_error = 0;
  g->iov.clear();
  g->iov_pos = 0;
  g->started_ns = started_ns;
}

BlockDevice::AsyncWriteReq NbdConnection::WriteReqOf(NbdRequest* g) {
  return {g->offset, g->length, g->data.get(), (g->flags & kCmdFlagFua) != 0, g};
}

void NbdConnection::ExecuteGroup(NbdRequest* r, uint64_t started_ns) {
  BlockDevice::AsyncWriteReq wq[kGroupMax];
  BlockDevice::AsyncReadReq rq[kGroupMax];
  size_t nw = 0, nr = 0, n = 0;
  for (NbdRequest* g = r; g && n < kGroupMax; ++n) {
    NbdRequest* next = g->next_grouped;  // read first: g may be answered and recycled once handed over
    Unlink(g, started_ns);
    if (g->type == kCmdWrite) {
      wq[nw++] = WriteReqOf(g);
    } else if (g->EnsureData(g->length)) {
      rq[nr++] = {g->offset, g->length, g->data.get(), g};
    } else {
      FinishIo(g, -ENOMEM);
    }
    g = next;
  }
  ctx_->requests.fetch_add(n - 1, std::memory_order_relaxed);  // Execute counted the first
  ctx_->grouped_requests.fetch_add(n, std::memory_order_relaxed);
  if (nw > 0) dev_->WriteAsyncMany(wq, nw);
  if (nr > 0) dev_->ReadAsyncMany(rq, nr);
}

bool NbdConnection::TryReadInline(NbdRequest* r) {
  if (r->type != kCmdRead || r->early_error != 0 || r->length == 0 || r->length > kInlineReadMaxBytes) return false;
  if (!r->EnsureData(r->length)) return false;
  const uint64_t started_ns = NowNs();
  if (dev_->TryRead(r->offset, r->length, r->data.get()) != 0) return false;
  ctx_->requests.fetch_add(1, std::memory_order_relaxed);
  ctx_->inline_reads.fetch_add(1, std::memory_order_relaxed);
  r->reply_error = 0;
  r->iov.clear();
  r->iov_pos = 0;
  r->started_ns = started_ns;
  FinishIo(r, 0);
  return true;
}

void NbdConnection::FinishIo(NbdRequest* r, int rc) {
  if (r->type == kCmdWrite) {
    if (rc == 0) ctx_->bytes_written.fetch_add(r->length, std::memory_order_relaxed);
    BuildSimple(r, ErrorFromErrno(rc), false);
  } else if (rc < 0) {  // READ
    if (structured_) BuildChunkError(r, ErrorFromErrno(rc)); else BuildSimple(r, ErrorFromErrno(rc), false);
  } else {
    ctx_->bytes_read.fetch_add(r->length, std::memory_order_relaxed);
    if (structured_) {
      AppendDataChunk(r, r->head, kChunkFlagDone, 0, r->length);  // the whole range, one chunk
    } else {
      BuildSimple(r, 0, true);
    }
  }
  ctx_->CountOp(OpKind(r->type), NowNs() - r->started_ns, r->reply_error != 0);
  SendReply(r);
}

bool NbdConnection::ExecuteRead(NbdRequest* r, uint64_t started_ns) {
  // Structured, with holes worth finding first: reads run by the runs BlockStatus gives.
  if (structured_ && r->length > 0 && dev_->BlockStatusIsCheap()) {
    ExecuteStructuredRead(r);
    return false;
  }
  if (r->length == 0 || !r->EnsureData(r->length)) {
    if (structured_) ExecuteStructuredRead(r);  // the empty reply, or ENOMEM as a chunk
    else BuildSimple(r, r->length == 0 ? 0 : kErrNoMem, false);
    return false;
  }
  // Answered by FinishIo, maybe on another thread, maybe already: r is not touched again.
  r->started_ns = started_ns;
  dev_->ReadAsync(r->offset, r->length, r->data.get(), r);
  return true;
}

void NbdConnection::ExecuteStructuredRead(NbdRequest* r) {
  const uint32_t len = r->length;
  if (len == 0) {
    PutChunkHeader(r->head, kChunkFlagDone, kChunkNone, r->cookie, 0);
    r->iov.push_back({r->head, kChunkHeaderBytes});
    return;
  }
  if (!r->EnsureData(len)) {
    BuildChunkError(r, kErrNoMem);
    return;
  }

  // Split the range into runs that read as zero (sent as OFFSET_HOLE, never read) and runs
  // that need data. r->extents is reused as the run list: flags kExtentZero or 0.
  std::vector<Extent>& runs = r->extents;
  runs.clear();
  int rc = dev_->BlockStatus(r->offset, len, kReadExtentsMax, &runs);
  if (rc < 0) runs.clear();  // allocation info is only an optimisation here
  uint64_t covered = 0;
  size_t out = 0;
  for (size_t i = 0; i < runs.size() && covered < len; ++i) {
    uint64_t l = std::min<uint64_t>(runs[i].length, len - covered);
    if (l == 0) continue;
    uint32_t kind = (runs[i].flags & kExtentZero) ? kExtentZero : 0;
    if (out > 0 && runs[out - 1].flags == kind) {
      runs[out - 1].length += l;
    } else {
      runs[out++] = Extent{l, kind};
    }
    covered += l;
  }
  runs.resize(out);
  if (covered < len) {
    if (!runs.empty() && runs.back().flags == 0) runs.back().length += len - covered;
    else runs.push_back(Extent{len - covered, 0});
  }
  if ((r->flags & kCmdFlagDf) && runs.size() > 1) {
    runs.clear();  // one chunk only: send it all as data
    runs.push_back(Extent{len, 0});
  }

  uint64_t pos = 0;
  for (const Extent& e : runs) {
    if (e.flags == 0) {
      rc = dev_->Read(r->offset + pos, static_cast<uint32_t>(e.length), r->data.get() + pos);
      if (rc < 0) {
        BuildChunkError(r, ErrorFromErrno(rc));
        return;
      }
    }
    pos += e.length;
  }
  ctx_->bytes_read.fetch_add(len, std::memory_order_relaxed);

  // Chunk headers: data 20 + 8 (offset), hole 20 + 12 (offset, length).
  uint8_t* hdr = r->head;
  if (runs.size() > 1) {
    r->scratch.resize(runs.size() * 32);
    hdr = r->scratch.data();
  }
  pos = 0;
  size_t h = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Extent& e = runs[i];
    uint16_t cflags = (i + 1 == runs.size()) ? kChunkFlagDone : 0;
    uint64_t off = r->offset + pos;
    if (e.flags == 0) {
      h += AppendDataChunk(r, hdr + h, cflags, pos, static_cast<uint32_t>(e.length));
    } else {
      PutChunkHeader(hdr + h, cflags, kChunkOffsetHole, r->cookie, 12);
      Store64(hdr + h + 20, off);
      Store32(hdr + h + 28, static_cast<uint32_t>(e.length));
      r->iov.push_back({hdr + h, 32});
      h += 32;
    }
    pos += e.length;
  }
}

void NbdConnection::ExecuteBlockStatus(NbdRequest* r) {
  const uint32_t max = (r->flags & kCmdFlagReqOne) ? 1 : kBlockStatusExtentsMax;
  std::vector<Extent>& ext = r->extents;
  ext.clear();
  int rc = dev_->BlockStatus(r->offset, r->length, max, &ext);
  if (rc < 0) {
    BuildChunkError(r, ErrorFromErrno(rc));
    return;
  }
  // Never trust the device's list: drop empty extents, merge equal neighbours, stay within
  // the request and the descriptor limit.
  uint64_t covered = 0;
  size_t out = 0;
  for (size_t i = 0; i < ext.size() && covered < r->length; ++i) {
    uint64_t l = std::min<uint64_t>(ext[i].length, r->length - covered);
    if (l == 0) continue;
    uint32_t f = ext[i].flags & (kExtentHole | kExtentZero);
    if (out > 0 && ext[out - 1].flags == f) {
      ext[out - 1].length += l;
    } else {
      if (out == max) break;
      ext[out++] = Extent{l, f};
    }
    covered += l;
  }
  ext.resize(out);
  if (ext.empty()) {
    BuildChunkError(r, kErrIo);
    return;
  }
  const uint32_t payload = 4 + 8 * static_cast<uint32_t>(ext.size());
  r->scratch.resize(kChunkHeaderBytes + payload);
  uint8_t* p = r->scratch.data();
  PutChunkHeader(p, kChunkFlagDone, kChunkBlockStatus, r->cookie, payload);
  Store32(p + 20, kMetaBaseAllocationId);
  for (size_t i = 0; i < ext.size(); ++i) {
    Store32(p + 24 + 8 * i, static_cast<uint32_t>(ext[i].length));
    Store32(p + 28 + 8 * i, ext[i].flags);
  }
  r->iov.push_back({p, r->scratch.size()});
}

// ---------------------------------------------------------------------------------------
// Sending and completion.

void NbdConnection::SendReply(NbdRequest* r) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (dead_.load()) {
    CompleteLocked(r);
    return;
  }
  // Finished with others on this thread (a loop reading several replicas' answers): queued,
  // and sent with them when the thread's ReplyBatch closes.
  if (!batched_ && !out_head_ && ReplyBatch::Defer(this)) {
    batched_ = true;
    inflight_.fetch_add(1);  // SendBatched gives it back
  }
  if (batched_) {
    QueueOutLocked(r);
    return;
  }
  if (!out_head_) {
    int s = SendIov(r);
    if (s == 1) {
      if (!replied_.load()) replied_.store(true);
      CompleteLocked(r);
      return;
    }
    if (s < 0) {
      MarkDeadLocked();
      CompleteLocked(r);
      Signal();
      return;
    }
  }
  // The socket is full (or earlier replies are queued): leave it to the connection's loop,
  // which waits for the socket to become writable.
  QueueOutLocked(r);
  if (send_stalled_since_ms_.load() == 0) send_stalled_since_ms_.store(NowMs());
  if (!out_pending_.exchange(true)) Signal();
}

void NbdConnection::QueueOutLocked(NbdRequest* r) {
  r->next_out = nullptr;
  if (out_tail_) out_tail_->next_out = r; else out_head_ = r;
  out_tail_ = r;
}

void NbdConnection::Kill() {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (dead_.load()) return;
  ctx_->protocol_errors.fetch_add(1, std::memory_order_relaxed);
  MarkDeadLocked();  // shuts the socket down: the loop (nudged) sees it and ends
  Signal();
}

int NbdConnection::SendIov(NbdRequest* r) {
  while (r->iov_pos < r->iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(r->iov.size() - r->iov_pos, IOV_MAX));
    ssize_t n;
    if (tls_) {
      short want = 0;
      n = tls_->Writev(&r->iov[r->iov_pos], count, &want);
      if (n == -EAGAIN) return 0;  // the loop waits for EPOLLOUT and tries again
      if (n < 0) return -1;
    } else {
      msghdr m{};
      m.msg_iov = &r->iov[r->iov_pos];
      m.msg_iovlen = count;
      n = sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return -1;
      }
    }
    size_t left = static_cast<size_t>(n);
    ConsumeSent(r, &left);
  }
  return 1;
}

bool NbdConnection::ConsumeSent(NbdRequest* r, size_t* left) {
  while (r->iov_pos < r->iov.size()) {
    iovec& v = r->iov[r->iov_pos];
    if (*left < v.iov_len) {
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + *left;
      v.iov_len -= *left;
      *left = 0;
      return false;
    }
    *left -= v.iov_len;
    ++r->iov_pos;
  }
  return true;
}

void NbdConnection::SendBatched() noexcept {
  std::lock_guard<std::mutex> lock(send_mu_);
  batched_ = false;
  if (!dead_.load()) FlushPendingLocked();  // sets out_pending_ if the socket is full
  if (out_head_) Signal();                   // then the loop goes on when it drains
  inflight_.fetch_sub(1);
  if (waiting_.load()) Signal();
}

int NbdConnection::SendQueuedLocked() {
  while (out_head_) {
    iovec v[kGatherIovMax];
    int n = 0;
    for (NbdRequest* r = out_head_; r && n < static_cast<int>(kGatherIovMax); r = r->next_out)
      for (size_t i = r->iov_pos; i < r->iov.size() && n < static_cast<int>(kGatherIovMax); ++i) v[n++] = r->iov[i];
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    const ssize_t sent = sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    size_t left = static_cast<size_t>(sent);
    while (out_head_) {
      NbdRequest* r = out_head_;
      if (!ConsumeSent(r, &left)) break;  // this one only in part
      out_head_ = r->next_out;
      if (!out_head_) out_tail_ = nullptr;
      CompleteLocked(r);
      if (!replied_.load()) replied_.store(true);
    }
    send_stalled_since_ms_.store(out_head_ ? NowMs() : 0);  // progress
  }
  return 1;
}

void NbdConnection::FlushPendingLocked() {
  if (!tls_) {
    if (SendQueuedLocked() < 0) return MarkDeadLocked();
    out_pending_.store(out_head_ != nullptr);
    return;
  }
  while (out_head_) {
    int s = SendIov(out_head_);
    if (s == 0) break;
    if (s < 0) {
      MarkDeadLocked();
      return;
    }
    NbdRequest* r = out_head_;
    out_head_ = r->next_out;
    if (!out_head_) out_tail_ = nullptr;
    CompleteLocked(r);
    if (!replied_.load()) replied_.store(true);
    send_stalled_since_ms_.store(out_head_ ? NowMs() : 0);  // progress
  }
  out_pending_.store(out_head_ != nullptr);
}

void NbdConnection::MarkDeadLocked() {
  if (!dead_.exchange(true)) shutdown(fd_, SHUT_RDWR);
  while (out_head_) {
    NbdRequest* r = out_head_;
    out_head_ = r->next_out;
    CompleteLocked(r);
  }
  out_tail_ = nullptr;
  out_pending_.store(false);
  send_stalled_since_ms_.store(0);
}

void NbdConnection::CompleteLocked(NbdRequest* r) {
  uint64_t bytes = r->budget_bytes;
  Recycle(r);
  ctx_->budget->Release(bytes);
  inflight_bytes_.fetch_sub(bytes);
  inflight_.fetch_sub(1);
  // The reader only sleeps on in-flight work when it said so; otherwise stay quiet, one
  // eventfd write per request would cost more than the request.
  if (waiting_.load()) Signal();
}

}  // namespace mooring
