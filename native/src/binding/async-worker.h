// PromiseWorker: the one way a binding method runs native work.
//
// The JS thread builds the worker with everything it needs already copied (strings,
// numbers) or pinned (buffers, the calling handle: see Pin), queues it, and returns its
// promise. Execute() runs Run() on a libuv pool thread and never touches JS; OnOK settles
// the promise on the JS thread. Errors reject with an Error carrying `code` (CodeName),
// `errno` (negative, Node's convention) and a message naming the object concerned.
#pragma once

#include <napi.h>

#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace mooring {

// An error decided on the JS thread (bad argument, closed handle...). Methods that
// return a promise turn it into a rejection; synchronous ones throw it.
struct JsError : std::exception {
  JsError(Code c, std::string msg) : code(c), message(std::move(msg)) {}
  const char* what() const noexcept override { return message.c_str(); }
  Code code;
  std::string message;
};

inline Napi::Error MakeError(Napi::Env env, Code code, const std::string& message, int sys_errno = 0) {
  Napi::Error err = code == Code::kInvalidArgument ? Napi::TypeError::New(env, message)
                                                   : Napi::Error::New(env, message);
  err.Set("code", Napi::String::New(env, CodeName(code)));
  if (sys_errno != 0) err.Set("errno", Napi::Number::New(env, sys_errno > 0 ? -sys_errno : sys_errno));
  return err;
}

inline Napi::Error MakeError(Napi::Env env, const Status& st) {
  return MakeError(env, st.code, st.message, st.sys_errno);
}

// A data-path result (0 or -errno) as a Status. -ESHUTDOWN means the object was closed
// under the call: CLOSED, not IO_ERROR.
inline Status StatusFromRc(int rc, const std::string& what) {
  if (rc >= 0) return Status::Ok();
  if (rc == -ESHUTDOWN) return Status::Error(Code::kClosed, what + ": closed", ESHUTDOWN);
  return Status::FromErrno(rc, what + ": " + std::strerror(-rc));
}

inline Napi::Promise RejectedPromise(Napi::Env env, const Napi::Error& err) {
  auto d = Napi::Promise::Deferred::New(env);
  d.Reject(err.Value());
  return d.Promise();
}

class PromiseWorker : public Napi::AsyncWorker {
 public:
  explicit PromiseWorker(Napi::Env env)
      : Napi::AsyncWorker(env, "mooring"), deferred_(Napi::Promise::Deferred::New(env)) {}

  // Keeps `value` (and whatever memory it owns) alive until the promise settles.
  void Pin(const Napi::Value& value) {
    if (value.IsObject()) pins_.push_back(Napi::Persistent(value.As<Napi::Object>()));
  }

  // Queues the worker; from here on it deletes itself after settling.
  Napi::Promise Start() {
    Napi::Promise p = deferred_.Promise();
    Queue();
    return p;
  }

 protected:
  // Worker thread. Must not touch JS.
  virtual Status Run() = 0;
  // JS thread, after Run, whatever its outcome: bookkeeping on the calling handle.
  virtual void Done(Napi::Env, const Status&) {}
  // JS thread, only after success: the resolved value.
  virtual Napi::Value Result(Napi::Env env) { return env.Undefined(); }

 private:
  void Execute() override {
    try {
      status_ = Run();
    } catch (const std::exception& e) {
      status_ = Status::Error(Code::kIoError, std::string("native exception: ") + e.what());
    } catch (...) {
      status_ = Status::Error(Code::kIoError, "native exception");
    }
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::HandleScope scope(env);
    try {
      Done(env, status_);
      if (status_.ok()) {
        deferred_.Resolve(Result(env));
      } else {
        deferred_.Reject(MakeError(env, status_).Value());
      }
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    } catch (const JsError& e) {
      deferred_.Reject(MakeError(env, e.code, e.message).Value());
    } catch (const std::exception& e) {
      deferred_.Reject(MakeError(env, Code::kIoError, e.what()).Value());
    }
  }

  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

  Napi::Promise::Deferred deferred_;
  std::vector<Napi::ObjectReference> pins_;
  Status status_;
};

// A PromiseWorker from lambdas, for the many one-call methods. The lambdas must capture
// by value (copies, shared_ptrs); anything JS-owned they point into must be Pin()ned.
class TaskWorker final : public PromiseWorker {
 public:
  using RunFn = std::function<Status()>;
  using DoneFn = std::function<void(Napi::Env, const Status&)>;
  using ResultFn = std::function<Napi::Value(Napi::Env)>;

  TaskWorker(Napi::Env env, RunFn run, ResultFn result = nullptr, DoneFn done = nullptr)
      : PromiseWorker(env), run_(std::move(run)), result_(std::move(result)), done_(std::move(done)) {}

 protected:
  Status Run() override { return run_(); }
  void Done(Napi::Env env, const Status& st) override {
    if (done_) done_(env, st);
  }
  Napi::Value Result(Napi::Env env) override { return result_ ? result_(env) : env.Undefined(); }

 private:
  RunFn run_;
  ResultFn result_;
  DoneFn done_;
};

// A TaskWorker for a method of a wrapped object, pinning the object (`this`) until the
// promise settles so that it is not collected under the call.
inline TaskWorker* PinnedTask(const Napi::CallbackInfo& info, TaskWorker::RunFn run,
                              TaskWorker::ResultFn result = nullptr, TaskWorker::DoneFn done = nullptr) {
  auto* w = new TaskWorker(info.Env(), std::move(run), std::move(result), std::move(done));
  w->Pin(info.This());
  return w;
}

// Runs `make` (which validates on the JS thread and returns a worker) and starts the
// worker; a JsError thrown while validating becomes a rejected promise, so promise
// methods never throw synchronously for bad input.
template <typename Make>
Napi::Value RunPromise(Napi::Env env, Make&& make) {
  try {
    PromiseWorker* w = make();
    return w->Start();
  } catch (const JsError& e) {
    return RejectedPromise(env, MakeError(env, e.code, e.message));
  } catch (const Napi::Error& e) {
    // Reading the arguments ran JS that threw (a getter, a Proxy trap): still a coded error.
    Napi::Error err = MakeError(env, Code::kInvalidArgument, std::string("reading the arguments threw: ") + e.Message());
    err.Set("cause", e.Value());
    return RejectedPromise(env, err);
  }
}

}  // namespace mooring
