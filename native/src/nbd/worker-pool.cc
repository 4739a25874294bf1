#include "nbd/worker-pool.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "util/thread-name.h"

namespace mooring {

WorkerPool::Lane::Lane(WorkerPool* pool, uint32_t cap) : pool_(pool), cap_(std::max<uint32_t>(cap, 1)) {
  pool_->Reserve(cap_);
}

WorkerPool::Lane::~Lane() {
  std::unique_lock<std::mutex> lock(pool_->mu_);
  pool_->lane_cv_.wait(lock, [this] { return running_ == 0 && !head_ && !ready_; });
}

void WorkerPool::Lane::Submit(Batch* batch) {
  if (batch->count == 0) return;
  Job* head = batch->head;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(pool_->mu_);
    if (!pool_->stopping_) {
      if (tail_) tail_->next = head; else head_ = head;
      tail_ = batch->tail;
      head = nullptr;
      if (!ready_ && running_ < cap_) pool_->ReadyLocked(this);
      // One worker more, woken or started; it wakes the next if work is still waiting
      // when it takes its job (Loop), so short jobs are run by the workers already awake.
      if (running_ < cap_) wake = pool_->WakeOneLocked();
    }
  }
  if (wake) pool_->cv_.notify_one();  // outside the lock: the woken worker takes it at once
  *batch = Batch{};
  while (head) {  // pool stopped: run inline rather than lose the job
    Job* next = head->next;
    head->run(head);
    head = next;
  }
}

WorkerPool::WorkerPool(uint32_t min_threads, uint32_t max_threads, const char* name)
    : name_(name), min_(std::max<uint32_t>(min_threads, 1)), max_(std::max(max_threads, std::max<uint32_t>(min_threads, 1))) {
  std::lock_guard<std::mutex> lock(mu_);
  while (live_ < min_) {
    if (!GrowLocked()) throw std::runtime_error("cannot start worker threads");
  }
}

WorkerPool::~WorkerPool() { Stop(); }

WorkerPool& WorkerPool::Nbd() {
  // Never destroyed: exports may be closed from static destructors' time on.
  static WorkerPool* pool = new WorkerPool(kNbdThreadsMin, kNbdThreadsMax, "mr-nbd-io");
  return *pool;
}

void WorkerPool::Reserve(uint32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  max_ = std::max(max_, n);
}

uint32_t WorkerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

void WorkerPool::ReadyLocked(Lane* l) {
  l->ready_ = true;
  l->next_ready_ = nullptr;
  if (ready_tail_) ready_tail_->next_ready_ = l; else ready_head_ = l;
  ready_tail_ = l;
}

bool WorkerPool::WakeOneLocked() {
  if (idle_ > waking_) {
    ++waking_;
    return true;
  }
  GrowLocked();
  return false;
}

bool WorkerPool::GrowLocked() {
  if (live_ >= max_ || stopping_) return false;
  try {
    std::thread([this] {
      NameThisThread(name_);
      Loop();
    }).detach();
  } catch (const std::system_error&) {
    return false;  // the threads there are take the work in turn
  }
  ++live_;
  return true;
}

void WorkerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!ready_head_ && !stopping_) {
      ++idle_;
      const bool timed_out = cv_.wait_for(lock, std::chrono::milliseconds(kIdleExitMs)) == std::cv_status::timeout;
      --idle_;
      if (waking_ > 0) --waking_;
      if (timed_out && !ready_head_ && live_ > min_ && !stopping_) {
        --live_;
        return;
      }
    }
    if (!ready_head_) {  // stopping and drained
      --live_;
      done_cv_.notify_all();
      return;
    }
    Lane* l = ready_head_;
    ready_head_ = l->next_ready_;
    if (!ready_head_) ready_tail_ = nullptr;
    l->ready_ = false;
    Job* j = l->head_;
    l->head_ = j->next;
    if (!l->head_) l->tail_ = nullptr;
    ++l->running_;
    // Its turn is over: the lane goes to the back of the list if it may start another.
    if (l->head_ && l->running_ < l->cap_) ReadyLocked(l);
    // Work still waits: one more worker for it (the cascade Submit started).
    const bool wake = ready_head_ && WakeOneLocked();
    lock.unlock();
    if (wake) cv_.notify_one();
    j->run(j);
    lock.lock();
    --l->running_;
    if (l->head_ && !l->ready_) {
      ReadyLocked(l);  // it was at its cap; this thread takes its next job itself
    }
    if (l->running_ == 0 && !l->head_ && !l->ready_) lane_cv_.notify_all();
  }
}

void WorkerPool::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  done_cv_.wait(lock, [this] { return live_ == 0; });
}

}  // namespace mooring
