#include "net/poller.h"

#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "util/thread-name.h"

namespace mooring {

namespace {
constexpr int kMaxEvents = 64;
constexpr uint64_t kWakeId = 0;  // the poller's own eventfd (ids handed out start at 1)
}  // namespace

int64_t Poller::NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

Poller& Poller::Get() {
  static Poller* p = new Poller("mr-poller");  // never destroyed: its thread runs until the process ends
  return *p;
}

int Poller::ConnectionLoops() {
  static const int n = [] {
    const char* v = getenv("MOORING_CONNECTION_LOOPS");
    char* end = nullptr;
    const long k = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end != '\0' || k < 1 || k > kMaxConnectionLoops) return kDefaultConnectionLoops;
    return static_cast<int>(k);
  }();
  return n;
}

Poller& Poller::ForConnection() {
  static Poller* loops[kMaxConnectionLoops] = {};
  static std::mutex mu;
  static unsigned next = 0;
  std::lock_guard<std::mutex> l(mu);
  const unsigned i = next++ % static_cast<unsigned>(ConnectionLoops());
  if (!loops[i]) loops[i] = new Poller("mr-conn-loop");  // never destroyed, like Get()'s
  return *loops[i];
}

Poller::Poller(const char* name) : name_(name) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) throw std::runtime_error(std::string("starting the poller: ") + strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  std::thread t([this] {
    NameThisThread(name_);
    Loop();
  });
  thread_id_ = t.get_id();
  t.detach();
}

uint64_t Poller::Add(int fd, uint32_t events, Handler h, Status* st) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t id = next_id_++;
  if (events != 0) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      *st = Status::FromErrno(errno, std::string("epoll_ctl: ") + strerror(errno));
      return 0;
    }
  }
  Reg& r = regs_[id];
  r.fd = fd;
  r.in_epoll = events != 0;
  r.handler = std::move(h);
  return id;
}

void Poller::Modify(uint64_t id, uint32_t events) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = regs_.find(id);
  if (it == regs_.end()) return;
  Reg& r = it->second;
  // None: out of the epoll set, where EPOLLHUP and EPOLLERR would still be reported (level-
  // triggered, so a hung-up socket nobody reads would spin the loop).
  if (events == 0) {
    if (r.in_epoll) epoll_ctl(epfd_, EPOLL_CTL_DEL, r.fd, nullptr);
    r.in_epoll = false;
    return;
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  epoll_ctl(epfd_, r.in_epoll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, r.fd, &ev);
  r.in_epoll = true;
}

void Poller::SetTimerLocked(uint64_t id, int64_t at_ms, bool earlier_only) {
  auto it = regs_.find(id);
  if (it == regs_.end()) return;
  Reg& r = it->second;
  if (earlier_only && r.timer_ms != 0 && r.timer_ms <= at_ms) return;
  if (r.timer_ms != 0) timers_.erase({r.timer_ms, id});
  r.timer_ms = at_ms;
  if (at_ms != 0) timers_.insert({at_ms, id});
}

void Poller::SetTimer(uint64_t id, int64_t at_ms) { ArmOrSet(id, at_ms, false); }

void Poller::ArmTimer(uint64_t id, int64_t at_ms) {
  if (at_ms == 0) return;
  ArmOrSet(id, at_ms, true);
}

void Poller::ArmOrSet(uint64_t id, int64_t at_ms, bool earlier_only) {
  {
    std::lock_guard<std::mutex> l(mu_);
    SetTimerLocked(id, at_ms, earlier_only);
  }
  if (std::this_thread::get_id() != thread_id_) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof one);
    (void)n;
  }
}

void Poller::Remove(uint64_t id) {
  std::unique_lock<std::mutex> l(mu_);
  auto it = regs_.find(id);
  if (it == regs_.end()) return;
  if (it->second.in_epoll) epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  if (it->second.timer_ms != 0) timers_.erase({it->second.timer_ms, id});
  regs_.erase(it);
  if (std::this_thread::get_id() == thread_id_) return;  // from its own handler
  idle_cv_.wait(l, [&] { return running_ != id; });
}

void Poller::Loop() {
  epoll_event evs[kMaxEvents];
  std::vector<uint64_t> due;
  for (;;) {
    int timeout = -1;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!timers_.empty()) {
        const int64_t at = timers_.begin()->first, now = NowMs();
        timeout = at > now ? static_cast<int>(std::min<int64_t>(at - now, 1 << 30)) : 0;
      }
    }
    const int n = epoll_wait(epfd_, evs, kMaxEvents, timeout);
    // Calls one handler unless its registration went meanwhile (the lookup and running_
    // under mu_, the call outside it).
    auto call = [this](uint64_t id, uint32_t events) {
      Handler h;
      {
        std::lock_guard<std::mutex> l(mu_);
        auto it = regs_.find(id);
        if (it == regs_.end()) return;
        if (events == 0) {
          if (it->second.timer_ms == 0 || it->second.timer_ms > NowMs()) return;
          SetTimerLocked(id, 0, false);
        }
        h = it->second.handler;  // a copy: Remove from within may destroy the original
        running_ = id;
      }
      h(events);
      {
        std::lock_guard<std::mutex> l(mu_);
        running_ = 0;
      }
      idle_cv_.notify_all();
    };
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u64 == kWakeId) {
        uint64_t v;
        ssize_t r = read(wake_fd_, &v, sizeof v);
        (void)r;
        continue;
      }
      call(evs[i].data.u64, evs[i].events ? evs[i].events : EPOLLIN);
    }
    due.clear();
    {
      std::lock_guard<std::mutex> l(mu_);
      const int64_t now = NowMs();
      for (auto t = timers_.begin(); t != timers_.end() && t->first <= now; ++t) due.push_back(t->second);
    }
    for (uint64_t id : due) call(id, 0);
  }
}

}  // namespace mooring
