// Authentication of a replica-protocol connection with the cluster secret
// (docs/replica-protocol.md, "Authentication"): a challenge-response in both directions
// before HELLO, so that a process without the secret can neither use a replica server nor
// pass for one.
//
//   client -> AUTH        payload: Nc (32 random bytes)
//   server -> reply OK    payload: Ns (32 random bytes), HMAC(K, "server" label | Nc | Ns)
//   client -> AUTH_PROOF  payload: HMAC(K, "client" label | Nc | Ns)
//   server -> reply OK, or UNAUTHENTICATED and the connection closes
//
// K = HMAC-SHA256(secret, "mooring replica protocol v1"): the secret itself never crosses
// the wire, and the gRPC token (derived with another label) cannot stand in for it. The
// two directions use different labels, so a proof cannot be reflected; each side's fresh
// nonce makes the other's proof impossible to replay. HMAC from the OpenSSL that Node
// exports, as for TLS (net/transport.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mooring {

constexpr size_t kAuthNonceBytes = 32;
constexpr size_t kAuthProofBytes = 32;
// The secret's bounds (the JS layer checks them first; native refuses others).
constexpr size_t kClusterSecretMinBytes = 16;
constexpr size_t kClusterSecretMaxBytes = 1024;

// A key derived from the cluster secret for the replica protocol. Empty secret: no key.
class ReplicaAuthKey {
 public:
  ReplicaAuthKey() = default;
  explicit ReplicaAuthKey(const std::string& secret);
  bool enabled() const { return enabled_; }
  // HMAC(K, label | nc | ns), label "server" or "client".
  void Proof(bool server, const uint8_t* nc, const uint8_t* ns, uint8_t out[kAuthProofBytes]) const;
  // Constant-time comparison against the expected proof.
  bool Check(bool server, const uint8_t* nc, const uint8_t* ns, const uint8_t* proof) const;

 private:
  bool enabled_ = false;
  uint8_t key_[32] = {};
};

// Fills out with random bytes (OpenSSL's RAND_bytes). False if the generator failed.
bool AuthNonce(uint8_t out[kAuthNonceBytes]);

}  // namespace mooring
