#include "nbd/nbd-server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "nbd/nbd-connection.h"
#include "nbd/nbd-server-context.h"
#include "nbd/worker-pool.h"
#include "util/fs-util.h"
#include "net/acceptor.h"

namespace mooring {

namespace {

// Option bounds (see docs/nbd-frontend.md).
constexpr uint32_t kMaxRequestBytesMin = NbdConnection::kPreferredBlockBytes;
constexpr uint32_t kMaxRequestBytesLimit = 256u << 20;
constexpr uint32_t kIoThreadsMax = 256;
constexpr uint32_t kMaxConnectionsLimit = 4096;
constexpr uint32_t kMaxInflightLimit = 4096;
constexpr size_t kNameLimit = NbdConnection::kNameMax;
// How long past a freeze's deadline the server waits for a connection to answer (one still
// in its handshake does not answer: it is given up on and left running).
constexpr int64_t kFreezeAnswerGraceMs = 100;
// A peer's (IP address's, or user id's on a unix socket) share of connections still in
// their NBD handshake on a full export (net/acceptor.h): QEMU has a few at a time at most.
constexpr uint32_t kHandshakingPerPeerMax = 16;

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

class NbdServerImpl final : public NbdServer {
 public:
  NbdServerImpl(BlockDevice* device, const NbdServerOptions& opts) {
    ctx_.device = device;
    ctx_.opts = opts;
    // Reserve: one largest request, for clients that take their replies.
    ctx_.budget.reset(new MemoryBudget(opts.max_inflight_bytes_total, opts.max_request_bytes));
    // A reader the budget refused drops the clients whose replies have not moved
    // (docs/hardening.md).
    ctx_.reclaim = [this] { acceptor_.DropStalled(kStalledUnderPressureMs); };
  }

  ~NbdServerImpl() override {
    Close();
    if (listen_fd_ >= 0) close(listen_fd_);  // only if Init failed before the acceptor took it
  }

  // The server side of mutual TLS, parsed once for every connection.
  Status InitTls() {
    if (!ctx_.opts.tls.enabled()) return Status::Ok();
    return TlsContext::Create(ctx_.opts.tls, true, &ctx_.tls);
  }

  Status Init() {
    Status s = InitTls();
    if (!s.ok()) return s;
    s = acceptor_.Init();
    if (!s.ok()) return s;
    ctx_.server_wake_fd = acceptor_.wake_fd();
    const bool tcp = ctx_.opts.unix_path.empty();
    s = tcp ? ListenTcp(ctx_.opts.tcp_host, ctx_.opts.tcp_port, &listen_fd_, &port_) : ListenUnix();
    if (!s.ok()) return s;
    try {
      lane_.reset(new WorkerPool::Lane(&WorkerPool::Nbd(), ctx_.opts.io_threads));
      ctx_.pool = lane_.get();
      StartAcceptor();
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("starting NBD server threads: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  NbdServerStats stats() const override {
    NbdServerStats s;
    s.connections_total = acceptor_.total();
    s.requests = ctx_.requests.load();
    s.bytes_read = ctx_.bytes_read.load();
    s.bytes_written = ctx_.bytes_written.load();
    s.protocol_errors = ctx_.protocol_errors.load();
    s.inline_reads = ctx_.inline_reads.load();
    s.loop_writes = ctx_.loop_writes.load();
    s.grouped_requests = ctx_.grouped_requests.load();
    ctx_.ReadOps(&s);
    if (ctx_.budget) {
      s.budget_limit_bytes = ctx_.budget->limit();
      s.budget_used_bytes = ctx_.budget->used();
      s.budget_peak_bytes = ctx_.budget->peak();
      s.budget_waits = ctx_.budget->waits();
    }
    {
      std::lock_guard<std::mutex> lock(adopted_mu_);
      for (const auto& c : adopted_) s.connection_ids.push_back(c->id());
    }
    acceptor_.ForEachOpen([&s](const NbdConnection& c) { s.connection_ids.push_back(c.id()); });
    std::sort(s.connection_ids.begin(), s.connection_ids.end());
    s.connections_open = s.connection_ids.size();
    return s;
  }

  bool detached() const override { return state_.load() == State::kDetached; }

  Status Close() override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_) return close_status_;
    const State state = state_.load();
    if (state == State::kDetached || state == State::kAdopted) return CloseWithoutTouching();
    std::list<std::unique_ptr<NbdConnection>> conns = acceptor_.Stop();
    RemoveSocketFile();
    for (auto& c : conns) c->RequestStop();  // also wakes a frozen one, which then stops
    for (auto& c : conns) c->Join();  // each answers what it has in flight, then closes
    conns.clear();

    close_status_ = Status::Ok();
    if (lane_) {
      int rc;
      try {
        rc = ctx_.device->Flush();
      } catch (...) {
        rc = -EIO;
      }
      // -EPERM: a device that serves nothing now (a migration standby, or an engine that
      // handed over and flushed then) has nothing of ours to flush.
      if (rc < 0 && rc != -EPERM) close_status_ = Status::FromErrno(rc, "flushing the device while closing the NBD server");
      lane_.reset();  // every connection has ended: nothing of ours is queued or running
    }
    closed_ = true;
    return close_status_;
  }

