#include "store/replica.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

// SHA-256 for LayerDigest. The addon only ever runs inside node, which exports its
// bundled OpenSSL's symbols; node-gyp puts node's headers (openssl/ included) on the
// include path, so no library is linked.
#include <openssl/evp.h>

#include "util/fs-util.h"

namespace mooring {

namespace {

constexpr uint64_t kBlock = Replica::kBlockSize;
constexpr const char* kLockFile = "lock";

// Shared source of zeros for WRITE_ZEROES and for holes in reads.
const uint8_t* ZeroChunk() {
  static const std::vector<uint8_t> zeros(Replica::kCopyChunkBytes, 0);
  return zeros.data();
}

std::string ErrText(int err) { return std::strerror(err < 0 ? -err : err); }

// Opens and flocks <dir>/lock. kBusy if another open holds it.
Status LockDir(const std::string& dir, int* out_fd) {
  std::string path = fsutil::JoinPath(dir, kLockFile);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, fsutil::kPrivateFileMode);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::Error(Code::kNotFound, "no replica directory " + dir, err);
    return Status::FromErrno(err, "open " + path + ": " + ErrText(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(Code::kCorrupt, path + " is not a regular file");
  }
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) break;
    int err = errno;
    if (err == EINTR) continue;
    ::close(fd);
    if (err == EWOULDBLOCK) return Status::Error(Code::kBusy, "replica " + dir + " is already open", err);
    return Status::FromErrno(err, "lock " + path + ": " + ErrText(err));
  }
  *out_fd = fd;
  return Status::Ok();
}

// Calls fn(start, end) for each part of [start, end) that `map` does not cover.
template <typename Fn>
void ForEachGap(const ExtentMap& map, uint64_t start, uint64_t end, Fn&& fn) {
  uint64_t pos = start;
  map.ForEach(start, end, [&](const ExtentMap::Interval& iv) {
    if (iv.start > pos) fn(pos, iv.start);
    pos = iv.end;
  });
  if (pos < end) fn(pos, end);
}

// Splits [off, off+len) into one run of whole blocks and up to two partial edge blocks,
// calling full(b0, b1) and edge(block, in_off, n) in address order. Stops at the first error.
template <typename Full, typename Edge>
int ForEachPiece(uint64_t off, uint64_t len, Full&& full, Edge&& edge) {
  const uint64_t end = off + len;
  uint64_t pos = off;
  while (pos < end) {
    const uint64_t block = pos / kBlock;
    const uint64_t in_off = pos - block * kBlock;
    int rc;
    if (in_off == 0 && end - pos >= kBlock) {
      const uint64_t last = end / kBlock;
      rc = full(block, last);
      pos = last * kBlock;
    } else {
      const uint64_t n = std::min(kBlock - in_off, end - pos);
      rc = edge(block, static_cast<uint32_t>(in_off), static_cast<uint32_t>(n));
      pos += n;
    }
    if (rc != 0) return rc;
  }
  return 0;
}

bool IsLayerFileName(const std::string& name, std::string* id) {
  const std::string prefix = "layer-", suffix = ".img";
  if (name.size() <= prefix.size() + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  *id = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  uint32_t num;
  return ReplicaMetadata::ParseLayerId(*id, &num);
}

// Opens the backing image `ref` of the replica at `dir` with its recorded format, and
// checks its virtual size against the record (`size_code`: the code of a mismatch).
Status OpenBackingImage(const std::string& dir, const BackingImageRef& ref, Code size_code,
                        std::unique_ptr<ImageReader>* out) {
  const std::string path = ReplicaMetadata::BackingImagePath(dir, ref.dir);
  const ImageFormatRequest format = ref.format == "qcow2" ? ImageFormatRequest::kQcow2 : ImageFormatRequest::kRaw;
  std::unique_ptr<ImageReader> image;
  Status s = OpenImage(path, format, &image);
  if (!s.ok()) {
    if (s.code == Code::kNotFound)
      return Status::Error(Code::kNotFound, "replica " + dir + ": backing image file " + path + " does not exist (" +
                                                s.message + ")",
                           s.sys_errno);
    s.message = "replica " + dir + ": backing image " + path + ": " + s.message;
    return s;
  }
  if (image->size() != ref.virtual_size_bytes) {
    image->Close();
    return Status::Error(size_code, "replica " + dir + ": backing image " + path + " has virtual size " +
                                        std::to_string(image->size()) + ", but " +
                                        std::to_string(ref.virtual_size_bytes) + " is recorded");
  }
  *out = std::move(image);
  return Status::Ok();
}

}  // namespace

Replica::Replica(std::string dir) : dir_(std::move(dir)), journal_(dir_) {}

Replica::~Replica() { Close(); }

// ---------------------------------------------------------------------------------------
// Create / Open / Close

Status Replica::Create(const std::string& dir, uint64_t size_bytes, const BackingImageRef* backing) {
  if (dir.empty()) return Status::Error(Code::kInvalidArgument, "replica directory is empty");
  if (size_bytes == 0 || size_bytes % kBlock != 0 || size_bytes > ReplicaMetadata::kMaxSizeBytes)
    return Status::Error(Code::kInvalidArgument,
                         "replica size " + std::to_string(size_bytes) +
                             " must be a positive multiple of 4096 up to 2^60");
  if (backing) {
    Status bs = ReplicaMetadata::ValidateBackingImage(*backing, size_bytes, Code::kInvalidArgument);
    if (!bs.ok()) return bs;
    // Checked before anything is created: a replica whose image cannot be read would only
    // fail later, at every open.
    std::unique_ptr<ImageReader> image;
    bs = OpenBackingImage(dir, *backing, Code::kInvalidArgument, &image);
    if (!bs.ok()) return bs;
    image->Close();
  }
  if (::mkdir(dir.c_str(), fsutil::kPrivateDirMode) != 0) {
    int err = errno;
    if (err != EEXIST) return Status::FromErrno(err, "create directory " + dir + ": " + ErrText(err));
    DIR* d = ::opendir(dir.c_str());
    if (!d) return Status::FromErrno(errno, "open directory " + dir + ": " + ErrText(errno));
    bool empty = true;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      // A lock file and a layer file are what an interrupted Create leaves behind.
      std::string id;
      if (n != "." && n != ".." && n != kLockFile && !IsLayerFileName(n, &id)) empty = false;
    }
    ::closedir(d);
    if (!empty) return Status::Error(Code::kAlreadyExists, "directory " + dir + " is not empty");
  }
  int lock_fd = -1;
  Status s = LockDir(dir, &lock_fd);
  if (!s.ok()) return s;
  struct stat st;
  if (::stat(fsutil::JoinPath(dir, ReplicaMetadata::kFileName).c_str(), &st) == 0) {
    ::close(lock_fd);
    return Status::Error(Code::kAlreadyExists, "a replica already exists at " + dir);
  }
  ReplicaMetadata m;
  m.size_bytes = size_bytes;
  m.epoch = 0;
  m.clean = true;
  if (backing) m.backing_image = *backing;
  LayerRecord head = m.NewLayer("", 0);
  m.head = head.id;
  m.layers.push_back(head);
  ::unlink(fsutil::JoinPath(dir, head.file).c_str());  // leftover of an interrupted Create
  s = fsutil::CreateSparseFile(fsutil::JoinPath(dir, head.file), size_bytes);
  if (s.ok()) {
    int rc = fsutil::FsyncDir(dir);
    if (rc != 0) s = Status::FromErrno(rc, "fsync directory " + dir + ": " + ErrText(rc));
  }
  if (s.ok()) s = m.Save(dir);
  if (!s.ok()) ::unlink(fsutil::JoinPath(dir, head.file).c_str());
  ::close(lock_fd);
  return s;
}

Status Replica::Open(const std::string& dir, std::unique_ptr<Replica>* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output pointer");
  int lock_fd = -1;
  Status s = LockDir(dir, &lock_fd);
  if (!s.ok()) return s;
  std::unique_ptr<Replica> r(new Replica(dir));
  r->lock_fd_ = lock_fd;  // released by Close (also on the error paths below)
  try {
    // A tmp file is a metadata write that never reached its rename: the old file rules.
    ::unlink((fsutil::JoinPath(dir, ReplicaMetadata::kFileName) + ".tmp").c_str());
    s = ReplicaMetadata::Load(dir, &r->meta_);
    if (!s.ok()) return s;
    r->size_ = r->meta_.size_bytes;
    r->epoch_ = r->meta_.epoch;
    r->clean_ = r->meta_.clean;
    r->rebuilding_ = r->meta_.rebuilding;
    if (r->meta_.backing_image) {
      s = OpenBackingImage(dir, *r->meta_.backing_image, Code::kCorrupt, &r->image_);
      if (!s.ok()) return s;
      r->image_size_ = r->image_->size();
    }
    for (const LayerRecord& rec : r->meta_.layers) {
      auto layer = std::make_unique<Layer>(rec.num, rec.id, fsutil::JoinPath(dir, rec.file));
      s = layer->Open(r->size_);
      if (!s.ok()) {
        s.message = dir + ": " + s.message;
        return s;
      }
      s = layer->ScanExtents(r->size_);
      if (!s.ok()) return s;
      if (rec.id != r->meta_.head) layer->MakeCached();
      r->by_num_[rec.num] = layer.get();
      r->layers_[rec.id] = std::move(layer);
    }
    r->head_ = r->layers_.at(r->meta_.head).get();
    // Every layer but the head hands its descriptor to the process-wide cache (scanned
    // above one at a time, so a long chain never holds more than the cache allows).
    // Layer files the metadata does not name are leftovers of an operation that crashed
    // before (new layer) or after (dropped layer) its metadata commit.
    if (DIR* d = ::opendir(dir.c_str())) {
      std::vector<std::string> orphans;
      while (struct dirent* e = ::readdir(d)) {
        std::string id;
        if (IsLayerFileName(e->d_name, &id) && !r->meta_.Find(id)) orphans.push_back(e->d_name);
      }
      ::closedir(d);
      for (const auto& n : orphans) ::unlink(fsutil::JoinPath(dir, n).c_str());
    }
    r->RebuildBase();
  } catch (const std::bad_alloc&) {
    return Status::Error(Code::kIoError, "out of memory opening replica " + dir, ENOMEM);
  } catch (const std::exception& e) {
    return Status::Error(Code::kIoError, std::string("opening replica ") + dir + ": " + e.what());
  }
  *out = std::move(r);
  return Status::Ok();
}

