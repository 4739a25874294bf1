#include "sanlock/delta-lease.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mooring {
namespace {

uint64_t Le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t Le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24); }

std::string Name(const uint8_t* p) {
  size_t n = 0;
  while (n < 48 && p[n] != 0) ++n;
  return std::string(reinterpret_cast<const char*>(p), n);
}

}  // namespace

Status DeltaLease::Read(const std::string& path, uint64_t offset, uint64_t host_id, uint32_t sector_size,
                        DeltaLease* out) {
  if (sector_size != 512 && sector_size != 4096)
    return Status::Error(Code::kInvalidArgument, "sector size must be 512 or 4096");
  if (host_id == 0 || host_id > 2000) return Status::Error(Code::kInvalidArgument, "host id must be 1..2000");
  if (offset % sector_size != 0) return Status::Error(Code::kInvalidArgument, "offset must be sector-aligned");
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT (tmpfs)
  if (fd < 0) return Status::FromErrno(errno, "open " + path + ": " + std::strerror(errno));
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, sector_size) != 0) {
    close(fd);
    return Status::Error(Code::kIoError, "out of memory", ENOMEM);
  }
  const off_t at = static_cast<off_t>(offset + (host_id - 1) * sector_size);
  ssize_t n;
  do {
    n = pread(fd, buf, sector_size, at);
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  close(fd);
  Status st;
  if (n < 0) {
    st = Status::FromErrno(err, "read " + path + ": " + std::strerror(err));
  } else if (static_cast<size_t>(n) < 256) {
    st = Status::Error(Code::kOutOfRange, path + " is too short to hold host " + std::to_string(host_id) + "'s lease");
  } else {
    const auto* p = static_cast<const uint8_t*>(buf);
    DeltaLease d;
    d.valid = Le32(p) == kMagic;
    if (d.valid) {
      d.owner_id = Le64(p + 32);
      d.generation = Le64(p + 40);
      d.lockspace = Name(p + 56);
      d.host_name = Name(p + 104);
      d.timestamp = Le64(p + 152);
    }
    *out = d;
  }
  std::free(buf);
  return st;
}

}  // namespace mooring