  // --- Hand-off ---

  Status Freeze(int timeout_ms, bool hold) override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_ || state_.load() != State::kServing) return NotIn("serving", "freeze");
    acceptor_.Pause();
    std::vector<NbdConnection*> conns = acceptor_.Connections();  // stable while paused
    const int64_t deadline = NowMs() + timeout_ms;
    for (NbdConnection* c : conns) c->RequestFreeze(deadline, hold);
    uint64_t failed_id = 0;
    for (NbdConnection* c : conns) {
      if (c->WaitFreeze(deadline + kFreezeAnswerGraceMs) == NbdConnection::FreezeResult::kFailed && failed_id == 0) {
        failed_id = c->id();
      }
    }
    if (failed_id != 0) {
      for (NbdConnection* c : conns) c->Unfreeze(nullptr);
      acceptor_.Resume();
      return Status::Error(Code::kBusy,
                           "NBD connection " + std::to_string(failed_id) + " did not reach a request boundary with " +
                               "nothing in flight within " + std::to_string(timeout_ms) + " ms (a client that does " +
                               "not read its replies, or a request or handshake that does not arrive); nothing was frozen",
                           ETIMEDOUT);
    }
    state_.store(State::kFrozen);
    return Status::Ok();
  }

  Status Detach(NbdServerRecord* out) override {
    std::lock_guard<std::mutex> lock(close_mu_);
    const State state = state_.load();
    if (closed_ || (state != State::kFrozen && state != State::kDetached)) return NotIn("frozen", "detach");
    if (ctx_.tls) {
      return Status::Error(Code::kUnsupported,
                           "an NBD export served over TLS cannot be handed to another process (TLS state cannot move)");
    }
    NbdServerRecord rec;
    rec.unix_path = ctx_.opts.unix_path;
    rec.tcp_port = port_;
    rec.export_name = ctx_.opts.export_name;
    rec.description = ctx_.opts.description;
    rec.read_only = ctx_.opts.read_only;
    rec.max_request_bytes = ctx_.opts.max_request_bytes;
    rec.own_socket_file = own_socket_file_;
    rec.sock_dev = sock_dev_;
    rec.sock_ino = sock_ino_;
    rec.next_connection_id = ctx_.next_connection_id.load();
    rec.connections_total = acceptor_.total();
    rec.requests = ctx_.requests.load();
    rec.bytes_read = ctx_.bytes_read.load();
    rec.bytes_written = ctx_.bytes_written.load();
    rec.protocol_errors = ctx_.protocol_errors.load();
    int lfd = fcntl(acceptor_.listen_fd(), F_DUPFD_CLOEXEC, 0);
    if (lfd < 0) return SocketStatus(errno, "dup of the NBD listening socket");
    rec.fds.Add(lfd);
    for (NbdConnection* c : acceptor_.Connections()) {
      if (c->finished()) continue;  // the client left before the freeze ended
      NbdConnectionRecord cr;
      int fd = -1;
      Status st = c->Snapshot(&cr, &fd);
      if (!st.ok()) return st;  // rec closes the dups made so far
      rec.fds.Add(fd);
      rec.connections.push_back(std::move(cr));
    }
    *out = std::move(rec);
    state_.store(State::kDetached);
    return Status::Ok();
  }