Status Replica::Close() {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  if (closed_.exchange(true)) return Status::Ok();
  Status s;
  if (head_ && head_->fd() >= 0) {
    int rc = fsutil::FdataSync(head_->fd());
    if (rc != 0) s = Status::FromErrno(rc, "flush " + head_->path() + ": " + ErrText(rc));
  }
  {
    std::unique_lock<RwLock> maps(map_mu_);
    head_ = nullptr;
    by_num_.clear();
    layers_.clear();  // closes every layer fd
    base_.Clear();
  }
  // Nothing reads it any more: the data path holds io_mu_ shared, which we hold exclusively.
  if (image_) image_->Close();
  {
    // Whole again in format 1, for builds without the journal. Not an error of Close when
    // it fails: the replica stays in format 2, which this build reads.
    std::lock_guard<std::mutex> g(meta_mu_);
    (void)journal_.Finish(&meta_);
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = -1;
  return s;
}

Status Replica::CheckOpen() const {
  if (closed_.load()) return Status::Error(Code::kClosed, "replica " + dir_ + " is closed", EBADF);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------
// Epoch and clean flag

Status Replica::SaveMeta(ReplicaMetadata m) {
  std::lock_guard<std::mutex> g(meta_mu_);
  return CommitMetaLocked(std::move(m));
}

Status Replica::CommitMetaLocked(ReplicaMetadata m) {
  Status s = journal_.Commit(meta_, &m);
  if (s.ok()) meta_ = std::move(m);
  return s;
}

namespace {
// initial-exec: the 8 bytes live in the static TLS block glibc keeps spare for dlopen'd
// objects, not in dynamic TLS. The process-wide NBD worker threads write through here and
// live until the process exits; dynamic TLS on a thread alive at exit made LeakSanitizer's
// tracer (GCC 12, glibc 2.36) read a garbage DTLS range and crash, and it is one
// __tls_get_addr call fewer per write.
__attribute__((tls_model("initial-exec"))) thread_local uint64_t tls_writer_token = 0;
}  // namespace

WriterScope::WriterScope(uint64_t token) : prev_(tls_writer_token) { tls_writer_token = token; }
WriterScope::~WriterScope() { tls_writer_token = prev_; }
uint64_t WriterScope::Current() { return tls_writer_token; }

Status Replica::ClaimEpoch(uint64_t epoch, ReplicaSet* stored, bool* was_clean) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  // Exclusive against the data path: once we hold it no older-epoch write is in flight,
  // and every write that starts after we release it sees the new epoch.
  std::unique_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (epoch <= epoch_.load())
    return Status::Error(Code::kStaleEpoch, "replica " + dir_ + ": epoch " + std::to_string(epoch) +
                                                " is not above the current epoch " +
                                                std::to_string(epoch_.load()));
  ReplicaMetadata m;
  {
    std::lock_guard<std::mutex> g(meta_mu_);
    m = meta_;
  }
  const bool clean_before = m.clean;
  m.epoch = epoch;
  m.clean = false;
  s = SaveMeta(m);
  if (!s.ok()) return s;
  if (was_clean) *was_clean = clean_before;
  epoch_ = epoch;
  writer_token_ = WriterScope::Current();
  clean_ = false;
  if (stored) *stored = m.replica_set;
  return Status::Ok();
}

Status Replica::PeekReplicaSet(ReplicaSet* out) {
  Status s = CheckOpen();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> g(meta_mu_);
  *out = meta_.replica_set;
  return Status::Ok();
}

Status Replica::LastRw(ReplicaSetId* out) {
  Status s = CheckOpen();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> g(meta_mu_);
  *out = meta_.last_rw;
  return Status::Ok();
}

Status Replica::SetReplicaSet(const ReplicaSet& set, bool self_rw) {
  // ctl_mu_ orders it with ClaimEpoch (a claim and a store never interleave); the data
  // path is not involved.
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  const std::string bad = set.Invalid();
  if (!bad.empty()) return Status::Error(Code::kInvalidArgument, "replica " + dir_ + ": " + bad, EINVAL);
  if (set.epoch != epoch_.load())
    return Status::Error(Code::kStaleEpoch, "replica " + dir_ + ": a replica set of epoch " + std::to_string(set.epoch) +
                                                " but the replica promised epoch " + std::to_string(epoch_.load()),
                         ESTALE);
  ReplicaMetadata m;
  {
    std::lock_guard<std::mutex> g(meta_mu_);
    m = meta_;
  }
  const ReplicaSetId id = ReplicaSetId::Of(set);
  if (m.replica_set == set) {
    // A retry: the same set again (recorded as the last RW one if the first call was not).
    if (!self_rw || m.last_rw == id) return Status::Ok();
  } else if (!set.NewerThan(m.replica_set)) {
    return Status::Error(Code::kStaleEpoch, "replica " + dir_ + ": replica set " + std::to_string(set.epoch) + "/" +
                                                std::to_string(set.generation) + " is not newer than the stored " +
                                                std::to_string(m.replica_set.epoch) + "/" +
                                                std::to_string(m.replica_set.generation),
                         ESTALE);
  }
  m.replica_set = set;
  if (self_rw) m.last_rw = id;
  return SaveMeta(std::move(m));
}

Status Replica::MarkClean(uint64_t epoch) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (epoch != epoch_.load())
    return Status::Error(Code::kStaleEpoch, "replica " + dir_ + ": MarkClean with epoch " +
                                                std::to_string(epoch) + " but the replica is at " +
                                                std::to_string(epoch_.load()));
  // Clean promises the data is durable; make it so even if the caller forgot to flush.
  int rc = fsutil::FdataSync(head_->fd());
  if (rc != 0) return Status::FromErrno(rc, "flush " + head_->path() + ": " + ErrText(rc));
  ReplicaMetadata m;
  {
    std::lock_guard<std::mutex> g(meta_mu_);
    m = meta_;
  }
  m.clean = true;
  s = SaveMeta(std::move(m));
  if (s.ok()) clean_ = true;
  return s;
}

Status Replica::ResizeLayers(uint64_t size_bytes, uint64_t undo_bytes) {
  std::vector<Layer*> done;
  for (const auto& kv : layers_) {
    if (int rc = kv.second->Resize(size_bytes); rc != 0) {
      for (Layer* l : done) l->Resize(undo_bytes);
      return Status::FromErrno(-rc, "resizing " + kv.second->path() + " to " + std::to_string(size_bytes) + " bytes: " + ErrText(-rc));
    }
    done.push_back(kv.second.get());
  }
  return Status::Ok();
}

Status Replica::Grow(uint64_t size_bytes) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  // Exclusive: no request is in flight while the files and size_ change.
  std::unique_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  const uint64_t old = size_.load();
  if (size_bytes % kBlock != 0 || size_bytes > ReplicaMetadata::kMaxSizeBytes)
    return Status::Error(Code::kInvalidArgument, "replica " + dir_ + ": size " + std::to_string(size_bytes) +
                                                     " must be a multiple of 4096 up to 2^60", EINVAL);
  if (size_bytes < old)
    return Status::Error(Code::kInvalidArgument, "replica " + dir_ + " has " + std::to_string(old) + " bytes: it can grow, not shrink to " +
                                                     std::to_string(size_bytes), EINVAL);
  if (size_bytes == old) return Status::Ok();  // a retry, or an engine catching up with the others
  // Files first, then the commit (invariant 4): a crash in between leaves files longer than
  // the recorded size, which Open cuts back. Sparse: the new range is a hole in every
  // layer, so it reads as zeros through the whole chain and costs no space.
  s = ResizeLayers(size_bytes, old);
  if (!s.ok()) return s;
  ReplicaMetadata m;
  {
    std::lock_guard<std::mutex> g(meta_mu_);
    m = meta_;
  }
  m.size_bytes = size_bytes;
  for (LayerRecord& l : m.layers) l.size_bytes = size_bytes;
  s = SaveMeta(std::move(m));
  if (!s.ok()) {
    ResizeLayers(old, old);
    return s;
  }
  size_ = size_bytes;
  return Status::Ok();
}

