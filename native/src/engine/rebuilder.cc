#include "engine/rebuilder.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "engine/range-set.h"

namespace mooring {
namespace {

constexpr uint64_t kBlock = 4096;

int ErrnoOf(const Status& st) { return st.sys_errno > 0 ? -st.sys_errno : -EIO; }

// Appends [off, off+len) to a list of runs, extending the last run when contiguous.
void AddRun(std::vector<Range>* runs, uint64_t off, uint64_t len) {
  if (!runs->empty() && runs->back().off + runs->back().len == off)
    runs->back().len += len;
  else
    runs->push_back({off, len});
}

// Adds the blocks of a unit's mask as runs.
void AddMaskRuns(std::vector<Range>* runs, uint64_t unit_off, uint32_t mask) {
  for (uint32_t i = 0; i < kDigestBlocksPerUnit;) {
    if (!(mask & (1u << i))) {
      ++i;
      continue;
    }
    uint32_t j = i;
    while (j < kDigestBlocksPerUnit && (mask & (1u << j))) ++j;
    AddRun(runs, unit_off + i * kBlock, (j - i) * kBlock);
    i = j;
  }
}

}  // namespace

Rebuilder::Rebuilder(ReplicaBackend* target, Hooks hooks) : target_(target), hooks_(std::move(hooks)) {}

int Rebuilder::LoadUnion(ReplicaBackend* source, const std::string& layer_id, std::vector<Range>* src,
                         std::vector<Range>* all, bool* source_failed) {
  Status st = source->LayerExtents(layer_id, src);
  if (!st.ok()) {
    *source_failed = true;
    return ErrnoOf(st);
  }
  SortAndMerge(src);
  std::vector<Range> dst;
  st = target_->LayerExtents(layer_id, &dst);
  if (!st.ok()) return ErrnoOf(st);
  *all = *src;
  all->insert(all->end(), dst.begin(), dst.end());
  SortAndMerge(all);
  return 0;
}

int Rebuilder::UnionBytes(ReplicaBackend* source, const std::string& layer_id, uint64_t* out, bool* source_failed) {
  std::vector<Range> src, all;
  int rc = LoadUnion(source, layer_id, &src, &all, source_failed);
  if (rc == 0) *out = TotalBytes(all);
  return rc;
}

int Rebuilder::CopyLayer(ReplicaBackend* source, const LayerInfo& layer, bool* source_failed) {
  *source_failed = false;
  // Listed now, when every layer below this one is complete on the target: from here on a
  // foreground write to a range outside both sides' extents acts the same on both, so
  // only the union needs visiting (docs/rebuild.md, "Why the union suffices").
  std::vector<Range> src, all;
  int rc = LoadUnion(source, layer.id, &src, &all, source_failed);
  if (rc < 0) return rc;
  if (buf_.empty()) buf_.resize(kWindowBytes);
  const uint64_t size = source->size();
  // Windows are aligned, so one window may cover several union ranges: visit each once.
  uint64_t next = 0;
  for (const Range& r : all) {
    for (uint64_t w = std::max(next, r.off / kWindowBytes * kWindowBytes); w < r.off + r.len; w += kWindowBytes) {
      const uint64_t end = std::min(w + kWindowBytes, (size + kDigestUnitBytes - 1) / kDigestUnitBytes * kDigestUnitBytes);
      rc = CopyWindow(source, layer.id, layer.head, w, end - w, src, source_failed);
      if (rc < 0) return rc;
      totals_.scanned_bytes += TotalBytes(Clip(all, w, end));
      if (hooks_.on_progress) hooks_.on_progress(totals_);
      next = w + kWindowBytes;
    }
  }
  return 0;
}

int Rebuilder::CopyWindow(ReplicaBackend* source, const std::string& id, bool head, uint64_t off, uint64_t len,
                          const std::vector<Range>& src, bool* source_failed) {
  std::optional<RangeLock::Guard> guard;
  if (head && hooks_.ranges) guard.emplace(hooks_.ranges->Lock(off, len));
  if (hooks_.check) {
    if (int rc = hooks_.check(); rc < 0) return rc;
  }
  if (hooks_.source_ok && !hooks_.source_ok()) {
    *source_failed = true;
    return -EIO;
  }
  std::vector<UnitDigest> td;
  Status st = target_->LayerDigest(id, off, len, &td);
  if (!st.ok()) return ErrnoOf(st);

  std::vector<Range> send, unmap;
  if (td.empty() && !head) {
    // Nothing to compare against: send what the source holds. Layers below the head do not
    // change during a rebuild, so the extents listed at the start are current.
    for (const Range& r : Clip(src, off, off + len)) AddRun(&send, r.off, r.len);
  } else {
    // The head's extents may have grown since they were listed; its digests are current.
    std::vector<UnitDigest> sd;
    st = source->LayerDigest(id, off, len, &sd);
    if (!st.ok()) {
      *source_failed = true;
      return ErrnoOf(st);
    }
    size_t i = 0, j = 0;
    while (i < sd.size() || j < td.size()) {
      const UnitDigest* s = i < sd.size() ? &sd[i] : nullptr;
      const UnitDigest* t = j < td.size() ? &td[j] : nullptr;
      uint64_t u;
      if (s && (!t || s->off <= t->off)) u = s->off;
      else u = t->off;
      const bool has_s = s && s->off == u, has_t = t && t->off == u;
      const uint32_t sm = has_s ? s->mask : 0, tm = has_t ? t->mask : 0;
      if (has_s) ++i;
      if (has_t) ++j;
      if (sm == tm && std::memcmp(s->sha256, t->sha256, sizeof s->sha256) == 0) continue;
      AddMaskRuns(&send, u, sm);
      AddMaskRuns(&unmap, u, tm & ~sm);
    }
  }
  for (const Range& r : send) {
    int rc = Send(source, id, r.off, r.len, source_failed);
    if (rc < 0) return rc;
  }
  for (const Range& r : unmap) {
    int rc = WithEpoch([&](uint64_t e) { return target_->UnmapLayer(e, id, r.off, r.len); });
    if (rc < 0) return rc;
    totals_.unmapped_bytes += r.len;
  }
  return 0;
}

int Rebuilder::Send(ReplicaBackend* source, const std::string& id, uint64_t off, uint64_t len, bool* source_failed) {
  for (uint64_t done = 0; done < len;) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, buf_.size()));
    int rc = source->ReadLayer(id, off + done, n, buf_.data());
    if (rc < 0) {
      *source_failed = true;
      return rc;
    }
    rc = WithEpoch([&](uint64_t e) { return target_->WriteLayer(e, id, off + done, n, buf_.data()); });
    if (rc < 0) return rc;
    totals_.sent_bytes += n;
    done += n;
  }
  return 0;
}

}  // namespace mooring
