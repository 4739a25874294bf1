#include "remote/replica-auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

namespace mooring {

namespace {

constexpr char kKeyLabel[] = "mooring replica protocol v1";
constexpr char kServerLabel[] = "mooring replica auth v1 server";
constexpr char kClientLabel[] = "mooring replica auth v1 client";

}  // namespace

ReplicaAuthKey::ReplicaAuthKey(const std::string& secret) {
  if (secret.empty()) return;
  unsigned int n = sizeof key_;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const uint8_t*>(kKeyLabel),
            sizeof kKeyLabel - 1, key_, &n) ||
      n != sizeof key_) {
    // Cannot happen with SHA-256; if it did, a server with a secret would accept no one
    // (enabled_ with a zero key no client knows) rather than everyone.
    memset(key_, 0, sizeof key_);
    RAND_bytes(key_, sizeof key_);
  }
  enabled_ = true;
}

void ReplicaAuthKey::Proof(bool server, const uint8_t* nc, const uint8_t* ns, uint8_t out[kAuthProofBytes]) const {
  const char* label = server ? kServerLabel : kClientLabel;
  const size_t label_len = strlen(label);
  uint8_t msg[64 + kAuthNonceBytes * 2];
  memcpy(msg, label, label_len);
  memcpy(msg + label_len, nc, kAuthNonceBytes);
  memcpy(msg + label_len + kAuthNonceBytes, ns, kAuthNonceBytes);
  unsigned int n = kAuthProofBytes;
  if (!HMAC(EVP_sha256(), key_, sizeof key_, msg, label_len + 2 * kAuthNonceBytes, out, &n)) {
    RAND_bytes(out, kAuthProofBytes);  // a proof nobody can match
  }
}

bool ReplicaAuthKey::Check(bool server, const uint8_t* nc, const uint8_t* ns, const uint8_t* proof) const {
  if (!enabled_) return false;
  uint8_t want[kAuthProofBytes];
  Proof(server, nc, ns, want);
  return CRYPTO_memcmp(want, proof, kAuthProofBytes) == 0;
}

bool AuthNonce(uint8_t out[kAuthNonceBytes]) { return RAND_bytes(out, kAuthNonceBytes) == 1; }

}  // namespace mooring
