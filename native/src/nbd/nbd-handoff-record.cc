#include "nbd/nbd-handoff-record.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>
#include <set>

namespace mooring {

namespace {

constexpr uint32_t kRecordMagic = 0x4e424448;  // "NBDH"
// Bumped for any change of layout or meaning: a receiver refuses versions it does not know.
constexpr uint32_t kRecordVersion = 1;
constexpr uint32_t kStringMax = 4096;

// Little-endian, fixed width, length-prefixed strings and byte runs.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Int(v, 2); }
  void U32(uint32_t v) { Int(v, 4); }
  void U64(uint64_t v) { Int(v, 8); }
  void Bytes(const void* p, size_t n) {
    U32(static_cast<uint32_t>(n));
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void Str(const std::string& s) { Bytes(s.data(), s.size()); }

 private:
  void Int(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t>* out_;
};

// Every read is bounds-checked; the first failure sticks and later reads return zeros.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == n_; }
  uint8_t U8() { return static_cast<uint8_t>(Int(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Int(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Int(4)); }
  uint64_t U64() { return Int(8); }
  bool Bool() {
    uint8_t v = U8();
    if (v > 1) ok_ = false;
    return v == 1;
  }
  bool Bytes(size_t max, std::vector<uint8_t>* out) {
    uint32_t n = U32();
    if (!ok_ || n > max || n > n_ - pos_) return ok_ = false;
    out->assign(p_ + pos_, p_ + pos_ + n);
    pos_ += n;
    return true;
  }
  bool Str(size_t max, std::string* out) {
    std::vector<uint8_t> b;
    if (!Bytes(max, &b)) return false;
    // An empty vector's data() may be null, and memchr(nullptr, 0, 0) is undefined.
    if (!b.empty() && memchr(b.data(), 0, b.size())) return ok_ = false;
    out->assign(b.begin(), b.end());
    return true;
  }

 private:
  uint64_t Int(int n) {
    if (!ok_ || static_cast<size_t>(n) > n_ - pos_) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t{p_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

Status Bad(const std::string& what) {
  return Status::Error(Code::kProtocolError, "NBD hand-off record: " + what, EPROTO);
}

// A stream socket, listening or not as expected: anything else passed as one is refused
// before a thread ever reads from it.
Status CheckSocket(int fd, bool listening, const std::string& what) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return Bad(what + " is not a socket");
  int type = 0, acc = 0, domain = 0;
  socklen_t l1 = sizeof type, l2 = sizeof acc, l3 = sizeof domain;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l1) != 0 || type != SOCK_STREAM) return Bad(what + " is not a stream socket");
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l3) != 0 ||
      (domain != AF_UNIX && domain != AF_INET && domain != AF_INET6)) {
    return Bad(what + " is not a unix or TCP socket");
  }
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l2) != 0 || (acc != 0) != listening) {
    return Bad(what + (listening ? " is not listening" : " is a listening socket"));
  }
  return Status::Ok();
}

}  // namespace

Status NbdHandOffRecords::Encode(NbdServerRecord* rec, HandOffRecord* out) {
  if (rec->connections.size() > kConnectionsMax || rec->fds.size() != rec->connections.size() + 1) {
    return Status::Error(Code::kInvalidArgument, "NBD hand-off record: fds do not match its connections");
  }
  out->kind = kHandOffKindNbdServer;
  out->bytes.clear();
  Writer w(&out->bytes);
  w.U32(kRecordMagic);
  w.U32(kRecordVersion);
  w.Str(rec->unix_path);
  w.U32(static_cast<uint32_t>(rec->tcp_port));
  w.Str(rec->export_name);
  w.Str(rec->description);
  w.U8(rec->read_only);
  w.U32(rec->max_request_bytes);
  w.U8(rec->own_socket_file);
  w.U64(rec->sock_dev);
  w.U64(rec->sock_ino);
  w.U64(rec->next_connection_id);
  w.U64(rec->connections_total);
  w.U64(rec->requests);
  w.U64(rec->bytes_read);
  w.U64(rec->bytes_written);
  w.U64(rec->protocol_errors);
  w.U32(static_cast<uint32_t>(rec->connections.size()));
  for (const NbdConnectionRecord& c : rec->connections) {
    w.U64(c.id);
    w.U64(c.size);
    w.U32(c.max_request_bytes);
    w.U16(c.transmission_flags);
    w.U8(c.no_zeroes);
    w.U8(c.structured);
    w.U8(c.meta_base_allocation);
    w.U32(c.meta_context_id);
    w.Bytes(c.pending.data(), c.pending.size());
  }
  if (out->bytes.size() > HandOffChannel::kRecordBytesMax) {
    return Status::Error(Code::kInvalidArgument, "NBD hand-off record larger than a hand-off record may be");
  }
  out->fds = std::move(rec->fds);
  return Status::Ok();
}

