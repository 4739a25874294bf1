#include "remote/backing-file-replica.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "block/replica-endpoint.h"

namespace mooring {

namespace {

// The name a backing image file has once verified (src/data-engine/backing-image-files.ts).
constexpr const char* kReadyFileName = "image";

class BackingFileReplica final : public ReplicaBackend {
 public:
  BackingFileReplica(std::string id, int fd, uint64_t size) : id_(std::move(id)), fd_(fd), size_(size) {}
  ~BackingFileReplica() override { Close(); }

  std::string id() const override { return id_; }
  uint64_t size() const override { return size_; }
  uint64_t epoch() const override { return 0; }
  bool clean() const override { return true; }
  bool rebuilding() const override { return false; }
  bool CanGrow() const override { return false; }

  int Read(uint64_t off, uint32_t len, uint8_t* buf) override {
    if (off > size_ || len > size_ - off) return -EINVAL;
    const int fd = fd_;
    if (fd < 0) return -EBADF;
    for (uint32_t done = 0; done < len;) {
      const ssize_t n = pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      if (n == 0) return -EIO;  // shorter than when it was opened: not the verified file any more
      done += static_cast<uint32_t>(n);
    }
    return 0;
  }

  Status ClaimEpoch(uint64_t, ReplicaSet*, bool*) override { return ReadOnly(); }
  Status SetReplicaSet(const ReplicaSet&, bool) override { return ReadOnly(); }
  Status LastRw(ReplicaSetId*) override { return ReadOnly(); }
  Status PeekReplicaSet(ReplicaSet*) override { return ReadOnly(); }
  Status MarkClean(uint64_t) override { return ReadOnly(); }
  Status Grow(uint64_t) override { return ReadOnly(); }
  int Write(uint64_t, uint64_t, uint32_t, const uint8_t*, bool) override { return -EROFS; }
  int Trim(uint64_t, uint64_t, uint64_t) override { return -EROFS; }
  int WriteZeroes(uint64_t, uint64_t, uint64_t, bool, bool, bool) override { return -EROFS; }
  int Flush() override { return 0; }
  int BlockStatus(uint64_t, uint64_t, uint32_t, std::vector<Extent>*) override { return -EOPNOTSUPP; }
  Status ListLayers(std::vector<LayerInfo>*) override { return ReadOnly(); }
  Status LayerExtents(const std::string&, std::vector<Range>*) override { return ReadOnly(); }
  int ReadLayer(const std::string&, uint64_t, uint32_t, uint8_t*) override { return -EOPNOTSUPP; }
  Status Snapshot(const std::string&, int64_t, const Labels&, bool) override { return ReadOnly(); }
  Status DeleteSnapshot(const std::string&) override { return ReadOnly(); }
  Status Revert(const std::string&, int64_t) override { return ReadOnly(); }
  Status AdoptChain(const std::vector<LayerInfo>&, uint64_t) override { return ReadOnly(); }
  Status LayerDigest(const std::string&, uint64_t, uint64_t, DigestDetail, std::vector<UnitDigest>*) override { return ReadOnly(); }
  int WriteLayer(uint64_t, const std::string&, uint64_t, uint32_t, const uint8_t*) override { return -EROFS; }
  int UnmapLayer(uint64_t, const std::string&, uint64_t, uint64_t) override { return -EROFS; }
  Status FinishRebuild() override { return ReadOnly(); }
  uint64_t AllocatedBytes() override { return size_; }

  // Called when the connection goes; no request is in flight then (the server drains first).
  Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0) close(fd);
    return Status::Ok();
  }

 private:
  Status ReadOnly() const {
    return Status::Error(Code::kUnsupported, "backing image file " + id_ + " is served read-only", EROFS);
  }
  const std::string id_;
  int fd_;
  const uint64_t size_;
};

}  // namespace

Status OpenBackingFileReplica(const std::string& root, const std::string& key, std::shared_ptr<ReplicaBackend>* out) {
  if (root.empty()) return Status::Error(Code::kNotFound, "this replica server serves no backing image files", ENOENT);
  if (!ValidBackingFileKey(key.data(), key.size()))
    return Status::Error(Code::kInvalidArgument, "backing image file keys are [A-Za-z0-9._-]{1,255}, not . or ..", EINVAL);
  char real_root[PATH_MAX];
  if (::realpath(root.c_str(), real_root) == nullptr) {
    const int err = errno;
    if (err == ENOENT) return Status::Error(Code::kNotFound, "no backing image file " + key + " (no backing images here)", ENOENT);
    return Status::Error(CodeFromErrno(-err), "resolving the backing image root: " + std::string(strerror(err)), err);
  }
  const std::string path = std::string(real_root) + "/" + key + "/" + kReadyFileName;
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) {
    const int err = errno;
    if (err == ENOENT) return Status::Error(Code::kNotFound, "no ready backing image file " + key, ENOENT);
    return Status::Error(CodeFromErrno(-err), "resolving backing image file " + key + ": " + strerror(err), err);
  }
  const std::string prefix = std::string(real_root) == "/" ? "/" : std::string(real_root) + "/";
  if (std::string(real).compare(0, prefix.size(), prefix) != 0)
    return Status::Error(Code::kInvalidArgument, "backing image file " + key + " resolves outside the server's root", EINVAL);
  const int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    return Status::Error(CodeFromErrno(-err), "opening backing image file " + key + ": " + strerror(err), err);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::Error(Code::kInvalidArgument, "backing image file " + key + " is not a regular file", EINVAL);
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  *out = std::make_shared<BackingFileReplica>(key, fd, static_cast<uint64_t>(st.st_size));
  return Status::Ok();
}

}  // namespace mooring
