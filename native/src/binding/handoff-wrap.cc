#include "binding/handoff-wrap.h"

#include <cstring>

#include "binding/async-worker.h"
#include "binding/js-args.h"

namespace mooring {

namespace {

// HandOffRecord::kind of a plain message (bytes, never fds): the caller's own protocol.
constexpr uint16_t kHandOffKindMessage = 2;
// Longest unix socket path (sun_path holds 108 bytes with the NUL).
constexpr size_t kMaxUnixPathBytes = 107;
// Largest timeout accepted (0 = none).
constexpr double kMaxTimeoutMs = 3600000;

int TimeoutArg(const Napi::Value& v, const char* name) {
  return v.IsUndefined() ? 0 : static_cast<int>(ToUint(v, name, kMaxTimeoutMs));
}

std::string PathArg(const Napi::Value& v) {
  std::string path = ToStr(v, "path", 1, kMaxUnixPathBytes);
  if (path[0] != '/') throw ArgError("path", "an absolute path");
  return path;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// NbdHandOffRecordWrap

Napi::Function NbdHandOffRecordWrap::Define(Napi::Env env) {
  using W = NbdHandOffRecordWrap;
  return DefineWithMethods<W>(env, {Method<W, &W::Close>(env, "close")});
}

NbdHandOffRecordWrap::NbdHandOffRecordWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NbdHandOffRecordWrap>(info) {
  Napi::Env env = info.Env();
  NbdHandOffRecordInit& init = TakePendingInit(env, &AddonData::nbd_record_class,
                                               "NativeNbdHandOffRecord is made by detach() or receive(), not with new");
  record_ = std::move(init.record);
  Napi::Array ids = Napi::Array::New(env, record_->connections.size());
  uint64_t pending = 0;
  for (size_t i = 0; i < record_->connections.size(); ++i) {
    ids.Set(static_cast<uint32_t>(i), JsNum(env, record_->connections[i].id));
    pending += record_->connections[i].pending.size();
  }
  Napi::Object self = info.This().As<Napi::Object>();
  self.TypeTag(&kTypeTag);
  // Not AdoptThis: no self-reference, so an unused record is collected and its fds closed.
  auto prop = [&](const char* k, Napi::Value v) { self.DefineProperty(Napi::PropertyDescriptor::Value(k, v, napi_enumerable)); };
  prop("connectionIds", ids);
  prop("unixPath", Napi::String::New(env, record_->unix_path));
  prop("tcpPort", Napi::Number::New(env, record_->tcp_port));
  prop("exportName", Napi::String::New(env, record_->export_name));
  prop("pendingBytes", JsNum(env, pending));
  prop("connectionsTotal", JsNum(env, record_->connections_total));
}

std::shared_ptr<NbdServerRecord> NbdHandOffRecordWrap::Take() {
  if (!record_) throw JsError(Code::kInvalidState, "this NBD hand-off record was used already (sent, adopted or closed)");
  return std::move(record_);
}

Napi::Value NbdHandOffRecordWrap::Close(const Napi::CallbackInfo& info) {
  record_.reset();  // closes its fds (the frozen server keeps its own)
  return info.Env().Undefined();
}

Napi::Object WrapNbdHandOffRecord(Napi::Env env, std::shared_ptr<NbdServerRecord> record) {
  return AddonData::Get(env)->nbd_record_class.New(NbdHandOffRecordInit{std::move(record)});
}

// ---------------------------------------------------------------------------------------
// HandOffChannelWrap

Napi::Function HandOffChannelWrap::Define(Napi::Env env) {
  using W = HandOffChannelWrap;
  return DefineWithMethods<W>(env, {
                                       Method<W, &W::Send>(env, "send"),
                                       Method<W, &W::Receive>(env, "receive"),
                                       Method<W, &W::Close>(env, "close"),
                                   });
}

HandOffChannelWrap::HandOffChannelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<HandOffChannelWrap>(info) {
  Napi::Env env = info.Env();
  HandOffChannelInit& init = TakePendingInit(env, &AddonData::handoff_channel_class,
                                             "NativeHandOffChannel is made by handOff.connect() or accept(), not with new");
  addon_ = AddonData::Get(env);
  channel_ = std::move(init.channel);
  AdoptThis(this, info, {{"peerPid", Napi::Number::New(env, channel_->peer_pid())},
                         {"peerUid", Napi::Number::New(env, channel_->peer_uid())}});
}

// A channel made on a worker, wrapped on the JS thread (connect and accept).
static Napi::Value WrapChannel(Napi::Env env, const std::shared_ptr<HandOffChannel>& ch) {
  AddonData* data = AddonData::Get(env);
  data->handoff_channels[ch.get()] = ch;  // before the wrapper, so the exit hook sees it
  return data->handoff_channel_class.New(HandOffChannelInit{ch});
}

Napi::Value HandOffChannelWrap::ConnectJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    const std::string path = PathArg(Arg(info, 0));
    const int timeout = TimeoutArg(Arg(info, 1), "timeoutMs");
    auto ch = std::make_shared<std::shared_ptr<HandOffChannel>>();
    return new TaskWorker(
        env, [path, timeout, ch]() { return HandOffChannel::Connect(path, timeout, ch.get()); },
        [ch](Napi::Env env) { return WrapChannel(env, *ch); });
  });
}

