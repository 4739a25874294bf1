// The replica protocol: how an engine (RemoteReplica) talks to a ReplicaServer on another
// host. One TCP connection (optionally mutual TLS) carries little-endian frames:
//
//   request  (48 bytes + payload)        reply (40 bytes + payload)
//   u32 magic  'MRQ1'                    u32 magic  'MRP1'
//   u8  version (1)                      u16 code   (util/status.h Code)
//   u8  op                               u16 state  (kState*: replica state, when valid)
//   u16 flags  (kFlag*)                  u64 seq    (copied from the request)
//   u64 seq                              i32 errno  (positive; 0 when ok)
//   u64 epoch  (writer epoch)            u32 payload length
//   u64 offset                           u64 epoch  (replica epoch, when kStateValid)
//   u64 length                           u64 value  (op-specific scalar)
//   u32 payload length
//   u32 reserved (0)
//
// The first request must be kOpHello; after it requests are pipelined, executed
// concurrently and answered in any order (replies carry the seq). Full description, the
// per-op layouts and the limits: docs/replica-protocol.md.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "block/replica-backend.h"
#include "block/replica-endpoint.h"
#include "util/byte-buffer.h"
#include "util/status.h"

namespace mooring {
namespace rp {

constexpr uint32_t kRequestMagic = 0x3151524d;  // "MRQ1"
constexpr uint32_t kReplyMagic = 0x3150524d;    // "MRP1"
constexpr uint8_t kVersion = 1;
constexpr size_t kRequestHeaderBytes = 48;
constexpr size_t kReplyHeaderBytes = 40;

// --- Limits (every length on the wire is checked against one of these). ---
// Largest data payload of one READ/WRITE/READ_LAYER/WRITE_LAYER frame; the client splits
// larger calls into several frames.
constexpr uint32_t kMaxIoBytes = 4u << 20;
// Largest payload of any frame, either direction (a layer list is the largest thing sent).
constexpr uint32_t kMaxPayloadBytes = 16u << 20;
// Layer ids, names, file names, label keys and values, replica names.
constexpr uint32_t kMaxWireStringBytes = 4096;
constexpr uint32_t kMaxLayersPerList = 65536;
constexpr uint32_t kMaxLabelsPerLayer = 64;
// Ranges per LAYER_EXTENTS reply; the client asks again from where a page ends.
constexpr uint32_t kMaxRangesPerReply = 65536;
constexpr uint32_t kMaxExtentsPerReply = 65536;
constexpr uint32_t kMaxDigestsPerReply = kMaxDigestRangeBytes / kDigestUnitBytes;
// Error messages carried in error replies (longer ones are cut).
constexpr uint32_t kMaxMessageBytes = 1024;

enum Op : uint8_t {
  kOpHello = 1,
  kOpPing = 2,
  kOpRead = 3,
  kOpWrite = 4,
  kOpTrim = 5,
  kOpWriteZeroes = 6,
  kOpFlush = 7,
  kOpBlockStatus = 8,
  kOpClaimEpoch = 9,
  kOpMarkClean = 10,
  kOpListLayers = 11,
  kOpLayerExtents = 12,
  kOpReadLayer = 13,
  kOpSnapshot = 14,
  kOpDeleteSnapshot = 15,
  kOpRevert = 16,
  kOpAdoptChain = 17,
  kOpLayerDigest = 18,
  kOpWriteLayer = 19,
  kOpUnmapLayer = 20,
  kOpFinishRebuild = 21,
  kOpAllocatedBytes = 22,
  kOpSetReplicaSet = 23,
  kOpPeekReplicaSet = 24,
  // Grows the replica to `length` bytes. Sent only to a server whose HELLO reply announced
  // kFeatureGrow: an older one answers it PROTOCOL_ERROR (unknown op).
  kOpGrow = 25,
  // u64 bits (kFeature*) the client implements, in `length`; no payload. Sent once, right
  // after HELLO, and only to a server whose HELLO reply announced kFeatureGoAway (an older
  // server never sees it). Answered with OK and, in `value`, the bits both sides know.
  kOpClientFeatures = 26,
  // Authentication with the cluster secret, before HELLO (remote/replica-auth.h): AUTH
  // carries the client's nonce and is answered with the server's nonce and proof;
  // AUTH_PROOF carries the client's proof. Only a server with a secret accepts them.
  kOpAuth = 27,
  kOpAuthProof = 28,
  // The replica's last RW replica set (ReplicaBackend::LastRw): no payload; the reply
  // payload is u64 epoch, u64 generation (0, 0: none). Sent only to a server whose HELLO
  // reply announced kFeatureLastRw.
  kOpLastRw = 29,
  kOpMax = 29,
};

inline const char* OpName(uint8_t op) {
  static const char* const names[] = {"?",          "HELLO",          "PING",          "READ",         "WRITE",
                                      "TRIM",       "WRITE_ZEROES",   "FLUSH",         "BLOCK_STATUS", "CLAIM_EPOCH",
                                      "MARK_CLEAN", "LIST_LAYERS",    "LAYER_EXTENTS", "READ_LAYER",   "SNAPSHOT",
                                      "DELETE_SNAPSHOT", "REVERT",    "ADOPT_CHAIN",   "LAYER_DIGEST", "WRITE_LAYER",
                                      "UNMAP_LAYER", "FINISH_REBUILD", "ALLOCATED_BYTES", "SET_REPLICA_SET", "PEEK_REPLICA_SET",
                                      "GROW",       "CLIENT_FEATURES", "AUTH",   "AUTH_PROOF",
                                      "LAST_RW"};
  return op <= kOpMax ? names[op] : "?";
}

// Request flags.
constexpr uint16_t kFlagFua = 1;        // WRITE, WRITE_ZEROES
constexpr uint16_t kFlagMayTrim = 2;    // WRITE_ZEROES
constexpr uint16_t kFlagFastOnly = 4;   // WRITE_ZEROES
constexpr uint16_t kFlagUserCreated = 8;  // SNAPSHOT
// SET_REPLICA_SET: the receiving replica is RW in the set (records it as its last RW set).
// Sent only to a server that announced kFeatureLastRw (an older one refuses the flag).
constexpr uint16_t kFlagSelfRw = 16;
// LAYER_DIGEST: masks only, every sha256 zero (DigestDetail::kMasksOnly). Sent only to a
// server that announced kFeatureDigestMasks (an older one refuses the flag).
constexpr uint16_t kFlagMasksOnly = 32;
// HELLO: the payload names a backing image file (block/replica-endpoint.h,
// ValidBackingFileKey) under the server's backing-files root, not a replica; the connection
// then serves that file read-only (READ and PING; remote/backing-file-replica.h). Sent only
// to a data engine announcing `backing-file-read` over gRPC; an older server refuses the
// flag (PROTOCOL_ERROR, "malformed HELLO").
constexpr uint16_t kFlagBackingFile = 64;
constexpr uint16_t kFlagsKnown = 127;

// Reply state bits (valid only with kStateValid).
constexpr uint16_t kStateValid = 0x8000;
constexpr uint16_t kStateClean = 1;
constexpr uint16_t kStateRebuilding = 2;
// In a CLAIM_EPOCH reply: the replica was clean just before this claim (servers that
// predate it never set it, and their clients then reconcile, as they always did).
constexpr uint16_t kStateWasClean = 4;

// --- Little-endian access. ---
inline void Put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void Put32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline void Put64(uint8_t* p, uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i)); }
inline uint16_t Get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t Get32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
inline uint64_t Get64(const uint8_t* p) { return uint64_t(Get32(p)) | (uint64_t(Get32(p + 4)) << 32); }

