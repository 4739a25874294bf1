#include "net/poller.h"

#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
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
  static Poller* p = new Poller();  // never destroyed: its thread runs until the process ends
  return *p;
}

Poller::Poller() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) throw std::runtime_error(std::string("starting the poller: ") + strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  std::thread t([this] {
    NameThisThread("mr-poller");
    Loop();
  });
  thread_id_ = t.get_id();
  t.detach();
}

uint64_t Poller::Add(int fd, uint32_t events, Handler h, Status* st) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t id = next_id_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    *st = Status::FromErrno(errno, std::string("epoll_ctl: ") + strerror(errno));
    return 0;
  }
  Reg& r = regs_[id];
  r.fd = fd;
  r.handler = std::move(h);
  return id;
}

void Poller::Modify(uint64_t id, uint32_t events) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = regs_.find(id);
  if (it == regs_.end()) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, it->second.fd, &ev);
}

void Poller::SetTimer(uint64_t id, int64_t at_ms) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regs_.find(id);
    if (it == regs_.end()) return;
    it->second.timer_ms = at_ms;
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
  epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
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
      const int64_t now = NowMs();
      for (const auto& [id, r] : regs_) {
        if (r.timer_ms == 0) continue;
        const int64_t left = r.timer_ms > now ? r.timer_ms - now : 0;
        if (timeout < 0 || left < timeout) timeout = static_cast<int>(left);
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
          it->second.timer_ms = 0;
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
      for (const auto& [id, r] : regs_)
        if (r.timer_ms != 0 && r.timer_ms <= now) due.push_back(id);
    }
    for (uint64_t id : due) call(id, 0);
  }
}

}  // namespace mooring
