// The listening side shared by the NBD server and the replica server: a TCP listening
// socket, and Acceptor<Conn>, which accepts on its own thread, turns each socket into a
// connection object, keeps the connections and reaps those that finished.
//
// Conn needs: a constructor the `make` callback calls, Start() (may throw), finished()
// (thread-safe), and a destructor that joins its threads and closes its socket. A finished
// connection writes to wake_fd() so that the accept thread reaps it.
//
// Pause() stops accepting without closing the listening socket (new clients wait in its
// backlog) and stops reaping, so that Connections() stays valid until Resume(): the NBD
// hand-off freezes each connection meanwhile (docs/nbd-frontend.md).
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "util/status.h"

namespace mooring {

// Backlog of every listening socket.
constexpr int kListenBacklog = 128;
// After EMFILE and friends the accept thread waits this long instead of spinning.
constexpr int kAcceptBackoffMs = 100;
// After connections went away, the accept thread hands freed memory back to the OS this
// long after the first of them (once for a burst of departures).
constexpr int kTrimDelayMs = 200;
// Buffers this large get their own mappings (see LimitAllocatorRetention).
constexpr int kLargeBufferBytes = 1 << 20;
// DropStalled looks at the connections at most this often.
constexpr int64_t kDropStalledEveryMs = 100;

// Hands the allocator's free memory back to the OS (malloc_trim): glibc keeps what
// connection threads freed in their arenas, so the RSS a burst of peers drove up would stay
// after they left. Cheap next to a connection's life; called off the data path only.
void ReturnFreeMemory();

// Once per process, when the first server starts: buffers of 1 MiB and more are given their
// own mappings (mallopt M_MMAP_THRESHOLD), so freeing one gives it back to the OS. glibc
// otherwise raises that threshold as large blocks are freed, serves the next ones from
// per-thread arenas, and malloc_trim never shrinks the top of an arena that is not the main
// one: peers that made the server hold its whole budget left ~4 MiB resident in every
// arena after they left (docs/hardening.md).
void LimitAllocatorRetention();

// A Status for a failed socket call: kAddressInUse for EADDRINUSE, the errno's code otherwise.
Status SocketStatus(int err, const std::string& what);

// Binds and listens on host:port (host "" = 127.0.0.1; port 0 = any free port).
// *bound_port is the port actually bound.
Status ListenTcp(const std::string& host, int port, int* fd, int* bound_port);

template <typename Conn>
class Acceptor {
 public:
  // Builds a connection that owns fd (the acceptor closes fd if this throws).
  using Make = std::function<std::unique_ptr<Conn>(int fd)>;

  Acceptor() = default;
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;
  ~Acceptor() {
    Stop();
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  // The eventfd a connection writes to when it has finished. Valid after Init().
  int wake_fd() const { return wake_fd_; }

  Status Init() {
    LimitAllocatorRetention();
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return wake_fd_ < 0 ? SocketStatus(errno, "eventfd") : Status::Ok();
  }

  // Starts accepting on listen_fd (which the acceptor closes when it stops). Over
  // max_connections open, a new socket is closed at once (its client sees EOF).
  void Start(int listen_fd, uint32_t max_connections, bool tcp_nodelay, Make make) {
    listen_fd_ = listen_fd;
    max_connections_ = max_connections;
    tcp_nodelay_ = tcp_nodelay;
    make_ = std::move(make);
    thread_ = std::thread([this] { Loop(); });
  }

  // Stops accepting (joins the accept thread, closes the listening socket) and hands over
  // the connections still held, for the server to stop in its own order. Idempotent.
  std::list<std::unique_ptr<Conn>> Stop() {
    closing_.store(true);
    Wake();
    if (thread_.joinable()) thread_.join();
    if (listen_fd_ >= 0) {
      close(listen_fd_);
      listen_fd_ = -1;
    }
    std::list<std::unique_ptr<Conn>> conns;
    std::lock_guard<std::mutex> l(mu_);
    conns.swap(conns_);
    return conns;
  }

  // After Pause() returns, nothing is accepted or reaped until Resume().
  void Pause() {
    std::lock_guard<std::mutex> l(loop_mu_);
    paused_.store(true);
    Wake();  // the loop polls again, without the listening socket
  }
  void Resume() {
    {
      std::lock_guard<std::mutex> l(loop_mu_);
      paused_.store(false);
    }
    Wake();  // and reaps what finished meanwhile
  }
  // The connections held now. Stable while paused (only reaping and Stop free them).
  std::vector<Conn*> Connections() const {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Conn*> out;
    for (const auto& c : conns_) out.push_back(c.get());
    return out;
  }
  // Takes a connection built elsewhere (a hand-off) and starts it; false if it could not
  // start (it is freed, closing its socket).
  bool Adopt(std::unique_ptr<Conn> c) { return Admit(std::move(c)); }
  void SetTotal(uint64_t n) { total_.store(n); }
  // f(conn) for every connection not finished, under the lock (keep f short).
  template <typename F>
  void ForEachOpen(F f) const {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& c : conns_) {
      if (!c->finished()) f(*c);
    }
  }
  // Drops the connections whose replies have made no progress for stall_ms
  // (Conn::RepliesStalledMs, Conn::Kill): what a reader refused by its server's memory
  // budget waits for is held by them. Any thread; at most once per kDropStalledEveryMs.
  void DropStalled(int64_t stall_ms) {
    const int64_t now = NowMonotonicMs();
    int64_t last = last_drop_stalled_ms_.load();
    if (now - last < kDropStalledEveryMs || !last_drop_stalled_ms_.compare_exchange_strong(last, now)) return;
    ForEachOpen([now, stall_ms](Conn& c) {
      if (c.RepliesStalledMs(now) >= stall_ms) c.Kill();
    });
  }