struct RequestHeader {
  uint8_t version = kVersion;
  uint8_t op = 0;
  uint16_t flags = 0;
  uint64_t seq = 0;
  uint64_t epoch = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t payload_len = 0;
  uint32_t reserved = 0;
};

struct ReplyHeader {
  uint16_t code = 0;
  uint16_t state = 0;
  uint64_t seq = 0;
  int32_t err = 0;
  uint32_t payload_len = 0;
  uint64_t epoch = 0;
  uint64_t value = 0;
};

inline void EncodeRequest(const RequestHeader& h, uint8_t* p) {
  Put32(p, kRequestMagic);
  p[4] = h.version;
  p[5] = h.op;
  Put16(p + 6, h.flags);
  Put64(p + 8, h.seq);
  Put64(p + 16, h.epoch);
  Put64(p + 24, h.offset);
  Put64(p + 32, h.length);
  Put32(p + 40, h.payload_len);
  Put32(p + 44, h.reserved);
}

// False when the magic is wrong: the stream cannot be trusted any more.
inline bool DecodeRequest(const uint8_t* p, RequestHeader* h) {
  if (Get32(p) != kRequestMagic) return false;
  h->version = p[4];
  h->op = p[5];
  h->flags = Get16(p + 6);
  h->seq = Get64(p + 8);
  h->epoch = Get64(p + 16);
  h->offset = Get64(p + 24);
  h->length = Get64(p + 32);
  h->payload_len = Get32(p + 40);
  h->reserved = Get32(p + 44);
  return true;
}

