// WorkerPool: a fixed set of threads running intrusive jobs in FIFO order. Jobs are
// embedded in the objects they work on (no allocation per submit), and a reader can hand
// over a whole batch of requests under one lock acquisition.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace mooring {

class WorkerPool {
 public:
  struct Job {
    Job* next = nullptr;
    void (*run)(Job*) = nullptr;  // must not throw
  };

  // A batch of jobs linked through Job::next, built without locking.
  struct Batch {
    Job* head = nullptr;
    Job* tail = nullptr;
    size_t count = 0;
    void Push(Job* j) {
      j->next = nullptr;
      if (tail) tail->next = j; else head = j;
      tail = j;
      ++count;
    }
  };

  explicit WorkerPool(uint32_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues the batch (empties it). Jobs submitted after Stop() run on the caller's thread
  // so that nobody waits forever for a reply.
  void Submit(Batch* batch);
  // Runs what is queued, then joins the threads. Idempotent.
  void Stop();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  Job* head_ = nullptr;
  Job* tail_ = nullptr;
  uint32_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace mooring
