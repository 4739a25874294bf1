#include "engine/reconciler.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/range-set.h"

namespace mooring {
namespace {

int ErrnoOf(const Status& st) { return st.sys_errno > 0 ? -st.sys_errno : -EIO; }

bool Covers(const std::vector<Range>& segs, uint64_t pos) {
  for (const Range& r : segs)
    if (pos >= r.off && pos < r.off + r.len) return true;
  return false;
}

}  // namespace

Reconciler::Reconciler(ReplicaBackend* source, uint64_t epoch) : source_(source), epoch_(epoch) {}

int Reconciler::LoadHead(ReplicaBackend* r, std::string* head, std::vector<Range>* extents) {
  std::vector<LayerInfo> layers;
  Status st = r->ListLayers(&layers);
  if (!st.ok()) return ErrnoOf(st);
  head->clear();
  for (const LayerInfo& l : layers)
    if (l.head) *head = l.id;
  if (head->empty()) return -EIO;  // a replica without a head is damaged
  st = r->LayerExtents(*head, extents);
  if (!st.ok()) return ErrnoOf(st);
  SortAndMerge(extents);
  return 0;
}

Reconciler::Result Reconciler::Run(ReplicaBackend* target) {
  Result res;
  if (!loaded_) {
    source_error_ = LoadHead(source_, &source_head_, &source_extents_);
    loaded_ = true;
  }
  if (source_error_ != 0) {
    res.error = source_error_;
    res.source_failed = true;
    return res;
  }
  std::string target_head;
  std::vector<Range> target_extents;
  if (int rc = LoadHead(target, &target_head, &target_extents); rc < 0) {
    res.error = rc;
    return res;
  }
  if (src_buf_.empty()) {
    src_buf_.resize(kChunkBytes);
    dst_buf_.resize(kChunkBytes);
  }

  std::vector<Range> all = source_extents_;
  all.insert(all.end(), target_extents.begin(), target_extents.end());
  SortAndMerge(&all);

  for (const Range& r : all) {
    uint64_t off = r.off, end = r.off + r.len;
    while (off < end) {
      // Chunks are aligned so that consecutive ranges share no buffer reads.
      uint64_t chunk_end = std::min(end, (off / kChunkBytes + 1) * kChunkBytes);
      int rc = SyncChunk(target, target_head, off, chunk_end - off, source_extents_,
                         target_extents, &res);
      if (rc < 0) {
        res.error = rc;
        return res;
      }
      off = chunk_end;
    }
  }
  return res;
}

int Reconciler::SyncChunk(ReplicaBackend* target, const std::string& target_head, uint64_t off,
                          uint64_t len, const std::vector<Range>& src_ext,
                          const std::vector<Range>& dst_ext, Result* res) {
  const uint64_t end = off + len;
  std::vector<Range> src = Clip(src_ext, off, end);
  std::vector<Range> dst = Clip(dst_ext, off, end);

  if (!src.empty()) {
    int rc = source_->ReadLayer(source_head_, off, static_cast<uint32_t>(len), src_buf_.data());
    if (rc < 0) {
      res->source_failed = true;
      return rc;
    }
  }
  if (!src.empty() && !dst.empty()) {
    int rc = target->ReadLayer(target_head, off, static_cast<uint32_t>(len), dst_buf_.data());
    if (rc < 0) return rc;
  }

  // Split the chunk where either side's allocation changes.
  std::vector<uint64_t> cuts = {off, end};
  for (const Range& r : src) cuts.insert(cuts.end(), {r.off, r.off + r.len});
  for (const Range& r : dst) cuts.insert(cuts.end(), {r.off, r.off + r.len});
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const uint64_t a = cuts[i], b = cuts[i + 1];
    const bool s = Covers(src, a), t = Covers(dst, a);
    const uint8_t* sp = src_buf_.data() + (a - off);
    if (s && !t) {
      int rc = target->Write(epoch_, a, static_cast<uint32_t>(b - a), sp, false);
      if (rc < 0) return rc;
      res->bytes_written += b - a;
    } else if (!s && t) {
      // The source reads through to the (identical) layer below here; so must the target.
      int rc = target->Trim(epoch_, a, b - a);
      if (rc < 0) return rc;
      res->bytes_trimmed += b - a;
    } else if (s && t) {
      // Rewrite only runs of differing blocks.
      const uint8_t* dp = dst_buf_.data() + (a - off);
      uint64_t p = a;
      while (p < b) {
        uint64_t q = std::min(b, (p / kCompareBytes + 1) * kCompareBytes);
        if (std::memcmp(sp + (p - a), dp + (p - a), q - p) == 0) {
          p = q;
          continue;
        }
        uint64_t run_end = q;
        while (run_end < b) {
          uint64_t n = std::min(b, run_end + kCompareBytes);
          if (std::memcmp(sp + (run_end - a), dp + (run_end - a), n - run_end) == 0) break;
          run_end = n;
        }
        int rc = target->Write(epoch_, p, static_cast<uint32_t>(run_end - p), sp + (p - a), false);
        if (rc < 0) return rc;
        res->bytes_written += run_end - p;
        p = run_end;
      }
    }
  }
  return 0;
}

}  // namespace mooring
