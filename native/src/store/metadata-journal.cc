#include "store/metadata-journal.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <chrono>

#include "util/crc32c.h"
#include "util/fs-util.h"

namespace mooring {

namespace {

std::string ErrText(int err) { return std::strerror(err < 0 ? -err : err); }

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A positive generation below 2^53 (a JSON number any reader keeps exactly), not `avoid`.
// The getrandom system call: no generator state (a thread_local engine would not fit the
// static TLS block the addon's initial-exec model draws from), and through syscall(), not
// glibc's wrapper (GLIBC_2.25, above the arm64 prebuild's 2.17 floor). The clock and a
// counter if it fails.
uint64_t NewGeneration(uint64_t avoid) {
  static std::atomic<uint64_t> counter{0};
  for (;;) {
    uint64_t g = 0;
    if (::syscall(SYS_getrandom, &g, sizeof g, 0) != static_cast<long>(sizeof g))
      g = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull +
          counter.fetch_add(1);
    g &= (1ull << 53) - 1;
    if (g != 0 && g != avoid) return g;
  }
}

constexpr uint32_t kNoRecord = 0xffffffffu;

// The payload length of the whole record of generation `gen` at pos, or kNoRecord.
uint32_t WholeRecordAt(const std::string& log, size_t pos, uint64_t gen) {
  if (log.size() - pos < MetadataJournal::kHeaderBytes) return kNoRecord;
  const auto* h = reinterpret_cast<const uint8_t*>(log.data()) + pos;
  const uint32_t len = Get32(h + 4);
  if (Get32(h) != MetadataJournal::kMagic || len > MetadataJournal::kMaxRecordBytes ||
      log.size() - pos - MetadataJournal::kHeaderBytes < len || Get64(h + 8) != gen)
    return kNoRecord;
  if (Crc32c(h + MetadataJournal::kHeaderBytes, len, Crc32c(h, 16)) != Get32(h + 16)) return kNoRecord;
  return len;
}

// Whether the record at pos, whose header still gives a plausible length, is followed by a
// whole record (checked only when the record at pos is not whole).
bool FollowedByWholeRecord(const std::string& log, size_t pos, uint64_t gen) {
  if (log.size() - pos < MetadataJournal::kHeaderBytes) return false;
  const uint32_t len = Get32(reinterpret_cast<const uint8_t*>(log.data()) + pos + 4);
  if (len > MetadataJournal::kMaxRecordBytes || log.size() - pos - MetadataJournal::kHeaderBytes < len) return false;
  return WholeRecordAt(log, pos + MetadataJournal::kHeaderBytes + len, gen) != kNoRecord;
}

}  // namespace

Status MetadataJournal::Replay(const std::string& dir, ReplicaMetadata* m) {
  std::string log;
  Status s = fsutil::ReadFileLimited(fsutil::JoinPath(dir, kFileName), fsutil::kMaxMetadataFileBytes, &log);
  if (s.code == Code::kNotFound) {
    log.clear();  // created before any base names it; a missing log holds no records
  } else if (!s.ok()) {
    return s;
  }
  size_t pos = 0;
  while (pos < log.size()) {
    const uint32_t len = WholeRecordAt(log, pos, m->journal);
    if (len == kNoRecord) {
      // The end of the log: a crash cuts only the last append, after which nothing was
      // written. A whole record after this one means damage in the middle instead, and
      // stopping here would silently drop acknowledged commits.
      if (FollowedByWholeRecord(log, pos, m->journal))
        return Status::Error(Code::kCorrupt, std::string(kFileName) + ": the record at byte " + std::to_string(pos) +
                                                 " is damaged but later records are whole");
      break;
    }
    s = m->ApplyChange(log.substr(pos + kHeaderBytes, len));
    if (!s.ok()) {
      s.message = std::string(kFileName) + " record at byte " + std::to_string(pos) + ": " + s.message;
      return s;
    }
    pos += kHeaderBytes + len;
  }
  s = m->Validate();
  if (!s.ok()) return Status::Error(Code::kCorrupt, std::string("after ") + kFileName + ": " + s.message);
  return Status::Ok();
}

MetadataJournal::~MetadataJournal() { CloseLog(); }

void MetadataJournal::CloseLog() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  appendable_ = false;
}

