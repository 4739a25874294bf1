// ReplicaServerConnection::Dispatch: one request run against the connection's replica, on a
// worker of the server's pool (remote/replica-server-connection.h). Its reply is filled in
// place (code, value, epoch and state, payload); Execute queues it for sending.
#include <algorithm>
#include <string>
#include <vector>

#include "remote/replica-server-connection.h"

namespace mooring {

using namespace rp;  // NOLINT: wire constants

void ReplicaServerConnection::Dispatch(Request* r) {
  const RequestHeader& h = r->h;
  ReplicaBackend* rep = replica_.get();
  PayloadReader in(r->payload.data(), r->payload.size());
  auto bad = [&](const std::string& why) { SetError(r, Code::kProtocolError, std::string(OpName(h.op)) + ": " + why); };
  // The flags each op may carry.
  uint16_t allowed = 0;
  if (h.op == kOpWrite) allowed = kFlagFua;
  if (h.op == kOpWriteZeroes) allowed = kFlagFua | kFlagMayTrim | kFlagFastOnly;
  if (h.op == kOpSnapshot) allowed = kFlagUserCreated;
  if (h.op == kOpSetReplicaSet) allowed = kFlagSelfRw;
  if (h.op == kOpLayerDigest) allowed = kFlagMasksOnly;
  if (h.reserved != 0 || (h.flags & ~allowed)) return bad("unknown flags or reserved bits set");
  auto no_payload = [&]() {
    if (h.payload_len == 0) return true;
    bad("takes no payload");
    return false;
  };
  auto io_len = [&](uint64_t len) {
    if (len <= kMaxIoBytes) return true;
    bad("length " + std::to_string(len) + " exceeds " + std::to_string(kMaxIoBytes));
    return false;
  };
  auto finished = [&]() {
    if (in.done()) return true;
    bad("malformed payload");
    return false;
  };

  switch (h.op) {
    case kOpPing:
      if (!no_payload()) return;
      return;
    case kOpHello:
      return bad("the connection is already open");
    case kOpRead: {
      if (!no_payload() || !io_len(h.length)) return;
      r->reply_payload = BufferPool::Get().Take(h.length);
      int rc = h.length ? rep->Read(h.offset, static_cast<uint32_t>(h.length), r->reply_payload.data()) : 0;
      if (rc < 0) {
        r->reply_payload.clear();
        return SetRc(r, rc);
      }
      ctx_->bytes_read.fetch_add(h.length, std::memory_order_relaxed);
      return;
    }
    case kOpWrite: {
      if (!io_len(h.length)) return;
      if (h.length != h.payload_len) return bad("length and payload length differ");
      int rc = h.length ? rep->Write(h.epoch, h.offset, static_cast<uint32_t>(h.length), r->payload.data(), h.flags & kFlagFua) : 0;
      if (rc == 0) ctx_->bytes_written.fetch_add(h.length, std::memory_order_relaxed);
      return SetRc(r, rc);
    }
    case kOpTrim:
      if (!no_payload()) return;
      return SetRc(r, rep->Trim(h.epoch, h.offset, h.length));
    case kOpWriteZeroes:
      if (!no_payload()) return;
      return SetRc(r, rep->WriteZeroes(h.epoch, h.offset, h.length, h.flags & kFlagMayTrim, h.flags & kFlagFastOnly,
                                       h.flags & kFlagFua));
    case kOpFlush:
      if (!no_payload()) return;
      return SetRc(r, rep->Flush());
    case kOpBlockStatus: {
      uint32_t max = in.U32();
      if (!finished()) return;
      if (max == 0 || max > kMaxExtentsPerReply) max = kMaxExtentsPerReply;
      std::vector<Extent> ext;
      int rc = rep->BlockStatus(h.offset, h.length, max, &ext);
      if (rc < 0) return SetRc(r, rc);
      if (ext.size() > max) ext.resize(max);
      PayloadWriter w(&r->reply_payload);
      w.U32(static_cast<uint32_t>(ext.size()));
      for (const Extent& e : ext) {
        w.U64(e.length);
        w.U32(e.flags);
      }
      return;
    }
    case kOpClaimEpoch: {
      if (!no_payload()) return;
      ReplicaSet stored;
      bool was_clean = false;
      Status st = rep->ClaimEpoch(h.epoch, &stored, &was_clean);
      SetStatus(r, st);
      if (st.ok()) {
        PayloadWriter w(&r->reply_payload);
        EncodeReplicaSet(stored, &w);
      }
      SetState(r);
      if (st.ok() && was_clean) r->reply.state |= kStateWasClean;
      return;
    }
    case kOpPeekReplicaSet: {
      if (!no_payload()) return;
      ReplicaSet stored;
      Status st = rep->PeekReplicaSet(&stored);
      SetStatus(r, st);
      if (st.ok()) {
        PayloadWriter w(&r->reply_payload);
        EncodeReplicaSet(stored, &w);
      }
      return SetState(r);
    }
    case kOpSetReplicaSet: {
      ReplicaSet set;
      if (!DecodeReplicaSet(&in, &set)) return bad("malformed replica set");
      if (!finished()) return;
      if (set.epoch != h.epoch) return bad("replica set epoch differs from the header's");
      SetStatus(r, rep->SetReplicaSet(set, (h.flags & kFlagSelfRw) != 0));
      return SetState(r);
    }
    case kOpLastRw: {
      if (!no_payload()) return;
      ReplicaSetId last;
      Status st = rep->LastRw(&last);
      SetStatus(r, st);
      if (st.ok()) {
        PayloadWriter w(&r->reply_payload);
        w.U64(last.epoch);
        w.U64(last.generation);
      }
      return SetState(r);
    }
    case kOpMarkClean:
      if (!no_payload()) return;
      SetStatus(r, rep->MarkClean(h.epoch));
      return SetState(r);
    case kOpListLayers: {
      if (!no_payload()) return;
      std::vector<LayerInfo> layers;
      Status st = rep->ListLayers(&layers);
      if (!st.ok()) return SetStatus(r, st);
      if (!EncodeLayers(layers, &r->reply_payload)) {
        r->reply_payload.clear();
        return SetError(r, Code::kOutOfRange, "the layer list of " + name_ + " exceeds the protocol's limits");
      }
      return;
    }
    case kOpLayerExtents: {
      std::string id = in.Str();
      if (!finished()) return;
      std::vector<Range> ranges;
      Status st = rep->LayerExtents(id, &ranges);
      if (!st.ok()) return SetStatus(r, st);
      // Page: ranges ending after `offset`, clipped to start there, at most a page's worth.
      std::vector<Range> page;
      bool more = false;
      for (const Range& x : ranges) {
        if (x.off + x.len <= h.offset) continue;
        if (page.size() == kMaxRangesPerReply) {
          more = true;
          break;
        }
        uint64_t from = std::max(x.off, h.offset);
        page.push_back({from, x.off + x.len - from});
      }
      PayloadWriter w(&r->reply_payload);
      w.U8(more ? 1 : 0);
      w.U32(static_cast<uint32_t>(page.size()));
      for (const Range& x : page) {
        w.U64(x.off);
        w.U64(x.len);
      }
      r->reply.value = page.empty() ? h.offset : page.back().off + page.back().len;
      return;
    }
    case kOpReadLayer: {
      std::string id = in.Str();
      if (!finished() || !io_len(h.length)) return;
      r->reply_payload = BufferPool::Get().Take(h.length);
      int rc = h.length ? rep->ReadLayer(id, h.offset, static_cast<uint32_t>(h.length), r->reply_payload.data()) : 0;
      if (rc < 0) {
        r->reply_payload.clear();
        return SetRc(r, rc);
      }
      ctx_->bytes_read.fetch_add(h.length, std::memory_order_relaxed);
      return;
    }
    case kOpSnapshot: {
      std::string name = in.Str();
      int64_t created = static_cast<int64_t>(in.U64());
      Labels labels;
      if (!DecodeLabels(&in, &labels) || !finished()) return bad("malformed payload");
      SetStatus(r, rep->Snapshot(name, created, labels, h.flags & kFlagUserCreated));
      return SetState(r);
    }
    case kOpDeleteSnapshot: {
      std::string name = in.Str();
      if (!finished()) return;
      SetStatus(r, rep->DeleteSnapshot(name));
      return SetState(r);
    }
    case kOpRevert: {
      std::string name = in.Str();
      int64_t created = static_cast<int64_t>(in.U64());
      if (!finished()) return;
      SetStatus(r, rep->Revert(name, created));
      return SetState(r);
    }
    case kOpAdoptChain: {
      std::vector<LayerInfo> layers;
      if (!DecodeLayers(&in, &layers) || !finished()) return bad("malformed layer list");
      SetStatus(r, rep->AdoptChain(layers, h.epoch));
      return SetState(r);
    }
    case kOpLayerDigest: {
      std::string id = in.Str();
      if (!finished()) return;
      if (h.length > kMaxDigestRangeBytes) return bad("range exceeds " + std::to_string(kMaxDigestRangeBytes));
      std::vector<UnitDigest> d;
      const DigestDetail detail = (h.flags & kFlagMasksOnly) ? DigestDetail::kMasksOnly : DigestDetail::kHashes;
      Status st = rep->LayerDigest(id, h.offset, h.length, detail, &d);
      if (!st.ok()) return SetStatus(r, st);
      if (d.size() > kMaxDigestsPerReply) return SetError(r, Code::kIoError, "replica returned too many digests");
      PayloadWriter w(&r->reply_payload);
      w.U32(static_cast<uint32_t>(d.size()));
      for (const UnitDigest& u : d) {
        w.U64(u.off);
        w.U16(u.mask);
        w.Bytes(u.sha256, sizeof u.sha256);
      }
      return;
    }
    case kOpWriteLayer: {
      std::string id = in.Str();
      if (!in.ok()) return bad("malformed payload");
      if (!io_len(h.length)) return;
      if (in.left() != h.length) return bad("length and data length differ");
      const uint8_t* data = in.Take(in.left());
      int rc = h.length ? rep->WriteLayer(h.epoch, id, h.offset, static_cast<uint32_t>(h.length), data) : 0;
      if (rc == 0) ctx_->bytes_written.fetch_add(h.length, std::memory_order_relaxed);
      return SetRc(r, rc);
    }
    case kOpUnmapLayer: {
      std::string id = in.Str();
      if (!finished()) return;
      return SetRc(r, rep->UnmapLayer(h.epoch, id, h.offset, h.length));
    }
    case kOpFinishRebuild:
      if (!no_payload()) return;
      SetStatus(r, rep->FinishRebuild());
      return SetState(r);
    case kOpGrow:
      if (!no_payload()) return;
      SetStatus(r, rep->Grow(h.length));
      return SetState(r);
    case kOpAllocatedBytes:
      if (!no_payload()) return;
      r->reply.value = rep->AllocatedBytes();
      return;
    case kOpClientFeatures:  // handled by the reader (ClientFeatures); never dispatched
      return bad("unexpected");
    case kOpAuth:
    case kOpAuthProof:
      return bad("only before HELLO");
    default:
      return bad("unknown op " + std::to_string(h.op));
  }
}

}  // namespace mooring
