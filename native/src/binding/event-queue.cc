#include "binding/event-queue.h"

namespace mooring {
namespace {

const char* RebuildTypeName(EngineEvent::Type t) {
  switch (t) {
    case EngineEvent::Type::kRebuildStarted: return "rebuild-started";
    case EngineEvent::Type::kRebuildProgress: return "rebuild-progress";
    case EngineEvent::Type::kRebuildCompleted: return "rebuild-completed";
    default: return "rebuild-failed";
  }
}

}  // namespace

std::shared_ptr<EventQueue> EventQueue::Create(Napi::Env env, Napi::Function callback) {
  std::shared_ptr<EventQueue> q(new EventQueue());
  // The finalizer holds the queue until Node is done with the function, and marks it
  // closed so no I/O thread calls a finalized function.
  q->tsfn_ = Napi::ThreadSafeFunction::New(env, callback, "mooring-engine-events", 0, 1,
                                           [q](Napi::Env) {
                                             std::lock_guard<std::mutex> lk(q->mu_);
                                             q->closed_ = true;
                                           });
  // Events alone must not keep a process alive (a file handle does not either).
  q->tsfn_.Unref(env);
  return q;
}

void EventQueue::Push(const EngineEvent& ev) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  if (queue_.size() >= kMaxQueuedEvents) {
    ++dropped_;
    return;
  }
  queue_.push_back(ev);
  ScheduleLocked();
}

void EventQueue::Resume() {
  std::lock_guard<std::mutex> lk(mu_);
  paused_ = false;
  ScheduleLocked();
}

void EventQueue::ScheduleLocked() {
  if (paused_ || closed_ || call_pending_ || queue_.empty()) return;
  std::weak_ptr<EventQueue> weak = weak_from_this();
  napi_status st = tsfn_.NonBlockingCall([weak](Napi::Env env, Napi::Function cb) {
    auto self = weak.lock();
    if (!self || env == nullptr) return;
    std::vector<EngineEvent> batch;
    {
      std::lock_guard<std::mutex> lk(self->mu_);
      batch.swap(self->queue_);
      self->call_pending_ = false;
    }
    if (!batch.empty()) Deliver(env, cb, batch);
  });
  call_pending_ = st == napi_ok;
}

void EventQueue::Deliver(Napi::Env env, Napi::Function cb, const std::vector<EngineEvent>& batch) {
  Napi::HandleScope scope(env);
  Napi::Array arr = Napi::Array::New(env, batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const EngineEvent& e = batch[i];
    Napi::Object o = Napi::Object::New(env);
    switch (e.type) {
      case EngineEvent::Type::kReplicaError:
        o.Set("type", "replica-error");
        o.Set("replicaId", e.replica_id);
        o.Set("errno", Napi::Number::New(env, e.error));
        break;
      case EngineEvent::Type::kEpochClaimed:
        o.Set("type", "epoch-claimed");
        o.Set("epoch", Napi::Number::New(env, static_cast<double>(e.epoch)));
        break;
      case EngineEvent::Type::kReplicaSetChanged: {
        o.Set("type", "replica-set-changed");
        o.Set("epoch", Napi::Number::New(env, static_cast<double>(e.epoch)));
        o.Set("generation", Napi::Number::New(env, static_cast<double>(e.generation)));
        Napi::Array rw = Napi::Array::New(env, e.rw_members.size());
        for (size_t k = 0; k < e.rw_members.size(); ++k) rw.Set(static_cast<uint32_t>(k), e.rw_members[k]);
        o.Set("rwMembers", rw);
        break;
      }
      case EngineEvent::Type::kReconciled:
        o.Set("type", "reconciled");
        o.Set("bytes", Napi::Number::New(env, static_cast<double>(e.bytes)));
        o.Set("message", e.message);
        break;
      case EngineEvent::Type::kRebuildStarted:
      case EngineEvent::Type::kRebuildProgress:
      case EngineEvent::Type::kRebuildCompleted:
      case EngineEvent::Type::kRebuildFailed:
        o.Set("type", RebuildTypeName(e.type));
        o.Set("replicaId", e.replica_id);
        o.Set("sentBytes", Napi::Number::New(env, static_cast<double>(e.bytes)));
        o.Set("scannedBytes", Napi::Number::New(env, static_cast<double>(e.scanned_bytes)));
        o.Set("totalBytes", Napi::Number::New(env, static_cast<double>(e.total_bytes)));
        if (e.type == EngineEvent::Type::kRebuildFailed) {
          o.Set("errno", Napi::Number::New(env, e.error));
          o.Set("message", e.message);
        }
        break;
      case EngineEvent::Type::kSnapshotCopyProgress:
        o.Set("type", "snapshot-copy-progress");
        o.Set("snapshot", e.snapshot);
        o.Set("copiedBytes", Napi::Number::New(env, static_cast<double>(e.bytes)));
        o.Set("totalBytes", Napi::Number::New(env, static_cast<double>(e.total_bytes)));
        break;
      case EngineEvent::Type::kSalvaged: {
        o.Set("type", "salvaged");
        o.Set("replicaId", e.replica_id);
        Napi::Value last = env.Null();
        if (e.epoch != 0) {
          Napi::Object lr = Napi::Object::New(env);
          lr.Set("epoch", Napi::Number::New(env, static_cast<double>(e.epoch)));
          lr.Set("generation", Napi::Number::New(env, static_cast<double>(e.generation)));
          last = lr;
        }
        o.Set("lastRw", last);
        o.Set("complete", Napi::Boolean::New(env, e.bytes != 0));
        o.Set("message", e.message);
        break;
      }
    }
    if (e.type == EngineEvent::Type::kReplicaError) o.Set("message", e.message);
    arr.Set(static_cast<uint32_t>(i), o);
  }
  try {
    cb.Call({arr});
  } catch (const Napi::Error& err) {
    // A throwing listener is the application's uncaught exception, as with EventEmitter.
    err.ThrowAsJavaScriptException();
  }
}

void EventQueue::Close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
  }
  tsfn_.Release();
}

void EventQueue::Detach() {
  std::lock_guard<std::mutex> lk(mu_);
  closed_ = true;
}

uint64_t EventQueue::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

}  // namespace mooring
