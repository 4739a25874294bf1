#include "remote/replica-server.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "net/acceptor.h"
#include "remote/replica-server-connection.h"

namespace mooring {

namespace {

// Option bounds (docs/replica-protocol.md).
constexpr uint32_t kMaxConnectionsLimit = 4096;
constexpr uint32_t kIoThreadsMax = 256;
constexpr uint32_t kMaxInflightLimit = 4096;
constexpr uint64_t kMaxInflightBytesMin = 2ull * rp::kMaxIoBytes;
constexpr uint64_t kMaxInflightBytesLimit = 4ull << 30;
constexpr uint64_t kMaxInflightBytesTotalLimit = 64ull << 30;
constexpr uint32_t kTimeoutMinMs = 100;
constexpr uint32_t kTimeoutMaxMs = 3600 * 1000;

class ReplicaServerImpl final : public ReplicaServer {
 public:
  static constexpr int kGoAwayPollMs = 5;

  explicit ReplicaServerImpl(const ReplicaServerOptions& opts) {
    ctx_.opts = opts;
    // Reserve: two largest requests, for connections that take their replies.
    ctx_.budget.reset(new MemoryBudget(opts.max_inflight_bytes_total, 2ull * (rp::kMaxPayloadBytes + rp::kMaxIoBytes)));
    // A reader waiting for budget drops the connections that stopped taking their replies
    // (docs/hardening.md).
    ctx_.reclaim = [this] { acceptor_.DropStalled(kStalledUnderPressureMs); };
  }

  ~ReplicaServerImpl() override {
    Close();
    if (listen_fd_ >= 0) close(listen_fd_);  // only if Init failed before the acceptor took it
  }

  Status Init() {
    char real[PATH_MAX];
    if (::realpath(ctx_.opts.root.c_str(), real) == nullptr) return SocketStatus(errno, "replica server root " + ctx_.opts.root);
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::Error(Code::kInvalidArgument, "replica server root " + ctx_.opts.root + " is not a directory");
    ctx_.root_real = real;
    if (!ctx_.opts.cluster_secret.empty()) {
      if (ctx_.opts.cluster_secret.size() < kClusterSecretMinBytes || ctx_.opts.cluster_secret.size() > kClusterSecretMaxBytes)
        return Status::Error(Code::kInvalidArgument, "the cluster secret must be " + std::to_string(kClusterSecretMinBytes) + " to " +
                                                         std::to_string(kClusterSecretMaxBytes) + " bytes");
      ctx_.auth = ReplicaAuthKey(ctx_.opts.cluster_secret);
    }
    if (ctx_.opts.tls.enabled()) {
      Status s = TlsContext::Create(ctx_.opts.tls, true, &ctx_.tls);
      if (!s.ok()) return s;
    }
    Status s = acceptor_.Init();
    if (!s.ok()) return s;
    ctx_.server_wake_fd = acceptor_.wake_fd();
    s = ListenTcp(ctx_.opts.host, ctx_.opts.port, &listen_fd_, &port_);
    if (!s.ok()) return s;
    try {
      pool_.reset(new WorkerPool(ctx_.opts.io_threads, ctx_.opts.io_threads, "mr-rs-io"));
      lane_.reset(new WorkerPool::Lane(pool_.get(), ctx_.opts.io_threads));
      ctx_.pool = lane_.get();
      acceptor_.Start(listen_fd_, ctx_.opts.max_connections, true,
                      [this](int fd) { return std::make_unique<ReplicaServerConnection>(&ctx_, fd); },
                      ctx_.opts.max_handshaking_per_peer);
      listen_fd_ = -1;  // the acceptor's now
    } catch (const std::exception& e) {
      return Status::Error(Code::kIoError, std::string("starting replica server threads: ") + e.what());
    }
    return Status::Ok();
  }

  int port() const override { return port_; }

  ReplicaServerStats stats() const override {  // NOLINT: locks conns_mu_ (mutable)
    ReplicaServerStats s;
    s.connections_total = acceptor_.total();
    s.connections_open = acceptor_.open();
    s.requests = ctx_.requests.load();
    s.stale_epoch_refusals = ctx_.stale_epoch_refusals.load();
    s.protocol_errors = ctx_.protocol_errors.load();
    s.auth_failures = ctx_.auth_failures.load();
    s.connections_refused = acceptor_.refused();
    s.handshakes_dropped = acceptor_.evicted();
    s.bytes_read = ctx_.bytes_read.load();
    s.bytes_written = ctx_.bytes_written.load();
    s.inline_writes = ctx_.inline_writes.load();
    s.inline_reads = ctx_.inline_reads.load();
    s.buffer_bytes = ctx_.budget->used();
    s.buffer_bytes_peak = ctx_.budget->peak();
    s.buffer_waits = ctx_.budget->waits();
    return s;
  }

  Status GoAway(uint32_t timeout_ms, ReplicaServerGoAway* out) override {
    std::lock_guard<std::mutex> lock(close_mu_);
    *out = ReplicaServerGoAway();
    if (closed_) return Status::Error(Code::kClosed, "replica server is closed", EBADF);
    acceptor_.Pause();  // connections stay listed (no reaping) until Close()
    const int64_t deadline = MonotonicMs() + timeout_ms;
    std::vector<ReplicaServerConnection*> all = acceptor_.Connections();
    std::vector<ReplicaServerConnection*> draining;
    for (ReplicaServerConnection* c : all) {
      if (c->finished()) continue;
      if (c->GoAway()) {
        draining.push_back(c);
      } else {
        c->RequestStop();
        ++out->closed;
      }
    }
    auto all_finished = [](const std::vector<ReplicaServerConnection*>& v) {
      for (ReplicaServerConnection* c : v)
        if (!c->finished()) return false;
      return true;
    };
    while (!all_finished(draining) && MonotonicMs() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(kGoAwayPollMs));
    for (ReplicaServerConnection* c : draining) {
      if (c->finished()) {
        ++out->goaway;
      } else {
        c->RequestStop();
        ++out->timed_out;
      }
    }
    // Stopped connections answer what they have in flight, then release their replicas.
    while (!all_finished(all)) std::this_thread::sleep_for(std::chrono::milliseconds(kGoAwayPollMs));
    return Status::Ok();
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(close_mu_);
    if (closed_) return Status::Ok();
    std::list<std::unique_ptr<ReplicaServerConnection>> conns = acceptor_.Stop();
    for (auto& c : conns) c->RequestStop();
    for (auto& c : conns) c->Join();  // each answers what it has in flight, then releases its replica
    conns.clear();
    lane_.reset();  // nothing of it is queued or running now
    if (pool_) pool_->Stop();
    closed_ = true;
    return Status::Ok();
  }

 private:
  ReplicaServerContext ctx_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<WorkerPool::Lane> lane_;  // the server's one lane in pool_ (cap: io_threads)
  int listen_fd_ = -1;
  int port_ = 0;
  // Declared after ctx_ and pool_: destroyed first, so no connection outlives them.
  Acceptor<ReplicaServerConnection> acceptor_;
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
  if (!within(o.max_inflight_bytes_total, kMaxInflightBytesMin, kMaxInflightBytesTotalLimit))
    return bad("max_inflight_bytes_total must be within [8 MiB, 64 GiB]");
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
