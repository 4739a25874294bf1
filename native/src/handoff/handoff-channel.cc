#include "handoff/handoff-channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace mooring {

namespace {

constexpr uint32_t kMagic = 0x4d484f46;  // "MHOF"
constexpr uint16_t kVersion = 1;

// Every message starts with this (host byte order: both ends run on one host).
struct MessageHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint32_t seq;           // message index within its record, from 0
  uint32_t record_bytes;  // the whole record's, announced by every message
  uint32_t record_fds;
  uint32_t chunk_bytes;   // bytes after this header in this message
  uint32_t chunk_fds;     // fds attached to this message
  uint32_t reserved;      // 0
};
static_assert(sizeof(MessageHeader) == 32, "fixed wire size");

// The rest of a record follows its first message at once; a peer that stalls mid-record
// is broken, not slow.
constexpr int64_t kContinuationTimeoutMs = 10000;

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

int64_t DeadlineOf(int timeout_ms) { return timeout_ms > 0 ? NowMs() + timeout_ms : 0; }

Status Errno(int err, const std::string& what) { return Status::FromErrno(err, what + ": " + strerror(err)); }

Status ProtocolError(const std::string& what) {
  return Status::Error(Code::kProtocolError, "hand-off channel: " + what, EPROTO);
}

bool FillAddr(const std::string& path, sockaddr_un* addr) {
  if (path.empty() || path.size() >= sizeof addr->sun_path) return false;
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

// The peer must be us (same uid) or root: a hand-off moves a VM's disk connection.
Status CheckPeer(int fd, pid_t* pid, uid_t* uid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno(errno, "SO_PEERCRED");
  if (cred.uid != geteuid() && cred.uid != 0) {
    return ProtocolError("peer pid " + std::to_string(cred.pid) + " runs as uid " + std::to_string(cred.uid) +
                         ", not as uid " + std::to_string(geteuid()) + " or root");
  }
  *pid = cred.pid;
  *uid = cred.uid;
  return Status::Ok();
}

// poll() on fd and a wake eventfd until deadline_ms (0: none). kClosed when woken.
Status WaitOn(int fd, int wake_fd, const std::atomic<bool>& closed, short events, int64_t deadline_ms,
              const char* what) {
  for (;;) {
    if (closed.load()) return Status::Error(Code::kClosed, std::string("hand-off channel closed while ") + what, ESHUTDOWN);
    int timeout = -1;
    if (deadline_ms != 0) {
      int64_t left = deadline_ms - NowMs();
      if (left <= 0) return Status::Error(Code::kUnavailable, std::string("hand-off channel: timed out ") + what, ETIMEDOUT);
      timeout = static_cast<int>(left);
    }
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    int n = poll(p, 2, timeout);
    if (n < 0 && errno != EINTR) return Errno(errno, "poll");
    if (n > 0 && p[0].revents) return Status::Ok();  // ready, or an error the next call reports
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// HandOffFds

HandOffFds& HandOffFds::operator=(HandOffFds&& o) noexcept {
  if (this != &o) {
    CloseAll();
    fds_ = std::move(o.fds_);
    o.fds_.clear();
  }
  return *this;
}

int HandOffFds::Take(size_t i) {
  int fd = fds_[i];
  fds_[i] = -1;
  return fd;
}

void HandOffFds::CloseAll() {
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
  fds_.clear();
}

// ---------------------------------------------------------------------------------------
// HandOffChannel

HandOffChannel::~HandOffChannel() {
  close(fd_);
  close(wake_fd_);
}

Status HandOffChannel::Adopt(int fd, std::shared_ptr<HandOffChannel>* out) {
  int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    int err = errno;
    close(fd);
    return Errno(err, "eventfd");
  }
  std::shared_ptr<HandOffChannel> ch(new HandOffChannel(fd, wake));
  Status st = CheckPeer(fd, &ch->peer_pid_, &ch->peer_uid_);
  if (!st.ok()) return st;  // ch closes both fds
  *out = std::move(ch);
  return Status::Ok();
}

Status HandOffChannel::Connect(const std::string& path, int timeout_ms, std::shared_ptr<HandOffChannel>* out) {
  sockaddr_un addr;
  if (!FillAddr(path, &addr)) return Status::Error(Code::kInvalidArgument, "hand-off socket path too long or empty: " + path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno(errno, "socket");
  const int64_t deadline = DeadlineOf(timeout_ms);
  // A unix connect never completes later: EAGAIN (a full backlog) means try again.
  while (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN || (deadline != 0 && NowMs() >= deadline)) {
      close(fd);
      return Errno(err, "connecting to hand-off socket " + path);
    }
    poll(nullptr, 0, 10);
  }
  return Adopt(fd, out);
}

void HandOffChannel::Close() {
  closed_.store(true);
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof one);
  (void)n;
}

Status HandOffChannel::Break(Status st) {
  std::lock_guard<std::mutex> l(state_mu_);
  if (broken_.ok()) broken_ = st;
  return broken_;
}

Status HandOffChannel::Broken() {
  if (closed_.load()) return Status::Error(Code::kClosed, "hand-off channel is closed", ESHUTDOWN);
  std::lock_guard<std::mutex> l(state_mu_);
  return broken_;
}

Status HandOffChannel::Wait(short events, int64_t deadline_ms, const char* what) {
  return WaitOn(fd_, wake_fd_, closed_, events, deadline_ms, what);
}

Status HandOffChannel::Send(const HandOffRecord& rec, int timeout_ms) {
  std::lock_guard<std::mutex> l(send_mu_);
  Status st = Broken();
  if (!st.ok()) return st;
  if (rec.kind == 0 || rec.kind > kKindMax) return Status::Error(Code::kInvalidArgument, "hand-off record kind out of range");
  if (rec.bytes.size() > kRecordBytesMax || rec.fds.size() > kRecordFdsMax) {
    return Status::Error(Code::kInvalidArgument, "hand-off record too large: " + std::to_string(rec.bytes.size()) +
                                                     " bytes, " + std::to_string(rec.fds.size()) + " fds");
  }
  for (int fd : rec.fds.all()) {
    if (fd < 0) return Status::Error(Code::kInvalidArgument, "hand-off record holds a closed fd");
  }
  const int64_t deadline = DeadlineOf(timeout_ms);
  const uint32_t total_bytes = static_cast<uint32_t>(rec.bytes.size());
  const uint32_t total_fds = static_cast<uint32_t>(rec.fds.size());
  uint32_t sent_bytes = 0, sent_fds = 0;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMessageFdsMax));
  for (uint32_t seq = 0; seq == 0 || sent_bytes < total_bytes || sent_fds < total_fds; ++seq) {
    MessageHeader h{kMagic, kVersion, rec.kind, seq, total_bytes, total_fds, 0, 0, 0};
    h.chunk_bytes = std::min(kChunkBytes, total_bytes - sent_bytes);
    h.chunk_fds = std::min(kMessageFdsMax, total_fds - sent_fds);
    iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t*>(rec.bytes.data()) + sent_bytes, h.chunk_bytes}};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = h.chunk_bytes ? 2 : 1;
    if (h.chunk_fds > 0) {
      m.msg_control = control.data();
      m.msg_controllen = CMSG_SPACE(sizeof(int) * h.chunk_fds);
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * h.chunk_fds);
      memcpy(CMSG_DATA(c), rec.fds.all().data() + sent_fds, sizeof(int) * h.chunk_fds);
    }
    for (;;) {
      ssize_t n = sendmsg(fd_, &m, MSG_NOSIGNAL);
      if (n >= 0) break;  // SEQPACKET: all of it or nothing
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        int err = errno;
        return Break(Errno(err, "sending a hand-off record"));
      }
      st = Wait(POLLOUT, deadline, "sending a record");
      // A timeout mid-record leaves the peer with half of it: the channel is unusable.
      if (!st.ok()) return seq == 0 ? st : Break(st);
    }
    sent_bytes += h.chunk_bytes;
    sent_fds += h.chunk_fds;
  }
  return Status::Ok();
}