Status Replica::EnsureDirty() {
  // A write after MarkClean (a contract breach, but cheap to survive) must not leave the
  // replica claiming to be clean.
  std::lock_guard<std::mutex> g(meta_mu_);
  if (!clean_.load()) return Status::Ok();
  ReplicaMetadata m = meta_;
  m.clean = false;
  Status s = CommitMetaLocked(std::move(m));
  if (!s.ok()) return s;
  clean_ = false;
  return Status::Ok();
}

int Replica::StartWrite(uint64_t epoch) {
  if (closed_.load()) return -EBADF;
  // Exactly the promised epoch: an older writer was fenced; a newer one never claimed
  // this replica, so it is not its writer either. And only through the handle that claimed
  // or adopted it (WriterScope).
  if (epoch != epoch_.load()) return -kErrStaleEpoch;
  if (const uint64_t w = writer_token_.load(); w != 0 && w != WriterScope::Current()) return -kErrStaleEpoch;
  if (clean_.load()) {
    Status s = EnsureDirty();
    if (!s.ok()) return s.sys_errno ? -s.sys_errno : -EIO;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Chain resolution and reads

template <typename Fn>
void Replica::ResolveLocked(uint64_t b0, uint64_t b1, bool include_head, Fn&& fn) const {
  uint64_t p = b0;
  while (p < b1) {
    ExtentMap::Interval h{};
    bool has_head = include_head && head_->extents().NextFrom(p, &h) && h.start < b1;
    if (has_head && h.start <= p) {
      uint64_t e = std::min(h.end, b1);
      if (!fn(p, e, head_->num())) return;
      p = e;
      continue;
    }
    uint64_t gap_end = has_head ? h.start : b1;
    uint64_t q = p;
    bool go = base_.ForEachUntil(p, gap_end, [&](const ExtentMap::Interval& iv) {
      if (iv.start > q && !fn(q, iv.start, 0u)) return false;
      q = iv.end;
      return static_cast<bool>(fn(iv.start, iv.end, iv.value));
    });
    if (!go) return;
    if (q < gap_end && !fn(q, gap_end, 0u)) return;
    p = gap_end;
  }
}

void Replica::CollectSegments(uint64_t off, uint64_t len, bool include_head,
                              std::vector<Segment>* out) const {
  const uint64_t end = off + len;
  std::shared_lock<RwLock> maps(map_mu_);
  ResolveLocked(off / kBlock, (end + kBlock - 1) / kBlock, include_head,
                [&](uint64_t bs, uint64_t be, uint32_t num) {
                  uint64_t s = std::max(bs * kBlock, off);
                  uint64_t e = std::min(be * kBlock, end);
                  Layer* layer = nullptr;
                  if (num != 0) {
                    auto it = by_num_.find(num);
                    if (it != by_num_.end()) layer = it->second;
                  }
                  const bool image = !layer && image_;
                  if (!out->empty() && out->back().layer == layer && out->back().image == image &&
                      out->back().off + out->back().len == s)
                    out->back().len += e - s;
                  else
                    out->push_back(Segment{s, e - s, layer, image});
                  return true;
                });
}

int Replica::ReadSegments(uint64_t off, uint64_t len, uint8_t* buf, bool include_head, bool cached_only) {
  std::vector<Segment> segs;
  segs.reserve(4);
  CollectSegments(off, len, include_head, &segs);
  // The map lock is released: a layer's file holds whole blocks before the map says so,
  // and Layer objects live while io_mu_ is held, so reading without the lock is safe. A
  // cached layer's descriptor is pinned for the read (LayerFd).
  for (const Segment& s : segs) {
    uint8_t* dst = buf + (s.off - off);
    if (s.image) {
      if (cached_only) return -EWOULDBLOCK;  // an image read may read and decompress from disk
      int rc = ReadImage(s.off, s.len, dst);
      if (rc != 0) return rc;
    } else if (!s.layer) {
      std::memset(dst, 0, s.len);
    } else {
      LayerFd h;
      int rc = s.layer->Acquire(&h);
      if (rc == 0) rc = cached_only ? fsutil::PreadCached(h.fd(), dst, s.len, s.off) : fsutil::PreadFull(h.fd(), dst, s.len, s.off);
      if (rc != 0) return cached_only ? -EWOULDBLOCK : rc;
    }
  }
  return 0;
}

int Replica::ReadImage(uint64_t off, uint64_t len, uint8_t* buf) {
  const uint64_t end = off + len;
  // The image's virtual size is a multiple of 512, not necessarily of the block: a block
  // may be partly image, partly zeros.
  const uint64_t in_end = std::min(end, std::max(off, image_size_));
  for (uint64_t p = off; p < in_end;) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(in_end - p, kCopyChunkBytes * 32));
    int rc = image_->Read(p, n, buf + (p - off));
    if (rc != 0) return rc;
    p += n;
  }
  if (in_end < end) std::memset(buf + (in_end - off), 0, end - in_end);
  return 0;
}

int Replica::ImageDataBlocks(uint64_t b0, uint64_t b1, std::vector<std::pair<uint64_t, uint64_t>>* out) {
  if (!image_) return 0;
  const uint64_t end = std::min(b1 * kBlock, image_size_);
  std::vector<Extent> ext;
  for (uint64_t p = b0 * kBlock; p < end;) {
    int rc = image_->BlockStatus(p, end - p, kMaxBlockStatusExtents, &ext);
    if (rc != 0) return rc;
    uint64_t q = p;
    for (const Extent& e : ext) {
      // Only data counts: zeros recorded in the image read as zeros, like nothing at all.
      if ((e.flags & kExtentZero) == 0) {
        const uint64_t s = q / kBlock, t = std::min(b1, (q + e.length + kBlock - 1) / kBlock);
        if (!out->empty() && out->back().second >= s)
          out->back().second = std::max(out->back().second, t);
        else
          out->emplace_back(s, t);
      }
      q += e.length;
    }
    if (q == p) return -EIO;  // the reader promises progress; never spin if it breaks that
    p = q;
  }
  return 0;
}

int Replica::AppendImageStatus(uint64_t off, uint64_t end, uint32_t limit, std::vector<Extent>* out, bool* stopped) {
  auto add = [&](uint64_t len, uint32_t flags) {
    if (!out->empty() && out->back().flags == flags) {
      out->back().length += len;
      return true;
    }
    if (out->size() >= limit) return false;
    out->push_back(Extent{len, flags});
    return true;
  };
  const uint64_t in_end = std::min(end, std::max(off, image_size_));
  std::vector<Extent> ext;
  for (uint64_t p = off; p < in_end;) {
    int rc = image_->BlockStatus(p, in_end - p, limit, &ext);
    if (rc != 0) return rc;
    uint64_t q = p;
    for (const Extent& e : ext) {
      if (!add(e.length, e.flags)) {
        *stopped = true;
        return 0;
      }
      q += e.length;
    }
    if (q == p) return -EIO;
    p = q;
  }
  if (in_end < end && !add(end - in_end, kExtentHole | kExtentZero)) *stopped = true;
  return 0;
}

int Replica::Read(uint64_t off, uint32_t len, uint8_t* buf) {
  if (!InRange(off, len, size_)) return -EINVAL;
  if (len == 0) return closed_.load() ? -EBADF : 0;
  if (!buf) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  if (closed_.load()) return -EBADF;
  return ReadSegments(off, len, buf, true);
}

int Replica::TryRead(uint64_t off, uint32_t len, uint8_t* buf) {
  if (len == 0 || !InRange(off, len, size_) || !buf) return -EWOULDBLOCK;  // Read says what is wrong
  std::shared_lock<RwLock> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock() || closed_.load()) return -EWOULDBLOCK;
  return ReadSegments(off, len, buf, true, true);
}

// ---------------------------------------------------------------------------------------
// Writes

int Replica::BelowBlocks(uint64_t b0, uint64_t b1, std::vector<std::pair<uint64_t, uint64_t>>* out) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    base_.ForEach(b0, b1, [&](const ExtentMap::Interval& iv) { runs.emplace_back(iv.start, iv.end); });
  }
  // The image is asked outside map_mu_ (its block status may read L2 tables from disk).
  // Into a list of its own: ImageDataBlocks merges with the last run it finds in *out.
  std::vector<std::pair<uint64_t, uint64_t>> image_runs;
  int rc = ImageDataBlocks(b0, b1, &image_runs);
  if (rc != 0) return rc;
  runs.insert(runs.end(), image_runs.begin(), image_runs.end());
  std::sort(runs.begin(), runs.end());
  out->clear();
  for (const auto& r : runs) {
    if (!out->empty() && out->back().second >= r.first)
      out->back().second = std::max(out->back().second, r.second);
    else
      out->push_back(r);
  }
  return 0;
}