  Status Unfreeze(BlockDevice* device) override {
    std::lock_guard<std::mutex> lock(close_mu_);
    const State state = state_.load();
    if (closed_ || state == State::kServing) return NotIn("frozen", "unfreeze");
    if (device == ctx_.device) device = nullptr;
    if (device && state == State::kAdopted) {
      return Status::Error(Code::kInvalidArgument, "unfreeze: an adopted server serves the device it was adopted for");
    }
    if (device && device->size() < ctx_.device->size()) {
      return Status::Error(Code::kInvalidArgument, "unfreeze: the new device is smaller than the one served");
    }
    if (device) ctx_.device = device;
    if (state == State::kAdopted) {
      std::list<std::unique_ptr<NbdConnection>> conns;
      {
        std::lock_guard<std::mutex> l(adopted_mu_);
        conns.swap(adopted_);
      }
      for (auto& c : conns) acceptor_.Adopt(std::move(c));  // one that cannot start closes its fd only
      // From here on the socket file is this server's to remove (the sender released it).
      own_socket_file_ = adopted_owns_socket_file_;
      state_.store(State::kServing);
      try {
        StartAcceptor();
      } catch (const std::exception& e) {
        return Status::Error(Code::kIoError, std::string("starting the NBD accept thread: ") + e.what());
      }
      return Status::Ok();
    }
    for (NbdConnection* c : acceptor_.Connections()) c->Unfreeze(device);
    acceptor_.Resume();
    state_.store(State::kServing);
    return Status::Ok();
  }

