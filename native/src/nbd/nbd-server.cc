#include "nbd/nbd-server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

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

namespace mooring {

namespace {

// Option bounds (see docs/nbd-frontend.md).
constexpr uint32_t kMaxRequestBytesMin = NbdConnection::kPreferredBlockBytes;
constexpr uint32_t kMaxRequestBytesLimit = 256u << 20;
constexpr uint32_t kIoThreadsMax = 256;
constexpr uint32_t kMaxConnectionsLimit = 4096;
constexpr uint32_t kMaxInflightLimit = 4096;
constexpr size_t kNameLimit = NbdConnection::kNameMax;
constexpr int kListenBacklog = 128;
constexpr int kAcceptBackoffMs = 100;  // after EMFILE and friends, instead of spinning

Status ErrnoStatus(int err, const std::string& what) {
  if (err == EADDRINUSE) return Status::Error(Code::kAddressInUse, what + ": address in use", err);
  return Status::FromErrno(err, what + ": " + strerror(err));
}

class NbdServerImpl final : public NbdServer {
 public:
  NbdServerImpl(BlockDevice* device, const NbdServerOptions& opts) {
    ctx_.device = device;
    ctx_.opts = opts;
  }

  ~NbdServerImpl() override {
    Close();
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  Status Init() {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return ErrnoStatus(errno, "eventfd");
    ctx_.server_wake_fd = wake_fd_;
    Status s = ctx_.opts.unix_path.empty() ? ListenTcp() : ListenUnix();
    if (!s.ok()) return s;
    try {
      pool_.reset(new WorkerPool(ctx_.opts.io_threads));
      ctx_.pool = pool_.get();
      accept_thread_ = std::thread([this] { AcceptLoop(); });
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("starting NBD server threads: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  NbdServerStats stats() const override {
    NbdServerStats s;
    s.connections_total = connections_total_.load();
    s.connections_open = connections_open_.load();
    s.requests = ctx_.requests.load();
    s.bytes_read = ctx_.bytes_read.load();
    s.bytes_written = ctx_.bytes_written.load();
    s.protocol_errors = ctx_.protocol_errors.load();
    return s;
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_) return close_status_;
    closing_.store(true);
    Wake();
    if (accept_thread_.joinable()) accept_thread_.join();
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
    }
    RemoveSocketFile();

    std::list<std::unique_ptr<NbdConnection>> conns;
    {
      std::lock_guard<std::mutex> l(conns_mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) c->RequestStop();
    for (auto& c : conns) c->Join();  // each answers what it has in flight, then closes
    conns.clear();
    connections_open_.store(0);

    close_status_ = Status::Ok();
    if (pool_) {
      int rc;
      try {
        rc = ctx_.device->Flush();
      } catch (...) {
        rc = -EIO;
      }
      if (rc < 0) close_status_ = Status::FromErrno(rc, "flushing the device while closing the NBD server");
      pool_->Stop();
    }
    closed_ = true;
    return close_status_;
  }

 private:
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
      if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, "removing stale socket " + path);
    }

    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return ErrnoStatus(errno, "socket");
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return ErrnoStatus(errno, "binding " + path);
    }
    if (lstat(path.c_str(), &st) == 0) {
      sock_dev_ = st.st_dev;
      sock_ino_ = st.st_ino;
      own_socket_file_ = true;
    }
    if (listen(listen_fd_, kListenBacklog) != 0) return ErrnoStatus(errno, "listening on " + path);
    return Status::Ok();
  }

  Status ListenTcp() {
    const NbdServerOptions& o = ctx_.opts;
    if (o.tcp_port < 0 || o.tcp_port > 65535) {
      return Status::Error(Code::kInvalidArgument, "tcp_port out of range: " + std::to_string(o.tcp_port));
    }
    std::string host = o.tcp_host.empty() ? "127.0.0.1" : o.tcp_host;
    std::string port = std::to_string(o.tcp_port);
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
      tcp_ = true;
      last = Status::Ok();
      break;
    }
    freeaddrinfo(res);
    return last;
  }

  void RemoveSocketFile() {
    if (!own_socket_file_) return;
    own_socket_file_ = false;
    struct stat st;
    const std::string& path = ctx_.opts.unix_path;
    // Someone may have replaced it since (another server on the same path): leave theirs.
    if (lstat(path.c_str(), &st) == 0 && st.st_dev == sock_dev_ && st.st_ino == sock_ino_) unlink(path.c_str());
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }

  // Joins and frees connections whose thread has finished.
  void Reap() {
    std::list<std::unique_ptr<NbdConnection>> done;
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
    done.clear();  // joins each thread, closes each socket
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
          backoff = true;  // EMFILE, ENFILE, ENOBUFS, ENOMEM: let resources come back
          break;
        }
        if (connections_open_.load() >= ctx_.opts.max_connections) {
          Reap();
          if (connections_open_.load() >= ctx_.opts.max_connections) {
            close(fd);  // the client sees EOF before the greeting
            continue;
          }
        }
        if (tcp_) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (!Admit(fd)) continue;
        connections_total_.fetch_add(1);
        connections_open_.fetch_add(1);
      }
    }
  }

  // Takes ownership of fd: on failure it is closed.
  bool Admit(int fd) {
    NbdConnection* raw = nullptr;
    try {
      raw = new NbdConnection(&ctx_, fd);
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
      conns_.pop_back();  // never started: the destructor only closes the socket
      return false;
    }
    return true;
  }

  NbdServerContext ctx_;
  std::unique_ptr<WorkerPool> pool_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  bool tcp_ = false;
  bool own_socket_file_ = false;
  dev_t sock_dev_ = 0;
  ino_t sock_ino_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> closing_{false};
  std::mutex conns_mu_;
  std::list<std::unique_ptr<NbdConnection>> conns_;
  std::atomic<uint64_t> connections_total_{0};
  std::atomic<uint64_t> connections_open_{0};
  std::mutex close_mu_;
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