int Replica::WriteEdge(uint64_t block, uint32_t in_off, uint32_t n, const uint8_t* src,
                       bool only_if_owned) {
  // Serialises read-modify-writes of one block, so two writers of disjoint bytes in it
  // cannot each copy the old block and overwrite the other's bytes.
  std::lock_guard<std::mutex> g(edge_locks_[block % kEdgeLockStripes]);
  bool owned, below;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    owned = head_->extents().Lookup(block, nullptr);
    below = base_.Lookup(block, nullptr);
  }
  const uint64_t boff = block * kBlock;
  if (owned) {
    return fsutil::PwriteFull(head_->fd(), src ? src : ZeroChunk(), n, boff + in_off);
  }
  if (only_if_owned) return 0;
  if (!src && !below && image_) {
    std::vector<std::pair<uint64_t, uint64_t>> data;
    int rc = ImageDataBlocks(block, block + 1, &data);
    if (rc != 0) return rc;
    below = !data.empty();
  }
  if (!src && !below) return 0;  // the whole block already reads as zeros
  // The head must own whole blocks (a partial block would expose holes as zeros over the
  // lower layers' data), so copy the block up from the chain and patch it.
  uint8_t tmp[kBlock];
  int rc = ReadSegments(boff, kBlock, tmp, false);
  if (rc != 0) return rc;
  if (src)
    std::memcpy(tmp + in_off, src, n);
  else
    std::memset(tmp + in_off, 0, n);
  rc = fsutil::PwriteFull(head_->fd(), tmp, kBlock, boff);
  if (rc != 0) return rc;
  std::unique_lock<RwLock> maps(map_mu_);
  head_->extents().Set(block, block + 1, head_->num());
  return 0;
}

int Replica::WriteBlocks(uint64_t b0, uint64_t b1, const uint8_t* src) {
  if (src) {
    int rc = fsutil::PwriteFull(head_->fd(), src, (b1 - b0) * kBlock, b0 * kBlock);
    if (rc != 0) return rc;
    {
      // A warm volume mostly overwrites blocks the head already owns: skip the exclusive
      // lock (which every replica's every write would otherwise serialise on).
      std::shared_lock<RwLock> maps(map_mu_);
      if (head_->extents().Covers(b0, b1)) return 0;
    }
    std::unique_lock<RwLock> maps(map_mu_);
    head_->extents().Set(b0, b1, head_->num());
    return 0;
  }
  const uint64_t chunk_blocks = kCopyChunkBytes / kBlock;
  for (uint64_t b = b0; b < b1;) {
    uint64_t e = std::min(b1, b + chunk_blocks);
    int rc = fsutil::PwriteFull(head_->fd(), ZeroChunk(), (e - b) * kBlock, b * kBlock);
    if (rc != 0) return rc;
    {
      std::unique_lock<RwLock> maps(map_mu_);
      head_->extents().Set(b, e, head_->num());
    }
    b = e;
  }
  return 0;
}

int Replica::WriteHead(uint64_t off, uint64_t len, const uint8_t* src) {
  return ForEachPiece(
      off, len,
      [&](uint64_t b0, uint64_t b1) {
        return WriteBlocks(b0, b1, src ? src + (b0 * kBlock - off) : nullptr);
      },
      [&](uint64_t block, uint32_t in_off, uint32_t n) {
        return WriteEdge(block, in_off, n, src ? src + (block * kBlock + in_off - off) : nullptr, false);
      });
}

int Replica::Write(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf, bool fua) {
  if (!InRange(off, len, size_)) return -EINVAL;
  if (len > 0 && !buf) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  int rc = StartWrite(epoch);
  if (rc != 0 || len == 0) return rc;
  rc = WriteHead(off, len, buf);
  if (rc == 0 && fua) rc = fsutil::FdataSync(head_->fd());
  return rc;
}

int Replica::TryWrite(uint64_t epoch, uint64_t off, uint32_t len, const uint8_t* buf) {
  // Whole blocks of a replica already marked dirty, and the I/O lock free: then the write
  // is page-cache pwrites and an in-memory extent update, nothing that waits on another
  // operation or on the disk's commits.
  if (len == 0 || off % kBlock != 0 || len % kBlock != 0 || clean_.load()) return -EWOULDBLOCK;
  if (!InRange(off, len, size_)) return -EINVAL;
  if (!buf) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock()) return -EWOULDBLOCK;
  int rc = StartWrite(epoch);
  if (rc != 0) return rc;
  return WriteHead(off, len, buf);
}

int Replica::PunchHead(uint64_t b0, uint64_t b1) {
  std::vector<ExtentMap::Interval> owned;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    head_->extents().ForEach(b0, b1, [&](const ExtentMap::Interval& iv) { owned.push_back(iv); });
  }
  for (const auto& iv : owned) {
    int rc = fsutil::PunchHole(head_->fd(), iv.start * kBlock, (iv.end - iv.start) * kBlock);
    if (rc != 0) return rc;
  }
  if (!owned.empty()) {
    std::unique_lock<RwLock> maps(map_mu_);
    head_->extents().Erase(b0, b1);
  }
  return 0;
}

int Replica::Trim(uint64_t epoch, uint64_t off, uint64_t len) {
  if (!InRange(off, len, size_)) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  int rc = StartWrite(epoch);
  if (rc != 0 || len == 0) return rc;
  // Whole blocks are punched out of the head; partial blocks are zeroed only where the
  // head holds them (elsewhere discarding nothing is a valid discard).
  return ForEachPiece(
      off, len, [&](uint64_t b0, uint64_t b1) { return PunchHead(b0, b1); },
      [&](uint64_t block, uint32_t in_off, uint32_t n) {
        return WriteEdge(block, in_off, n, nullptr, true);
      });
}

int Replica::WriteZeroes(uint64_t epoch, uint64_t off, uint64_t len, bool may_trim,
                         bool fast_only, bool fua) {
  if (!InRange(off, len, size_)) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  int rc = StartWrite(epoch);
  if (rc != 0 || len == 0) return rc;
  if (!may_trim) {
    // NO_HOLE: the zeros must be allocated, which is the slow path by definition.
    if (fast_only) return -ENOTSUP;
    rc = WriteHead(off, len, nullptr);
  } else {
    if (fast_only) {
      // Fast = punch holes in the head and zero partial blocks the head already holds.
      // Data in a lower layer, or in the backing image, would need real zeros written over it.
      rc = ForEachPiece(
          off, len,
          [&](uint64_t b0, uint64_t b1) {
            std::vector<std::pair<uint64_t, uint64_t>> below;
            int err = BelowBlocks(b0, b1, &below);
            return err != 0 ? err : below.empty() ? 0 : -ENOTSUP;
          },
          [&](uint64_t block, uint32_t, uint32_t) {
            {
              std::shared_lock<RwLock> maps(map_mu_);
              if (head_->extents().Lookup(block, nullptr)) return 0;
            }
            std::vector<std::pair<uint64_t, uint64_t>> below;
            int err = BelowBlocks(block, block + 1, &below);
            return err != 0 ? err : below.empty() ? 0 : -ENOTSUP;
          });
      if (rc != 0) return rc;
    }
    rc = ForEachPiece(
        off, len,
        [&](uint64_t b0, uint64_t b1) {
          // Punch where nothing below holds data; write zeros over what lower layers or the
          // backing image hold (a hole there would re-expose their bytes).
          std::vector<std::pair<uint64_t, uint64_t>> below;
          int err = BelowBlocks(b0, b1, &below);
          if (err != 0) return err;
          uint64_t b = b0;
          for (const auto& r : below) {
            err = r.first > b ? PunchHead(b, r.first) : 0;
            if (err == 0) err = WriteBlocks(r.first, r.second, nullptr);
            if (err != 0) return err;
            b = r.second;
          }
          return b < b1 ? PunchHead(b, b1) : 0;
        },
        [&](uint64_t block, uint32_t in_off, uint32_t n) {
          return WriteEdge(block, in_off, n, nullptr, false);
        });
  }
  if (rc == 0 && fua) rc = fsutil::FdataSync(head_->fd());
  return rc;
}

int Replica::Flush() {
  std::shared_lock<RwLock> io(io_mu_);
  if (closed_.load()) return -EBADF;
  // Only the head is written on the data path; snapshot, merge and revert sync the other
  // layers themselves before their metadata commits.
  return fsutil::FdataSync(head_->fd());
}