  // Adopt, after the checks in NbdServer::Adopt.
  Status InitAdopted(NbdServerRecord* rec) {
    state_.store(State::kAdopted);  // from here on, closing touches nothing (even on failure)
    Status s = InitTls();
    if (!s.ok()) return s;
    s = acceptor_.Init();
    if (!s.ok()) return s;
    ctx_.server_wake_fd = acceptor_.wake_fd();
    ctx_.next_connection_id.store(rec->next_connection_id);
    ctx_.requests.store(rec->requests);
    ctx_.bytes_read.store(rec->bytes_read);
    ctx_.bytes_written.store(rec->bytes_written);
    ctx_.protocol_errors.store(rec->protocol_errors);
    acceptor_.SetTotal(rec->connections_total);
    port_ = rec->tcp_port;
    sock_dev_ = static_cast<dev_t>(rec->sock_dev);
    sock_ino_ = static_cast<ino_t>(rec->sock_ino);
    adopted_owns_socket_file_ = rec->own_socket_file;
    listen_fd_ = rec->fds.Take(0);
    for (size_t i = 0; i < rec->connections.size(); ++i) {
      s = NbdConnection::Honours(ctx_, rec->connections[i]);
      if (!s.ok()) return s;
    }
    try {
      lane_.reset(new WorkerPool::Lane(&WorkerPool::Nbd(), ctx_.opts.io_threads));
      ctx_.pool = lane_.get();
      std::lock_guard<std::mutex> l(adopted_mu_);
      for (size_t i = 0; i < rec->connections.size(); ++i) {
        int fd = rec->fds.Take(i + 1);
        try {
          adopted_.push_back(std::make_unique<NbdConnection>(&ctx_, fd, rec->connections[i]));
        } catch (...) {
          close(fd);
          throw;
        }
      }
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("adopting the NBD export: ") + e.what());
    }
    return Status::Ok();
  }

 private:
  enum class State { kServing, kFrozen, kDetached, kAdopted };

  Status NotIn(const char* want, const char* what) const {
    static const char* const names[] = {"serving", "frozen", "detached", "adopted, not started"};
    std::string now = closed_ ? "closed" : names[static_cast<int>(state_.load())];
    return Status::Error(Code::kInvalidState, std::string("cannot ") + what + " an NBD server that is " + now +
                                                  " (it must be " + want + ")");
  }

  void StartAcceptor() {
    const bool tcp = ctx_.opts.unix_path.empty();
    acceptor_.Start(listen_fd_, ctx_.opts.max_connections, tcp, [this](int fd) {
      return std::make_unique<NbdConnection>(&ctx_, fd, ctx_.next_connection_id.fetch_add(1));
    }, kHandshakingPerPeerMax);
    listen_fd_ = -1;  // the acceptor's now
  }

  // Close() of a detached server (the hand-off committed) or of an adopted one never
  // started (it may still go back to the sender): the sockets are not ours to touch, so
  // every fd is closed and nothing else happens. No flush either: the device is not
  // served from here any more.
  Status CloseWithoutTouching() {
    std::list<std::unique_ptr<NbdConnection>> conns = acceptor_.Stop();  // closes the listening fd
    for (auto& c : conns) c->Release();  // frozen threads end; the finished ones have
    for (auto& c : conns) c->Join();
    conns.clear();  // destructors: close(fd) only
    {
      std::lock_guard<std::mutex> l(adopted_mu_);
      adopted_.clear();  // never started: close(fd) only
    }
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
    }
    own_socket_file_ = false;
    lane_.reset();
    closed_ = true;
    close_status_ = Status::Ok();
    return close_status_;
  }

  Status ListenUnix() {
    const std::string& path = ctx_.opts.unix_path;
    sockaddr_un addr{};
    if (path.size() >= sizeof addr.sun_path) {
      return Status::Error(Code::kInvalidArgument, "unix socket path too long: " + path);
    }
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path.data(), path.size());

    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      // Replace only a stale socket: never delete a regular file, never steal a live server.
      if (!S_ISSOCK(st.st_mode)) {
        return Status::Error(Code::kAddressInUse, "exists and is not a socket: " + path, EEXIST);
      }
      int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (probe >= 0) {
        bool live = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        close(probe);
        if (live) return Status::Error(Code::kAddressInUse, "a server is already listening on " + path, EADDRINUSE);
      }
      if (unlink(path.c_str()) != 0 && errno != ENOENT) return SocketStatus(errno, "removing stale socket " + path);
    }

    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return SocketStatus(errno, "socket");
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return SocketStatus(errno, "binding " + path);
    }
    if (lstat(path.c_str(), &st) == 0) {
      sock_dev_ = st.st_dev;
      sock_ino_ = st.st_ino;
      own_socket_file_ = true;
    }
    // The socket serves the whole disk: only its owner may connect (the embedder widens it
    // to a group, NbdExportOptions.socketGroup). Set before listen(), so no connect()
    // succeeds under the umask's mode.
    if (chmod(path.c_str(), fsutil::kPrivateFileMode) != 0) return SocketStatus(errno, "chmod 0600 " + path);
    if (listen(listen_fd_, kListenBacklog) != 0) return SocketStatus(errno, "listening on " + path);
    return Status::Ok();
  }

  void RemoveSocketFile() {
    if (!own_socket_file_) return;
    own_socket_file_ = false;
    struct stat st;
    const std::string& path = ctx_.opts.unix_path;
    // Someone may have replaced it since (another server on the same path): leave theirs.
    if (lstat(path.c_str(), &st) == 0 && st.st_dev == sock_dev_ && st.st_ino == sock_ino_) unlink(path.c_str());
  }

  NbdServerContext ctx_;
  std::unique_ptr<WorkerPool::Lane> lane_;  // in WorkerPool::Nbd(), cap io_threads
  int listen_fd_ = -1;
  int port_ = 0;
  bool own_socket_file_ = false;
  dev_t sock_dev_ = 0;
  ino_t sock_ino_ = 0;
  bool adopted_owns_socket_file_ = false;
  std::atomic<State> state_{State::kServing};
  // Declared after ctx_ and lane_: destroyed first, so no connection outlives them.
  Acceptor<NbdConnection> acceptor_;
  mutable std::mutex adopted_mu_;
  std::list<std::unique_ptr<NbdConnection>> adopted_;  // built by Adopt, not started yet
  std::mutex close_mu_;  // serialises Close and the hand-off calls
  bool closed_ = false;
  Status close_status_;
};

