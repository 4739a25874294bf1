// NativeClass: the JS class of a wrapper whose objects only native code may create.
//
// A wrapper's constructor is reachable from JS (`obj.constructor`), so it must not build
// a hollow handle when called with `new`. Native code hands the constructor its Init
// through `pending` for exactly one synchronous constructor call; a constructor that
// finds no Init refuses (see TakePendingInit in addon-data.h).
#pragma once

#include <napi.h>

#include <initializer_list>
#include <utility>

namespace mooring {

template <typename Init>
struct NativeClass {
  Napi::FunctionReference ctor;
  Init* pending = nullptr;  // set only while New() runs the constructor

  // Runs the JS constructor with `init` handed over (JS thread).
  Napi::Object New(Init init) {
    pending = &init;
    try {
      Napi::Object o = ctor.New({});
      pending = nullptr;
      return o;
    } catch (...) {
      pending = nullptr;
      throw;
    }
  }

  // The Init handed over by New(), at most once; nullptr when JS code called `new`.
  Init* Take() {
    Init* init = pending;
    pending = nullptr;
    return init;
  }
};

// The end of every wrapper constructor: tags `this` as a T (CheckedThis relies on it),
// defines `props` as read-only enumerable properties, and keeps the open handle from
// being collected (its Close() drops that reference).
template <typename T>
void AdoptThis(T* wrap, const Napi::CallbackInfo& info,
               std::initializer_list<std::pair<const char*, Napi::Value>> props) {
  Napi::Object self = info.This().As<Napi::Object>();
  self.TypeTag(&T::kTypeTag);
  for (const auto& p : props) self.DefineProperty(Napi::PropertyDescriptor::Value(p.first, p.second, napi_enumerable));
  wrap->Ref();
}

}  // namespace mooring
