// The listening side shared by the NBD server and the replica server: a TCP listening
// socket, and Acceptor<Conn>, which accepts on its own thread, turns each socket into a
// connection object, keeps the connections and reaps those that finished.
//
// Conn needs: a constructor the `make` callback calls, Start() (may throw), finished()
// and handshaking() (thread-safe: true until the peer has completed the protocol's
// handshake), Kill(), and a destructor that joins its threads and closes its socket. A
// finished connection writes to wake_fd() so that the accept thread reaps it.
//
// Per peer (docs/hardening.md, "Connections"): a peer is the client's IP address (TCP) or
// user id (a unix socket, SO_PEERCRED). Its share of connections in their handshake is
// `handshaking_per_peer`. While the server has room every connection is admitted; when it is
// full, a new one is admitted in place of a connection still in its handshake: the oldest
// of the peer furthest over its share, else the oldest that has been in its handshake for
// kEvictHandshakingAfterMs (of the peer holding the most); with neither, the new one is
// closed. Connections past their handshake are never dropped for another and have no
// per-peer cap (an engine host opens one replica connection per volume).
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
#include <unordered_map>
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
// A connection this long in its handshake may be dropped for a new one on a full server
// even if its peer is within its share. A client that is served finishes its handshake in a
// few round trips.
constexpr int64_t kEvictHandshakingAfterMs = 1000;

// Who a connected socket's peer is, for the per-peer limits: "ip:ADDRESS" for TCP (an IPv4
// address mapped into IPv6 as the IPv4 address), "uid:N" for a unix socket; "" if unknown
// (not limited).
std::string PeerKey(int fd);

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
  // max_connections open, a new socket is closed at once (its client sees EOF), unless a
  // connection in its handshake can go for it, as described above (handshaking_per_peer 0:
  // no shares, only connections that have waited kEvictHandshakingAfterMs can go).
  void Start(int listen_fd, uint32_t max_connections, bool tcp_nodelay, Make make, uint32_t handshaking_per_peer = 0) {
    listen_fd_ = listen_fd;
    max_connections_ = max_connections;
    handshaking_per_peer_ = handshaking_per_peer;
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
    peers_.clear();
    dropping_ = 0;
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
  // Connections closed at accept (server full, nothing to drop), and connections dropped in
  // their handshake for a new one.
  uint64_t refused() const { return refused_.load(); }
  uint64_t evicted() const { return evicted_.load(); }
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
          auto pi = peers_.find(it->get());
          if (pi != peers_.end()) {
            if (pi->second.dropped) --dropping_;
            peers_.erase(pi);
          }
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
        const std::string peer = handshaking_per_peer_ > 0 ? PeerKey(fd) : std::string();
        if (Held() >= max_connections_) {
          Reap();
          if (Held() >= max_connections_ && !MakeRoom()) {
            close(fd);
            refused_.fetch_add(1);
            continue;
          }
        }
        if (tcp_nodelay_) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (Admit(fd, peer)) total_.fetch_add(1);
      }
    }
  }

  // Connections held, less those dropped for new ones and not reaped yet (their threads
  // are ending: they only wait to be joined).
  uint64_t Held() {
    std::lock_guard<std::mutex> l(mu_);
    return held_ - dropping_;
  }

  // What the acceptor knows of a connection it accepted.
  struct PeerInfo {
    std::string key;        // PeerKey, "" when not limited
    int64_t since_ms = 0;   // accepted at (monotonic)
    bool dropped = false;   // Kill()ed for a new connection (counted in dropping_)
  };

  // On a full server: drops a connection still in its handshake to make room for a new one
  // (the oldest of the peer furthest over its share, else the oldest that has waited
  // kEvictHandshakingAfterMs, of the peer with the most such). False if there is none.
  bool MakeRoom() {
    const int64_t now = NowMonotonicMs();
    std::lock_guard<std::mutex> l(mu_);
    struct PerPeer {
      uint32_t n = 0;
      Conn* oldest = nullptr;       // list order: oldest first
      Conn* oldest_aged = nullptr;  // the oldest that has waited kEvictHandshakingAfterMs
    };
    std::unordered_map<std::string, PerPeer> peers;
    for (const auto& c : conns_) {
      auto it = peers_.find(c.get());
      if (it == peers_.end() || it->second.dropped || c->finished() || !c->handshaking()) continue;
      PerPeer& p = peers[it->second.key];
      ++p.n;
      if (!p.oldest) p.oldest = c.get();
      if (!p.oldest_aged && now - it->second.since_ms >= kEvictHandshakingAfterMs) p.oldest_aged = c.get();
    }
    Conn* victim = nullptr;
    uint32_t most = 0;
    for (const auto& [key, p] : peers) {
      if (handshaking_per_peer_ > 0 && !key.empty() && p.n > handshaking_per_peer_ && p.n > most) {
        most = p.n;
        victim = p.oldest;
      }
    }
    if (!victim) {
      for (const auto& [key, p] : peers) {
        if (p.oldest_aged && p.n > most) {
          most = p.n;
          victim = p.oldest_aged;
        }
      }
    }
    if (!victim) return false;
    peers_[victim].dropped = true;
    ++dropping_;
    evicted_.fetch_add(1);
    victim->Kill();
    return true;
  }

  // Takes ownership of fd: on failure it is closed (by the connection once one exists).
  bool Admit(int fd, const std::string& peer) {
    std::unique_ptr<Conn> c;
    try {
      c = make_(fd);
    } catch (const std::exception&) {
      close(fd);
      return false;
    }
    return Admit(std::move(c), peer);
  }

  bool Admit(std::unique_ptr<Conn> c, const std::string& peer = std::string()) {
    if (!c) return false;
    Conn* raw = c.get();
    std::lock_guard<std::mutex> l(mu_);
    try {
      conns_.push_back(std::move(c));
      peers_[raw] = PeerInfo{peer, NowMonotonicMs(), false};
    } catch (const std::exception&) {
      if (!conns_.empty() && conns_.back().get() == raw) conns_.pop_back();
      return false;  // c (moved-from or not) is freed: the connection closes its socket
    }
    try {
      raw->Start();
    } catch (const std::exception&) {
      peers_.erase(raw);
      conns_.pop_back();  // never started: its destructor only closes the socket
      return false;
    }
    ++held_;
    return true;
  }

  int listen_fd_ = -1;
  int wake_fd_ = -1;
  uint32_t max_connections_ = 0;
  uint32_t handshaking_per_peer_ = 0;
  bool tcp_nodelay_ = false;
  Make make_;
  std::thread thread_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> paused_{false};
  std::mutex loop_mu_;  // held by the loop while it accepts or reaps; Pause() waits for it
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  uint64_t held_ = 0;                       // conns_.size(), guarded by mu_
  std::unordered_map<Conn*, PeerInfo> peers_;  // guarded by mu_: one per connection in conns_
  uint64_t dropping_ = 0;                   // guarded by mu_: dropped (PeerInfo.dropped), not reaped yet
  int64_t trim_due_ms_ = 0;                 // accept thread only: when to ReturnFreeMemory (0: not due)
  std::atomic<int64_t> last_drop_stalled_ms_{0};
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> evicted_{0};
};

}  // namespace mooring
