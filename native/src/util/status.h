// Status and error codes shared by every native object.
//
// Data-path calls (read/write/flush...) return int: 0 or a negative errno, because they
// are hot and map straight onto NBD error numbers. Control-path calls (open, snapshot,
// claim epoch...) return Status, whose Code maps 1:1 onto the TypeScript MooringError
// codes (src/errors.ts). Keep the two lists in step.
#pragma once

#include <cerrno>
#include <string>

namespace mooring {

// Errno used on the data path for "write from an engine whose epoch is older than the
// replica's" (invariant 2). Distinct from EIO so callers can tell fencing from failure.
constexpr int kErrStaleEpoch = ESTALE;
// Errno for "a replica-set change could not reach a majority of the volume's replicas"
// (docs/single-writer.md): the request was held, then failed; nothing was acknowledged.
// NBD clients see it as EIO.
constexpr int kErrNoQuorum = EREMOTEIO;

enum class Code {
  kOk = 0,
  kInvalidArgument,   // INVALID_ARGUMENT
  kNotFound,          // NOT_FOUND
  kAlreadyExists,     // ALREADY_EXISTS
  kIoError,           // IO_ERROR
  kNoSpace,           // NO_SPACE
  kStaleEpoch,        // STALE_EPOCH
  kCorrupt,           // CORRUPT_METADATA
  kBusy,              // BUSY
  kClosed,            // CLOSED
  kNoHealthyReplica,  // NO_HEALTHY_REPLICA
  kOutOfRange,        // OUT_OF_RANGE
  kUnsupported,       // UNSUPPORTED
  kInvalidState,      // INVALID_STATE
  kAddressInUse,      // ADDRESS_IN_USE
  kUnavailable,       // UNAVAILABLE
  kProtocolError,     // PROTOCOL_ERROR
  kNoQuorum,          // NO_QUORUM: a majority of the volume's replicas cannot be reached
  kUnauthenticated,   // UNAUTHENTICATED: a peer did not prove the cluster secret (docs/replica-protocol.md)
};

// The string each Code crosses into JavaScript as (error.code).
inline const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kIoError: return "IO_ERROR";
    case Code::kNoSpace: return "NO_SPACE";
    case Code::kStaleEpoch: return "STALE_EPOCH";
    case Code::kCorrupt: return "CORRUPT_METADATA";
    case Code::kBusy: return "BUSY";
    case Code::kClosed: return "CLOSED";
    case Code::kNoHealthyReplica: return "NO_HEALTHY_REPLICA";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnsupported: return "UNSUPPORTED";
    case Code::kInvalidState: return "INVALID_STATE";
    case Code::kAddressInUse: return "ADDRESS_IN_USE";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kProtocolError: return "PROTOCOL_ERROR";
    case Code::kNoQuorum: return "NO_QUORUM";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "IO_ERROR";
}

// Maps a negative errno from the data path onto a Code.
inline Code CodeFromErrno(int neg_errno) {
  switch (-neg_errno) {
    case 0: return Code::kOk;
    case ENOSPC: return Code::kNoSpace;
    case EINVAL: return Code::kInvalidArgument;
    case ENOENT: return Code::kNotFound;
    case EEXIST: return Code::kAlreadyExists;
    case ESTALE: return Code::kStaleEpoch;
    case ENOTSUP: return Code::kUnsupported;
    case EBUSY: return Code::kBusy;
    case ERANGE: return Code::kOutOfRange;
    case EADDRINUSE: return Code::kAddressInUse;
    case ENOTCONN:
    case ECONNREFUSED:
    case ECONNRESET:
    case ETIMEDOUT:
    case EHOSTUNREACH: return Code::kUnavailable;
    case EPROTO: return Code::kProtocolError;
    case EREMOTEIO: return Code::kNoQuorum;
    // Damaged metadata: the image reader's kErrCorruptImage (and a file system's
    // EFSCORRUPTED, which is the same number).
    case EUCLEAN: return Code::kCorrupt;
    default: return Code::kIoError;
  }
}

struct Status {
  Code code = Code::kOk;
  int sys_errno = 0;      // the OS errno behind it, 0 if none
  std::string message;    // human-readable, names the path or object concerned

  bool ok() const { return code == Code::kOk; }
  static Status Ok() { return {}; }
  static Status Error(Code c, std::string msg, int err = 0) { return Status{c, err, std::move(msg)}; }
  // From a negative errno (or positive; the sign is ignored).
  static Status FromErrno(int e, std::string msg) {
    int pe = e < 0 ? -e : e;
    return Status{CodeFromErrno(-pe), pe, std::move(msg)};
  }
};

}  // namespace mooring