Status CheckOptions(BlockDevice* device, const NbdServerOptions& o) {
  auto bad = [](const std::string& m) { return Status::Error(Code::kInvalidArgument, m); };
  if (!device) return bad("NbdServer needs a device");
  if (o.max_request_bytes < kMaxRequestBytesMin || o.max_request_bytes > kMaxRequestBytesLimit) {
    return bad("max_request_bytes must be within [" + std::to_string(kMaxRequestBytesMin) + ", " +
               std::to_string(kMaxRequestBytesLimit) + "]");
  }
  if (o.io_threads < 1 || o.io_threads > kIoThreadsMax) return bad("io_threads must be within [1, 256]");
  if (o.max_connections < 1 || o.max_connections > kMaxConnectionsLimit) {
    return bad("max_connections must be within [1, 4096]");
  }
  if (o.max_inflight_per_connection < 1 || o.max_inflight_per_connection > kMaxInflightLimit) {
    return bad("max_inflight_per_connection must be within [1, 4096]");
  }
  if (o.export_name.size() > kNameLimit) return bad("export_name longer than 4096 bytes");
  if (o.description.size() > kNameLimit) return bad("description longer than 4096 bytes");
  if (o.export_name.find('\0') != std::string::npos) return bad("export_name contains NUL");
  return Status::Ok();
}

}  // namespace

Status NbdServer::Adopt(BlockDevice* device, const NbdServerOptions& runtime, NbdServerRecord* rec,
                        std::unique_ptr<NbdServer>* out) {
  HandOffFds fds = std::move(rec->fds);  // closed on every failure below
  NbdServerOptions opts = runtime;
  opts.unix_path = rec->unix_path;
  opts.tcp_port = rec->tcp_port;
  opts.export_name = rec->export_name;
  opts.description = rec->description;
  opts.read_only = rec->read_only;
  opts.max_request_bytes = rec->max_request_bytes;
  Status s = CheckOptions(device, opts);
  if (!s.ok()) return Status::Error(Code::kProtocolError, "NBD hand-off record: " + s.message, EPROTO);
  if (fds.size() != rec->connections.size() + 1) {
    return Status::Error(Code::kProtocolError, "NBD hand-off record: fds do not match its connections", EPROTO);
  }
  try {
    std::unique_ptr<NbdServerImpl> server(new NbdServerImpl(device, opts));
    rec->fds = std::move(fds);
    s = server->InitAdopted(rec);
    rec->fds.CloseAll();  // whatever InitAdopted did not take
    if (!s.ok()) return s;  // the destructor closes what it took, touching nothing else
    *out = std::move(server);
    return Status::Ok();
  } catch (const std::exception& e) {
    rec->fds.CloseAll();
    return Status::Error(Code::kIoError, std::string("adopting NBD export: ") + e.what());
  }
}

Status NbdServer::Start(BlockDevice* device, const NbdServerOptions& opts, std::unique_ptr<NbdServer>* out) {
  Status s = CheckOptions(device, opts);
  if (!s.ok()) return s;
  try {
    std::unique_ptr<NbdServerImpl> server(new NbdServerImpl(device, opts));
    s = server->Init();
    if (!s.ok()) return s;  // the destructor closes what Init opened
    *out = std::move(server);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Error(Code::kIoError, std::string("starting NBD server: ") + e.what());
  }
}

}  // namespace mooring
