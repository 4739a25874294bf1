#include "engine/file-snapshot-sink.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/fs-util.h"

namespace mooring {

Status FileSnapshotSink::Create(const std::string& path, uint64_t size, std::unique_ptr<FileSnapshotSink>* out) {
  if (path.empty() || path[0] != '/')
    return Status::Error(Code::kInvalidArgument, "export path '" + path.substr(0, 4096) + "' is not absolute");
  const size_t slash = path.rfind('/');
  const std::string base = path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..")
    return Status::Error(Code::kInvalidArgument, "export path '" + path + "' does not name a file");
  const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return Status::Error(Code::kInvalidArgument, "directory " + dir + " of export path " + path + " does not exist", e);
    return Status::FromErrno(e, "directory " + dir + " of export path " + path + ": " + std::strerror(e));
  }
  if (!S_ISDIR(ds.st_mode))
    return Status::Error(Code::kInvalidArgument, dir + " (the directory of export path " + path + ") is not a directory", ENOTDIR);

  // O_EXCL: never over an existing file, and (with O_NOFOLLOW) never through a symlink.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == EEXIST) return Status::Error(Code::kAlreadyExists, path + " exists already", e);
    return Status::FromErrno(e, "creating " + path + ": " + std::strerror(e));
  }
  struct stat fs;
  if (::fstat(fd, &fs) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::FromErrno(e, "stat of " + path + ": " + std::strerror(e));
  }
  std::unique_ptr<FileSnapshotSink> sink(new FileSnapshotSink(path, dir, fd, fs.st_dev, fs.st_ino));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status st = sink->Error(errno, "sizing to " + std::to_string(size) + " bytes");
    sink->Abort();
    return st;
  }
  *out = std::move(sink);
  return Status::Ok();
}

FileSnapshotSink::~FileSnapshotSink() {
  if (!done_) Abort();
}

Status FileSnapshotSink::Error(int err, const std::string& what) const {
  return Status::FromErrno(err, path_ + ": " + what + ": " + std::strerror(err));
}

Status FileSnapshotSink::Data(uint64_t off, const uint8_t* buf, uint32_t len) {
  // Whole-run writes (not fsutil::PwriteFull's 16 KiB pieces): this file is written once,
  // front to back, and never rewritten in small pieces, so large folios cost nothing later.
  while (len > 0) {
    const ssize_t n = ::pwrite(fd_, buf, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(errno, "writing at " + std::to_string(off));
    }
    if (n == 0) return Error(EIO, "writing at " + std::to_string(off));
    // Writeback starts now, overlapping the reads of the next windows, so the fsync at
    // the end finds little left to write. Advisory; errors surface at that fsync.
    (void)::sync_file_range(fd_, static_cast<off_t>(off), n, SYNC_FILE_RANGE_WRITE);
    buf += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint32_t>(n);
  }
  return Status::Ok();
}

Status FileSnapshotSink::Zeroes(uint64_t, uint64_t) {
  return Status::Ok();  // a new, truncated file reads as zeros wherever nothing was written
}

Status FileSnapshotSink::Finish() {
  // fsync, not fdatasync: the size and the directory entry must be durable too.
  if (int rc = fsutil::FsyncFd(fd_); rc < 0) return Error(-rc, "fsync");
  if (int rc = fsutil::FsyncDir(dir_); rc < 0) return Error(-rc, "fsync of directory " + dir_);
  ::close(fd_);
  fd_ = -1;
  done_ = true;
  return Status::Ok();
}

void FileSnapshotSink::Abort() {
  if (done_) return;
  done_ = true;
  // Remove the path only if it still is the file we created (not one put there since).
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace mooring
