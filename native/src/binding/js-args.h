// Argument checks for the binding. They run on the JS thread before anything is queued
// and throw JsError(kInvalidArgument) with a message naming the argument.
#pragma once

#include <napi.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "binding/async-worker.h"
#include "binding/js-values.h"  // JsNum, for the files that include only this one

namespace mooring {

// Largest integer a JS number holds exactly: offsets and sizes above it are refused.
constexpr double kMaxSafeInteger = 9007199254740991.0;
// Longest string accepted for paths, names and labels (bytes of UTF-8).
constexpr size_t kMaxStringBytes = 4096;

inline JsError ArgError(const std::string& name, const std::string& want) {
  return JsError(Code::kInvalidArgument, name + " must be " + want);
}

inline uint64_t ToUint(const Napi::Value& v, const std::string& name, double max = kMaxSafeInteger) {
  if (!v.IsNumber()) throw ArgError(name, "a number");
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d < 0 || d != std::floor(d) || d > max)
    throw ArgError(name, "an integer in [0, " + std::to_string(static_cast<uint64_t>(max)) + "]");
  return static_cast<uint64_t>(d);
}

inline bool ToBool(const Napi::Value& v, const std::string& name, bool dflt) {
  if (v.IsUndefined()) return dflt;
  if (!v.IsBoolean()) throw ArgError(name, "a boolean");
  return v.As<Napi::Boolean>().Value();
}

inline std::string ToStr(const Napi::Value& v, const std::string& name, size_t min_bytes = 1,
                         size_t max_bytes = kMaxStringBytes) {
  if (!v.IsString()) throw ArgError(name, "a string");
  std::string s = v.As<Napi::String>().Utf8Value();
  if (s.size() < min_bytes || s.size() > max_bytes)
    throw ArgError(name, "a string of " + std::to_string(min_bytes) + ".." + std::to_string(max_bytes) + " bytes");
  if (s.find('\0') != std::string::npos) throw ArgError(name, "a string without NUL characters");
  return s;
}

inline Napi::Object ToObject(const Napi::Value& v, const std::string& name) {
  if (!v.IsObject() || v.IsArray() || v.IsFunction()) throw ArgError(name, "an object");
  return v.As<Napi::Object>();
}

// Bytes to write: a Uint8Array (or Buffer) of at most `max_bytes`. The caller must Pin
// `v` for as long as the native side reads the bytes.
inline Napi::Uint8Array ToBytes(const Napi::Value& v, const std::string& name, size_t max_bytes) {
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw ArgError(name, "a Uint8Array or Buffer");
  Napi::Uint8Array bytes = v.As<Napi::Uint8Array>();
  if (bytes.ByteLength() > max_bytes) throw ArgError(name, "at most " + std::to_string(max_bytes) + " bytes");
  return bytes;
}

inline Napi::Value Arg(const Napi::CallbackInfo& info, size_t i) {
  return i < info.Length() ? info[i] : info.Env().Undefined();
}

// Checks that `this` is an object wrapped by T (type-tagged when T was constructed).
// A method called on anything else throws instead of reinterpreting foreign memory.
template <typename T>
T* CheckedThis(const Napi::CallbackInfo& info) {
  Napi::Value self = info.This();
  if (!self.IsObject() || !self.As<Napi::Object>().CheckTypeTag(&T::kTypeTag)) {
    throw MakeError(info.Env(), Code::kInvalidArgument,
                    std::string("method called on an object that is not a ") + T::kClassName);
  }
  return T::Unwrap(self.As<Napi::Object>());
}

// Prototype method trampoline: type-checks `this` before calling the member.
template <typename T, Napi::Value (T::*M)(const Napi::CallbackInfo&)>
Napi::Value Dispatch(const Napi::CallbackInfo& info) {
  T* self = CheckedThis<T>(info);
  try {
    return (self->*M)(info);
  } catch (const JsError& e) {
    throw MakeError(info.Env(), e.code, e.message);
  }
}

// A prototype method as a plain function property. (napi_define_class templates only take
// primitives as values, so methods are added to the prototype after the class exists.)
template <typename T, Napi::Value (T::*M)(const Napi::CallbackInfo&)>
Napi::PropertyDescriptor Method(Napi::Env env, const char* name) {
  return Napi::PropertyDescriptor::Value(name, Napi::Function::New(env, Dispatch<T, M>, name),
                                         static_cast<napi_property_attributes>(napi_writable | napi_configurable));
}

// A read-only prototype property whose value the member computes at each read (a size
// that a resize changes, where a value fixed at construction would go stale).
template <typename T, Napi::Value (T::*M)(const Napi::CallbackInfo&)>
Napi::PropertyDescriptor Getter(const char* name) {
  return Napi::PropertyDescriptor::Accessor<Dispatch<T, M>>(name, napi_enumerable);
}

// Defines class T with `methods` on its prototype.
template <typename T>
Napi::Function DefineWithMethods(Napi::Env env, const std::vector<Napi::PropertyDescriptor>& methods) {
  Napi::Function ctor = T::DefineClass(env, T::kClassName, {});
  ctor.Get("prototype").As<Napi::Object>().DefineProperties(methods);
  return ctor;
}

}  // namespace mooring
