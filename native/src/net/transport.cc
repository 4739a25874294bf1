#include "net/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace mooring {

int64_t MonotonicMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

Transport::~Transport() { close(fd_); }

void Transport::Shutdown() { shutdown(fd_, SHUT_RDWR); }

void Transport::ShutdownWrite() { shutdown(fd_, SHUT_WR); }

namespace {

class PlainTransport final : public Transport {
 public:
  explicit PlainTransport(int fd) : Transport(fd) {}

  ssize_t Read(void* buf, size_t n, short* want) override {
    for (;;) {
      ssize_t r = recv(fd_, buf, n, 0);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *want = POLLIN;
        return -EAGAIN;
      }
      return -errno;
    }
  }

  ssize_t Writev(const iovec* iov, int count, short* want) override {
    for (;;) {
      msghdr m{};
      m.msg_iov = const_cast<iovec*>(iov);
      m.msg_iovlen = std::min(count, IOV_MAX);
      ssize_t r = sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r >= 0) return r;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *want = POLLOUT;
        return -EAGAIN;
      }
      return -errno;
    }
  }
};

std::string OpenSslErrors() {
  std::string out;
  unsigned long e;
  char buf[256];
  while ((e = ERR_get_error()) != 0) {
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown TLS error" : out;
}

// One SSL object shared by a reader and a writer thread: every SSL_* call under mu_.
class TlsTransport final : public Transport {
 public:
  TlsTransport(int fd, SSL* ssl) : Transport(fd), ssl_(ssl) {}
  ~TlsTransport() override { SSL_free(ssl_); }

  ssize_t Read(void* buf, size_t n, short* want) override {
    std::lock_guard<std::mutex> lk(mu_);
    ERR_clear_error();
    size_t got = 0;
    int r = SSL_read_ex(ssl_, buf, n, &got);
    if (r == 1) return static_cast<ssize_t>(got);
    return Failure(r, want, true);
  }

  ssize_t Writev(const iovec* iov, int count, short* want) override {
    // One record's worth at a time: small frames (a header and its payload) go out as one
    // record instead of one each. A retry after WANT_* gathers the same leading bytes,
    // as OpenSSL requires (moving buffers are allowed).
    size_t n = 0;
    for (int i = 0; i < count && n < kGatherBytes; ++i) {
      size_t k = std::min(iov[i].iov_len, kGatherBytes - n);
      memcpy(gather_ + n, iov[i].iov_base, k);
      n += k;
    }
    std::lock_guard<std::mutex> lk(mu_);
    ERR_clear_error();
    size_t put = 0;
    int r = SSL_write_ex(ssl_, gather_, n, &put);
    if (r == 1) return static_cast<ssize_t>(put);
    return Failure(r, want, false);
  }

  size_t Pending() override {
    std::lock_guard<std::mutex> lk(mu_);
    int n = SSL_pending(ssl_);
    return n > 0 ? static_cast<size_t>(n) : 0;
  }

  void ShutdownWrite() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ERR_clear_error();
      SSL_shutdown(ssl_);  // sends close_notify (non-blocking: best effort)
      ERR_clear_error();
    }
    Transport::ShutdownWrite();
  }

  Status Handshake(int64_t deadline_ms, int wake_fd) override {
    for (;;) {
      short want = 0;
      {
        std::lock_guard<std::mutex> lk(mu_);
        ERR_clear_error();
        int r = SSL_do_handshake(ssl_);
        if (r == 1) return Status::Ok();
        int e = SSL_get_error(ssl_, r);
        if (e == SSL_ERROR_WANT_READ) {
          want = POLLIN;
        } else if (e == SSL_ERROR_WANT_WRITE) {
          want = POLLOUT;
        } else {
          std::string why;
          long v = SSL_get_verify_result(ssl_);
          if (v != X509_V_OK) why = std::string("certificate verify failed: ") + X509_verify_cert_error_string(v);
          else if (e == SSL_ERROR_SYSCALL && errno != 0) why = strerror(errno);
          else if (e == SSL_ERROR_SYSCALL) why = "connection closed during the TLS handshake";
          else why = OpenSslErrors();
          return Status::Error(Code::kUnavailable, "TLS handshake failed: " + why, EPROTO);
        }
      }
      int64_t left = deadline_ms - MonotonicMs();
      if (left <= 0) return Status::Error(Code::kUnavailable, "TLS handshake timed out", ETIMEDOUT);
      int p = PollFdOrWake(fd_, want, wake_fd, static_cast<int>(left));
      if (p == 2) return Status::Error(Code::kClosed, "TLS handshake interrupted", ESHUTDOWN);
      if (p < 0) return Status::FromErrno(p, "poll during the TLS handshake");
    }
  }

 private:
  static constexpr size_t kGatherBytes = 16u << 10;  // one TLS record

  ssize_t Failure(int r, short* want, bool reading) {
    int e = SSL_get_error(ssl_, r);
    switch (e) {
      case SSL_ERROR_WANT_READ:
        *want = POLLIN;
        return -EAGAIN;
      case SSL_ERROR_WANT_WRITE:
        *want = POLLOUT;
        return -EAGAIN;
      case SSL_ERROR_ZERO_RETURN:
        return reading ? 0 : -EPIPE;
      case SSL_ERROR_SYSCALL:
        // OpenSSL 3 reports an EOF without close_notify as SSL_ERROR_SSL; errno 0 here
        // means the same thing from older paths.
        if (errno != 0 && errno != EAGAIN) return -errno;
        return reading ? 0 : -EPIPE;
      default: {
        unsigned long le = ERR_peek_error();
        ERR_clear_error();
        if (reading && ERR_GET_REASON(le) == SSL_R_UNEXPECTED_EOF_WHILE_READING) return 0;
        return -EPROTO;
      }
    }
  }

  std::mutex mu_;
  SSL* ssl_;
  uint8_t gather_[kGatherBytes];
};