int Replica::BlockStatus(uint64_t off, uint64_t len, uint32_t max_extents, std::vector<Extent>* out) {
  if (!out || len == 0 || !InRange(off, len, size_)) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  if (closed_.load()) return -EBADF;
  out->clear();
  uint32_t limit = max_extents == 0 ? kMaxBlockStatusExtents : std::min(max_extents, kMaxBlockStatusExtents);
  const uint64_t end = off + len;
  if (!image_) {
    std::shared_lock<RwLock> maps(map_mu_);
    // Stops at the first run that does not fit, so the cost is bounded by the extents
    // returned, not by how fragmented the rest of the range is.
    ResolveLocked(off / kBlock, (end + kBlock - 1) / kBlock, true, [&](uint64_t bs, uint64_t be, uint32_t num) {
      uint64_t s = std::max(bs * kBlock, off);
      uint64_t e = std::min(be * kBlock, end);
      uint32_t flags = num == 0 ? (kExtentHole | kExtentZero) : 0;
      if (!out->empty() && out->back().flags == flags) {
        out->back().length += e - s;
        return true;
      }
      if (out->size() >= limit) return false;
      out->push_back(Extent{e - s, flags});
      return true;
    });
    return 0;
  }
  // Over a backing image, runs no layer owns take the image's allocation. The runs are
  // collected first (owned and not owned alternate, so `limit` runs are enough) and the
  // image is asked after map_mu_ is released.
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // byte ranges
  std::vector<bool> owned;                          // per run: some layer owns it
  {
    std::shared_lock<RwLock> maps(map_mu_);
    ResolveLocked(off / kBlock, (end + kBlock - 1) / kBlock, true, [&](uint64_t bs, uint64_t be, uint32_t num) {
      uint64_t s = std::max(bs * kBlock, off);
      uint64_t e = std::min(be * kBlock, end);
      if (!runs.empty() && owned.back() == (num != 0)) {
        runs.back().second = e;
        return true;
      }
      if (runs.size() >= limit) return false;
      runs.emplace_back(s, e);
      owned.push_back(num != 0);
      return true;
    });
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (owned[i]) {
      if (!out->empty() && out->back().flags == 0) {
        out->back().length += runs[i].second - runs[i].first;
        continue;
      }
      if (out->size() >= limit) break;
      out->push_back(Extent{runs[i].second - runs[i].first, 0});
      continue;
    }
    bool stopped = false;
    int rc = AppendImageStatus(runs[i].first, runs[i].second, limit, out, &stopped);
    if (rc != 0) return rc;
    if (stopped) break;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------
// Per-layer access

Layer* Replica::FindLayer(const std::string& id) const {
  auto it = layers_.find(id);
  return it == layers_.end() ? nullptr : it->second.get();
}

Status Replica::ListLayers(std::vector<LayerInfo>* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output vector");
  std::shared_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> g(meta_mu_);
  out->clear();
  // meta_.layers is kept in id order and parents are always older: bottom first.
  for (const LayerRecord& rec : meta_.layers) out->push_back(InfoOfLocked(rec));
  return Status::Ok();
}

LayerInfo Replica::InfoOfLocked(const LayerRecord& rec) const {
  LayerInfo info;
  info.id = rec.id;
  info.file = rec.file;
  info.parent = rec.parent;
  info.name = rec.name;
  info.head = rec.id == meta_.head;
  info.removed = rec.removed;
  info.user_created = rec.user_created;
  info.created_ms = rec.created_ms;
  info.labels = rec.labels;
  info.size_bytes = rec.size_bytes;
  if (Layer* l = FindLayer(rec.id)) info.allocated_bytes = l->AllocatedBytes();
  return info;
}

Status Replica::SnapshotLayers(const std::string& name, std::vector<LayerInfo>* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output vector");
  // As ListLayers: Layer objects (their allocation is asked below) live while io_mu_ is held.
  std::shared_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> g(meta_mu_);
  out->clear();
  // From memory: comparisons over the records, a stat only for the layers answered (the
  // snapshot and, past removed ones, its visible parent), whatever the chain's depth.
  const LayerRecord* cur = meta_.FindSnapshot(name);
  if (!cur) return Status::Ok();
  out->push_back(InfoOfLocked(*cur));
  for (size_t hops = 0; hops < meta_.layers.size() && !cur->parent.empty(); ++hops) {
    // meta_ was validated: its records are in ascending id order.
    const LayerRecord* p = meta_.FindOrdered(cur->parent);
    if (!p) break;
    out->push_back(InfoOfLocked(*p));
    if (p->id != meta_.head && !p->removed) break;
    cur = p;
  }
  std::reverse(out->begin(), out->end());
  return Status::Ok();
}

Status Replica::LayerExtents(const std::string& layer_id, std::vector<Range>* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output vector");
  std::shared_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (image_ && layer_id == kBackingImageLayerId) {
    // The blocks where the image holds data (zeros it records read as zeros anyway).
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    int rc = ImageDataBlocks(0, size_ / kBlock, &runs);
    if (rc != 0)
      return Status::FromErrno(rc, "replica " + dir_ + ": block status of the backing image: " + ErrText(rc));
    out->clear();
    for (const auto& r : runs) out->push_back(Range{r.first * kBlock, (r.second - r.first) * kBlock});
    return Status::Ok();
  }
  Layer* l = FindLayer(layer_id);
  if (!l) return Status::Error(Code::kNotFound, "replica " + dir_ + ": no layer '" + layer_id.substr(0, 64) + "'");
  std::shared_lock<RwLock> maps(map_mu_);
  out->clear();
  l->extents().ForEachAll([&](const ExtentMap::Interval& iv) {
    out->push_back(Range{iv.start * kBlock, (iv.end - iv.start) * kBlock});
  });
  return Status::Ok();
}

int Replica::ReadLayer(const std::string& layer_id, uint64_t off, uint32_t len, uint8_t* buf) {
  if (!InRange(off, len, size_)) return -EINVAL;
  if (len > 0 && !buf) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  if (closed_.load()) return -EBADF;
  if (image_ && layer_id == kBackingImageLayerId) return len == 0 ? 0 : ReadImage(off, len, buf);
  Layer* l = FindLayer(layer_id);
  if (!l) return -ENOENT;
  if (len == 0) return 0;
  LayerFd h;
  int rc = l->Acquire(&h);
  return rc != 0 ? rc : fsutil::PreadFull(h.fd(), buf, len, off);
}

uint64_t Replica::AllocatedBytes() {
  std::shared_lock<RwLock> io(io_mu_);
  if (closed_.load()) return 0;
  const uint64_t gen = below_gen_.load();
  uint64_t below = 0;
  bool cached = false;
  {
    std::lock_guard<std::mutex> g(below_mu_);
    if (below_cached_gen_ == gen) {
      below = below_bytes_;
      cached = true;
    }
  }
  if (!cached) {
    for (const auto& kv : layers_)
      if (kv.second.get() != head_) below += kv.second->AllocatedBytes();
    std::lock_guard<std::mutex> g(below_mu_);
    if (below_gen_.load() == gen) {
      below_cached_gen_ = gen;
      below_bytes_ = below;
    }
  }
  return below + (head_ ? head_->AllocatedBytes() : 0);
}

// ---------------------------------------------------------------------------------------
// Snapshots

Status Replica::NewLayerFile(const LayerRecord& rec, uint64_t size_bytes, std::unique_ptr<Layer>* out) {
  const std::string path = fsutil::JoinPath(dir_, rec.file);
  // A file by this name can only be an orphan of a crashed operation (ids are never reused).
  ::unlink(path.c_str());
  Status s = fsutil::CreateSparseFile(path, size_bytes);
  if (!s.ok()) return s;
  int rc = fsutil::FsyncDir(dir_);
  if (rc != 0) {
    ::unlink(path.c_str());
    return Status::FromErrno(rc, "fsync directory " + dir_ + ": " + ErrText(rc));
  }
  auto layer = std::make_unique<Layer>(rec.num, rec.id, path);
  s = layer->Open(size_bytes);
  if (!s.ok()) {
    ::unlink(path.c_str());
    return s;
  }
  *out = std::move(layer);
  return Status::Ok();
}

void Replica::ForgetLayer(const std::string& id, bool unlink_file) {
  auto it = layers_.find(id);
  if (it == layers_.end()) return;
  std::string path = it->second->path();
  {
    std::unique_lock<RwLock> maps(map_mu_);
    by_num_.erase(it->second->num());
    layers_.erase(it);
  }
  if (unlink_file) ::unlink(path.c_str());
}

Status Replica::Snapshot(const std::string& name, int64_t created_ms, const Labels& labels,
                         bool user_created) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (!ReplicaMetadata::ValidSnapshotName(name))
    return Status::Error(Code::kInvalidArgument,
                         "snapshot name must be 1..255 characters of [A-Za-z0-9._-]");
  s = ReplicaMetadata::ValidateLabels(labels, Code::kInvalidArgument);
  if (!s.ok()) return s;
  ReplicaMetadata m = meta_;
  if (m.FindSnapshot(name))
    return Status::Error(Code::kAlreadyExists, "snapshot '" + name + "' already exists");
  if (m.layers.size() >= ReplicaMetadata::kMaxLayers)
    return Status::Error(Code::kOutOfRange, "replica " + dir_ + " already has " +
                                                std::to_string(m.layers.size()) + " layers");
  // The old head becomes read-only snapshot data: make it durable before it is named.
  int rc = fsutil::FdataSync(head_->fd());
  if (rc != 0) return Status::FromErrno(rc, "flush " + head_->path() + ": " + ErrText(rc));
  const std::string old_head = m.head;
  LayerRecord* old = m.Find(old_head);
  old->name = name;
  old->user_created = user_created;
  old->created_ms = created_ms;
  old->labels = labels;
  // Nothing writes while io_mu_ is held exclusively: this is what the old head adds below.
  const uint64_t old_head_bytes = head_->AllocatedBytes();
  s = CommitNewHead(std::move(m), old_head, created_ms, [this]() {
    // The old head's blocks now sit directly below the new, empty head.
    head_->extents().ForEachAll(
        [&](const ExtentMap::Interval& iv) { base_.Set(iv.start, iv.end, iv.value); });
  });
  if (s.ok()) {
    // The layers below grew by the old head alone: a kept figure moves with it (recounting
    // every layer after each snapshot would cost what the cache saves).
    std::lock_guard<std::mutex> g(below_mu_);
    const bool kept = below_cached_gen_ == below_gen_.load();
    const uint64_t gen = below_gen_.fetch_add(1) + 1;
    if (kept) {
      below_bytes_ += old_head_bytes;
      below_cached_gen_ = gen;
    }
  }
  return s;
}

Status Replica::CommitNewHead(ReplicaMetadata m, std::string parent, int64_t created_ms,
                              const std::function<void()>& before_switch) {
  LayerRecord rec = m.NewLayer(parent, created_ms);
  std::unique_ptr<Layer> layer;
  Status s = NewLayerFile(rec, size_, &layer);
  if (!s.ok()) return s;
  m.layers.push_back(rec);
  m.head = rec.id;
  s = SaveMeta(std::move(m));
  if (!s.ok()) {
    ::unlink(layer->path().c_str());
    return s;
  }
  std::unique_lock<RwLock> maps(map_mu_);
  if (before_switch) before_switch();
  Layer* raw = layer.get();
  by_num_[rec.num] = raw;
  layers_[rec.id] = std::move(layer);
  // The old head is read-only from now on: its descriptor goes to the cache.
  if (head_) head_->MakeCached();
  head_ = raw;
  return Status::Ok();
}

Status Replica::DropLayer(const std::string& id) { return CommitWithoutLayer(meta_, id); }

Status Replica::CommitWithoutLayer(ReplicaMetadata m, const std::string& id) {
  m.layers.erase(std::remove_if(m.layers.begin(), m.layers.end(),
                                [&](const LayerRecord& l) { return l.id == id; }),
                 m.layers.end());
  Status s = SaveMeta(std::move(m));
  if (!s.ok()) return s;
  ForgetLayer(id, true);
  return Status::Ok();
}

Status Replica::MergeInto(const std::string& id, const std::string& child_id) {
  Layer* src = FindLayer(id);
  Layer* dst = FindLayer(child_id);
  if (!src || !dst) return Status::Error(Code::kInvalidState, "merge: layer missing in memory");
  // 1. Copy the blocks the child does not hold. Reads through the child are unchanged:
  //    for those blocks they already resolved to this layer's identical data.
  std::vector<std::pair<uint64_t, uint64_t>> todo;
  src->extents().ForEachAll([&](const ExtentMap::Interval& iv) {
    ForEachGap(dst->extents(), iv.start, iv.end,
               [&](uint64_t s, uint64_t e) { todo.emplace_back(s, e); });
  });
  LayerFd src_fd, dst_fd;
  if (int rc = src->Acquire(&src_fd); rc != 0) return Status::FromErrno(-rc, "open " + src->path() + ": " + ErrText(rc));
  if (int rc = dst->Acquire(&dst_fd); rc != 0) return Status::FromErrno(-rc, "open " + dst->path() + ": " + ErrText(rc));
  std::vector<uint8_t> buf(kCopyChunkBytes);
  const uint64_t chunk_blocks = kCopyChunkBytes / kBlock;
  for (const auto& r : todo) {
    for (uint64_t b = r.first; b < r.second;) {
      uint64_t e = std::min(r.second, b + chunk_blocks);
      size_t n = static_cast<size_t>((e - b) * kBlock);
      int rc = fsutil::PreadFull(src_fd.fd(), buf.data(), n, b * kBlock);
      if (rc == 0) rc = fsutil::PwriteFull(dst_fd.fd(), buf.data(), n, b * kBlock);
      if (rc != 0) return Status::FromErrno(rc, "merge " + id + " into " + child_id + ": " + ErrText(rc));
      b = e;
    }
  }
  {
    std::unique_lock<RwLock> maps(map_mu_);
    for (const auto& r : todo) dst->extents().Set(r.first, r.second, dst->num());
  }
  // 2. Durable before the metadata stops pointing the child at this layer.
  int rc = fsutil::FdataSync(dst_fd.fd());
  if (rc != 0) return Status::FromErrno(rc, "flush " + dst->path() + ": " + ErrText(rc));
  src_fd.Reset();
  dst_fd.Reset();
  // 3. Re-parent the child and drop the layer in one metadata commit; 4. unlink the file.
  ReplicaMetadata m = meta_;
  LayerRecord* child = m.Find(child_id);
  const LayerRecord* me = m.Find(id);
  child->parent = me->parent;
  return CommitWithoutLayer(std::move(m), id);
}

Status Replica::Prune(const std::string& id) {
  Layer* l = FindLayer(id);
  if (!l) return Status::Error(Code::kInvalidState, "prune: layer missing in memory");
  // The head's copies of these blocks must be durable before the snapshot's go.
  int rc = fsutil::FdataSync(head_->fd());
  if (rc != 0) return Status::FromErrno(rc, "flush " + head_->path() + ": " + ErrText(rc));
  std::vector<ExtentMap::Interval> shadowed;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    l->extents().ForEachAll([&](const ExtentMap::Interval& iv) {
      head_->extents().ForEach(iv.start, iv.end,
                               [&](const ExtentMap::Interval& h) { shadowed.push_back(h); });
    });
  }
  LayerFd h;
  if (!shadowed.empty()) {
    rc = l->Acquire(&h);
    if (rc != 0) return Status::FromErrno(-rc, "open " + l->path() + ": " + ErrText(rc));
  }
  for (const auto& iv : shadowed) {
    rc = fsutil::PunchHole(h.fd(), iv.start * kBlock, (iv.end - iv.start) * kBlock);
    if (rc != 0) return Status::FromErrno(rc, "punch " + l->path() + ": " + ErrText(rc));
  }
  std::unique_lock<RwLock> maps(map_mu_);
  for (const auto& iv : shadowed) l->extents().Erase(iv.start, iv.end);
  return Status::Ok();
}

