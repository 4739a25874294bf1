// File-system helpers for the store: full-length pread/pwrite loops, directory fsync and
// the atomic "tmp file, fsync, rename, fsync dir" write behind invariant 4.
//
// Data-path helpers return 0 or a negative errno; control-path helpers return Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>

#include <string>

#include "util/status.h"

namespace mooring {
namespace fsutil {

// Largest file ReadFileLimited will read, so hostile metadata cannot exhaust memory.
constexpr size_t kMaxMetadataFileBytes = 64u << 20;

std::string JoinPath(const std::string& dir, const std::string& name);

// Reads exactly len bytes at off; -EIO if the file ends first.
int PreadFull(int fd, void* buf, size_t len, uint64_t off);
// PreadFull only from the page cache (preadv2 RWF_NOWAIT): -EAGAIN when any of the bytes
// would have to come from the disk (or the kernel cannot tell), with `buf` unspecified.
int PreadCached(int fd, void* buf, size_t len, uint64_t off);
// Largest single pwrite PwriteFull issues (see fs-util.cc for why writes are split).
constexpr size_t kPwriteChunkBytesMax = 16 * 1024;

// Modes of what Mooring creates: VM disks and their metadata are for the service's own
// user only (QEMU reaches a volume through its NBD socket, never through these files).
// Kept in step with src/util/files.ts PRIVATE_FILE_MODE / PRIVATE_DIR_MODE.
constexpr mode_t kPrivateFileMode = 0600;
constexpr mode_t kPrivateDirMode = 0700;
// Writes exactly len bytes at off.

int PwriteFull(int fd, const void* buf, size_t len, uint64_t off);
// Deallocates [off, off+len) keeping the file size (FALLOC_FL_PUNCH_HOLE|KEEP_SIZE).
int PunchHole(int fd, uint64_t off, uint64_t len);
int FdataSync(int fd);
int FsyncFd(int fd);
// fsync of a directory, so that creates, renames and unlinks inside it are durable.
int FsyncDir(const std::string& dir);

// Writes <dir>/<name> atomically and durably: <name>.tmp is written and fsynced, renamed
// over <name>, then the directory is fsynced. A crash leaves either the old or the new file
// (plus possibly a stale .tmp, which readers ignore).
Status WriteFileAtomic(const std::string& dir, const std::string& name, const std::string& data);
// Reads a whole file of at most max_bytes (larger -> kCorrupt: such files are not ours).
Status ReadFileLimited(const std::string& path, size_t max_bytes, std::string* out);

// Creates a file of size_bytes with no data (sparse), fsyncs it. Fails if it exists.
Status CreateSparseFile(const std::string& path, uint64_t size_bytes);

}  // namespace fsutil
}  // namespace mooring
