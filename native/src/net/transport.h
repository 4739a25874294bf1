// Transport: a connected socket as the replica protocol (plain TCP or mutual TLS, server and
// client) and a TLS NBD connection use it. Every call is non-blocking: threads wait for
// the socket with poll() outside any lock, and the TLS object is only touched under the
// transport's own mutex (OpenSSL objects must not be used by two threads at once; a reader
// and a writer thread share one connection).
//
// TLS uses the OpenSSL 3 that Node itself exports (headers from Node's include dir): the
// addon only ever runs inside node, so it does not link libssl.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "block/replica-endpoint.h"
#include "util/status.h"

namespace mooring {

int64_t MonotonicMs();

class Transport {
 public:
  explicit Transport(int fd) : fd_(fd) {}
  virtual ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int fd() const { return fd_; }
  // Bytes moved (> 0); 0 when the peer closed (Read); -EAGAIN with *want set to the poll
  // events to wait for; or another negative errno (-EPROTO for a TLS failure).
  virtual ssize_t Read(void* buf, size_t n, short* want) = 0;
  virtual ssize_t Writev(const iovec* iov, int count, short* want) = 0;
  // TLS handshake (no-op for plain TCP), waiting at most until deadline_ms (MonotonicMs),
  // or until wake_fd (if >= 0) becomes readable.
  virtual Status Handshake(int64_t deadline_ms, int wake_fd) { return Status::Ok(); }
  // Bytes already taken from the socket and ready to Read (TLS: decrypted, not yet read),
  // which poll() on fd() cannot see.
  virtual size_t Pending() { return 0; }
  // Any thread: ends both directions, so blocked pollers wake up.
  void Shutdown();
  // Ends our direction only (TLS: close_notify first, best effort); the peer reads EOF and
  // may still send. The GOAWAY half-close (docs/replica-protocol.md).
  virtual void ShutdownWrite();

 protected:
  const int fd_;
};

std::unique_ptr<Transport> MakePlainTransport(int fd);

// A TLS configuration made ready for connections (certificate, key and CA parsed once).
class TlsContext {
 public:
  // server: peers must present a certificate signed by cfg.ca_pem (mutual TLS).
  static Status Create(const TlsConfig& cfg, bool server, std::shared_ptr<TlsContext>* out);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // Takes ownership of fd (closed on failure). Client side: server_name, when not empty,
  // must match the server's certificate (DNS name, or IP address).
  Status Wrap(int fd, const std::string& server_name, std::unique_ptr<Transport>* out);

 private:
  TlsContext() = default;
  void* ctx_ = nullptr;  // SSL_CTX*
  bool server_ = false;
};

// What a thread does when the transport said -EAGAIN: wait for `want` (or give up with a
// negative errno). Returns 0 to retry.
using WaitFn = std::function<int(short want)>;

// Polls fd for `events` and wake_fd (if >= 0) for input, at most timeout_ms (-1: no limit).
// Returns 1 fd ready, 2 woken (wake fd drained), 0 timeout, -errno on poll failure.
int PollFdOrWake(int fd, short events, int wake_fd, int timeout_ms);

// Sends all of iov (modified in place while advancing).
int WriteAll(Transport* t, iovec* iov, int count, const WaitFn& wait);

// A receive buffer in front of a transport: headers are taken from it, large payloads
// read straight into their destination.
class RecvBuffer {
 public:
  static constexpr size_t kBytes = 64u << 10;
  RecvBuffer() : buf_(new uint8_t[kBytes]) {}
  // 0 when n bytes were read; -ECONNRESET if the peer closed (at a frame boundary when
  // *clean_eof is set by the caller to be checked), or the error from the transport/wait.
  int ReadExact(Transport* t, void* dst, size_t n, const WaitFn& wait, bool* eof_at_start = nullptr);
  // Without waiting: up to n bytes (> 0, from the buffer or one read of the transport); 0
  // when the peer closed; -EAGAIN with *want set to the poll events to wait for; or the
  // transport's error. For readers driven by a connection loop (net/poller.h).
  ssize_t ReadSome(Transport* t, void* dst, size_t n, short* want);
  size_t buffered() const { return end_ - pos_; }

 private:
  std::unique_ptr<uint8_t[]> buf_;
  size_t pos_ = 0;
  size_t end_ = 0;
};

// Connects to host:port over TCP (non-blocking socket, TCP_NODELAY) before deadline_ms.
// kUnavailable when nothing answers or the connection is refused.
Status ConnectTcp(const std::string& host, uint16_t port, int64_t deadline_ms, int* fd);

}  // namespace mooring
