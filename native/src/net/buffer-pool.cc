#include "net/buffer-pool.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "net/poller.h"

namespace mooring {

BufferPool& BufferPool::Get() {
  static BufferPool* pool = new BufferPool();  // never destroyed: used until exit
  return *pool;
}

ByteBuffer BufferPool::Take(size_t n) {
  ByteBuffer b;
  if (n >= kMinBytes && n <= kMaxBytes) {
    std::lock_guard<std::mutex> lk(mu_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const size_t cap = free_[i].buf.capacity();
      if (cap >= n && (best == free_.size() || cap < free_[best].buf.capacity())) best = i;
    }
    if (best != free_.size()) {
      b = std::move(free_[best].buf);
      free_[best] = std::move(free_.back());
      free_.pop_back();
      bytes_ -= b.capacity();
      hits_++;
    }
  }
  b.resize(n);
  return b;
}

void BufferPool::Give(ByteBuffer&& b) {
  ByteBuffer gone = std::move(b);  // freed at return unless kept
  const size_t cap = gone.capacity();
  if (cap < kMinBytes || cap > kMaxBytes) return;
  gone.clear();
  const int64_t now = Poller::NowMs();
  std::lock_guard<std::mutex> lk(mu_);
  if (bytes_ + cap > kCapBytes) return;
  bytes_ += cap;
  free_.push_back(Spare{std::move(gone), now});
  ArmLocked(now + kIdleMs);
}

void BufferPool::ArmLocked(int64_t at_ms) {
  if (armed_) return;
  if (timer_id_ == 0) {
    // A registration for its timer only: an eventfd nobody signals, watched for nothing.
    if (timer_fd_ < 0) timer_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (timer_fd_ < 0) return;  // spares then wait for the next Take or Give to be reused
    Status st;
    timer_id_ = Poller::Get().Add(timer_fd_, 0, [this](uint32_t) { OnTimer(); }, &st);
    if (timer_id_ == 0) return;
  }
  armed_ = true;
  Poller::Get().ArmTimer(timer_id_, at_ms);
}

void BufferPool::OnTimer() {
  std::vector<ByteBuffer> drop;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lk(mu_);
    armed_ = false;
    const int64_t now = Poller::NowMs();
    int64_t oldest = 0;
    for (size_t i = 0; i < free_.size();) {
      if (now - free_[i].given_ms >= kIdleMs) {
        bytes_ -= free_[i].buf.capacity();
        drop.push_back(std::move(free_[i].buf));
        free_[i] = std::move(free_.back());
        free_.pop_back();
      } else {
        if (oldest == 0 || free_[i].given_ms < oldest) oldest = free_[i].given_ms;
        ++i;
      }
    }
    if (!free_.empty()) ArmLocked(oldest + kIdleMs);
  }
}

size_t BufferPool::spare_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  return bytes_;
}

uint64_t BufferPool::hits() {
  std::lock_guard<std::mutex> lk(mu_);
  return hits_;
}

}  // namespace mooring
