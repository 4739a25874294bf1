// HandOffChannel: the link over which one process of a host hands live sockets (an NBD
// export's listening socket and its client connections) to another process of the same
// host (docs/nbd-frontend.md, "Hand-off of an export between processes").
//
// AF_UNIX SOCK_SEQPACKET, so message boundaries survive and every fd arrives (SCM_RIGHTS)
// together with the message that announced it: the receiver never guesses where a record
// ends or which fds belong to it. Not Node's IPC: that needs a parent/child pair, and it
// hands a socket to libuv, which reads the client's requests into JS (upgrade-design §3.3).
//
// A record is `kind` + bytes (at most kRecordBytesMax) + fds (at most kRecordFdsMax). It
// travels as messages of one fixed header, at most kChunkBytes of its bytes and at most
// kMessageFdsMax fds (the kernel's SCM_MAX_FD). A message that disagrees with what the
// record's first message announced, a truncated message (MSG_TRUNC, MSG_CTRUNC: fds the
// kernel could not install), or any control message but SCM_RIGHTS breaks the channel:
// every fd received for that record is closed, and every later call fails with the first
// error. Received fds are close-on-exec (MSG_CMSG_CLOEXEC).
//
// Calls block (run them off the JS thread); Close() wakes them. One Send and one Receive
// may run at the same time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "util/status.h"

namespace mooring {

// Owned fds: closed (close only, never shutdown) unless taken.
class HandOffFds {
 public:
  HandOffFds() = default;
  ~HandOffFds() { CloseAll(); }
  HandOffFds(HandOffFds&& o) noexcept : fds_(std::move(o.fds_)) { o.fds_.clear(); }
  HandOffFds& operator=(HandOffFds&& o) noexcept;
  HandOffFds(const HandOffFds&) = delete;
  HandOffFds& operator=(const HandOffFds&) = delete;

  void Add(int fd) { fds_.push_back(fd); }
  size_t size() const { return fds_.size(); }
  int at(size_t i) const { return fds_[i]; }
  const std::vector<int>& all() const { return fds_; }
  // The fd at i, now the caller's (-1 left in its place).
  int Take(size_t i);
  void CloseAll();

 private:
  std::vector<int> fds_;
};

struct HandOffRecord {
  uint16_t kind = 0;
  std::vector<uint8_t> bytes;
  HandOffFds fds;
};

class HandOffChannel {
 public:
  static constexpr uint32_t kRecordBytesMax = 1u << 20;
  static constexpr uint32_t kRecordFdsMax = 4097;   // a listening socket + 4096 connections
  static constexpr uint32_t kChunkBytes = 64u << 10;  // fits the default socket buffers
  static constexpr uint32_t kMessageFdsMax = 253;     // SCM_MAX_FD
  static constexpr uint16_t kKindMax = 0x7fff;

  ~HandOffChannel();
  HandOffChannel(const HandOffChannel&) = delete;
  HandOffChannel& operator=(const HandOffChannel&) = delete;

  // Connects to a HandOffListener at path; the listener's process must run as our uid or
  // as root (SO_PEERCRED).
  static Status Connect(const std::string& path, int timeout_ms, std::shared_ptr<HandOffChannel>* out);

  Status Send(const HandOffRecord& rec, int timeout_ms);
  Status Receive(int timeout_ms, HandOffRecord* out);
  // Wakes blocked calls (they fail with kClosed); the socket is closed with the object.
  void Close();
  // For a record the caller found bad after Receive: every later call fails with `st`.
  Status Abort(Status st) { return Break(std::move(st)); }

  pid_t peer_pid() const { return peer_pid_; }
  uid_t peer_uid() const { return peer_uid_; }

 private:
  friend class HandOffListener;
  HandOffChannel(int fd, int wake_fd) : fd_(fd), wake_fd_(wake_fd) {}
  static Status Adopt(int fd, std::shared_ptr<HandOffChannel>* out);

  // Waits for `events` on the socket until deadline_ms (0: forever).
  Status Wait(short events, int64_t deadline_ms, const char* what);
  Status Break(Status st);  // records the first error, returns it
  Status Broken();
  Status ReceiveLocked(int timeout_ms, HandOffRecord* out);

  const int fd_;
  const int wake_fd_;
  pid_t peer_pid_ = 0;
  uid_t peer_uid_ = 0;
  std::atomic<bool> closed_{false};
  std::mutex send_mu_;
  std::mutex recv_mu_;
  std::mutex state_mu_;
  Status broken_;  // guarded by state_mu_
};

// The listening end: a socket file created with mode 0600, removed by Close() only while it
// is still the one this listener created (device and inode checked).
class HandOffListener {
 public:
  ~HandOffListener();
  HandOffListener(const HandOffListener&) = delete;
  HandOffListener& operator=(const HandOffListener&) = delete;

  static Status Listen(const std::string& path, std::unique_ptr<HandOffListener>* out);
  // The next peer of an allowed uid (others are closed and waited past).
  Status Accept(int timeout_ms, std::shared_ptr<HandOffChannel>* out);
  void Close();
  const std::string& path() const { return path_; }

 private:
  HandOffListener() = default;

  std::string path_;
  int fd_ = -1;
  int wake_fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::atomic<bool> closed_{false};
  std::mutex accept_mu_;
  std::mutex close_mu_;
  bool unlinked_ = false;
};

}  // namespace mooring