int BioRead(BIO* bio, std::vector<X509*>* certs) {
  for (;;) {
    X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    if (!x) break;
    certs->push_back(x);
  }
  ERR_clear_error();  // the end of the PEM text reads as an error
  return static_cast<int>(certs->size());
}

Status ParseCerts(const std::string& pem, const char* what, std::vector<X509*>* out) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (!bio) return Status::Error(Code::kIoError, "out of memory reading TLS material");
  BioRead(bio, out);
  BIO_free(bio);
  if (out->empty()) return Status::Error(Code::kInvalidArgument, std::string("tls.") + what + ": no PEM certificate found");
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Transport> MakePlainTransport(int fd) { return std::unique_ptr<Transport>(new PlainTransport(fd)); }

TlsContext::~TlsContext() {
  if (ctx_) SSL_CTX_free(static_cast<SSL_CTX*>(ctx_));
}

Status TlsContext::Create(const TlsConfig& cfg, bool server, std::shared_ptr<TlsContext>* out) {
  if (!cfg.enabled()) return Status::Error(Code::kInvalidArgument, "TLS needs cert, key and ca");
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (!ctx) return Status::Error(Code::kIoError, "SSL_CTX_new: " + OpenSslErrors());
  std::shared_ptr<TlsContext> c(new TlsContext());
  c->ctx_ = ctx;
  c->server_ = server;
  // Both ends are ours: TLS 1.3 only (no renegotiation, so a read never has to write).
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (server) {
    SSL_CTX_set_num_tickets(ctx, 0);  // no session resumption: nothing to send after the handshake
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  }

  std::vector<X509*> chain;
  Status st = ParseCerts(cfg.cert_pem, "cert", &chain);
  if (!st.ok()) return st;
  bool ok = SSL_CTX_use_certificate(ctx, chain[0]) == 1;
  X509_free(chain[0]);
  for (size_t i = 1; i < chain.size(); ++i) {
    if (ok && SSL_CTX_add0_chain_cert(ctx, chain[i]) == 1) continue;  // owns it now
    X509_free(chain[i]);
    ok = false;
  }
  if (!ok) return Status::Error(Code::kInvalidArgument, "tls.cert: " + OpenSslErrors());

  BIO* kb = BIO_new_mem_buf(cfg.key_pem.data(), static_cast<int>(cfg.key_pem.size()));
  EVP_PKEY* key = kb ? PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr) : nullptr;
  if (kb) BIO_free(kb);
  if (!key) return Status::Error(Code::kInvalidArgument, "tls.key: no PEM private key found (" + OpenSslErrors() + ")");
  ok = SSL_CTX_use_PrivateKey(ctx, key) == 1;
  EVP_PKEY_free(key);
  if (!ok || SSL_CTX_check_private_key(ctx) != 1)
    return Status::Error(Code::kInvalidArgument, "tls.key does not match tls.cert: " + OpenSslErrors());

  std::vector<X509*> cas;
  st = ParseCerts(cfg.ca_pem, "ca", &cas);
  if (!st.ok()) return st;
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  ok = true;
  for (X509* x : cas) {
    if (X509_STORE_add_cert(store, x) != 1) ok = false;
    X509_free(x);
  }
  if (!ok) return Status::Error(Code::kInvalidArgument, "tls.ca: " + OpenSslErrors());
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), nullptr);
  *out = std::move(c);
  return Status::Ok();
}