Status HandOffChannel::Receive(int timeout_ms, HandOffRecord* out) {
  std::lock_guard<std::mutex> l(recv_mu_);
  Status st = Broken();
  if (!st.ok()) return st;
  HandOffRecord rec;  // closes what it received unless the whole record arrives
  st = ReceiveLocked(timeout_ms, &rec);
  if (!st.ok()) return st.code == Code::kClosed ? st : Break(st);
  *out = std::move(rec);
  return Status::Ok();
}

Status HandOffChannel::ReceiveLocked(int timeout_ms, HandOffRecord* rec) {
  const int64_t deadline = DeadlineOf(timeout_ms);
  std::vector<uint8_t> buf(sizeof(MessageHeader) + kChunkBytes);
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMessageFdsMax));
  MessageHeader first{};
  for (uint32_t seq = 0;; ++seq) {
    iovec iov{buf.data(), buf.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control.data();
    m.msg_controllen = control.size();
    ssize_t n;
    for (;;) {
      n = recvmsg(fd_, &m, MSG_CMSG_CLOEXEC);
      if (n >= 0) break;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno(errno, "receiving a hand-off record");
      // Only the first message may take long: the rest of a record is already on its way.
      int64_t until = deadline;
      if (seq > 0) until = until == 0 ? NowMs() + kContinuationTimeoutMs : std::min(until, NowMs() + kContinuationTimeoutMs);
      Status st = Wait(POLLIN, until, seq == 0 ? "waiting for a hand-off record" : "waiting for the rest of a hand-off record");
      if (!st.ok()) return st;
    }
    // Whatever happens next, fds that arrived are ours to close.
    uint32_t got_fds = 0;
    bool foreign_cmsg = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const uint8_t* p = CMSG_DATA(c);
        for (size_t i = 0; i < k; ++i) {
          int fd;
          memcpy(&fd, p + i * sizeof(int), sizeof fd);
          rec->fds.Add(fd);
        }
        got_fds += static_cast<uint32_t>(k);
      } else {
        foreign_cmsg = true;
      }
    }
    if (n == 0 && seq == 0 && got_fds == 0) {
      return Status::Error(Code::kUnavailable, "hand-off channel: the peer closed the channel", ECONNRESET);
    }
    if (m.msg_flags & MSG_CTRUNC) return ProtocolError("fds lost in transit (MSG_CTRUNC: out of fds, or too many sent)");
    if (m.msg_flags & MSG_TRUNC) return ProtocolError("message larger than " + std::to_string(buf.size()) + " bytes");
    if (foreign_cmsg) return ProtocolError("unexpected control message (only SCM_RIGHTS is accepted)");
    if (static_cast<size_t>(n) < sizeof(MessageHeader)) return ProtocolError("short message (" + std::to_string(n) + " bytes)");
    MessageHeader h;
    memcpy(&h, buf.data(), sizeof h);
    if (h.magic != kMagic) return ProtocolError("bad magic");
    if (h.version != kVersion) return ProtocolError("unsupported version " + std::to_string(h.version));
    if (h.reserved != 0) return ProtocolError("reserved field set");
    if (h.chunk_bytes != static_cast<size_t>(n) - sizeof h) return ProtocolError("message length disagrees with its header");
    if (h.chunk_fds != got_fds) {
      return ProtocolError("message announced " + std::to_string(h.chunk_fds) + " fds, carried " + std::to_string(got_fds));
    }
    if (seq == 0) {
      if (h.kind == 0 || h.kind > kKindMax) return ProtocolError("bad record kind");
      if (h.record_bytes > kRecordBytesMax) return ProtocolError("record of " + std::to_string(h.record_bytes) + " bytes is over the limit");
      if (h.record_fds > kRecordFdsMax) return ProtocolError("record of " + std::to_string(h.record_fds) + " fds is over the limit");
      first = h;
      rec->kind = h.kind;
      rec->bytes.reserve(h.record_bytes);
    } else if (h.kind != first.kind || h.record_bytes != first.record_bytes || h.record_fds != first.record_fds) {
      return ProtocolError("message disagrees with its record's first message");
    }
    if (h.seq != seq) return ProtocolError("message out of sequence");
    if (h.chunk_bytes > first.record_bytes - rec->bytes.size() || rec->fds.size() > first.record_fds) {
      return ProtocolError("more bytes or fds than the record announced");
    }
    // A record must make progress in every message but its first.
    if (seq > 0 && h.chunk_bytes == 0 && h.chunk_fds == 0) return ProtocolError("empty continuation message");
    rec->bytes.insert(rec->bytes.end(), buf.data() + sizeof h, buf.data() + n);
    if (rec->bytes.size() == first.record_bytes && rec->fds.size() == first.record_fds) return Status::Ok();
  }
}

