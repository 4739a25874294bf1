#include "engine/snapshot-reader.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "engine/range-set.h"

namespace mooring {
namespace {

constexpr uint64_t kBlock = 4096;

bool IsZeroBlock(const uint8_t* p) {
  static const uint8_t kZero[kBlock] = {};
  return std::memcmp(p, kZero, kBlock) == 0;
}

// Failures that say nothing about the replica: switching replicas would not help.
bool IsFinal(Code c) {
  switch (c) {
    case Code::kClosed:
    case Code::kStaleEpoch:
    case Code::kNotFound:
    case Code::kInvalidArgument:
    case Code::kUnsupported:
    case Code::kNoHealthyReplica:
      return true;
    default:
      return false;
  }
}

int ErrnoOf(const Status& st) { return st.sys_errno > 0 ? -st.sys_errno : -EIO; }

Status FromRc(int rc, const std::string& what) {
  if (rc == -ESHUTDOWN) return Status::Error(Code::kClosed, what + ": the engine is closed", ESHUTDOWN);
  return Status::FromErrno(rc, what + ": " + std::strerror(-rc));
}

}  // namespace

Status SnapshotReader::Open(Engine* engine, const std::string& name, std::unique_ptr<SnapshotReader>* out) {
  if (name.empty()) return Status::Error(Code::kInvalidArgument, "a snapshot name is required");
  std::unique_ptr<Engine::SnapshotRead> read;
  Status st = engine->OpenSnapshotRead(&read);
  if (!st.ok()) return st;
  std::unique_ptr<SnapshotReader> r(new SnapshotReader(std::move(read), name, engine->size()));
  size_t failovers = 0;
  std::vector<std::string> chain;
  for (;;) {
    st = r->ResolveChain(&chain);
    if (st.ok() || IsFinal(st.code)) break;
    st = r->Recover(st, &failovers);  // chain_ is empty: it only switches replicas
    if (!st.ok()) return st;
  }
  if (!st.ok()) return st;
  r->chain_ = std::move(chain);
  *out = std::move(r);
  return Status::Ok();
}

Status SnapshotReader::ResolveChain(std::vector<std::string>* chain) {
  std::vector<LayerInfo> layers;
  Status st = read_->ListLayers(&layers);
  if (!st.ok()) return Status::Error(st.code, "listing the layers of " + read_->replica_id() + ": " + st.message, st.sys_errno);
  std::map<std::string, const LayerInfo*> by_id;
  const LayerInfo* top = nullptr;
  for (const LayerInfo& l : layers) {
    by_id[l.id] = &l;
    if (!l.head && !l.removed && l.name == name_) top = &l;
  }
  if (!top) return Status::Error(Code::kNotFound, "no snapshot '" + name_.substr(0, 255) + "'");
  chain->clear();
  // Parents are older than their children (ReplicaMetadata checks it), so this ends; the
  // bound keeps a damaged list from looping all the same.
  for (const LayerInfo* l = top; l; ) {
    if (chain->size() >= layers.size())
      return Status::Error(Code::kCorrupt, "replica " + read_->replica_id() + ": the chain of '" + name_ + "' loops");
    chain->push_back(l->id);
    if (l->parent.empty()) break;
    auto it = by_id.find(l->parent);
    if (it == by_id.end())
      return Status::Error(Code::kCorrupt, "replica " + read_->replica_id() + ": layer " + l->id + " names a missing parent " + l->parent);
    l = it->second;
  }
  // The backing image is the bottom of every chain: blocks no layer owns read from it.
  std::vector<Range> probe;
  st = read_->LayerExtents(kBackingImageLayerId, &probe);
  if (st.ok()) {
    chain->push_back(kBackingImageLayerId);
  } else if (st.code != Code::kNotFound) {
    return Status::Error(st.code, "backing image of " + read_->replica_id() + ": " + st.message, st.sys_errno);
  }
  return Status::Ok();
}

Status SnapshotReader::Recover(Status failure, size_t* failovers) {
  for (;;) {
    if (IsFinal(failure.code) || ++*failovers > kMaxFailovers) return failure;
    const std::string from = read_->replica_id();
    Status st = read_->Failover(ErrnoOf(failure));
    if (!st.ok())
      return Status::Error(failure.code, failure.message + " (no other RW replica to read from: " + st.message + ")",
                           failure.sys_errno);
    if (chain_.empty()) return Status::Ok();  // still resolving (Open)
    // Layer lists are equal on every RW replica (the engine checks it at start and when a
    // rebuild finishes); a different chain here would be a broken invariant, not a retry.
    std::vector<std::string> chain;
    st = ResolveChain(&chain);
    if (!st.ok()) {
      failure = st;  // the next replica failed too
      continue;
    }
    if (chain != chain_)
      return Status::Error(Code::kIoError, "replica " + read_->replica_id() + " holds a different chain for '" + name_ +
                                               "' than " + from);
    return Status::Ok();
  }
}

Status SnapshotReader::LoadExtentsRecovering(size_t* failovers) {
  for (;;) {
    Status st = LoadExtents();
    if (st.ok()) return st;
    st = Recover(st, failovers);
    if (!st.ok()) return st;
  }
}

Status SnapshotReader::LoadExtents() {
  extents_.assign(chain_.size(), {});
  for (size_t i = 0; i < chain_.size(); ++i) {
    Status st = read_->LayerExtents(chain_[i], &extents_[i]);
    // A chain layer that vanished is a broken invariant (the read holds them), not a missing snapshot.
    if (st.code == Code::kNotFound) st.code = Code::kIoError;
    if (!st.ok())
      return Status::Error(st.code, "extents of layer " + chain_[i] + " on " + read_->replica_id() + ": " + st.message, st.sys_errno);
    SortAndMerge(&extents_[i]);
    // Ownership is per block; anything else (or beyond the volume) is a damaged replica.
    for (const Range& r : extents_[i])
      if (r.off % kBlock != 0 || r.len % kBlock != 0 || r.off + r.len > size_ || r.off + r.len < r.off)
        return Status::Error(Code::kIoError, "layer " + chain_[i] + " on " + read_->replica_id() + " lists an extent outside the volume's blocks");
  }
  return Status::Ok();
}

Status SnapshotReader::CopyTo(SnapshotSink* sink, const Progress& progress, SnapshotCopyResult* out) {
  if (used_) return Status::Error(Code::kInvalidState, "a snapshot reader copies once");
  used_ = true;
  const auto t0 = std::chrono::steady_clock::now();
  SnapshotCopyResult res;
  res.size_bytes = size_;
  Status st = Run(sink, progress, &res);
  if (st.ok()) st = sink->Finish();
  if (!st.ok()) {
    sink->Abort();
    return st;
  }
  res.duration_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  if (out) *out = res;
  return Status::Ok();
}

Status SnapshotReader::Run(SnapshotSink* sink, const Progress& progress, SnapshotCopyResult* res) {
  size_t failovers = 0;
  Status st = LoadExtentsRecovering(&failovers);
  if (!st.ok()) return st;

  uint64_t total = 0;
  {
    std::vector<Range> all;
    for (const auto& e : extents_) all.insert(all.end(), e.begin(), e.end());
    SortAndMerge(&all);
    total = TotalBytes(all);
  }
  uint64_t next_progress = kProgressIntervalBytes;

  std::vector<uint8_t> buf(kWindowBytes);
  std::vector<int32_t> owner(kWindowBytes / kBlock);
  std::vector<uint8_t> data(kWindowBytes / kBlock);  // block holds nonzero data
  std::vector<size_t> cur(extents_.size(), 0);
  uint64_t pos = 0;        // start of the next window
  uint64_t zero_from = 0;  // [zero_from, pos) reads as zeros and was not handed over yet

  while (pos < size_) {
    // Skip to the next block any chain layer owns.
    uint64_t next = size_;
    for (size_t i = 0; i < extents_.size(); ++i) {
      const auto& ext = extents_[i];
      while (cur[i] < ext.size() && ext[cur[i]].off + ext[cur[i]].len <= pos) ++cur[i];
      if (cur[i] < ext.size()) next = std::min(next, std::max(pos, ext[cur[i]].off));
    }
    if (next >= size_) break;
    pos = next;
    const uint64_t end = std::min(size_, pos + kWindowBytes);
    const size_t nblocks = static_cast<size_t>((end - pos) / kBlock);

    // Owners: chain order is top first, so the first layer to claim a block wins.
    std::fill(owner.begin(), owner.begin() + static_cast<std::ptrdiff_t>(nblocks), -1);
    for (size_t i = 0; i < extents_.size(); ++i) {
      const auto& ext = extents_[i];
      for (size_t k = cur[i]; k < ext.size() && ext[k].off < end; ++k) {
        const uint64_t a = std::max(pos, ext[k].off), b = std::min(end, ext[k].off + ext[k].len);
        for (uint64_t x = a; x < b; x += kBlock) {
          int32_t& o = owner[static_cast<size_t>((x - pos) / kBlock)];
          if (o < 0) o = static_cast<int32_t>(i);
        }
      }
    }

    // Read each run of one owner in one call.
    bool restart = false;
    uint64_t owned = 0;
    for (size_t b = 0; b < nblocks;) {
      if (owner[b] < 0) {
        ++b;
        continue;
      }
      size_t e = b + 1;
      while (e < nblocks && owner[e] == owner[b]) ++e;
      const uint64_t off = pos + b * kBlock;
      const uint32_t len = static_cast<uint32_t>((e - b) * kBlock);
      const std::string& layer = chain_[static_cast<size_t>(owner[b])];
      int rc = read_->ReadLayer(layer, off, len, buf.data() + b * kBlock);
      if (rc < 0) {
        Status failure = FromRc(rc, "reading layer " + layer + " of snapshot '" + name_ + "' on " + read_->replica_id() +
                                        " at " + std::to_string(off));
        if (rc == -ENOENT) failure = Status::Error(Code::kIoError, failure.message, ENOENT);  // a layer vanished: not a missing snapshot
        st = Recover(failure, &failovers);
        if (st.ok()) st = LoadExtentsRecovering(&failovers);
        if (!st.ok()) return st;
        std::fill(cur.begin(), cur.end(), 0);  // new extent lists: the window starts again
        restart = true;
        break;
      }
      owned += len;
      b = e;
    }
    if (restart) continue;

    for (size_t b = 0; b < nblocks; ++b) data[b] = owner[b] >= 0 && !IsZeroBlock(buf.data() + b * kBlock);
    for (size_t b = 0; b < nblocks;) {
      size_t e = b + 1;
      while (e < nblocks && data[e] == data[b]) ++e;
      if (data[b]) {
        const uint64_t off = pos + b * kBlock;
        if (zero_from < off) {
          st = sink->Zeroes(zero_from, off - zero_from);
          if (!st.ok()) return st;
        }
        const uint32_t len = static_cast<uint32_t>((e - b) * kBlock);
        st = sink->Data(off, buf.data() + b * kBlock, len);
        if (!st.ok()) return st;
        res->copied_bytes += len;
        zero_from = off + len;
      }
      b = e;
    }
    res->read_bytes += owned;
    if (progress && res->read_bytes >= next_progress) {
      progress(res->read_bytes, total);
      next_progress = (res->read_bytes / kProgressIntervalBytes + 1) * kProgressIntervalBytes;
    }
    pos = end;
  }
  if (zero_from < size_) return sink->Zeroes(zero_from, size_ - zero_from);
  return Status::Ok();
}

}  // namespace mooring