Status TlsContext::Wrap(int fd, const std::string& server_name, std::unique_ptr<Transport>* out) {
  ERR_clear_error();
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(ctx_));
  if (!ssl) {
    close(fd);
    return Status::Error(Code::kIoError, "SSL_new: " + OpenSslErrors());
  }
  std::unique_ptr<Transport> t(new TlsTransport(fd, ssl));  // owns fd and ssl from here
  if (SSL_set_fd(ssl, fd) != 1) return Status::Error(Code::kIoError, "SSL_set_fd: " + OpenSslErrors());
  if (server_) {
    SSL_set_accept_state(ssl);
  } else {
    if (!server_name.empty()) {
      in6_addr a6;
      in_addr a4;
      const bool ip = inet_pton(AF_INET, server_name.c_str(), &a4) == 1 || inet_pton(AF_INET6, server_name.c_str(), &a6) == 1;
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
      int r = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, server_name.c_str()) : SSL_set1_host(ssl, server_name.c_str());
      if (r != 1) return Status::Error(Code::kInvalidArgument, "tls.serverName " + server_name + ": " + OpenSslErrors());
      if (!ip) SSL_set_tlsext_host_name(ssl, server_name.c_str());
    }
    SSL_set_connect_state(ssl);
  }
  *out = std::move(t);
  return Status::Ok();
}

int PollFdOrWake(int fd, short events, int wake_fd, int timeout_ms) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    int n = poll(p, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return 0;
    if (wake_fd >= 0 && p[1].revents) {
      uint64_t v;
      ssize_t r = read(wake_fd, &v, sizeof v);
      (void)r;
      return 2;
    }
    return 1;
  }
}

int WriteAll(Transport* t, iovec* iov, int count, const WaitFn& wait) {
  int i = 0;
  while (i < count) {
    if (iov[i].iov_len == 0) {
      ++i;
      continue;
    }
    short want = 0;
    ssize_t n = t->Writev(iov + i, count - i, &want);
    if (n == -EAGAIN) {
      int w = wait(want);
      if (w < 0) return w;
      continue;
    }
    if (n < 0) return static_cast<int>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0 && i < count) {
      if (left >= iov[i].iov_len) {
        left -= iov[i].iov_len;
        iov[i].iov_len = 0;
        ++i;
      } else {
        iov[i].iov_base = static_cast<uint8_t*>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
        left = 0;
      }
    }
  }
  return 0;
}

ssize_t RecvBuffer::ReadSome(Transport* t, void* dst, size_t n, short* want) {
  if (n == 0) return -EINVAL;
  if (pos_ == end_) {
    pos_ = end_ = 0;
    // Large remainders go straight to the destination; small ones fill the buffer.
    if (n >= kBytes) return t->Read(dst, n, want);
    ssize_t r = t->Read(buf_.get(), kBytes, want);
    if (r <= 0) return r;
    end_ = static_cast<size_t>(r);
  }
  const size_t k = std::min(n, end_ - pos_);
  memcpy(dst, buf_.get() + pos_, k);
  pos_ += k;
  return static_cast<ssize_t>(k);
}

int RecvBuffer::ReadExact(Transport* t, void* dst, size_t n, const WaitFn& wait, bool* eof_at_start) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  const size_t total = n;
  if (eof_at_start) *eof_at_start = false;
  while (n > 0) {
    short want = 0;
    ssize_t r = ReadSome(t, out, n, &want);
    if (r == -EAGAIN) {
      int w = wait(want);
      if (w < 0) return w;
      continue;
    }
    if (r < 0) return static_cast<int>(r);
    if (r == 0) {
      if (eof_at_start && n == total) *eof_at_start = true;
      return -ECONNRESET;
    }
    out += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

Status ConnectTcp(const std::string& host, uint16_t port, int64_t deadline_ms, int* out) {
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (g != 0) return Status::Error(Code::kUnavailable, "cannot resolve " + host + ": " + gai_strerror(g), EHOSTUNREACH);
  Status last = Status::Error(Code::kUnavailable, "no address for " + host, EHOSTUNREACH);
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = Status::FromErrno(errno, "socket: " + std::string(strerror(errno)));
      continue;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      int64_t left = deadline_ms - MonotonicMs();
      int p = left > 0 ? PollFdOrWake(fd, POLLOUT, -1, static_cast<int>(left)) : 0;
      if (p == 0) {
        err = ETIMEDOUT;
      } else if (p < 0) {
        err = -p;
      } else {
        socklen_t sl = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) err = errno;
      }
    }
    if (err == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *out = fd;
      freeaddrinfo(res);
      return Status::Ok();
    }
    close(fd);
    last = Status::Error(Code::kUnavailable, "connecting to " + where + ": " + strerror(err), err);
    if (err == ETIMEDOUT) break;  // the deadline is spent
  }
  freeaddrinfo(res);
  return last;
}

}  // namespace mooring
