// The listening side shared by the NBD server and the replica server: a TCP listening
// socket, and Acceptor<Conn>, which accepts, turns each socket into a connection object,
// keeps the connections and reaps those that finished. An acceptor has no thread of its
// own: its listening socket and wake fd are watched by the process's Poller
// (net/poller.h), whose one thread runs the accepts and reaps of every acceptor.
//
// Conn needs: a constructor the `make` callback calls, Start() (may throw), finished()
// and handshaking() (thread-safe: true until the peer has completed the protocol's
// handshake), Kill(), and a destructor that joins its threads and closes its socket. A
// finished connection writes to wake_fd() so that the acceptor reaps it.
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
#include <stdexcept>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net/poller.h"
#include "util/status.h"

namespace mooring {

// Backlog of every listening socket.
constexpr int kListenBacklog = 128;
// After EMFILE and friends the acceptor waits this long instead of spinning.
constexpr int kAcceptBackoffMs = 100;
// Connections one acceptor accepts in one turn on the poller.
constexpr int kAcceptBatch = 64;
// After connections went away, the acceptor hands freed memory back to the OS this
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
    Poller& poller = Poller::Get();
    Status st;
    wake_id_ = poller.Add(wake_fd_, EPOLLIN, [this](uint32_t ev) { OnWake(ev); }, &st);
    if (wake_id_ == 0) throw std::runtime_error(st.message);
    listen_id_ = poller.Add(listen_fd_, EPOLLIN, [this](uint32_t) { OnListen(); }, &st);
    if (listen_id_ == 0) throw std::runtime_error(st.message);
  }

  // Stops accepting (no handler of this acceptor runs once it returns, the listening socket
  // is closed) and hands over the connections still held, for the server to stop in its own
  // order. Idempotent.
  std::list<std::unique_ptr<Conn>> Stop() {
    closing_.store(true);
    if (listen_id_ != 0) Poller::Get().Remove(listen_id_);
    if (wake_id_ != 0) Poller::Get().Remove(wake_id_);
    listen_id_ = wake_id_ = 0;
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
    if (listen_id_ != 0) Poller::Get().Modify(listen_id_, 0);
  }
  void Resume() {
    {
      std::lock_guard<std::mutex> l(loop_mu_);
      paused_.store(false);
      if (listen_id_ != 0 && backoff_until_ms_ == 0) Poller::Get().Modify(listen_id_, EPOLLIN);
    }
    Wake();  // reaps what finished meanwhile
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
  // Connections not finished yet (counted now: reaping happens lazily, on the poller).
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
      if (trim_due_ms_ == 0) {
        trim_due_ms_ = NowMonotonicMs() + kTrimDelayMs;
        ArmTimerLocked();
      }
    }
  }

  static int64_t NowMonotonicMs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
  }

  // Under loop_mu_: the poller's timer for this acceptor, at the earlier of a due trim and
  // the end of an accept back-off.
  void ArmTimerLocked() {
    int64_t at = trim_due_ms_;
    if (backoff_until_ms_ != 0 && (at == 0 || backoff_until_ms_ < at)) at = backoff_until_ms_;
    if (wake_id_ != 0) Poller::Get().SetTimer(wake_id_, at);
  }

  // The wake fd (a connection finished, Resume) or the timer (events 0), on the poller.
  void OnWake(uint32_t events) {
    std::lock_guard<std::mutex> pause_lock(loop_mu_);
    if (closing_.load()) return;
    if (events != 0) {
      uint64_t v;
      ssize_t r = read(wake_fd_, &v, sizeof v);
      (void)r;
      if (!paused_.load()) Reap();
    }
    const int64_t now = NowMonotonicMs();
    if (trim_due_ms_ != 0 && trim_due_ms_ <= now) {
      trim_due_ms_ = 0;
      ReturnFreeMemory();
    }
    if (backoff_until_ms_ != 0 && backoff_until_ms_ <= now) {
      backoff_until_ms_ = 0;
      if (!paused_.load()) Poller::Get().Modify(listen_id_, EPOLLIN);
    }
    ArmTimerLocked();
  }

  // The listening socket is readable, on the poller.
  void OnListen() {
    std::lock_guard<std::mutex> pause_lock(loop_mu_);
    if (closing_.load() || paused_.load() || backoff_until_ms_ != 0) return;
    // At most kAcceptBatch at a time: the socket stays readable and the poller comes back,
    // after the other acceptors' turn.
    for (int i = 0; i < kAcceptBatch; ++i) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        // EMFILE, ENFILE, ENOBUFS, ENOMEM: let resources come back, without spinning.
        backoff_until_ms_ = NowMonotonicMs() + kAcceptBackoffMs;
        Poller::Get().Modify(listen_id_, 0);
        ArmTimerLocked();
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
  uint64_t listen_id_ = 0;  // Poller registrations (0: none)
  uint64_t wake_id_ = 0;
  std::atomic<bool> closing_{false};
  std::atomic<bool> paused_{false};
  std::mutex loop_mu_;  // held by the handlers while they accept or reap; Pause() waits for it
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;  // guarded by mu_
  uint64_t held_ = 0;                       // conns_.size(), guarded by mu_
  std::unordered_map<Conn*, PeerInfo> peers_;  // guarded by mu_: one per connection in conns_
  uint64_t dropping_ = 0;                   // guarded by mu_: dropped (PeerInfo.dropped), not reaped yet
  int64_t trim_due_ms_ = 0;                 // under loop_mu_: when to ReturnFreeMemory (0: not due)
  int64_t backoff_until_ms_ = 0;            // under loop_mu_: accepting resumes then (0: not backing off)
  std::atomic<int64_t> last_drop_stalled_ms_{0};
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> evicted_{0};
};

}  // namespace mooring
