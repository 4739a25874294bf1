// NBD wire constants and big-endian helpers (NetworkBlockDevice/nbd doc/proto.md).
// Only what the server speaks: fixed newstyle handshake, simple and structured replies.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace mooring {
namespace nbd {

// Handshake.
constexpr uint64_t kMagicNbd = 0x4e42444d41474943ull;      // "NBDMAGIC"
constexpr uint64_t kMagicIHaveOpt = 0x49484156454F5054ull;  // "IHAVEOPT"
constexpr uint64_t kMagicOptReply = 0x3e889045565a9ull;

constexpr uint16_t kFlagFixedNewstyle = 1u << 0;
constexpr uint16_t kFlagNoZeroes = 1u << 1;
constexpr uint32_t kClientFlagFixedNewstyle = 1u << 0;
constexpr uint32_t kClientFlagNoZeroes = 1u << 1;
constexpr uint32_t kClientFlagsKnown = kClientFlagFixedNewstyle | kClientFlagNoZeroes;

// Options.
constexpr uint32_t kOptExportName = 1;
constexpr uint32_t kOptAbort = 2;
constexpr uint32_t kOptList = 3;
constexpr uint32_t kOptStartTls = 5;
constexpr uint32_t kOptInfo = 6;
constexpr uint32_t kOptGo = 7;
constexpr uint32_t kOptStructuredReply = 8;
constexpr uint32_t kOptListMetaContext = 9;
constexpr uint32_t kOptSetMetaContext = 10;

// Option reply types.
constexpr uint32_t kRepAck = 1;
constexpr uint32_t kRepServer = 2;
constexpr uint32_t kRepInfo = 3;
constexpr uint32_t kRepMetaContext = 4;
constexpr uint32_t kRepErrBit = 1u << 31;
constexpr uint32_t kRepErrUnsup = kRepErrBit | 1;
constexpr uint32_t kRepErrPolicy = kRepErrBit | 2;
constexpr uint32_t kRepErrInvalid = kRepErrBit | 3;
constexpr uint32_t kRepErrPlatform = kRepErrBit | 4;
constexpr uint32_t kRepErrTlsReqd = kRepErrBit | 5;
constexpr uint32_t kRepErrUnknown = kRepErrBit | 6;
constexpr uint32_t kRepErrShutdown = kRepErrBit | 7;
constexpr uint32_t kRepErrBlockSizeReqd = kRepErrBit | 8;
constexpr uint32_t kRepErrTooBig = kRepErrBit | 9;

// NBD_OPT_INFO / NBD_OPT_GO information types.
constexpr uint16_t kInfoExport = 0;
constexpr uint16_t kInfoName = 1;
constexpr uint16_t kInfoDescription = 2;
constexpr uint16_t kInfoBlockSize = 3;

// Transmission flags.
constexpr uint16_t kTxHasFlags = 1u << 0;
constexpr uint16_t kTxReadOnly = 1u << 1;
constexpr uint16_t kTxSendFlush = 1u << 2;
constexpr uint16_t kTxSendFua = 1u << 3;
constexpr uint16_t kTxRotational = 1u << 4;
constexpr uint16_t kTxSendTrim = 1u << 5;
constexpr uint16_t kTxSendWriteZeroes = 1u << 6;
constexpr uint16_t kTxSendDf = 1u << 7;
constexpr uint16_t kTxCanMultiConn = 1u << 8;
constexpr uint16_t kTxSendCache = 1u << 10;
constexpr uint16_t kTxSendFastZero = 1u << 11;

// Transmission phase.
constexpr uint32_t kMagicRequest = 0x25609513u;
constexpr uint32_t kMagicSimpleReply = 0x67446698u;
constexpr uint32_t kMagicStructuredReply = 0x668e33efu;

constexpr size_t kRequestHeaderBytes = 28;
constexpr size_t kSimpleReplyBytes = 16;
constexpr size_t kChunkHeaderBytes = 20;

constexpr uint16_t kCmdRead = 0;
constexpr uint16_t kCmdWrite = 1;
constexpr uint16_t kCmdDisc = 2;
constexpr uint16_t kCmdFlush = 3;
constexpr uint16_t kCmdTrim = 4;
constexpr uint16_t kCmdCache = 5;
constexpr uint16_t kCmdWriteZeroes = 6;
constexpr uint16_t kCmdBlockStatus = 7;

constexpr uint16_t kCmdFlagFua = 1u << 0;
constexpr uint16_t kCmdFlagNoHole = 1u << 1;
constexpr uint16_t kCmdFlagDf = 1u << 2;
constexpr uint16_t kCmdFlagReqOne = 1u << 3;
constexpr uint16_t kCmdFlagFastZero = 1u << 4;

constexpr uint16_t kChunkFlagDone = 1u << 0;
constexpr uint16_t kChunkNone = 0;
constexpr uint16_t kChunkOffsetData = 1;
constexpr uint16_t kChunkOffsetHole = 2;
constexpr uint16_t kChunkBlockStatus = 5;
constexpr uint16_t kChunkError = 0x8001;

// Error values on the wire (fixed by the spec, independent of the host's errno values).
constexpr uint32_t kErrPerm = 1;
constexpr uint32_t kErrIo = 5;
constexpr uint32_t kErrNoMem = 12;
constexpr uint32_t kErrInval = 22;
constexpr uint32_t kErrNoSpc = 28;
constexpr uint32_t kErrOverflow = 75;
constexpr uint32_t kErrNotSup = 95;
constexpr uint32_t kErrShutdown = 108;

// The one metadata context we serve, and the id we give it.
constexpr const char* kMetaBaseAllocation = "base:allocation";
constexpr uint32_t kMetaBaseAllocationId = 1;

// Maps a device result (0 or negative errno) onto an NBD error value.
inline uint32_t ErrorFromErrno(int neg_errno) {
  switch (-neg_errno) {
    case 0: return 0;
    case EPERM:
    case EACCES:
    case EROFS:
    case ESTALE:  // fenced by a newer writer epoch: the client may not write here any more
      return kErrPerm;
    case ENOMEM: return kErrNoMem;
    case EINVAL: return kErrInval;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return kErrNoSpc;
    case EOVERFLOW: return kErrOverflow;
    case ENOTSUP: return kErrNotSup;
    case ESHUTDOWN: return kErrShutdown;
    default: return kErrIo;
  }
}

inline uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t Load32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline uint64_t Load64(const uint8_t* p) { return (uint64_t{Load32(p)} << 32) | Load32(p + 4); }

inline void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void Store32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
inline void Store64(uint8_t* p, uint64_t v) {
  Store32(p, static_cast<uint32_t>(v >> 32));
  Store32(p + 4, static_cast<uint32_t>(v));
}

// Writes a simple reply header (16 bytes).
inline void PutSimpleReply(uint8_t* p, uint32_t error, uint64_t cookie) {
  Store32(p, kMagicSimpleReply);
  Store32(p + 4, error);
  Store64(p + 8, cookie);
}

// Writes a structured reply chunk header (20 bytes).
inline void PutChunkHeader(uint8_t* p, uint16_t flags, uint16_t type, uint64_t cookie, uint32_t len) {
  Store32(p, kMagicStructuredReply);
  Store16(p + 4, flags);
  Store16(p + 6, type);
  Store64(p + 8, cookie);
  Store32(p + 16, len);
}

}  // namespace nbd
}  // namespace mooring
