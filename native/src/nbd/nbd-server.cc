#include "nbd/nbd-server.h"

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

class NbdServerImpl final : public NbdServer {
 public:
  NbdServerImpl(BlockDevice* device, const NbdServerOptions& opts) {
    ctx_.device = device;
    ctx_.opts = opts;
  }

  ~NbdServerImpl() override {
    Close();
    if (listen_fd_ >= 0) close(listen_fd_);  // only if Init failed before the acceptor took it
  }

  Status Init() {
    Status s = acceptor_.Init();
    if (!s.ok()) return s;
    ctx_.server_wake_fd = acceptor_.wake_fd();
    const bool tcp = ctx_.opts.unix_path.empty();
    s = tcp ? ListenTcp(ctx_.opts.tcp_host, ctx_.opts.tcp_port, &listen_fd_, &port_) : ListenUnix();
    if (!s.ok()) return s;
    try {
      pool_.reset(new WorkerPool(ctx_.opts.io_threads));
      ctx_.pool = pool_.get();
      acceptor_.Start(listen_fd_, ctx_.opts.max_connections, tcp,
                      [this](int fd) { return std::make_unique<NbdConnection>(&ctx_, fd); });
      listen_fd_ = -1;  // the acceptor's now
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("starting NBD server threads: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  NbdServerStats stats() const override {
    NbdServerStats s;
    s.connections_total = acceptor_.total();
    s.connections_open = acceptor_.open();
    s.requests = ctx_.requests.load();
    s.bytes_read = ctx_.bytes_read.load();
    s.bytes_written = ctx_.bytes_written.load();
    s.protocol_errors = ctx_.protocol_errors.load();
    return s;
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_) return close_status_;
    std::list<std::unique_ptr<NbdConnection>> conns = acceptor_.Stop();
    RemoveSocketFile();
    for (auto& c : conns) c->RequestStop();
    for (auto& c : conns) c->Join();  // each answers what it has in flight, then closes
    conns.clear();

    close_status_ = Status::Ok();
    if (pool_) {
      int rc;
      try {
        rc = ctx_.device->Flush();
      } catch (...) {
        rc = -EIO;
      }
      // -EPERM: a device that serves nothing now (a migration standby, or an engine that
      // handed over and flushed then) has nothing of ours to flush.
      if (rc < 0 && rc != -EPERM) close_status_ = Status::FromErrno(rc, "flushing the device while closing the NBD server");
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
  std::unique_ptr<WorkerPool> pool_;
  int listen_fd_ = -1;
  int port_ = 0;
  bool own_socket_file_ = false;
  dev_t sock_dev_ = 0;
  ino_t sock_ino_ = 0;
  // Declared after ctx_ and pool_: destroyed first, so no connection outlives them.
  Acceptor<NbdConnection> acceptor_;
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
