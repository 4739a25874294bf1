// The JS side of the NBD hand-off between processes (src/native/binding.ts, NativeHandOff):
//
// - NbdHandOffRecordWrap (NativeNbdHandOffRecord): an NBD export's record, from
//   server.detach() or channel.receive(). Opaque but for a summary (connection ids,
//   counts); it owns the fds it carries and closes them when sent, adopted, closed or
//   garbage-collected, whichever comes first. It is used at most once.
// - HandOffChannelWrap (NativeHandOffChannel): send/receive of records and of plain
//   messages (bytes, no fds) over a HandOffChannel.
// - HandOffListenerWrap (NativeHandOffListener): accepts channels at a socket path.
//
// Channels and listeners keep their JS object alive while open and are closed by the exit
// hook (a listener removes its socket file then).
#pragma once

#include <napi.h>

#include <memory>

#include "binding/addon-data.h"
#include "handoff/handoff-channel.h"
#include "nbd/nbd-handoff-record.h"

namespace mooring {

struct NbdHandOffRecordInit {
  std::shared_ptr<NbdServerRecord> record;
};
struct HandOffChannelInit {
  std::shared_ptr<HandOffChannel> channel;
};
struct HandOffListenerInit {
  std::shared_ptr<HandOffListener> listener;
};

class NbdHandOffRecordWrap : public Napi::ObjectWrap<NbdHandOffRecordWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6706ULL, 0x7c2e95a1d04b3f68ULL};
  static constexpr const char* kClassName = "NativeNbdHandOffRecord";

  static Napi::Function Define(Napi::Env env);
  explicit NbdHandOffRecordWrap(const Napi::CallbackInfo& info);

  // The record, now the caller's; JsError(INVALID_STATE) if it was used already.
  std::shared_ptr<NbdServerRecord> Take();

 private:
  Napi::Value Close(const Napi::CallbackInfo& info);
  std::shared_ptr<NbdServerRecord> record_;
};

class HandOffChannelWrap : public Napi::ObjectWrap<HandOffChannelWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6707ULL, 0x41d8b2c96e0f7a35ULL};
  static constexpr const char* kClassName = "NativeHandOffChannel";

  static Napi::Function Define(Napi::Env env);
  // handOff.connect(path, timeoutMs?)
  static Napi::Value ConnectJs(const Napi::CallbackInfo& info);
  explicit HandOffChannelWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Send(const Napi::CallbackInfo& info);
  Napi::Value Receive(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  AddonData* addon_ = nullptr;
  std::shared_ptr<HandOffChannel> channel_;
  bool closed_ = false;
};

class HandOffListenerWrap : public Napi::ObjectWrap<HandOffListenerWrap> {
 public:
  static constexpr napi_type_tag kTypeTag = {0x6d6f6f72696e6708ULL, 0xe5306a7d19c84b2fULL};
  static constexpr const char* kClassName = "NativeHandOffListener";

  static Napi::Function Define(Napi::Env env);
  // handOff.listen(path)
  static Napi::Value ListenJs(const Napi::CallbackInfo& info);
  explicit HandOffListenerWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Accept(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);

  AddonData* addon_ = nullptr;
  std::shared_ptr<HandOffListener> listener_;
  bool closed_ = false;
};

// The wrapper of a record, for NbdServerWrap::Detach and channel.receive (JS thread).
Napi::Object WrapNbdHandOffRecord(Napi::Env env, std::shared_ptr<NbdServerRecord> record);
// The `handOff` export: { listen, connect }.
Napi::Object CreateHandOffBinding(Napi::Env env);

}  // namespace mooring
