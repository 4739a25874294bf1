// WorkerPool: threads running intrusive jobs, shared by many clients through lanes.
//
// Jobs are embedded in the objects they work on (no allocation per submit), and a reader
// hands over a whole batch of requests under one lock acquisition. Each client (an NBD
// export, a replica server) submits through its own Lane: a lane's jobs start in FIFO order,
// at most `cap` of them run at once, and lanes with queued work take turns, so one slow or
// stuck client holds at most its cap of workers while the others go on.
//
// The pool starts threads when work waits and none is idle, up to max_threads, and a thread
// idle for kIdleExitMs ends while more than min_threads are left: the thread count follows
// the load and its bound is a setting, never the number of clients (docs/architecture.md,
// "Threads"). WorkerPool::Nbd() is the one pool every NBD export of the process shares.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

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

  // One client's queue in a pool. Destroy it only once nothing it submitted is queued or
  // running (the destructor waits for that).
  class Lane {
   public:
    Lane(WorkerPool* pool, uint32_t cap);
    ~Lane();
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    // Queues the batch (empties it). On a stopped pool the jobs run on the caller's thread,
    // so that nobody waits forever for a reply.
    void Submit(Batch* batch);

   private:
    friend class WorkerPool;
    WorkerPool* const pool_;
    const uint32_t cap_;
    Job* head_ = nullptr;      // guarded by pool_->mu_
    Job* tail_ = nullptr;
    uint32_t running_ = 0;
    bool ready_ = false;       // in the pool's ready list
    Lane* next_ready_ = nullptr;
  };

  static constexpr int kIdleExitMs = 10000;
  // Threads of the NBD pool at most, unless an export asks for more (Reserve).
  static constexpr uint32_t kNbdThreadsMax = 64;
  static constexpr uint32_t kNbdThreadsMin = 2;

  // name: of its threads (NameThisThread), at most 15 characters. min_threads start now.
  WorkerPool(uint32_t min_threads, uint32_t max_threads, const char* name);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // The pool every NBD export of this process submits to (never stopped).
  static WorkerPool& Nbd();

  // Lets the pool grow to at least n threads (an export whose cap is above the default).
  void Reserve(uint32_t n);
  // Runs what is queued, then waits for every thread to end. Idempotent.
  void Stop();
  // Threads alive now (for tests and stats).
  uint32_t threads() const;

 private:
  void Loop();
  // Under mu_: puts a lane that may start a job at the end of the ready list.
  void ReadyLocked(Lane* l);
  // Under mu_: starts one more thread unless at max_threads (false if none started).
  bool GrowLocked();
  // Under mu_: an idle worker is to be woken (true: notify cv_ once mu_ is let go), else
  // one is started if the pool may grow.
  bool WakeOneLocked();

  const char* const name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // idle workers
  std::condition_variable lane_cv_;  // a lane's job finished (Lane destructor)
  std::condition_variable done_cv_;  // a thread ended (Stop)
  Lane* ready_head_ = nullptr;
  Lane* ready_tail_ = nullptr;
  uint32_t min_ = 0;
  uint32_t max_ = 0;
  uint32_t live_ = 0;
  uint32_t idle_ = 0;
  uint32_t waking_ = 0;  // notified, not yet taken a job
  bool stopping_ = false;
};

}  // namespace mooring
