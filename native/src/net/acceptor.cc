#include "net/acceptor.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <sys/un.h>

#include <cstring>
#include <mutex>

namespace mooring {

Status SocketStatus(int err, const std::string& what) {
  if (err == EADDRINUSE) return Status::Error(Code::kAddressInUse, what + ": address in use", err);
  return Status::FromErrno(err, what + ": " + strerror(err));
}

Status ListenTcp(const std::string& host_in, int port_in, int* out_fd, int* bound_port) {
  if (port_in < 0 || port_in > 65535) return Status::Error(Code::kInvalidArgument, "port out of range: " + std::to_string(port_in));
  const std::string host = host_in.empty() ? "127.0.0.1" : host_in;
  const std::string port = std::to_string(port_in);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int g = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (g != 0) return Status::Error(Code::kInvalidArgument, "cannot resolve " + host + ": " + gai_strerror(g));
  Status last = Status::Error(Code::kInvalidArgument, "no address for " + host);
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = SocketStatus(errno, "socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, kListenBacklog) != 0) {
      last = SocketStatus(errno, "binding " + host + ":" + port);
      close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    *bound_port = port_in;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) == 0) {
      if (ss.ss_family == AF_INET) *bound_port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      if (ss.ss_family == AF_INET6) *bound_port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    }
    *out_fd = fd;
    last = Status::Ok();
    break;
  }
  freeaddrinfo(res);
  return last;
}

std::string PeerKey(int fd) {
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) return std::string();
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &a->sin_addr, text, sizeof text)) return std::string();
    return std::string("ip:") + text;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      in_addr v4;
      memcpy(&v4, a->sin6_addr.s6_addr + 12, sizeof v4);
      if (!inet_ntop(AF_INET, &v4, text, sizeof text)) return std::string();
    } else if (!inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text)) {
      return std::string();
    }
    return std::string("ip:") + text;
  }
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return std::string();
    return "uid:" + std::to_string(cred.uid);
  }
  return std::string();
}

void LimitAllocatorRetention() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] { mallopt(M_MMAP_THRESHOLD, kLargeBufferBytes); });
#endif
}

void ReturnFreeMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace mooring
