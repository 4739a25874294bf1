// EventQueue: carries engine events from I/O threads to one JS callback, in batches.
//
// Push() (any thread) appends under a mutex and schedules at most one thread-safe-function
// call at a time; that call drains everything queued so far into one array. The queue is
// bounded: past kMaxQueuedEvents, events are counted in dropped() instead of queued, so a
// stalled event loop cannot grow memory without limit.
#pragma once

#include <napi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"

namespace mooring {

class EventQueue : public std::enable_shared_from_this<EventQueue> {
 public:
  static constexpr size_t kMaxQueuedEvents = 4096;

  // JS thread. Starts paused: events queue up until Resume(), so those raised while an
  // engine opens arrive after the openEngine promise has resolved.
  static std::shared_ptr<EventQueue> Create(Napi::Env env, Napi::Function callback);

  void Push(const EngineEvent& ev);  // any thread
  void Resume();                     // JS thread
  // JS thread: stop delivering and let the thread-safe function go (events already
  // scheduled are still delivered). Idempotent.
  void Close();
  // Env teardown: Node finalizes the thread-safe function itself; only stop calling it.
  void Detach();
  uint64_t dropped() const;

 private:
  EventQueue() = default;
  void ScheduleLocked();
  static void Deliver(Napi::Env env, Napi::Function cb, const std::vector<EngineEvent>& batch);

  mutable std::mutex mu_;
  Napi::ThreadSafeFunction tsfn_;
  std::vector<EngineEvent> queue_;
  bool paused_ = true;
  bool call_pending_ = false;
  bool closed_ = false;
  uint64_t dropped_ = 0;
};

}  // namespace mooring