// Removes or merges removed layers that no longer need to be kept: a removed layer with no
// children is dropped; one whose only child is a snapshot is merged into it; one whose only
// child is the head is pruned against it.
Status Replica::Collect() {
  for (size_t round = 0; round <= meta_.layers.size() + 1; ++round) {
    std::map<std::string, std::vector<std::string>> children;
    for (const LayerRecord& l : meta_.layers)
      if (!l.parent.empty()) children[l.parent].push_back(l.id);
    std::string action, target, child;
    for (const LayerRecord& l : meta_.layers) {
      if (!l.removed || l.id == meta_.head) continue;
      const auto& ch = children[l.id];
      if (ch.empty()) {
        action = "drop";
      } else if (ch.size() == 1 && ch[0] != meta_.head) {
        action = "merge";
        child = ch[0];
      } else {
        continue;
      }
      target = l.id;
      break;
    }
    if (action.empty()) break;
    Status s = action == "drop" ? DropLayer(target) : MergeInto(target, child);
    if (!s.ok()) return s;
  }
  std::vector<std::string> prune;
  for (const LayerRecord& l : meta_.layers) {
    if (!l.removed) continue;
    auto ch = meta_.Children(l.id);
    if (ch.size() == 1 && ch[0]->id == meta_.head) prune.push_back(l.id);
  }
  for (const auto& id : prune) {
    Status s = Prune(id);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void Replica::RebuildBase() {
  std::map<std::string, const LayerRecord*> recs;
  for (const LayerRecord& l : meta_.layers) recs[l.id] = &l;
  std::vector<Layer*> chain;  // head's parent first
  const LayerRecord* cur = recs.at(meta_.head);
  // Parents are strictly older (validated), so the walk ends within layers.size() steps.
  while (!cur->parent.empty()) {
    cur = recs.at(cur->parent);
    chain.push_back(layers_.at(cur->id).get());
  }
  std::unique_lock<RwLock> maps(map_mu_);
  base_.Clear();
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    (*it)->extents().ForEachAll(
        [&](const ExtentMap::Interval& iv) { base_.Set(iv.start, iv.end, iv.value); });
  }
}

Status Replica::DeleteSnapshot(const std::string& name) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  BelowChange below_change{this};
  Status s = CheckOpen();
  if (!s.ok()) return s;
  const LayerRecord* rec = meta_.FindSnapshot(name);
  if (!rec) return Status::Error(Code::kNotFound, "no snapshot '" + name.substr(0, 255) + "'");
  const std::string id = rec->id;
  auto children = meta_.Children(id);
  try {
    if (children.empty()) {
      s = DropLayer(id);
    } else if (children.size() == 1 && children[0]->id != meta_.head) {
      s = MergeInto(id, children[0]->id);
    } else {
      // Kept but hidden. Commit "removed" before pruning: a crash between the two must not
      // leave a visible snapshot with blocks punched out of it.
      ReplicaMetadata m = meta_;
      m.Find(id)->removed = true;
      s = SaveMeta(std::move(m));
      if (s.ok() && children.size() == 1) s = Prune(id);
    }
    if (s.ok()) s = Collect();
  } catch (const std::exception& e) {
    s = Status::Error(Code::kIoError, std::string("delete snapshot: ") + e.what());
  }
  RebuildBase();
  return s;
}

