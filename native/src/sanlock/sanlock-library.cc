#include "sanlock/sanlock-library.h"

#include <dlfcn.h>

#include <mutex>

namespace mooring {
namespace {

template <typename Fn>
bool Bind(void* handle, const char* symbol, Fn* out, std::string* missing) {
  void* p = dlsym(handle, symbol);
  if (p == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += symbol;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

}  // namespace

bool SanlockLibrary::Load(std::string* error) {
  // RTLD_LOCAL: the library's symbols (and its private helpers such as send_command) stay
  // out of the global namespace of a process that may load other libraries.
  handle_ = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    *error = std::string("sanlock's client library ") + kSoname + " cannot be loaded (" +
             (why != nullptr ? why : "unknown error") + "); install the Debian/Ubuntu packages " + kPackages;
    return false;
  }
  std::string missing;
  Bind(handle_, "sanlock_add_lockspace_timeout", &add_lockspace_timeout, &missing);
  Bind(handle_, "sanlock_inq_lockspace", &inq_lockspace, &missing);
  Bind(handle_, "sanlock_rem_lockspace", &rem_lockspace, &missing);
  Bind(handle_, "sanlock_get_lockspaces", &get_lockspaces, &missing);
  Bind(handle_, "sanlock_get_hosts", &get_hosts, &missing);
  Bind(handle_, "sanlock_align", &align, &missing);
  Bind(handle_, "sanlock_write_lockspace", &write_lockspace, &missing);
  Bind(handle_, "sanlock_read_lockspace", &read_lockspace, &missing);
  Bind(handle_, "sanlock_write_resource", &write_resource, &missing);
  Bind(handle_, "sanlock_read_resource", &read_resource, &missing);
  Bind(handle_, "sanlock_read_resource_owners", &read_resource_owners, &missing);
  Bind(handle_, "sanlock_format_rindex", &format_rindex, &missing);
  Bind(handle_, "sanlock_lookup_rindex", &lookup_rindex, &missing);
  Bind(handle_, "sanlock_create_resource", &create_resource, &missing);
  Bind(handle_, "sanlock_delete_resource", &delete_resource, &missing);
  Bind(handle_, "sanlock_version", &version, &missing);
  Bind(handle_, "sanlock_reg_event", &reg_event, &missing);
  Bind(handle_, "sanlock_end_event", &end_event, &missing);
  Bind(handle_, "sanlock_set_event", &set_event, &missing);
  Bind(handle_, "sanlock_get_event", &get_event, &missing);
  Bind(handle_, "sanlock_register", &register_client, &missing);
  Bind(handle_, "sanlock_restrict", &restrict_client, &missing);
  Bind(handle_, "sanlock_killpath", &killpath, &missing);
  Bind(handle_, "sanlock_acquire", &acquire, &missing);
  Bind(handle_, "sanlock_release", &release, &missing);
  Bind(handle_, "sanlock_inquire", &inquire, &missing);
  Bind(handle_, "sanlock_convert", &convert, &missing);
  Bind(handle_, "sanlock_request", &request, &missing);
  Bind(handle_, "sanlock_res_to_str", &res_to_str, &missing);
  Bind(handle_, "sanlock_str_to_res", &str_to_res, &missing);
  Bind(handle_, "sanlock_args_to_state", &args_to_state, &missing);
  Bind(handle_, "sanlock_state_to_args", &state_to_args, &missing);
  Bind(handle_, "sanlock_strerror", &strerror, &missing);
  if (!missing.empty()) {
    *error = std::string(kSoname) + " lacks " + missing + " (sanlock 3.8 or newer is needed; install " + kPackages + ")";
    dlclose(handle_);
    handle_ = nullptr;
    return false;
  }
  return true;
}

const SanlockLibrary* SanlockLibrary::Get(std::string* error) {
  // Loaded once; a failed load is remembered too, so every later call reports the same
  // reason without retrying dlopen (installing the package needs a restart anyway).
  static std::once_flag once;
  static SanlockLibrary* lib = nullptr;
  static std::string load_error;
  std::call_once(once, []() {
    auto* l = new SanlockLibrary();  // never freed: the function pointers live until exit
    if (l->Load(&load_error)) {
      lib = l;
    } else {
      delete l;
    }
  });
  if (lib == nullptr && error != nullptr) *error = load_error;
  return lib;
}

}  // namespace mooring