Napi::Value HandOffChannelWrap::Send(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "hand-off channel is closed");
    Napi::Value item = Arg(info, 0);
    const int timeout = TimeoutArg(Arg(info, 1), "timeoutMs");
    std::shared_ptr<NbdServerRecord> nbd;
    auto msg = std::make_shared<HandOffRecord>();
    if (item.IsObject() && item.As<Napi::Object>().CheckTypeTag(&NbdHandOffRecordWrap::kTypeTag)) {
      nbd = NbdHandOffRecordWrap::Unwrap(item.As<Napi::Object>())->Take();  // sent or not, used up
    } else {
      Napi::Uint8Array bytes = ToBytes(item, "item", HandOffChannel::kRecordBytesMax);
      msg->kind = kHandOffKindMessage;
      msg->bytes.assign(bytes.Data(), bytes.Data() + bytes.ByteLength());
    }
    auto ch = channel_;
    return PinnedTask(info, [ch, nbd, msg, timeout]() -> Status {
      if (nbd) {
        Status st = NbdHandOffRecords::Encode(nbd.get(), msg.get());
        if (!st.ok()) return st;
      }
      return ch->Send(*msg, timeout);
    });
  });
}

Napi::Value HandOffChannelWrap::Receive(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "hand-off channel is closed");
    const int timeout = TimeoutArg(Arg(info, 0), "timeoutMs");
    auto ch = channel_;
    auto msg = std::make_shared<HandOffRecord>();
    auto nbd = std::make_shared<NbdServerRecord>();
    return PinnedTask(
        info,
        [ch, msg, nbd, timeout]() -> Status {
          Status st = ch->Receive(timeout, msg.get());
          if (!st.ok()) return st;
          if (msg->kind == kHandOffKindNbdServer) {
            st = NbdHandOffRecords::Decode(msg.get(), nbd.get());
            return st.ok() ? st : ch->Abort(st);  // a bad record breaks the channel, as bad framing does
          }
          if (msg->kind == kHandOffKindMessage && msg->fds.size() == 0) return Status::Ok();
          msg->fds.CloseAll();
          return ch->Abort(Status::Error(Code::kProtocolError,
                                         "hand-off channel: record kind " + std::to_string(msg->kind) +
                                             (msg->kind == kHandOffKindMessage ? " (message) carries fds" : " is unknown"),
                                         EPROTO));
        },
        [msg, nbd](Napi::Env env) -> Napi::Value {
          Napi::Object o = Napi::Object::New(env);
          if (msg->kind == kHandOffKindNbdServer) {
            o.Set("type", "nbd-server");
            o.Set("record", WrapNbdHandOffRecord(env, nbd));
          } else {
            o.Set("type", "message");
            o.Set("data", Napi::Buffer<uint8_t>::Copy(env, msg->bytes.data(), msg->bytes.size()));
          }
          return o;
        });
  });
}

Napi::Value HandOffChannelWrap::Close(const Napi::CallbackInfo& info) {
  if (!closed_) {
    closed_ = true;
    channel_->Close();  // wakes a pending send/receive; the socket closes with the last user
    addon_->handoff_channels.erase(channel_.get());
    channel_.reset();  // now, not when this object is collected
    Unref();
  }
  return info.Env().Undefined();
}

// ---------------------------------------------------------------------------------------
// HandOffListenerWrap

Napi::Function HandOffListenerWrap::Define(Napi::Env env) {
  using W = HandOffListenerWrap;
  return DefineWithMethods<W>(env, {
                                       Method<W, &W::Accept>(env, "accept"),
                                       Method<W, &W::Close>(env, "close"),
                                   });
}

HandOffListenerWrap::HandOffListenerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<HandOffListenerWrap>(info) {
  Napi::Env env = info.Env();
  HandOffListenerInit& init = TakePendingInit(env, &AddonData::handoff_listener_class,
                                              "NativeHandOffListener is made by handOff.listen(), not with new");
  addon_ = AddonData::Get(env);
  listener_ = std::move(init.listener);
  AdoptThis(this, info, {{"path", Napi::String::New(env, listener_->path())}});
}

Napi::Value HandOffListenerWrap::ListenJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return RunPromise(env, [&]() -> PromiseWorker* {
    const std::string path = PathArg(Arg(info, 0));
    auto made = std::make_shared<std::shared_ptr<HandOffListener>>();
    return new TaskWorker(
        env,
        [path, made]() {
          std::unique_ptr<HandOffListener> l;
          Status st = HandOffListener::Listen(path, &l);
          if (st.ok()) *made = std::move(l);
          return st;
        },
        [made](Napi::Env env) -> Napi::Value {
          AddonData* data = AddonData::Get(env);
          data->handoff_listeners[made->get()] = *made;
          return data->handoff_listener_class.New(HandOffListenerInit{*made});
        });
  });
}

Napi::Value HandOffListenerWrap::Accept(const Napi::CallbackInfo& info) {
  return RunPromise(info.Env(), [&]() -> PromiseWorker* {
    if (closed_) throw JsError(Code::kClosed, "hand-off listener is closed");
    const int timeout = TimeoutArg(Arg(info, 0), "timeoutMs");
    auto l = listener_;
    auto ch = std::make_shared<std::shared_ptr<HandOffChannel>>();
    return PinnedTask(
        info, [l, ch, timeout]() { return l->Accept(timeout, ch.get()); },
        [ch](Napi::Env env) { return WrapChannel(env, *ch); });
  });
}

Napi::Value HandOffListenerWrap::Close(const Napi::CallbackInfo& info) {
  if (!closed_) {
    closed_ = true;
    listener_->Close();  // wakes a pending accept, removes the socket file if still ours
    addon_->handoff_listeners.erase(listener_.get());
    listener_.reset();
    Unref();
  }
  return info.Env().Undefined();
}

Napi::Object CreateHandOffBinding(Napi::Env env) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("listen", Napi::Function::New(env, HandOffListenerWrap::ListenJs, "listen"));
  o.Set("connect", Napi::Function::New(env, HandOffChannelWrap::ConnectJs, "connect"));
  return o;
}

}  // namespace mooring