Status Replica::Revert(const std::string& name, int64_t created_ms) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  BelowChange below_change{this};
  Status s = CheckOpen();
  if (!s.ok()) return s;
  const LayerRecord* target = meta_.FindSnapshot(name);
  if (!target) return Status::Error(Code::kNotFound, "no snapshot '" + name.substr(0, 255) + "'");
  ReplicaMetadata m = meta_;
  const std::string old_head = m.head;
  m.layers.erase(std::remove_if(m.layers.begin(), m.layers.end(),
                                [&](const LayerRecord& l) { return l.id == old_head; }),
                 m.layers.end());
  s = CommitNewHead(std::move(m), target->id, created_ms);
  if (!s.ok()) return s;
  // The discarded head's file was used by no other layer (heads are always leaves).
  ForgetLayer(old_head, true);
  try {
    s = Collect();
  } catch (const std::exception& e) {
    s = Status::Error(Code::kIoError, std::string("revert: ") + e.what());
  }
  RebuildBase();
  return s;
}

// ---------------------------------------------------------------------------------------
// Inspect (no lock) and rebuild target operations (docs/rebuild.md)

Status Replica::Inspect(const std::string& dir, ReplicaInfo* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output pointer");
  ReplicaMetadata m;
  Status s = ReplicaMetadata::Load(dir, &m);
  if (!s.ok()) return s;
  ReplicaInfo info;
  info.size_bytes = m.size_bytes;
  info.epoch = m.epoch;
  info.clean = m.clean;
  info.rebuilding = m.rebuilding;
  info.backing_image = m.backing_image;
  for (const LayerRecord& l : m.layers) {
    struct stat st;
    // lstat: a planted symlink is not followed (Open would refuse it anyway).
    if (::lstat(fsutil::JoinPath(dir, l.file).c_str(), &st) == 0 && S_ISREG(st.st_mode))
      info.allocated_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  *out = info;
  return Status::Ok();
}

std::vector<Layer*> Replica::ChainBelowHead() {
  std::vector<Layer*> chain;
  std::lock_guard<std::mutex> g(meta_mu_);
  std::unordered_map<std::string, const LayerRecord*> recs;
  for (const LayerRecord& l : meta_.layers) recs[l.id] = &l;
  auto it = recs.find(meta_.head);
  // Parents are strictly older (validated), so the walk ends within layers.size() steps.
  while (it != recs.end() && !it->second->parent.empty()) {
    it = recs.find(it->second->parent);
    if (it == recs.end()) break;
    if (Layer* l = FindLayer(it->first)) chain.push_back(l);
  }
  return chain;
}

void Replica::RecomputeBaseLocked(const std::vector<Layer*>& chain, uint64_t b0, uint64_t b1) {
  base_.Erase(b0, b1);
  // Bottom first, so nearer layers overwrite farther ones.
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    (*it)->extents().ForEach(b0, b1, [&](const ExtentMap::Interval& iv) { base_.Set(iv.start, iv.end, iv.value); });
}

int Replica::CheckRebuildOp(uint64_t epoch, uint64_t off, uint64_t len) const {
  if (!InRange(off, len, size_) || off % kBlock != 0 || len % kBlock != 0) return -EINVAL;
  if (closed_.load()) return -EBADF;
  // Checked under io_mu_ (shared), which ClaimEpoch/AdoptChain hold exclusively: no
  // rebuild write of an older engine can land after a newer one took the replica.
  if (epoch != epoch_.load()) return -kErrStaleEpoch;
  if (const uint64_t w = writer_token_.load(); w != 0 && w != WriterScope::Current()) return -kErrStaleEpoch;
  // Writing below the head of a replica that serves reads would change what it returns.
  if (!rebuilding_.load()) return -EPERM;
  return 0;
}

Status Replica::AdoptChain(const std::vector<LayerInfo>& layers, uint64_t epoch) {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  std::unique_lock<RwLock> io(io_mu_);
  BelowChange below_change{this};
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (epoch < epoch_.load())
    return Status::Error(Code::kStaleEpoch, "replica " + dir_ + ": adopting a chain at epoch " + std::to_string(epoch) +
                                                " but the replica is at epoch " + std::to_string(epoch_.load()),
                         ESTALE);
  if (layers.empty() || layers.size() > ReplicaMetadata::kMaxLayers)
    return Status::Error(Code::kInvalidArgument, "adopt chain: 1.." + std::to_string(ReplicaMetadata::kMaxLayers) +
                                                     " layers needed, got " + std::to_string(layers.size()));
  ReplicaMetadata m;
  {
    std::lock_guard<std::mutex> g(meta_mu_);
    m = meta_;
  }
  m.epoch = epoch;
  m.clean = false;
  m.rebuilding = true;
  m.head.clear();
  m.layers.clear();
  uint32_t max_num = 0;
  for (const LayerInfo& info : layers) {
    LayerRecord rec;
    if (!ReplicaMetadata::ParseLayerId(info.id, &rec.num))
      return Status::Error(Code::kInvalidArgument, "adopt chain: invalid layer id '" + info.id.substr(0, 64) + "'");
    rec.id = info.id;
    rec.file = ReplicaMetadata::LayerFile(rec.id);
    rec.parent = info.parent;
    rec.name = info.name;
    rec.removed = info.removed;
    rec.user_created = info.user_created;
    rec.created_ms = info.created_ms;
    rec.labels = info.labels;
    rec.size_bytes = info.size_bytes;
    if (info.head) {
      if (!m.head.empty()) return Status::Error(Code::kInvalidArgument, "adopt chain: more than one head");
      m.head = rec.id;
    }
    max_num = std::max(max_num, rec.num);
    m.layers.push_back(std::move(rec));
  }
  std::sort(m.layers.begin(), m.layers.end(), [](const LayerRecord& a, const LayerRecord& b) { return a.num < b.num; });
  // The source's head is always its newest layer (snapshot and revert allocate it last),
  // so this makes the next snapshot get the same id here as on the source.
  m.next_layer_num = max_num + 1;
  // The target takes the source's size with its chain: it may have missed a resize while
  // it was ERR, or been grown by one that never reached the engine that now rebuilds it
  // (docs/replica-format.md, "Size"). Its data is replaced by the rebuild either way.
  const uint64_t old_size = size_.load();
  m.size_bytes = layers.front().size_bytes;
  s = m.Validate();
  if (!s.ok()) return Status::Error(Code::kInvalidArgument, "adopt chain: " + s.message);
  const uint64_t new_size = m.size_bytes;
  // Kept files grow before the commit and shrink after it, so a crash on either side leaves
  // files at least as long as the recorded size (Open cuts longer ones back).
  if (new_size > old_size) {
    s = ResizeLayers(new_size, old_size);
    if (!s.ok()) return s;
  }

  // A kept layer that becomes the head keeps its descriptor open from now on; a reopen that
  // fails here fails the adoption before anything changed (a resident spare layer is harmless).
  if (Layer* kept_head = FindLayer(m.head)) {
    if (int rc = kept_head->MakeResident(); rc != 0) {
      if (new_size > old_size) ResizeLayers(old_size, old_size);
      return Status::FromErrno(-rc, "open " + kept_head->path() + ": " + ErrText(rc));
    }
  }
  // New files first (durable before the commit that names them); on failure nothing changed.
  std::vector<std::unique_ptr<Layer>> created;
  auto unlink_created = [&]() {
    for (const auto& l : created) ::unlink(l->path().c_str());
  };
  for (const LayerRecord& rec : m.layers) {
    if (FindLayer(rec.id)) continue;
    std::unique_ptr<Layer> layer;
    s = NewLayerFile(rec, new_size, &layer);
    if (!s.ok()) {
      unlink_created();
      if (new_size > old_size) ResizeLayers(old_size, old_size);
      return s;
    }
    created.push_back(std::move(layer));
  }
  s = SaveMeta(m);
  if (!s.ok()) {
    unlink_created();
    if (new_size > old_size) ResizeLayers(old_size, old_size);
    return s;
  }
  std::vector<std::string> dropped;
  {
    std::unique_lock<RwLock> maps(map_mu_);
    for (auto& l : created) {
      by_num_[l->num()] = l.get();
      std::string id = l->id();
      layers_[id] = std::move(l);
    }
    for (auto it = layers_.begin(); it != layers_.end();) {
      if (m.Find(it->first)) {
        ++it;
        continue;
      }
      dropped.push_back(it->second->path());
      by_num_.erase(it->second->num());
      it = layers_.erase(it);
    }
    head_ = layers_.at(m.head).get();
    for (const auto& kv : layers_)
      if (kv.second.get() != head_) kv.second->MakeCached();
  }
  // After the commit: a crash before these unlinks leaves orphans that Open removes.
  for (const auto& path : dropped) ::unlink(path.c_str());
  if (new_size < old_size) {
    // Best effort: a file left longer is cut back by Open. What lay beyond the new end
    // leaves the extent sets with it.
    std::unique_lock<RwLock> maps(map_mu_);
    for (const auto& kv : layers_) {
      kv.second->Resize(new_size);
      kv.second->ScanExtents(new_size);
    }
  }
  size_ = new_size;
  RebuildBase();
  epoch_ = epoch;
  writer_token_ = WriterScope::Current();
  clean_ = false;
  rebuilding_ = true;
  return Status::Ok();
}

Status Replica::LayerDigest(const std::string& layer_id, uint64_t off, uint64_t len, DigestDetail detail,
                            std::vector<UnitDigest>* out) {
  if (!out) return Status::Error(Code::kInvalidArgument, "no output vector");
  // The last unit may reach past the end of a volume whose size is not a multiple of it.
  const uint64_t limit = (size_ + kDigestUnitBytes - 1) / kDigestUnitBytes * kDigestUnitBytes;
  if (off % kDigestUnitBytes != 0 || len % kDigestUnitBytes != 0 || len > kMaxDigestRangeBytes ||
      !InRange(off, len, limit))
    return Status::Error(Code::kInvalidArgument,
                         "layer digest range [" + std::to_string(off) + ", +" + std::to_string(len) +
                             ") must be whole digest units (" + std::to_string(kDigestUnitBytes) + " bytes), at most " + std::to_string(kMaxDigestRangeBytes) + " bytes, inside the volume");
  out->clear();
  std::shared_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  Layer* l = FindLayer(layer_id);
  if (!l) return Status::Error(Code::kNotFound, "replica " + dir_ + ": no layer '" + layer_id.substr(0, 64) + "'");
  if (len == 0) return Status::Ok();
  const uint64_t b0 = off / kBlock, b1 = std::min((off + len) / kBlock, size_ / kBlock);
  std::vector<ExtentMap::Interval> ivs;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    l->extents().ForEach(b0, b1, [&](const ExtentMap::Interval& iv) { ivs.push_back(iv); });
  }
  if (ivs.empty()) return Status::Ok();

  constexpr size_t kMaxUnits = kMaxDigestRangeBytes / kDigestUnitBytes;
  uint16_t masks[kMaxUnits] = {};
  auto mark = [&](const ExtentMap::Interval& iv) {
    for (uint64_t b = iv.start; b < iv.end; ++b)
      masks[(b - b0) / kDigestBlocksPerUnit] |= static_cast<uint16_t>(1u << ((b - b0) % kDigestBlocksPerUnit));
  };
  if (detail == DigestDetail::kMasksOnly) {
    for (const auto& iv : ivs) mark(iv);
    for (size_t u = 0; u < len / kDigestUnitBytes; ++u) {
      if (masks[u] == 0) continue;
      UnitDigest d{};
      d.off = off + u * kDigestUnitBytes;
      d.mask = masks[u];
      out->push_back(d);
    }
    return Status::Ok();
  }
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[len]);
  if (!buf) return Status::Error(Code::kIoError, "out of memory for a layer digest", ENOMEM);
  LayerFd h;
  if (int rc = l->Acquire(&h); rc != 0) return Status::FromErrno(-rc, "open " + l->path() + ": " + ErrText(rc));
  for (const auto& iv : ivs) {
    int rc = fsutil::PreadFull(h.fd(), buf.get() + (iv.start - b0) * kBlock, (iv.end - iv.start) * kBlock,
                               iv.start * kBlock);
    if (rc != 0) return Status::FromErrno(rc, "read " + l->path() + ": " + ErrText(rc));
    mark(iv);
  }

  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx) return Status::Error(Code::kIoError, "out of memory for a SHA-256 context", ENOMEM);
  for (size_t u = 0; u < len / kDigestUnitBytes; ++u) {
    if (masks[u] == 0) continue;
    UnitDigest d;
    d.off = off + u * kDigestUnitBytes;
    d.mask = masks[u];
    bool ok = EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
    // Runs of allocated blocks, in address order.
    for (uint32_t i = 0; ok && i < kDigestBlocksPerUnit;) {
      if (!(masks[u] & (1u << i))) {
        ++i;
        continue;
      }
      uint32_t j = i;
      while (j < kDigestBlocksPerUnit && (masks[u] & (1u << j))) ++j;
      ok = EVP_DigestUpdate(ctx.get(), buf.get() + u * kDigestUnitBytes + i * kBlock, (j - i) * kBlock) == 1;
      i = j;
    }
    unsigned int n = 0;
    if (ok) ok = EVP_DigestFinal_ex(ctx.get(), d.sha256, &n) == 1 && n == sizeof d.sha256;
    if (!ok) return Status::Error(Code::kIoError, "SHA-256 failed");
    out->push_back(d);
  }
  return Status::Ok();
}

