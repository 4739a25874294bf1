#include "sanlock/lease-area.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mooring {

Status LeaseArea::Read(const std::string& path, uint64_t offset, uint64_t length, std::string* out) {
  if (offset % 512 != 0 || length % 512 != 0)
    return Status::Error(Code::kInvalidArgument, "offset and length must be multiples of 512");
  if (length == 0 || length > kLengthMax)
    return Status::Error(Code::kInvalidArgument, "length must be 1.." + std::to_string(kLengthMax) + " bytes");
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT (tmpfs)
  if (fd < 0) return Status::FromErrno(errno, "open " + path + ": " + std::strerror(errno));
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, length) != 0) {
    close(fd);
    return Status::Error(Code::kIoError, "out of memory", ENOMEM);
  }
  uint64_t done = 0;
  Status st;
  while (done < length) {
    const ssize_t n = pread(fd, static_cast<char*>(buf) + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      st = Status::FromErrno(err, "read " + path + ": " + std::strerror(err));
      break;
    }
    if (n == 0) break;  // end of the storage
    done += static_cast<uint64_t>(n);
    if (done % 512 != 0) break;  // a short read that O_DIRECT cannot continue from
  }
  close(fd);
  if (st.ok()) out->assign(static_cast<const char*>(buf), done);
  std::free(buf);
  return st;
}

}  // namespace mooring
