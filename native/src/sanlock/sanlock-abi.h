// The parts of sanlock's client ABI (libsanlock_client.so.1, sanlock 3.x) that Mooring
// uses, declared here rather than taken from sanlock.h so the addon builds without
// libsanlock-dev and loads without the library (see SanlockLibrary). Layouts and values
// follow the installed headers of 3.8.5; the static_asserts pin the sizes the headers give,
// and test/system/locks checks them against the real daemon.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mooring {
namespace sanlock_abi {

constexpr size_t kNameLen = 48;       // SANLK_NAME_LEN (no terminating NUL required)
constexpr size_t kPathLen = 1024;     // SANLK_PATH_LEN (includes the terminating NUL)
constexpr int kMaxResources = 8;      // SANLK_MAX_RESOURCES per acquire/release call
constexpr int kMaxDisks = 4;          // SANLK_MAX_DISKS per resource
constexpr size_t kHelperPathLen = 128;  // SANLK_HELPER_PATH_LEN (killpath program)
constexpr size_t kHelperArgsLen = 128;  // SANLK_HELPER_ARGS_LEN (killpath arguments)

struct Disk {  // struct sanlk_disk
  char path[kPathLen];
  uint64_t offset;
  uint32_t pad1;
  uint32_t pad2;
};

struct Resource {  // struct sanlk_resource, followed by num_disks Disk
  char lockspace_name[kNameLen];
  char name[kNameLen];
  uint64_t lver;
  uint64_t data64;
  uint32_t data32;
  uint32_t unused;
  uint32_t flags;
  uint32_t num_disks;
  // Disk disks[] follows
};

struct Lockspace {  // struct sanlk_lockspace
  char name[kNameLen];
  uint64_t host_id;
  uint32_t flags;
  Disk host_id_disk;
};

struct Host {  // struct sanlk_host
  uint64_t host_id;
  uint64_t generation;
  uint64_t timestamp;
  uint32_t io_timeout;
  uint32_t flags;
};

struct HostEvent {  // struct sanlk_host_event
  uint64_t host_id;
  uint64_t generation;
  uint64_t event;
  uint64_t data;
};

struct Rindex {  // struct sanlk_rindex
  uint32_t flags;
  uint32_t max_resources;
  uint64_t unused;
  char lockspace_name[kNameLen];
  Disk disk;
};

struct Rentry {  // struct sanlk_rentry
  char name[kNameLen];
  uint64_t offset;
  uint32_t flags;
  uint32_t unused;
};

struct Options {  // struct sanlk_options (len and str unused)
  char owner_name[kNameLen];
  uint32_t flags;
  uint32_t len;
};

static_assert(sizeof(Disk) == 1040, "sanlk_disk");
static_assert(sizeof(Resource) == 128, "sanlk_resource");
static_assert(sizeof(Lockspace) == 1104, "sanlk_lockspace");
static_assert(sizeof(Host) == 32, "sanlk_host");
static_assert(sizeof(HostEvent) == 32, "sanlk_host_event");
static_assert(sizeof(Rindex) == 1104, "sanlk_rindex");
static_assert(sizeof(Rentry) == 64, "sanlk_rentry");
static_assert(sizeof(Options) == 56, "sanlk_options");
static_assert(offsetof(Lockspace, host_id_disk) == 64, "sanlk_lockspace.host_id_disk");

// SANLK_RES_* (resource flags); the same alignment/sector values are SANLK_LSF_* and SANLK_RIF_*.
constexpr uint32_t kResLver = 0x1;
constexpr uint32_t kResShared = 0x4;
constexpr uint32_t kResPersistent = 0x8;
constexpr uint32_t kAlign1M = 0x10;
constexpr uint32_t kAlign2M = 0x20;
constexpr uint32_t kAlign4M = 0x40;
constexpr uint32_t kAlign8M = 0x80;
constexpr uint32_t kSector512 = 0x100;
constexpr uint32_t kSector4K = 0x200;
// Bits of Resource.flags / Lockspace.flags / Rindex.flags a caller may set.
constexpr uint32_t kResFlagsAllowed =
    kResLver | kResShared | kResPersistent | kAlign1M | kAlign2M | kAlign4M | kAlign8M | kSector512 | kSector4K;
constexpr uint32_t kLsfFlagsAllowed = kAlign1M | kAlign2M | kAlign4M | kAlign8M | kSector512 | kSector4K;

}  // namespace sanlock_abi
}  // namespace mooring