int Replica::WriteLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint32_t len, const uint8_t* buf) {
  if (len > 0 && !buf) return -EINVAL;
  std::shared_lock<RwLock> io(io_mu_);
  BelowChange below_change{this};
  int rc = CheckRebuildOp(epoch, off, len);
  if (rc != 0) return rc;
  Layer* l = FindLayer(layer_id);
  if (!l) return -ENOENT;
  if (len == 0) return 0;
  LayerFd h;
  rc = l->Acquire(&h);
  if (rc == 0) rc = fsutil::PwriteFull(h.fd(), buf, len, off);
  if (rc != 0) return rc;
  // Start writeback now: FinishRebuild's fdatasync runs while the engine holds I/O off,
  // so it should find little left to write. Advisory; errors surface at that fdatasync.
  (void)::sync_file_range(h.fd(), static_cast<off_t>(off), static_cast<off_t>(len), SYNC_FILE_RANGE_WRITE);
  const uint64_t b0 = off / kBlock, b1 = (off + len) / kBlock;
  if (l == head_) {
    std::unique_lock<RwLock> maps(map_mu_);
    head_->extents().Set(b0, b1, head_->num());
    return 0;
  }
  // The file holds the data before the maps say so (as on the data path).
  const std::vector<Layer*> chain = ChainBelowHead();
  const bool in_chain = std::find(chain.begin(), chain.end(), l) != chain.end();
  std::unique_lock<RwLock> maps(map_mu_);
  l->extents().Set(b0, b1, l->num());
  if (in_chain) RecomputeBaseLocked(chain, b0, b1);
  return 0;
}

int Replica::UnmapLayer(uint64_t epoch, const std::string& layer_id, uint64_t off, uint64_t len) {
  std::shared_lock<RwLock> io(io_mu_);
  BelowChange below_change{this};
  int rc = CheckRebuildOp(epoch, off, len);
  if (rc != 0) return rc;
  Layer* l = FindLayer(layer_id);
  if (!l) return -ENOENT;
  if (len == 0) return 0;
  const uint64_t b0 = off / kBlock, b1 = (off + len) / kBlock;
  std::vector<ExtentMap::Interval> owned;
  {
    std::shared_lock<RwLock> maps(map_mu_);
    l->extents().ForEach(b0, b1, [&](const ExtentMap::Interval& iv) { owned.push_back(iv); });
  }
  if (owned.empty()) return 0;
  LayerFd h;
  rc = l->Acquire(&h);
  if (rc != 0) return rc;
  for (const auto& iv : owned) {
    rc = fsutil::PunchHole(h.fd(), iv.start * kBlock, (iv.end - iv.start) * kBlock);
    if (rc != 0) return rc;
  }
  if (l == head_) {
    std::unique_lock<RwLock> maps(map_mu_);
    head_->extents().Erase(b0, b1);
    return 0;
  }
  const std::vector<Layer*> chain = ChainBelowHead();
  const bool in_chain = std::find(chain.begin(), chain.end(), l) != chain.end();
  std::unique_lock<RwLock> maps(map_mu_);
  l->extents().Erase(b0, b1);
  if (in_chain) RecomputeBaseLocked(chain, b0, b1);
  return 0;
}

Status Replica::FinishRebuild() {
  std::lock_guard<std::mutex> ctl(ctl_mu_);
  // Shared: the syncs must not stop the data path (the engine keeps writing to its WO
  // target until it makes it RW).
  std::shared_lock<RwLock> io(io_mu_);
  Status s = CheckOpen();
  if (!s.ok()) return s;
  if (!rebuilding_.load()) return Status::Ok();
  // Every layer may have been written by WriteLayer; all must be durable before the flag
  // that says "this replica may be incomplete" goes.
  for (const auto& kv : layers_) {
    // A cached layer's descriptor may have been closed since WriteLayer wrote through it:
    // fdatasync of a new one flushes the same inode's pages (and reports an error no
    // descriptor saw yet).
    LayerFd h;
    int rc = kv.second->Acquire(&h);
    if (rc == 0) rc = fsutil::FdataSync(h.fd());
    if (rc != 0) return Status::FromErrno(rc, "flush " + kv.second->path() + ": " + ErrText(rc));
  }
  std::lock_guard<std::mutex> g(meta_mu_);
  ReplicaMetadata m = meta_;
  m.rebuilding = false;
  s = CommitMetaLocked(std::move(m));
  if (!s.ok()) return s;
  rebuilding_ = false;
  return Status::Ok();
}

}  // namespace mooring