inline void EncodeReply(const ReplyHeader& h, uint8_t* p) {
  Put32(p, kReplyMagic);
  Put16(p + 4, h.code);
  Put16(p + 6, h.state);
  Put64(p + 8, h.seq);
  Put32(p + 16, static_cast<uint32_t>(h.err));
  Put32(p + 20, h.payload_len);
  Put64(p + 24, h.epoch);
  Put64(p + 32, h.value);
}

inline bool DecodeReply(const uint8_t* p, ReplyHeader* h) {
  if (Get32(p) != kReplyMagic) return false;
  h->code = Get16(p + 4);
  h->state = Get16(p + 6);
  h->seq = Get64(p + 8);
  h->err = static_cast<int32_t>(Get32(p + 16));
  h->payload_len = Get32(p + 20);
  h->epoch = Get64(p + 24);
  h->value = Get64(p + 32);
  return true;
}

// The errno a data-path caller gets for a reply code without one.
inline int ErrnoForCode(Code c) {
  switch (c) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return EINVAL;
    case Code::kNotFound: return ENOENT;
    case Code::kAlreadyExists: return EEXIST;
    case Code::kNoSpace: return ENOSPC;
    case Code::kStaleEpoch: return ESTALE;
    case Code::kBusy: return EBUSY;
    case Code::kClosed: return EBADF;
    case Code::kOutOfRange: return ERANGE;
    case Code::kUnsupported: return ENOTSUP;
    case Code::kUnavailable: return ENOTCONN;
    case Code::kProtocolError: return EPROTO;
    case Code::kUnauthenticated: return EACCES;
    default: return EIO;
  }
}

inline bool ValidCode(uint16_t c) { return c <= static_cast<uint16_t>(Code::kUnauthenticated); }

// --- Payload building and parsing. Strings are u16 length + bytes. ---

class PayloadWriter {
 public:
  explicit PayloadWriter(ByteBuffer* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Grow(2, [&](uint8_t* p) { Put16(p, v); }); }
  void U32(uint32_t v) { Grow(4, [&](uint8_t* p) { Put32(p, v); }); }
  void U64(uint64_t v) { Grow(8, [&](uint8_t* p) { Put64(p, v); }); }
  // resize (which leaves the bytes uninitialised: ByteBuffer) then one memcpy: insert() of a
  // range goes element by element through the allocator's construct, a byte loop.
  void Bytes(const void* b, size_t n) {
    if (n == 0) return;
    const size_t at = out_->size();
    out_->resize(at + n);
    std::memcpy(out_->data() + at, b, n);
  }
  // Strings longer than kMaxWireStringBytes are refused by the reader: callers check.
  void Str(const std::string& s) {
    U16(static_cast<uint16_t>(s.size()));
    Bytes(s.data(), s.size());
  }

