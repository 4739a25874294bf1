// BlockDevice: what a frontend (the NBD server) serves. The Engine implements it; tests
// and the NBD server's own harness may use an in-memory implementation.
//
// Every method is called concurrently from many I/O threads and must be thread-safe.
// Return 0 or a negative errno. Offsets and lengths have already been checked by the
// caller against size() (off + len <= size()); implementations check again and return
// -EINVAL for out-of-range ranges rather than trusting the caller.
#pragma once

#include <cerrno>
#include <cstdint>
#include <vector>

namespace mooring {

// NBD base:allocation flags.
constexpr uint32_t kExtentHole = 1u << 0;  // no storage allocated
constexpr uint32_t kExtentZero = 1u << 1;  // reads as zero

// True if [off, off + len) lies inside a device of `size` bytes; never overflows, so
// hostile offsets near 2^64 are refused rather than wrapped.
inline bool InRange(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

struct Extent {
  uint64_t length;
  uint32_t flags;  // kExtentHole | kExtentZero, or 0 for data
};

// Where an asynchronous read or write (BlockDevice::ReadAsync, WriteAsync) ends: IoDone
// runs exactly once.
struct IoCompletion {
  virtual void IoDone(int rc) = 0;

 protected:
  ~IoCompletion() = default;
};

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  virtual uint64_t size() const = 0;

  virtual int Read(uint64_t off, uint32_t len, uint8_t* buf) = 0;
  // A Read done only if it cannot wait: 0 with `buf` filled, else -EWOULDBLOCK (`buf`
  // unspecified) whenever it might wait or fail (a lock held, bytes not in the page cache,
  // another host to ask, an error to report): the caller then calls Read or ReadAsync. For
  // the NBD connection loop, which answers such reads itself instead of handing them to a
  // worker. By default it never can.
  virtual int TryRead(uint64_t off, uint32_t len, uint8_t* buf) {
    (void)off, (void)len, (void)buf;
    return -EWOULDBLOCK;
  }
  // Read, answered through done->IoDone(rc) as WriteAsync is; `buf` is filled by then.
  virtual void ReadAsync(uint64_t off, uint32_t len, uint8_t* buf, IoCompletion* done) noexcept {
    int rc;
    try {
      rc = Read(off, len, buf);
    } catch (...) {
      rc = -EIO;
    }
    done->IoDone(rc);
  }
  // fua: durable before return.
  virtual int Write(uint64_t off, uint32_t len, const uint8_t* buf, bool fua) = 0;
  // Write, answered through done->IoDone(rc) instead of a return value, possibly before
  // this returns, possibly later on another thread. A device that waits for other hosts
  // (the Engine over remote replicas) returns once the write is sent, and the thread that
  // reads the last answer finishes it: no thread is held waiting. `buf` must stay valid
  // until IoDone. Never throws. By default: Write, then IoDone.
  virtual void WriteAsync(uint64_t off, uint32_t len, const uint8_t* buf, bool fua, IoCompletion* done) noexcept {
    int rc;
    try {
      rc = Write(off, len, buf, fua);
    } catch (...) {
      rc = -EIO;
    }
    done->IoDone(rc);
  }
  // One of several writes handed over together (WriteAsyncMany).
  struct AsyncWriteReq {
    uint64_t off;
    uint32_t len;
    const uint8_t* buf;
    bool fua;
    IoCompletion* done;
  };
  // WriteAsync for each of q[0..n), started in that order. A device that sends its writes
  // to other hosts may send them together (one message per host for the lot, not one per
  // write). The caller touches none of the requests' completions after this. By default:
  // WriteAsync, one by one.
  virtual void WriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept {
    for (size_t i = 0; i < n; ++i) WriteAsync(q[i].off, q[i].len, q[i].buf, q[i].fua, q[i].done);
  }
  // For a caller that must not wait (the NBD connection loop): starts the longest prefix of
  // q[0..n) that it can start as WriteAsyncMany would without waiting for anything, and
  // returns its length; the caller keeps the rest (for WriteAsyncMany on a thread that may
  // wait). By default none.
  virtual size_t TryWriteAsyncMany(const AsyncWriteReq* q, size_t n) noexcept {
    (void)q, (void)n;
    return 0;
  }
  // One of several reads handed over together (ReadAsyncMany).
  struct AsyncReadReq {
    uint64_t off;
    uint32_t len;
    uint8_t* buf;
    IoCompletion* done;
  };
  // ReadAsync for each of q[0..n), as WriteAsyncMany does for writes.
  virtual void ReadAsyncMany(const AsyncReadReq* q, size_t n) noexcept {
    for (size_t i = 0; i < n; ++i) ReadAsync(q[i].off, q[i].len, q[i].buf, q[i].done);
  }
  // Whether WriteAsyncMany and ReadAsyncMany do better than one call per request (an Engine
  // whose RW replicas are all on other hosts: one message per replica for the lot). A hint,
  // for a caller that must not wait (the NBD connection loop): false by default, and
  // whenever answering would wait. The NBD server then spreads requests over its workers.
  virtual bool GroupsRequests() { return false; }
  // Everything written (and replied to) before this call is durable on return.
  virtual int Flush() = 0;
  // Discard: the range may read as anything afterwards; space is released where possible.
  virtual int Trim(uint64_t off, uint32_t len, bool fua) = 0;
  // The range reads as zeros afterwards. may_trim: storage may be released (NBD flag
  // NO_HOLE not set). fast_only: return -ENOTSUP instead of writing zeros the slow way
  // (NBD FAST_ZERO).
  virtual int WriteZeroes(uint64_t off, uint32_t len, bool may_trim, bool fast_only, bool fua) = 0;
  // Allocation state of [off, off+len): extents in order, lengths summing to at most len
  // and at least one extent. max_extents bounds the vector (NBD REQ_ONE sets it to 1).
  virtual int BlockStatus(uint64_t off, uint32_t len, uint32_t max_extents, std::vector<Extent>* out) = 0;
  // Whether BlockStatus costs about as little as a lookup in memory (true by default). An
  // Engine whose RW replicas are all on other hosts says false: there each call is a round
  // trip, so the NBD server sends a structured READ as one data chunk (holes read as zeros)
  // instead of asking where the holes are before reading.
  virtual bool BlockStatusIsCheap() { return true; }
  // Prefetch hint; may do nothing.
  virtual int Cache(uint64_t off, uint32_t len) = 0;
};

}  // namespace mooring