  int listen_fd() const { return listen_fd_; }

  uint64_t total() const { return total_.load(); }
  // Connections not finished yet (counted now: reaping happens lazily on the accept thread).
  uint64_t open() const {
    std::lock_guard<std::mutex> l(mu_);
    uint64_t n = 0;
    for (const auto& c : conns_) n += c->finished() ? 0 : 1;
    return n;
  }

 private:
  void Wake() {
    if (wake_fd_ < 0) return;
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }

  // Joins and frees connections that have finished (outside the lock: joining may wait).
  void Reap() {
    std::list<std::unique_ptr<Conn>> done;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->finished()) {
          done.push_back(std::move(*it));
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      held_ -= done.size();
    }
    if (!done.empty()) {
      done.clear();  // joins their threads and frees their buffers first
      if (trim_due_ms_ == 0) trim_due_ms_ = NowMonotonicMs() + kTrimDelayMs;
    }
  }

  static int64_t NowMonotonicMs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
  }

  // The poll timeout the loop may sleep for: until a due trim (or -1: none due).
  int TrimTimeoutMs() {
    if (trim_due_ms_ == 0) return -1;
    const int64_t left = trim_due_ms_ - NowMonotonicMs();
    if (left > 0) return static_cast<int>(left);
    trim_due_ms_ = 0;
    ReturnFreeMemory();
    return -1;
  }

  void Loop() {
    bool backoff = false;
    while (!closing_.load()) {
      const bool paused = paused_.load();
      pollfd p[2] = {{backoff || paused ? -1 : listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      const int trim_ms = TrimTimeoutMs();
      int n = poll(p, 2, backoff ? kAcceptBackoffMs : trim_ms);
      backoff = false;
      if (n < 0 && errno != EINTR) backoff = true;
      std::lock_guard<std::mutex> pause_lock(loop_mu_);
      if (p[1].revents) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
        if (!paused_.load()) Reap();
      }
      if (closing_.load()) break;
      if (paused_.load() || !(p[0].revents & POLLIN)) continue;
      for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
          backoff = true;  // EMFILE, ENFILE, ENOBUFS, ENOMEM: let resources come back
          break;
        }
        if (Held() >= max_connections_) {
          Reap();
          if (Held() >= max_connections_) {
            close(fd);
            continue;
          }
        }
        if (tcp_nodelay_) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (Admit(fd)) total_.fetch_add(1);
      }
    }
  }

  uint64_t Held() {
    std::lock_guard<std::mutex> l(mu_);
    return held_;
  }

  // Takes ownership of fd: on failure it is closed (by the connection once one exists).
  bool Admit(int fd) {
    std::unique_ptr<Conn> c;
    try {
      c = make_(fd);
    } catch (const std::exception&) {
      close(fd);
      return false;
    }
    return Admit(std::move(c));
  }

  bool Admit(std::unique_ptr<Conn> c) {
    if (!c) return false;
    Conn* raw = c.get();
    std::lock_guard<std::mutex> l(mu_);
    try {
      conns_.push_back(std::move(c));
    } catch (const std::exception&) {
      return false;  // c (moved-from or not) is freed: the connection closes its socket
    }
    try {
      raw->Start();
    } catch (const std::exception&) {
      conns_.pop_back();  // never started: its destructor only closes the socket
      return false;
    }
    ++held_;
    return true;
  }

  int listen_fd_ = -1;
  int wake_fd_ = -1;
  uint32_t max_connections_ = 0;
  bool tcp_nodelay_ = false;
  Make make_;
  std::thread thread_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> paused_{false};
  std::mutex loop_mu_;  // held by the loop while it accepts or reaps; Pause() waits for it
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  uint64_t held_ = 0;                       // conns_.size(), guarded by mu_
  int64_t trim_due_ms_ = 0;                 // accept thread only: when to ReturnFreeMemory (0: not due)
  std::atomic<int64_t> last_drop_stalled_ms_{0};
  std::atomic<uint64_t> total_{0};
};

}  // namespace mooring
