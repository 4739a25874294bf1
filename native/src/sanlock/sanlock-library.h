// SanlockLibrary: sanlock's client library (libsanlock_client.so.1, LGPL) opened with
// dlopen on first use. The addon has no link-time dependency on sanlock, so it loads on
// hosts without it; a lock call there fails with a message naming the package to install.
#pragma once

#include <cstdint>
#include <string>

#include "sanlock/sanlock-abi.h"

namespace mooring {

class SanlockLibrary {
 public:
  // The library's soname and the Debian/Ubuntu packages that provide it and the daemon.
  static constexpr const char* kSoname = "libsanlock_client.so.1";
  static constexpr const char* kPackages = "libsanlock-client1 (library) and sanlock (daemon)";

  // The loaded library, or nullptr with *error saying why (and what to install). Loads
  // once per process, thread-safe; the library stays loaded until exit.
  static const SanlockLibrary* Get(std::string* error);

  using Lockspace = sanlock_abi::Lockspace;
  using Resource = sanlock_abi::Resource;
  using Host = sanlock_abi::Host;
  using HostEvent = sanlock_abi::HostEvent;
  using Rindex = sanlock_abi::Rindex;
  using Rentry = sanlock_abi::Rentry;
  using Options = sanlock_abi::Options;
  using Disk = sanlock_abi::Disk;

  // sanlock_admin.h
  int (*add_lockspace_timeout)(Lockspace*, uint32_t flags, uint32_t io_timeout) = nullptr;
  int (*inq_lockspace)(Lockspace*, uint32_t flags) = nullptr;
  int (*rem_lockspace)(Lockspace*, uint32_t flags) = nullptr;
  int (*get_lockspaces)(Lockspace** lss, int* count, uint32_t flags) = nullptr;
  int (*get_hosts)(const char* ls_name, uint64_t host_id, Host** hss, int* count, uint32_t flags) = nullptr;
  int (*align)(Disk*) = nullptr;
  int (*write_lockspace)(Lockspace*, int max_hosts, uint32_t flags, uint32_t io_timeout) = nullptr;
  int (*read_lockspace)(Lockspace*, uint32_t flags, uint32_t* io_timeout) = nullptr;
  int (*write_resource)(Resource*, int max_hosts, int num_hosts, uint32_t flags) = nullptr;
  int (*read_resource)(Resource*, uint32_t flags) = nullptr;
  int (*read_resource_owners)(Resource*, uint32_t flags, Host** hss, int* count) = nullptr;
  int (*format_rindex)(Rindex*, uint32_t flags) = nullptr;
  int (*lookup_rindex)(Rindex*, uint32_t flags, Rentry*) = nullptr;
  int (*create_resource)(Rindex*, uint32_t flags, Rentry*, int max_hosts, int num_hosts) = nullptr;
  int (*delete_resource)(Rindex*, uint32_t flags, Rentry*) = nullptr;
  int (*version)(uint32_t flags, uint32_t* version, uint32_t* proto) = nullptr;
  int (*reg_event)(const char* ls_name, HostEvent*, uint32_t flags) = nullptr;
  int (*end_event)(int fd, const char* ls_name, uint32_t flags) = nullptr;
  int (*set_event)(const char* ls_name, HostEvent*, uint32_t flags) = nullptr;
  int (*get_event)(int fd, uint32_t flags, HostEvent*, uint64_t* from_host_id, uint64_t* from_generation) = nullptr;
  // sanlock_resource.h
  int (*register_client)() = nullptr;  // sanlock_register
  int (*restrict_client)(int sock, uint32_t flags) = nullptr;  // sanlock_restrict
  int (*killpath)(int sock, uint32_t flags, const char* path, char* args) = nullptr;
  int (*acquire)(int sock, int pid, uint32_t flags, int count, Resource** res, Options* opt) = nullptr;
  int (*release)(int sock, int pid, uint32_t flags, int count, Resource** res) = nullptr;
  int (*inquire)(int sock, int pid, uint32_t flags, int* count, char** state) = nullptr;
  int (*convert)(int sock, int pid, uint32_t flags, Resource* res) = nullptr;
  int (*request)(uint32_t flags, uint32_t force_mode, Resource* res) = nullptr;
  int (*res_to_str)(Resource* res, char** str) = nullptr;
  int (*str_to_res)(char* str, Resource** res) = nullptr;
  int (*args_to_state)(int count, Resource** res, char** state) = nullptr;
  int (*state_to_args)(char* state, int* count, Resource*** res) = nullptr;
  const char* (*strerror)(int rv) = nullptr;

 private:
  SanlockLibrary() = default;
  bool Load(std::string* error);
  void* handle_ = nullptr;
};

}  // namespace mooring
