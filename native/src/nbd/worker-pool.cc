#include "nbd/worker-pool.h"

namespace mooring {

WorkerPool::WorkerPool(uint32_t threads) {
  threads_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() { Stop(); }

void WorkerPool::Submit(Batch* batch) {
  if (batch->count == 0) return;
  Job* head = batch->head;
  Job* tail = batch->tail;
  size_t count = batch->count;
  *batch = Batch{};
  uint32_t wake = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      if (tail_) tail_->next = head; else head_ = head;
      tail_ = tail;
      // Waking more threads than there are jobs only makes them contend for the lock.
      wake = idle_ < count ? idle_ : static_cast<uint32_t>(count);
      head = nullptr;
    }
  }
  for (uint32_t i = 0; i < wake; ++i) cv_.notify_one();
  while (head) {  // pool stopped: run inline rather than lose the job
    Job* next = head->next;
    head->run(head);
    head = next;
  }
}

void WorkerPool::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!head_ && !stopping_) {
      ++idle_;
      cv_.wait(lock);
      --idle_;
    }
    if (!head_) return;  // stopping and drained
    Job* j = head_;
    head_ = j->next;
    if (!head_) tail_ = nullptr;
    lock.unlock();
    j->run(j);
    lock.lock();
  }
}

void WorkerPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

}  // namespace mooring