Status MetadataJournal::EnsureLog() {
  if (fd_ >= 0) return Status::Ok();
  const std::string path = fsutil::JoinPath(dir_, kFileName);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, fsutil::kPrivateFileMode);
    // Its name must be durable before any base relies on records in it.
    if (fd >= 0) {
      if (int rc = fsutil::FsyncDir(dir_); rc != 0) {
        ::close(fd);
        return Status::FromErrno(rc, "fsync directory " + dir_ + ": " + ErrText(rc));
      }
    }
  }
  if (fd < 0) return Status::FromErrno(errno, "open " + path + ": " + ErrText(errno));
  fd_ = fd;
  return Status::Ok();
}

Status MetadataJournal::Commit(const ReplicaMetadata& prev, ReplicaMetadata* next) {
  Status s = next->Validate();
  if (!s.ok()) return Status::Error(Code::kInvalidState, "refusing to write bad metadata: " + s.message);
  next->journal = prev.journal;
  next->format = prev.format;
  if (appendable_ && next->journal != 0) {
    const std::string payload = next->SerializeChange(prev);
    const uint64_t limit = std::max<uint64_t>(kMinCompactBytes, 2 * base_bytes_);
    if (payload.size() <= kMaxRecordBytes && end_ + kHeaderBytes + payload.size() <= limit) {
      std::string rec(kHeaderBytes, '\0');
      auto* h = reinterpret_cast<uint8_t*>(rec.data());
      Put32(h, kMagic);
      Put32(h + 4, static_cast<uint32_t>(payload.size()));
      Put64(h + 8, next->journal);
      Put32(h + 16, Crc32c(payload.data(), payload.size(), Crc32c(h, 16)));
      rec += payload;
      int rc = fsutil::PwriteFull(fd_, rec.data(), rec.size(), end_);
      if (rc == 0) rc = fsutil::FdataSync(fd_);
      if (rc != 0) {
        // The record may be partly on disk: nothing more goes after it, the next commit
        // writes a new base.
        appendable_ = false;
        return Status::FromErrno(rc, "append to " + fsutil::JoinPath(dir_, kFileName) + ": " + ErrText(rc));
      }
      end_ += rec.size();
      return Status::Ok();
    }
  }
  return Compact(next);
}

Status MetadataJournal::Compact(ReplicaMetadata* next) {
  appendable_ = false;
  Status s = EnsureLog();
  if (!s.ok()) return s;
  const uint64_t old = next->journal;
  next->journal = NewGeneration(old);
  next->format = ReplicaMetadata::kJournalFormatVersion;
  const std::string text = next->Serialize();
  s = fsutil::WriteFileAtomic(dir_, ReplicaMetadata::kFileName, text);
  if (!s.ok()) return s;
  // The base is durable; the old generation's records no longer apply. Empty the log.
  int rc = ::ftruncate(fd_, 0) == 0 ? 0 : errno;
  if (rc == 0) rc = fsutil::FsyncFd(fd_);
  if (rc != 0) return Status::Ok();  // still not appendable: the next commit compacts again
  end_ = 0;
  base_bytes_ = text.size();
  appendable_ = true;
  return Status::Ok();
}

Status MetadataJournal::Finish(ReplicaMetadata* m) {
  if (m->journal == 0) {
    CloseLog();
    return Status::Ok();
  }
  ReplicaMetadata whole = *m;
  whole.journal = 0;
  whole.format = ReplicaMetadata::kFormatVersion;
  Status s = whole.Save(dir_);
  if (!s.ok()) return s;
  m->journal = 0;
  m->format = ReplicaMetadata::kFormatVersion;
  CloseLog();
  // A format 1 base ignores the log; removing it is tidiness.
  ::unlink(fsutil::JoinPath(dir_, kFileName).c_str());
  return Status::Ok();
}

}  // namespace mooring