 private:
  template <typename F>
  void Grow(size_t n, F f) {
    size_t at = out_->size();
    out_->resize(at + n);
    f(out_->data() + at);
  }
  ByteBuffer* out_;
};

// Bounds-checked reads; any overrun sets ok() false and yields zeros.
class PayloadReader {
 public:
  PayloadReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == n_; }
  size_t left() const { return n_ - pos_; }
  const uint8_t* Take(size_t k) {
    if (!ok_ || k > n_ - pos_) {
      ok_ = false;
      return nullptr;
    }
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  uint8_t U8() { const uint8_t* q = Take(1); return q ? q[0] : 0; }
  uint16_t U16() { const uint8_t* q = Take(2); return q ? Get16(q) : 0; }
  uint32_t U32() { const uint8_t* q = Take(4); return q ? Get32(q) : 0; }
  uint64_t U64() { const uint8_t* q = Take(8); return q ? Get64(q) : 0; }
  std::string Str(size_t max = kMaxWireStringBytes) {
    uint16_t k = U16();
    if (k > max) {
      ok_ = false;
      return std::string();
    }
    const uint8_t* q = Take(k);
    if (!q) return std::string();
    std::string s(reinterpret_cast<const char*>(q), k);
    if (s.find('\0') != std::string::npos) ok_ = false;
    return s;
  }
  void Fail() { ok_ = false; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Replica sets (CLAIM_EPOCH reply, SET_REPLICA_SET request; docs/single-writer.md):
//   u64 epoch (0: none, and nothing follows), u64 generation, u16 n members, n x str,
//   u16 n rw, n x str.
inline void EncodeReplicaSet(const ReplicaSet& set, PayloadWriter* w) {
  w->U64(set.epoch);
  if (set.empty()) return;
  w->U64(set.generation);
  for (const std::vector<std::string>* names : {&set.members, &set.rw}) {
    w->U16(static_cast<uint16_t>(names->size()));
    for (const std::string& n : *names) w->Str(n);
  }
}

// False when malformed (including a set that breaks ReplicaSet's limits).
inline bool DecodeReplicaSet(PayloadReader* in, ReplicaSet* out) {
  *out = ReplicaSet{};
  out->epoch = in->U64();
  if (!in->ok()) return false;
  if (out->epoch == 0) return true;
  out->generation = in->U64();
  for (std::vector<std::string>* names : {&out->members, &out->rw}) {
    const uint16_t n = in->U16();
    if (!in->ok() || n > ReplicaSet::kMaxMembers) return false;
    for (uint16_t i = 0; i < n && in->ok(); ++i) names->push_back(in->Str(ReplicaSet::kMaxNameBytes));
  }
  return in->ok() && out->Invalid().empty();
}

// Layer lists (LIST_LAYERS reply, ADOPT_CHAIN request):
//   u32 count, then per layer: str id, str file, str parent, str name, u8 flags
//   (1 head, 2 removed, 4 user_created), i64 created_ms, u64 size_bytes,
//   u64 allocated_bytes, u16 label count, label count x (str key, str value).
// False when the list does not fit kMaxPayloadBytes or breaks a limit.
inline bool EncodeLayers(const std::vector<LayerInfo>& layers, ByteBuffer* out) {
  if (layers.size() > kMaxLayersPerList) return false;
  PayloadWriter w(out);
  w.U32(static_cast<uint32_t>(layers.size()));
  for (const LayerInfo& l : layers) {
    for (const std::string* s : {&l.id, &l.file, &l.parent, &l.name})
      if (s->size() > kMaxWireStringBytes) return false;
    if (l.labels.size() > kMaxLabelsPerLayer) return false;
    w.Str(l.id);
    w.Str(l.file);
    w.Str(l.parent);
    w.Str(l.name);
    w.U8(static_cast<uint8_t>((l.head ? 1 : 0) | (l.removed ? 2 : 0) | (l.user_created ? 4 : 0)));
    w.U64(static_cast<uint64_t>(l.created_ms));
    w.U64(l.size_bytes);
    w.U64(l.allocated_bytes);
    w.U16(static_cast<uint16_t>(l.labels.size()));
    for (const auto& kv : l.labels) {
      if (kv.first.size() > kMaxWireStringBytes || kv.second.size() > kMaxWireStringBytes) return false;
      w.Str(kv.first);
      w.Str(kv.second);
    }
    if (out->size() > kMaxPayloadBytes) return false;
  }
  return true;
}

inline bool DecodeLayers(PayloadReader* r, std::vector<LayerInfo>* out) {
  uint32_t n = r->U32();
  if (!r->ok() || n > kMaxLayersPerList) return false;
  // Each layer takes at least 35 bytes: a count larger than the payload can hold is a lie.
  if (uint64_t{n} * 35 > r->left()) return false;
  out->clear();
  out->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    LayerInfo l;
    l.id = r->Str();
    l.file = r->Str();
    l.parent = r->Str();
    l.name = r->Str();
    uint8_t f = r->U8();
    if (f & ~7u) return false;
    l.head = f & 1;
    l.removed = f & 2;
    l.user_created = f & 4;
    l.created_ms = static_cast<int64_t>(r->U64());
    l.size_bytes = r->U64();
    l.allocated_bytes = r->U64();
    uint16_t nl = r->U16();
    if (nl > kMaxLabelsPerLayer) return false;
    for (uint16_t k = 0; k < nl; ++k) {
      std::string key = r->Str();
      std::string val = r->Str();
      l.labels[key] = val;
    }
    if (!r->ok()) return false;
    out->push_back(std::move(l));
  }
  return r->ok();
}

inline bool EncodeLabels(const Labels& labels, PayloadWriter* w) {
  if (labels.size() > kMaxLabelsPerLayer) return false;
  w->U16(static_cast<uint16_t>(labels.size()));
  for (const auto& kv : labels) {
    if (kv.first.size() > kMaxWireStringBytes || kv.second.size() > kMaxWireStringBytes) return false;
    w->Str(kv.first);
    w->Str(kv.second);
  }
  return true;
}

inline bool DecodeLabels(PayloadReader* r, Labels* out) {
  uint16_t n = r->U16();
  if (n > kMaxLabelsPerLayer) return false;
  for (uint16_t k = 0; k < n; ++k) {
    std::string key = r->Str();
    std::string val = r->Str();
    (*out)[key] = val;
  }
  return r->ok();
}

// HELLO reply payload: u32 server's in-flight request limit per connection, u32 its
// largest I/O payload (kMaxIoBytes), u64 feature bits (kFeature*; 0 from servers that
// predate them, which sent the field as reserved zeros). Size in `value`, state in the header.
constexpr uint32_t kHelloReplyBytes = 16;
// The server knows kOpGrow, and every reply that carries state (kStateValid) carries the
// replica's size in `value` (older servers leave it 0 there).
constexpr uint64_t kFeatureGrow = 1;
// GOAWAY. From a server: it knows kOpClientFeatures and may send GOAWAY to clients that
// announced this bit with it. From a client (in CLIENT_FEATURES): it handles GOAWAY.
constexpr uint64_t kFeatureGoAway = 2;
// The server knows kOpLastRw and kFlagSelfRw.
constexpr uint64_t kFeatureLastRw = 4;
// The server knows kFlagMasksOnly on LAYER_DIGEST.
constexpr uint64_t kFeatureDigestMasks = 8;
constexpr uint64_t kFeaturesKnown = kFeatureGrow | kFeatureGoAway | kFeatureLastRw | kFeatureDigestMasks;
// The server was given a backing-files root and takes kFlagBackingFile on HELLO (announced
// beside kFeaturesKnown by such servers only).
constexpr uint64_t kFeatureBackingFiles = 16;

// GOAWAY: a reply frame with seq 0 and this code (outside util/status.h's Code range, so no
// client that did not ask for it could take it for an answer), errno 0, no payload. The
// server answers every request it receives until the client half-closes, then closes.
constexpr uint16_t kCodeGoAway = 0x100;

}  // namespace rp
}  // namespace mooring
