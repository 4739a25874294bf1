#include "remote/replica-server.h"

#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

#include "remote/replica-server-connection.h"

namespace mooring {

namespace {

// Option bounds (docs/replica-protocol.md).
constexpr uint32_t kMaxConnectionsLimit = 4096;
constexpr uint32_t kIoThreadsMax = 256;
constexpr uint32_t kMaxInflightLimit = 4096;
constexpr uint64_t kMaxInflightBytesMin = 2ull * rp::kMaxIoBytes;
constexpr uint64_t kMaxInflightBytesLimit = 4ull << 30;
constexpr uint32_t kTimeoutMinMs = 100;
constexpr uint32_t kTimeoutMaxMs = 3600 * 1000;
constexpr int kListenBacklog = 128;
constexpr int kAcceptBackoffMs = 100;  // after EMFILE and friends, instead of spinning

Status ErrnoStatus(int err, const std::string& what) {
  if (err == EADDRINUSE) return Status::Error(Code::kAddressInUse, what + ": address in use", err);
  return Status::FromErrno(err, what + ": " + strerror(err));
}

class ReplicaServerImpl final : public ReplicaServer {
 public:
  explicit ReplicaServerImpl(const ReplicaServerOptions& opts) { ctx_.opts = opts; }

  ~ReplicaServerImpl() override {
    Close();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  Status Init() {
    char real[PATH_MAX];
    if (::realpath(ctx_.opts.root.c_str(), real) == nullptr) return ErrnoStatus(errno, "replica server root " + ctx_.opts.root);
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::Error(Code::kInvalidArgument, "replica server root " + ctx_.opts.root + " is not a directory");
    ctx_.root_real = real;
    if (ctx_.opts.tls.enabled()) {
      Status s = TlsContext::Create(ctx_.opts.tls, true, &ctx_.tls);
      if (!s.ok()) return s;
    }
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return ErrnoStatus(errno, "eventfd");
    ctx_.server_wake_fd = wake_fd_;
    Status s = Listen();
    if (!s.ok()) return s;
    try {
      pool_.reset(new WorkerPool(ctx_.opts.io_threads));
      ctx_.pool = pool_.get();
      accept_thread_ = std::thread([this] { AcceptLoop(); });
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("starting replica server threads: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  ReplicaServerStats stats() const override {  // NOLINT: locks conns_mu_ (mutable)
    ReplicaServerStats s;
    s.connections_total = connections_total_.load();
    {
      // Counted here rather than when reaped, which happens lazily on the accept thread.
      std::lock_guard<std::mutex> l(conns_mu_);
      uint64_t open = 0;
      for (const auto& c : conns_) open += c->finished() ? 0 : 1;
      s.connections_open = open;
    }
    s.requests = ctx_.requests.load();
    s.stale_epoch_refusals = ctx_.stale_epoch_refusals.load();
    s.protocol_errors = ctx_.protocol_errors.load();
    s.bytes_read = ctx_.bytes_read.load();
    s.bytes_written = ctx_.bytes_written.load();
    return s;
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_) return Status::Ok();
    closing_.store(true);
    Wake();
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
    }
    std::list<std::unique_ptr<ReplicaServerConnection>> conns;
    {
      std::lock_guard<std::mutex> l(conns_mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) c->RequestStop();
    for (auto& c : conns) c->Join();  // each answers what it has in flight, then releases its replica
    conns.clear();
    connections_open_.store(0);
    if (pool_) pool_->Stop();
    closed_ = true;
    return Status::Ok();
  }

 private:
  Status Listen() {
    const ReplicaServerOptions& o = ctx_.opts;
    const std::string host = o.host.empty() ? "127.0.0.1" : o.host;
    const std::string port = std::to_string(o.port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (g != 0) return Status::Error(Code::kInvalidArgument, "cannot resolve " + host + ": " + gai_strerror(g));
    Status last = Status::Error(Code::kInvalidArgument, "no address for " + host);
    for (addrinfo* a = res; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last = ErrnoStatus(errno, "socket");
        continue;
      }
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, kListenBacklog) != 0) {
        last = ErrnoStatus(errno, "binding " + host + ":" + port);
        close(fd);
        continue;
      }
      sockaddr_storage ss{};
      socklen_t sl = sizeof ss;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) == 0) {
        if (ss.ss_family == AF_INET) port_ = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
        if (ss.ss_family == AF_INET6) port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
      }
      listen_fd_ = fd;
      last = Status::Ok();
      break;
    }
    freeaddrinfo(res);
    return last;
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }

  // Joins and frees connections whose threads have finished.
  void Reap() {
    std::list<std::unique_ptr<ReplicaServerConnection>> done;
    {
      std::lock_guard<std::mutex> l(conns_mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->finished()) {
          done.push_back(std::move(*it));
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
    }
    connections_open_.fetch_sub(done.size());
    done.clear();
  }

  void AcceptLoop() {
    bool backoff = false;
    while (!closing_.load()) {
      pollfd p[2] = {{backoff ? -1 : listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int n = poll(p, 2, backoff ? kAcceptBackoffMs : -1);
      backoff = false;
      if (n < 0 && errno != EINTR) backoff = true;
      if (p[1].revents) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
        Reap();
      }
      if (closing_.load()) break;
      if (!(p[0].revents & POLLIN)) continue;
      for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
          backoff = true;
          break;
        }
        if (connections_open_.load() >= ctx_.opts.max_connections) {
          Reap();
          if (connections_open_.load() >= ctx_.opts.max_connections) {
            close(fd);  // the client sees EOF before its HELLO is answered
            continue;
          }
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (!Admit(fd)) continue;
        connections_total_.fetch_add(1);
        connections_open_.fetch_add(1);
      }
    }
  }

  // Takes ownership of fd.
  bool Admit(int fd) {
    ReplicaServerConnection* raw = nullptr;
    try {
      raw = new ReplicaServerConnection(&ctx_, fd);
    } catch (const std::exception&) {
      close(fd);
      return false;
    }
    std::lock_guard<std::mutex> l(conns_mu_);
    try {
      conns_.emplace_back(raw);
    } catch (const std::exception&) {
      delete raw;
      return false;
    }
    try {
      raw->Start();
    } catch (const std::exception&) {
      conns_.pop_back();
      return false;
    }
    return true;
  }

  ReplicaServerContext ctx_;
  std::unique_ptr<WorkerPool> pool_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> closing_{false};
  mutable std::mutex conns_mu_;
  std::list<std::unique_ptr<ReplicaServerConnection>> conns_;
  std::atomic<uint64_t> connections_total_{0};
  std::atomic<uint64_t> connections_open_{0};
  std::mutex close_mu_;
  bool closed_ = false;
};

Status CheckOptions(const ReplicaServerOptions& o) {
  auto bad = [](const std::string& m) { return Status::Error(Code::kInvalidArgument, m); };
  auto within = [](uint64_t v, uint64_t lo, uint64_t hi) { return v >= lo && v <= hi; };
  if (o.root.empty()) return bad("root must name a directory");
  if (o.port < 0 || o.port > 65535) return bad("port must be within [0, 65535]");
  if (!within(o.max_connections, 1, kMaxConnectionsLimit)) return bad("max_connections must be within [1, 4096]");
  if (!within(o.io_threads, 1, kIoThreadsMax)) return bad("io_threads must be within [1, 256]");
  if (!within(o.max_inflight_per_connection, 1, kMaxInflightLimit))
    return bad("max_inflight_per_connection must be within [1, 4096]");
  if (!within(o.max_inflight_bytes_per_connection, kMaxInflightBytesMin, kMaxInflightBytesLimit))
    return bad("max_inflight_bytes_per_connection must be within [8 MiB, 4 GiB]");
  if (!within(o.handshake_timeout_ms, kTimeoutMinMs, kTimeoutMaxMs) || !within(o.idle_timeout_ms, kTimeoutMinMs, kTimeoutMaxMs))
    return bad("timeouts must be within [100 ms, 1 h]");
  return Status::Ok();
}

}  // namespace

Status ReplicaServer::Start(const ReplicaServerOptions& opts, std::unique_ptr<ReplicaServer>* out) {
  Status s = CheckOptions(opts);
  if (!s.ok()) return s;
  try {
    std::unique_ptr<ReplicaServerImpl> server(new ReplicaServerImpl(opts));
    s = server->Init();
    if (!s.ok()) return s;
    *out = std::move(server);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Error(Code::kIoError, std::string("starting replica server: ") + e.what());
  }
}

}  // namespace mooring
