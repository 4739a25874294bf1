// JS -> ReplicaEndpoint (NativeReplicaEndpoint in src/native/binding.ts): a string is a
// local replica directory; an object names a remote replica. Checked on the JS thread.
#pragma once

#include <napi.h>

#include <string>

#include "binding/js-args.h"
#include "remote/replica-auth.h"
#include "block/replica-endpoint.h"

namespace mooring {

// Longest PEM bundle accepted for certificates, keys and CAs.
constexpr size_t kMaxPemBytes = 64 * 1024;
// Bounds of the engine-to-replica I/O timeout (Longhorn allows 8..30 s; we allow more).
constexpr uint32_t kMinReplicaIoTimeoutMs = 100;
constexpr uint32_t kMaxReplicaIoTimeoutMs = 600000;

inline TlsConfig ParseTls(const Napi::Value& v, const std::string& name) {
  TlsConfig tls;
  if (v.IsUndefined()) return tls;
  Napi::Object o = ToObject(v, name);
  tls.cert_pem = ToStr(o.Get("cert"), name + ".cert", 1, kMaxPemBytes);
  tls.key_pem = ToStr(o.Get("key"), name + ".key", 1, kMaxPemBytes);
  tls.ca_pem = ToStr(o.Get("ca"), name + ".ca", 1, kMaxPemBytes);
  if (!o.Get("serverName").IsUndefined()) tls.server_name = ToStr(o.Get("serverName"), name + ".serverName", 0, 255);
  return tls;
}

// The cluster secret (remote/replica-auth.h): undefined = none; else a Uint8Array of
// kClusterSecretMinBytes..kClusterSecretMaxBytes.
inline std::string ParseClusterSecret(const Napi::Value& v, const std::string& name) {
  if (v.IsUndefined()) return std::string();
  Napi::Uint8Array b = ToBytes(v, name, kClusterSecretMaxBytes);
  if (b.ByteLength() < kClusterSecretMinBytes) throw ArgError(name, "at least " + std::to_string(kClusterSecretMinBytes) + " bytes");
  return std::string(reinterpret_cast<const char*>(b.Data()), b.ByteLength());
}

// `allow_backing_file`: the endpoint may name a backing image file (`backingFile: true`,
// openReplica only); engines refuse it.
inline ReplicaEndpoint ParseReplicaEndpoint(const Napi::Value& v, const std::string& name, bool allow_backing_file = false) {
  ReplicaEndpoint ep;
  if (v.IsString()) {
    ep.dir = ToStr(v, name);
    return ep;
  }
  Napi::Object o = ToObject(v, name);
  ep.host = ToStr(o.Get("host"), name + ".host", 1, 255);
  const uint64_t port = ToUint(o.Get("port"), name + ".port", 65535);
  if (port == 0) throw ArgError(name + ".port", "a port in 1..65535");
  ep.port = static_cast<uint16_t>(port);
  const Napi::Value bf = o.Get("backingFile");
  if (!bf.IsUndefined() && !(allow_backing_file && bf.IsBoolean()))
    throw ArgError(name + ".backingFile", allow_backing_file ? "a boolean" : "absent (an engine's replica is never a backing image file)");
  ep.backing_file = bf.IsBoolean() && bf.As<Napi::Boolean>().Value();
  if (ep.backing_file) {
    ep.name = ToStr(o.Get("name"), name + ".name", 1, kMaxBackingFileKeyBytes);
    if (!ValidBackingFileKey(ep.name.data(), ep.name.size()))
      throw ArgError(name + ".name", "a backing image file key ([A-Za-z0-9._-]{1,255})");
  } else {
    ep.name = ToStr(o.Get("name"), name + ".name", 1, kMaxReplicaNameBytes);
    if (!ValidReplicaName(ep.name.data(), ep.name.size())) throw ArgError(name + ".name", "a replica name ([A-Za-z0-9._-]{1,63})");
  }
  ep.tls = ParseTls(o.Get("tls"), name + ".tls");
  ep.cluster_secret = ParseClusterSecret(o.Get("clusterSecret"), name + ".clusterSecret");
  if (!o.Get("ioTimeoutMs").IsUndefined()) {
    const uint64_t t = ToUint(o.Get("ioTimeoutMs"), name + ".ioTimeoutMs", kMaxReplicaIoTimeoutMs);
    if (t < kMinReplicaIoTimeoutMs) throw ArgError(name + ".ioTimeoutMs", "at least " + std::to_string(kMinReplicaIoTimeoutMs));
    ep.io_timeout_ms = static_cast<uint32_t>(t);
  }
  return ep;
}

}  // namespace mooring
