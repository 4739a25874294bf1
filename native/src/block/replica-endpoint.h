// ReplicaEndpoint: how an engine reaches one replica, as the control plane describes it.
// Local replicas (a directory on this host) are opened through the process's
// ReplicaRegistry, so an engine and the replica server of the same process share one open
// replica; remote ones are reached over the replica protocol (remote/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "block/replica-backend.h"
#include "util/status.h"

namespace mooring {

// Mutual TLS, PEM text given by the embedder. Enabled when cert, key and ca are all set.
struct TlsConfig {
  std::string cert_pem;     // our certificate chain
  std::string key_pem;      // our private key
  std::string ca_pem;       // CA(s) that must have signed the peer's certificate
  std::string server_name;  // client side: name to verify in the server's certificate; "" = skip name check (CA still checked)
  bool enabled() const { return !cert_pem.empty() && !key_pem.empty() && !ca_pem.empty(); }
};

// Replica names on a replica server (its subdirectories): [A-Za-z0-9._-]{1,63}, not "."
// or "..". The one rule for JS arguments and for names arriving over the wire.
constexpr size_t kMaxReplicaNameBytes = 63;
// [A-Za-z0-9._-]{1,max}, not "." or "..": the shape of every name that becomes a path on a
// replica server.
inline bool ValidPathName(const char* s, size_t n, size_t max) {
  if (n == 0 || n > max) return false;
  if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}
inline bool ValidReplicaName(const char* s, size_t n) { return ValidPathName(s, n, kMaxReplicaNameBytes); }

// Backing image files on a replica server (ReplicaServerOptions::backing_files_root): the
// directory key `<name>-<uuid>` of a file, [A-Za-z0-9._-]{1,255}, not . or ..; the served
// file is <root>/<key>/image, the name a file gets only once its checksum was verified.
constexpr size_t kMaxBackingFileKeyBytes = 255;
inline bool ValidBackingFileKey(const char* s, size_t n) { return ValidPathName(s, n, kMaxBackingFileKeyBytes); }

// Default engine-to-replica I/O timeout (Longhorn's engine-replica-timeout default).
constexpr uint32_t kDefaultReplicaIoTimeoutMs = 8000;

struct ReplicaEndpoint {
  // Local: the replica directory (absolute).
  std::string dir;
  // Remote: replica server address and the replica's name on that server.
  std::string host;
  uint16_t port = 0;
  std::string name;
  // Remote only: `name` is a backing image file's key (ValidBackingFileKey), served
  // read-only by the server's backing-files root (HELLO with rp::kFlagBackingFile).
  bool backing_file = false;
  TlsConfig tls;
  // Not empty: authenticate with it before HELLO, and require the server to prove it too
  // (remote/replica-auth.h). A server without a secret is then refused (kUnauthenticated).
  std::string cluster_secret;
  // A request outstanding longer than this fails the replica (-ETIMEDOUT), remote only.
  uint32_t io_timeout_ms = kDefaultReplicaIoTimeoutMs;

  bool remote() const { return !host.empty(); }
  // The id the engine reports: the directory, or "host:port/name".
  std::string Id() const { return remote() ? host + ":" + std::to_string(port) + "/" + name : dir; }
};

// Opens the replica an endpoint names. Local: through ReplicaRegistry (shared). Remote:
// connects and handshakes (kUnavailable if the server cannot be reached in io_timeout_ms,
// kNotFound if it does not serve `name`). Implemented in remote/replica-endpoint.cc.
Status OpenReplicaEndpoint(const ReplicaEndpoint& ep, std::shared_ptr<ReplicaBackend>* out);

// A stand-in for a replica that could not be reached when the engine started: every call
// fails with -ENOTCONN / kUnavailable and its epoch is 0, so the engine opens it as ERR and
// the control plane can rebuild it later. Implemented in remote/replica-endpoint.cc.
std::shared_ptr<ReplicaBackend> MakeOfflineReplica(const ReplicaEndpoint& ep, const Status& why);

}  // namespace mooring