// ---------------------------------------------------------------------------------------
// HandOffListener

HandOffListener::~HandOffListener() {
  Close();
  if (fd_ >= 0) close(fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status HandOffListener::Listen(const std::string& path, std::unique_ptr<HandOffListener>* out) {
  sockaddr_un addr;
  if (!FillAddr(path, &addr)) return Status::Error(Code::kInvalidArgument, "hand-off socket path too long or empty: " + path);
  std::unique_ptr<HandOffListener> l(new HandOffListener());
  l->path_ = path;
  l->unlinked_ = true;  // nothing of ours to remove until bound
  l->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (l->wake_fd_ < 0) return Errno(errno, "eventfd");
  // Never replace anything: a stale socket left by a crash is the caller's to remove, since
  // only the caller knows whether a hand-off is still under way there.
  l->fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return Errno(errno, "socket");
  if (bind(l->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    if (err == EADDRINUSE) return Status::Error(Code::kAddressInUse, "hand-off socket " + path + " exists", err);
    return Errno(err, "binding hand-off socket " + path);
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return Errno(errno, "stat " + path);
  l->dev_ = st.st_dev;
  l->ino_ = st.st_ino;
  l->unlinked_ = false;
  // Before listen(): until then nobody can connect, so 0600 holds from the first peer on.
  if (chmod(path.c_str(), 0600) != 0) return Errno(errno, "chmod 0600 " + path);
  if (listen(l->fd_, 8) != 0) return Errno(errno, "listening on " + path);
  *out = std::move(l);
  return Status::Ok();
}

Status HandOffListener::Accept(int timeout_ms, std::shared_ptr<HandOffChannel>* out) {
  std::lock_guard<std::mutex> lock(accept_mu_);
  const int64_t deadline = DeadlineOf(timeout_ms);
  for (;;) {
    Status st = WaitOn(fd_, wake_fd_, closed_, POLLIN, deadline, "waiting for a hand-off peer");
    if (!st.ok()) return st;
    int fd = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      return Errno(errno, "accepting on hand-off socket " + path_);
    }
    st = HandOffChannel::Adopt(fd, out);
    if (st.code != Code::kProtocolError) return st;  // a peer of another uid: wait for ours
  }
}

void HandOffListener::Close() {
  closed_.store(true);
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }
  std::lock_guard<std::mutex> l(close_mu_);
  if (unlinked_) return;
  unlinked_ = true;
  struct stat st;
  if (lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) unlink(path_.c_str());
}

}  // namespace mooring
