#include "engine/engine-snapshot-sink.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace mooring {
namespace {

Status TargetError(int rc, const std::string& what) {
  if (rc == -ESHUTDOWN) return Status::Error(Code::kClosed, what + ": the target engine is closed", ESHUTDOWN);
  return Status::FromErrno(rc, what + " on the target engine: " + std::strerror(-rc));
}

}  // namespace

Status EngineSnapshotSink::Data(uint64_t off, const uint8_t* buf, uint32_t len) {
  int rc = target_->Write(off, len, buf, false);
  return rc < 0 ? TargetError(rc, "writing " + std::to_string(len) + " bytes at " + std::to_string(off)) : Status::Ok();
}

Status EngineSnapshotSink::Zeroes(uint64_t off, uint64_t len) {
  for (uint64_t done = 0; done < len;) {
    const uint32_t n = static_cast<uint32_t>(std::min(len - done, kMaxZeroesCallBytes));
    int rc = target_->WriteZeroes(off + done, n, /*may_trim=*/true, /*fast_only=*/false, /*fua=*/false);
    if (rc < 0) return TargetError(rc, "zeroing " + std::to_string(n) + " bytes at " + std::to_string(off + done));
    done += n;
  }
  return Status::Ok();
}

Status EngineSnapshotSink::Finish() {
  int rc = target_->Flush();
  return rc < 0 ? TargetError(rc, "flushing") : Status::Ok();
}

}  // namespace mooring