Status NbdHandOffRecords::Decode(HandOffRecord* in, NbdServerRecord* out) {
  HandOffFds fds = std::move(in->fds);  // closed on every error return
  if (in->kind != kHandOffKindNbdServer) return Bad("record kind " + std::to_string(in->kind) + " is not an NBD export");
  Reader r(in->bytes.data(), in->bytes.size());
  NbdServerRecord rec;
  if (r.U32() != kRecordMagic) return Bad("bad magic");
  uint32_t version = r.U32();
  if (r.ok() && version != kRecordVersion) return Bad("version " + std::to_string(version) + " is not one this build reads");
  r.Str(sizeof(sockaddr_un::sun_path) - 1, &rec.unix_path);
  rec.tcp_port = static_cast<int>(r.U32());
  r.Str(kStringMax, &rec.export_name);
  r.Str(kStringMax, &rec.description);
  rec.read_only = r.Bool();
  rec.max_request_bytes = r.U32();
  rec.own_socket_file = r.Bool();
  rec.sock_dev = r.U64();
  rec.sock_ino = r.U64();
  rec.next_connection_id = r.U64();
  rec.connections_total = r.U64();
  rec.requests = r.U64();
  rec.bytes_read = r.U64();
  rec.bytes_written = r.U64();
  rec.protocol_errors = r.U64();
  uint32_t n = r.U32();
  if (!r.ok()) return Bad("truncated or malformed header");
  if (rec.tcp_port < 0 || rec.tcp_port > 65535) return Bad("port out of range");
  if (n > kConnectionsMax) return Bad(std::to_string(n) + " connections is over the limit");
  rec.connections.resize(n);
  for (NbdConnectionRecord& c : rec.connections) {
    c.id = r.U64();
    c.size = r.U64();
    c.max_request_bytes = r.U32();
    c.transmission_flags = r.U16();
    c.no_zeroes = r.Bool();
    c.structured = r.Bool();
    c.meta_base_allocation = r.Bool();
    c.meta_context_id = r.U32();
    r.Bytes(kPendingBytesMax, &c.pending);
    if (!r.ok()) return Bad("truncated or malformed connection entry");
    if (c.id == 0 || c.id >= rec.next_connection_id) return Bad("connection id " + std::to_string(c.id) + " out of range");
    if (c.meta_base_allocation && !c.structured) return Bad("base:allocation without structured replies");
  }
  if (!r.done()) return Bad(r.ok() ? "trailing bytes" : "truncated");
  std::set<uint64_t> ids;
  for (const NbdConnectionRecord& c : rec.connections) {
    if (!ids.insert(c.id).second) return Bad("connection id " + std::to_string(c.id) + " appears twice");
  }
  if (fds.size() != n + 1) {
    return Bad("carries " + std::to_string(fds.size()) + " fds for " + std::to_string(n) + " connections (expected " +
               std::to_string(n + 1) + ")");
  }
  Status st = CheckSocket(fds.at(0), true, "the listening fd");
  for (uint32_t i = 0; st.ok() && i < n; ++i) st = CheckSocket(fds.at(i + 1), false, "connection fd " + std::to_string(i));
  if (!st.ok()) return st;
  rec.fds = std::move(fds);
  *out = std::move(rec);
  return Status::Ok();
}

}  // namespace mooring
