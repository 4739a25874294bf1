#include "engine/rebuilder.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

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
  const uint64_t size = source->size();
  const uint64_t limit = (size + kDigestUnitBytes - 1) / kDigestUnitBytes * kDigestUnitBytes;
  // Windows are aligned, so one window may cover several union ranges: visit each once.
  std::vector<uint64_t> windows;
  uint64_t next = 0;
  for (const Range& r : all) {
    for (uint64_t w = std::max(next, r.off / kWindowBytes * kWindowBytes); w < r.off + r.len; w += kWindowBytes) {
      windows.push_back(w);
      next = w + kWindowBytes;
    }
  }
  // Up to kWindowsInFlight windows at once, each under its own range lock (disjoint), so
  // one window's digest on the source overlaps another's write on the target.
  std::atomic<size_t> cursor{0};
  std::mutex mu;  // guards totals_, hooks_.on_progress, first_rc and first_sf
  int first_rc = 0;
  bool first_sf = false;
  auto worker = [&](std::vector<uint8_t>* buf) {
    for (;;) {
      {
        std::lock_guard<std::mutex> g(mu);
        if (first_rc < 0) return;
      }
      const size_t i = cursor.fetch_add(1);
      if (i >= windows.size()) return;
      const uint64_t w = windows[i], end = std::min(w + kWindowBytes, limit);
      bool sf = false;
      WindowTotals wt;
      const int wrc = CopyWindow(source, layer.id, layer.head, w, end - w, src, buf, &wt, &sf);
      std::lock_guard<std::mutex> g(mu);
      totals_.sent_bytes += wt.sent;
      totals_.unmapped_bytes += wt.unmapped;
      if (wrc < 0) {
        if (first_rc == 0) {
          first_rc = wrc;
          first_sf = sf;
        }
        return;
      }
      totals_.scanned_bytes += TotalBytes(Clip(all, w, end));
      if (hooks_.on_progress) hooks_.on_progress(totals_);
    }
  };
  const size_t n = std::min<size_t>(kWindowsInFlight, windows.size());
  if (bufs_.size() < n) bufs_.resize(n);
  for (size_t k = 0; k < n; ++k)
    if (bufs_[k].empty()) bufs_[k].resize(kWindowBytes);
  std::vector<std::thread> threads;
  for (size_t k = 1; k < n; ++k) {
    try {
      threads.emplace_back(worker, &bufs_[k]);
    } catch (const std::system_error&) {
      break;  // no thread to be had: fewer windows in flight
    }
  }
  if (n > 0) worker(&bufs_[0]);
  for (std::thread& t : threads) t.join();
  *source_failed = first_sf;
  return first_rc;
}

int Rebuilder::CopyWindow(ReplicaBackend* source, const std::string& id, bool head, uint64_t off, uint64_t len,
                          const std::vector<Range>& src, std::vector<uint8_t>* buf, WindowTotals* wt,
                          bool* source_failed) {
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
  Status st = target_->LayerDigest(id, off, len, DigestDetail::kHashes, &td);
  if (!st.ok()) return ErrnoOf(st);

  std::vector<Range> send, unmap;
  if (td.empty() && !head) {
    // Nothing to compare against: send what the source holds. Layers below the head do not
    // change during a rebuild, so the extents listed at the start are current.
    for (const Range& r : Clip(src, off, off + len)) AddRun(&send, r.off, r.len);
  } else {
    // The head's extents may have grown since they were listed; its digests are current.
    // When the target holds nothing here every unit the source holds differs, so only the
    // source's masks are needed (not its hashes: that skips reading and hashing the window).
    std::vector<UnitDigest> sd;
    st = source->LayerDigest(id, off, len, td.empty() ? DigestDetail::kMasksOnly : DigestDetail::kHashes, &sd);
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
    int rc = Send(source, id, r.off, r.len, buf, wt, source_failed);
    if (rc < 0) return rc;
  }
  for (const Range& r : unmap) {
    int rc = WithEpoch([&](uint64_t e) { return target_->UnmapLayer(e, id, r.off, r.len); });
    if (rc < 0) return rc;
    wt->unmapped += r.len;
  }
  return 0;
}

int Rebuilder::Send(ReplicaBackend* source, const std::string& id, uint64_t off, uint64_t len,
                    std::vector<uint8_t>* buf, WindowTotals* wt, bool* source_failed) {
  for (uint64_t done = 0; done < len;) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(len - done, buf->size()));
    int rc = source->ReadLayer(id, off + done, n, buf->data());
    if (rc < 0) {
      *source_failed = true;
      return rc;
    }
    rc = WithEpoch([&](uint64_t e) { return target_->WriteLayer(e, id, off + done, n, buf->data()); });
    if (rc < 0) return rc;
    wt->sent += n;
    done += n;
  }
  return 0;
}

}  // namespace mooring
