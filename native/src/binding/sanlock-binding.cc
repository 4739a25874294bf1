#include "binding/sanlock-binding.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "binding/async-worker.h"
#include "binding/js-args.h"
#include "sanlock/delta-lease.h"
#include "sanlock/lease-area.h"
#include "sanlock/sanlock-abi.h"
#include "sanlock/sanlock-library.h"

namespace mooring {
namespace {

namespace abi = sanlock_abi;
using Lib = SanlockLibrary;

// Host ids sanlock accepts (the largest lockspace, 512-byte sectors with 8 MiB alignment
// or 4K sectors with 8 MiB, holds 2000 hosts).
constexpr double kMaxHostId = 2000;
// io_timeout values accepted, in seconds (sanlock stores it in 16 bits; beyond a few
// minutes a lease could not be taken over in any useful time).
constexpr double kMaxIoTimeoutSeconds = 300;
// Entries the library may hand back from one get_lockspaces/get_hosts/state_to_args call
// before we stop converting (the daemon's own limits are lower).
constexpr int kMaxListEntries = 4096;
// Longest inquire/state string converted back (SANLK_MAX_RES_STR is 4400 per resource).
constexpr size_t kMaxStateBytes = abi::kMaxResources * 4400 + 64;
// Arguments of an execvp (the VM command line).
constexpr uint32_t kMaxExecArgs = 4096;

const Lib* Library() {
  std::string error;
  const Lib* lib = Lib::Get(&error);
  if (lib == nullptr) throw JsError(Code::kUnsupported, error);
  return lib;
}

// ---- JS -> C structs ---------------------------------------------------------------

void CopyName(char (&dst)[abi::kNameLen], const std::string& src) {
  std::memset(dst, 0, abi::kNameLen);
  std::memcpy(dst, src.data(), src.size());  // size checked by ToName
}

std::string ToName(const Napi::Value& v, const std::string& what) {
  return ToStr(v, what, 1, abi::kNameLen);
}

std::string FromName(const char* p) { return std::string(p, strnlen(p, abi::kNameLen)); }

uint32_t ToFlags(const Napi::Value& v, const std::string& what, uint32_t allowed) {
  if (v.IsUndefined()) return 0;
  const uint64_t f = ToUint(v, what, 0xffffffffu);
  if ((f & ~static_cast<uint64_t>(allowed)) != 0) throw ArgError(what, "a combination of the documented flag bits");
  return static_cast<uint32_t>(f);
}

void ToDisk(const Napi::Value& v, const std::string& what, abi::Disk* d) {
  Napi::Object o = ToObject(v, what);
  const std::string path = ToStr(o.Get("path"), what + ".path", 1, abi::kPathLen - 1);
  std::memset(d, 0, sizeof(*d));
  std::memcpy(d->path, path.data(), path.size());
  d->offset = ToUint(o.Get("offset"), what + ".offset");
}

// A sanlk_resource with its disks in one allocation (the struct ends in a flexible array).
class ResourceBuf {
 public:
  ResourceBuf() = default;
  explicit ResourceBuf(uint32_t num_disks)
      : mem_((sizeof(abi::Resource) + num_disks * sizeof(abi::Disk) + 7) / 8, 0) {
    get()->num_disks = num_disks;
  }
  abi::Resource* get() { return reinterpret_cast<abi::Resource*>(mem_.data()); }
  abi::Disk* disks() { return reinterpret_cast<abi::Disk*>(mem_.data() + sizeof(abi::Resource) / 8); }

 private:
  std::vector<uint64_t> mem_;  // uint64_t: the struct's alignment
};

ResourceBuf ToResource(const Napi::Value& v, const std::string& what) {
  Napi::Object o = ToObject(v, what);
  Napi::Value dv = o.Get("disks");
  if (!dv.IsArray()) throw ArgError(what + ".disks", "an array of {path, offset}");
  Napi::Array arr = dv.As<Napi::Array>();
  if (arr.Length() < 1 || arr.Length() > static_cast<uint32_t>(abi::kMaxDisks))
    throw ArgError(what + ".disks", "1.." + std::to_string(abi::kMaxDisks) + " disks");
  ResourceBuf buf(arr.Length());
  abi::Resource* r = buf.get();
  CopyName(r->lockspace_name, ToName(o.Get("lockspace"), what + ".lockspace"));
  CopyName(r->name, ToName(o.Get("name"), what + ".name"));
  r->flags = ToFlags(o.Get("flags"), what + ".flags", abi::kResFlagsAllowed);
  Napi::Value lver = o.Get("lver");
  if (!lver.IsUndefined()) r->lver = ToUint(lver, what + ".lver");
  for (uint32_t i = 0; i < arr.Length(); ++i)
    ToDisk(arr.Get(i), what + ".disks[" + std::to_string(i) + "]", &buf.disks()[i]);
  return buf;
}

std::vector<ResourceBuf> ToResources(const Napi::Value& v, const std::string& what) {
  if (!v.IsArray()) throw ArgError(what, "an array of resources");
  Napi::Array arr = v.As<Napi::Array>();
  if (arr.Length() < 1 || arr.Length() > static_cast<uint32_t>(abi::kMaxResources))
    throw ArgError(what, "1.." + std::to_string(abi::kMaxResources) + " resources");
  std::vector<ResourceBuf> out;
  for (uint32_t i = 0; i < arr.Length(); ++i) out.push_back(ToResource(arr.Get(i), what + "[" + std::to_string(i) + "]"));
  return out;
}

abi::Lockspace ToLockspace(const Napi::Value& v, const std::string& what) {
  Napi::Object o = ToObject(v, what);
  abi::Lockspace ls;
  std::memset(&ls, 0, sizeof(ls));
  CopyName(ls.name, ToName(o.Get("name"), what + ".name"));
  Napi::Value id = o.Get("hostId");
  ls.host_id = id.IsUndefined() ? 0 : ToUint(id, what + ".hostId", kMaxHostId);
  ls.flags = ToFlags(o.Get("flags"), what + ".flags", abi::kLsfFlagsAllowed);
  const std::string path = ToStr(o.Get("path"), what + ".path", 1, abi::kPathLen - 1);
  std::memcpy(ls.host_id_disk.path, path.data(), path.size());
  ls.host_id_disk.offset = ToUint(o.Get("offset"), what + ".offset");
  return ls;
}

abi::Rindex ToRindex(const Napi::Value& v, const std::string& what) {
  Napi::Object o = ToObject(v, what);
  abi::Rindex rx;
  std::memset(&rx, 0, sizeof(rx));
  CopyName(rx.lockspace_name, ToName(o.Get("lockspace"), what + ".lockspace"));
  rx.flags = ToFlags(o.Get("flags"), what + ".flags", abi::kLsfFlagsAllowed);
  Napi::Value max = o.Get("maxResources");
  if (!max.IsUndefined()) rx.max_resources = static_cast<uint32_t>(ToUint(max, what + ".maxResources", 1u << 20));
  ToDisk(o, what, &rx.disk);
  return rx;
}

abi::Rentry ToRentry(const Napi::Value& v, const std::string& what) {
  abi::Rentry re;
  std::memset(&re, 0, sizeof(re));
  if (v.IsUndefined()) return re;
  Napi::Object o = ToObject(v, what);
  Napi::Value name = o.Get("name");
  if (!name.IsUndefined()) CopyName(re.name, ToName(name, what + ".name"));
  Napi::Value off = o.Get("offset");
  if (!off.IsUndefined()) re.offset = ToUint(off, what + ".offset");
  return re;
}

abi::HostEvent ToHostEvent(const Napi::Value& v, const std::string& what) {
  abi::HostEvent he;
  std::memset(&he, 0, sizeof(he));
  if (v.IsUndefined()) return he;
  Napi::Object o = ToObject(v, what);
  Napi::Value id = o.Get("hostId");
  if (!id.IsUndefined()) he.host_id = ToUint(id, what + ".hostId", kMaxHostId);
  Napi::Value gen = o.Get("generation");
  if (!gen.IsUndefined()) he.generation = ToUint(gen, what + ".generation");
  Napi::Value ev = o.Get("event");
  if (!ev.IsUndefined()) he.event = ToUint(ev, what + ".event");
  Napi::Value data = o.Get("data");
  if (!data.IsUndefined()) he.data = ToUint(data, what + ".data");
  return he;
}

// ---- C structs -> JS ---------------------------------------------------------------

Napi::Object DiskToJs(Napi::Env env, const abi::Disk& d) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("path", std::string(d.path, strnlen(d.path, abi::kPathLen)));
  o.Set("offset", JsNum(env, d.offset));
  return o;
}

Napi::Object ResourceToJs(Napi::Env env, const abi::Resource* r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("lockspace", FromName(r->lockspace_name));
  o.Set("name", FromName(r->name));
  o.Set("lver", JsNum(env, r->lver));
  o.Set("flags", Napi::Number::New(env, r->flags));
  const auto* disks = reinterpret_cast<const abi::Disk*>(r + 1);
  const uint32_t n = r->num_disks > static_cast<uint32_t>(abi::kMaxDisks) ? abi::kMaxDisks : r->num_disks;
  Napi::Array arr = Napi::Array::New(env, n);
  for (uint32_t i = 0; i < n; ++i) arr.Set(i, DiskToJs(env, disks[i]));
  o.Set("disks", arr);
  return o;
}

Napi::Object HostToJs(Napi::Env env, const abi::Host& h) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("hostId", JsNum(env, h.host_id));
  o.Set("generation", JsNum(env, h.generation));
  o.Set("timestamp", JsNum(env, h.timestamp));
  o.Set("ioTimeout", Napi::Number::New(env, h.io_timeout));
  o.Set("flags", Napi::Number::New(env, h.flags));
  return o;
}

Napi::Object LockspaceToJs(Napi::Env env, const abi::Lockspace& ls) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("name", FromName(ls.name));
  o.Set("hostId", JsNum(env, ls.host_id));
  o.Set("flags", Napi::Number::New(env, ls.flags));
  o.Set("path", std::string(ls.host_id_disk.path, strnlen(ls.host_id_disk.path, abi::kPathLen)));
  o.Set("offset", JsNum(env, ls.host_id_disk.offset));
  return o;
}

Napi::Object HostEventToJs(Napi::Env env, const abi::HostEvent& he) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("hostId", JsNum(env, he.host_id));
  o.Set("generation", JsNum(env, he.generation));
  o.Set("event", JsNum(env, he.event));
  o.Set("data", JsNum(env, he.data));
  return o;
}

Napi::Object Rv(Napi::Env env, int rv) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("rv", Napi::Number::New(env, rv));
  return o;
}

// ---- registered connections ----------------------------------------------------------

// A socket returned by sanlock_register (or sanlock_reg_event). sanlock requires calls on
// one registered fd to be serialised; `mu` does that, and `closed` keeps a call queued
// behind unregister() from using a closed (and maybe reused) fd number.
struct Connection {
  std::mutex mu;
  int fd = -1;
  bool closed = false;
};

// Process-wide, like the fds themselves: a connection registered in one Node environment
// is a connection of the process.
std::mutex g_conn_mu;
std::map<int, std::shared_ptr<Connection>>* g_conns = new std::map<int, std::shared_ptr<Connection>>();

std::shared_ptr<Connection> AddConnection(int fd) {
  auto c = std::make_shared<Connection>();
  c->fd = fd;
  std::lock_guard<std::mutex> lk(g_conn_mu);
  (*g_conns)[fd] = c;
  return c;
}

std::shared_ptr<Connection> FindConnection(const Napi::Value& v, const std::string& what) {
  const int fd = static_cast<int>(ToUint(v, what, 1 << 30));
  std::lock_guard<std::mutex> lk(g_conn_mu);
  auto it = g_conns->find(fd);
  if (it == g_conns->end())
    throw JsError(Code::kInvalidArgument, what + " " + std::to_string(fd) + " is not an open sanlock connection of this process");
  return it->second;
}

// Who a resource call acts for: a registered connection of this process ({fd}) or another
// registered process ({pid}, sock = -1).
struct Target {
  std::shared_ptr<Connection> conn;
  int pid = -1;
};

Target ToTarget(const Napi::Value& v, const std::string& what) {
  Napi::Object o = ToObject(v, what);
  Target t;
  Napi::Value fd = o.Get("fd");
  Napi::Value pid = o.Get("pid");
  if (!fd.IsUndefined() == !pid.IsUndefined()) throw ArgError(what, "{ fd } or { pid }, exactly one");
  if (!fd.IsUndefined()) {
    t.conn = FindConnection(fd, what + ".fd");
  } else {
    t.pid = static_cast<int>(ToUint(pid, what + ".pid", 4194304));
    if (t.pid <= 0) throw ArgError(what + ".pid", "a process id > 0");
  }
  return t;
}

// Runs `call(sock, pid)` for the target: under the connection's lock for {fd}.
int WithTarget(const Target& t, const std::function<int(int sock, int pid)>& call) {
  if (!t.conn) return call(-1, t.pid);
  std::lock_guard<std::mutex> lk(t.conn->mu);
  if (t.conn->closed) return -EBADF;
  return call(t.conn->fd, -1);
}

// ---- the calls ------------------------------------------------------------------------

// A daemon call: `run` (pool thread) fills `out` and returns rv; `fill` (JS thread) adds
// the results to the {rv} object.
template <typename Out>
Napi::Value RvCall(Napi::Env env, std::function<int(Out*)> run,
                   std::function<void(Napi::Env, Napi::Object, Out*)> fill = nullptr) {
  auto out = std::make_shared<Out>();
  auto rv = std::make_shared<int>(0);
  return (new TaskWorker(
              env,
              [run, out, rv]() -> Status {
                *rv = run(out.get());
                return Status::Ok();
              },
              [fill, out, rv](Napi::Env env) -> Napi::Value {
                Napi::Object o = Rv(env, *rv);
                if (fill) fill(env, o, out.get());
                return o;
              }))
      ->Start();
}

struct None {};

template <typename Make>
Napi::Value Promise(const Napi::CallbackInfo& info, Make&& make) {
  Napi::Env env = info.Env();
  try {
    return make();
  } catch (const JsError& e) {
    return RejectedPromise(env, MakeError(env, e.code, e.message));
  } catch (const Napi::Error& e) {
    Napi::Error err = MakeError(env, Code::kInvalidArgument, std::string("reading the arguments threw: ") + e.Message());
    err.Set("cause", e.Value());
    return RejectedPromise(env, err);
  }
}

template <typename Make>
Napi::Value Sync(const Napi::CallbackInfo& info, Make&& make) {
  try {
    return make();
  } catch (const JsError& e) {
    throw MakeError(info.Env(), e.code, e.message);
  }
}

Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string error;
  const Lib* lib = Lib::Get(&error);
  Napi::Object o = Napi::Object::New(env);
  o.Set("loaded", lib != nullptr);
  o.Set("library", Lib::kSoname);
  if (lib == nullptr) o.Set("error", error);
  return o;
}

Napi::Value StrError(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const Napi::Value v = Arg(info, 0);
    if (!v.IsNumber()) throw ArgError("rv", "a number");
    const int rv = v.As<Napi::Number>().Int32Value();
    const char* s = Library()->strerror(rv);
    return Napi::String::New(info.Env(), s != nullptr ? s : "");
  });
}

Napi::Value Version(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    struct Out {
      uint32_t version = 0, proto = 0;
    };
    return RvCall<Out>(
        info.Env(), [lib](Out* o) { return lib->version(0, &o->version, &o->proto); },
        [](Napi::Env env, Napi::Object r, Out* o) {
          r.Set("version", Napi::Number::New(env, o->version));
          r.Set("proto", Napi::Number::New(env, o->proto));
        });
  });
}

Napi::Value WriteLockspace(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Lockspace ls = ToLockspace(Arg(info, 0), "lockspace");
    const int max_hosts = static_cast<int>(ToUint(Arg(info, 1), "maxHosts", kMaxHostId));
    const uint32_t flags = 0;  // no write_lockspace flags are defined
    const uint32_t io = static_cast<uint32_t>(ToUint(Arg(info, 2), "ioTimeoutSeconds", kMaxIoTimeoutSeconds));
    return RvCall<None>(info.Env(), [lib, ls, max_hosts, flags, io](None*) mutable {
      return lib->write_lockspace(&ls, max_hosts, flags, io);
    });
  });
}

Napi::Value ReadLockspace(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    struct Out {
      abi::Lockspace ls;
      uint32_t io = 0;
    };
    abi::Lockspace ls = ToLockspace(Arg(info, 0), "lockspace");
    return RvCall<Out>(
        info.Env(),
        [lib, ls](Out* o) {
          o->ls = ls;
          return lib->read_lockspace(&o->ls, 0, &o->io);
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          r.Set("lockspace", LockspaceToJs(env, o->ls));
          r.Set("ioTimeoutSeconds", Napi::Number::New(env, o->io));
        });
  });
}

Napi::Value WriteResource(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    auto res = std::make_shared<ResourceBuf>(ToResource(Arg(info, 0), "resource"));
    const int max_hosts = static_cast<int>(ToUint(Arg(info, 1), "maxHosts", kMaxHostId));
    const int num_hosts = static_cast<int>(ToUint(Arg(info, 2), "numHosts", kMaxHostId));
    const bool clear = ToBool(Arg(info, 3), "clear", false);
    return RvCall<None>(info.Env(), [lib, res, max_hosts, num_hosts, clear](None*) {
      return lib->write_resource(res->get(), max_hosts, num_hosts, clear ? 0x1u /* SANLK_WRITE_CLEAR */ : 0u);
    });
  });
}

Napi::Value ReadResource(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    const bool owners = ToBool(Arg(info, 1), "withOwners", false);
    struct Out {
      std::shared_ptr<ResourceBuf> res;
      std::vector<abi::Host> hosts;
    };
    auto res = std::make_shared<ResourceBuf>(ToResource(Arg(info, 0), "resource"));
    return RvCall<Out>(
        info.Env(),
        [lib, res, owners](Out* o) {
          o->res = res;
          if (!owners) return lib->read_resource(res->get(), 0);
          abi::Host* hss = nullptr;
          int n = 0;
          const int rv = lib->read_resource_owners(res->get(), 0, &hss, &n);
          if (hss != nullptr) {
            for (int i = 0; i < n && i < kMaxListEntries; ++i) o->hosts.push_back(hss[i]);
            std::free(hss);
          }
          return rv;
        },
        [owners](Napi::Env env, Napi::Object r, Out* o) {
          r.Set("resource", ResourceToJs(env, o->res->get()));
          if (owners) {
            Napi::Array arr = Napi::Array::New(env, o->hosts.size());
            for (size_t i = 0; i < o->hosts.size(); ++i) arr.Set(static_cast<uint32_t>(i), HostToJs(env, o->hosts[i]));
            r.Set("owners", arr);
          }
        });
  });
}

Napi::Value Align(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Disk d;
    ToDisk(Arg(info, 0), "disk", &d);
    return RvCall<None>(info.Env(), [lib, d](None*) mutable { return lib->align(&d); });
  });
}

Napi::Value AddLockspace(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Lockspace ls = ToLockspace(Arg(info, 0), "lockspace");
    if (ls.host_id == 0) throw ArgError("lockspace.hostId", "1.." + std::to_string(static_cast<int>(kMaxHostId)));
    const bool async = ToBool(Arg(info, 1), "async", false);
    const uint32_t io = static_cast<uint32_t>(ToUint(Arg(info, 2), "ioTimeoutSeconds", kMaxIoTimeoutSeconds));
    return RvCall<None>(info.Env(), [lib, ls, async, io](None*) mutable {
      return lib->add_lockspace_timeout(&ls, async ? 0x1u /* SANLK_ADD_ASYNC */ : 0u, io);
    });
  });
}

Napi::Value InqLockspace(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Lockspace ls = ToLockspace(Arg(info, 0), "lockspace");
    const bool wait = ToBool(Arg(info, 1), "wait", false);
    return RvCall<None>(info.Env(), [lib, ls, wait](None*) mutable {
      return lib->inq_lockspace(&ls, wait ? 0x1u /* SANLK_INQ_WAIT */ : 0u);
    });
  });
}

Napi::Value RemLockspace(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Lockspace ls = ToLockspace(Arg(info, 0), "lockspace");
    Napi::Object opts = Arg(info, 1).IsUndefined() ? Napi::Object::New(info.Env()) : ToObject(Arg(info, 1), "options");
    uint32_t flags = 0;
    if (ToBool(opts.Get("async"), "options.async", false)) flags |= 0x1;    // SANLK_REM_ASYNC
    if (ToBool(opts.Get("unused"), "options.unused", false)) flags |= 0x2;  // SANLK_REM_UNUSED
    return RvCall<None>(info.Env(), [lib, ls, flags](None*) mutable { return lib->rem_lockspace(&ls, flags); });
  });
}

Napi::Value GetLockspaces(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    struct Out {
      std::vector<abi::Lockspace> lss;
    };
    return RvCall<Out>(
        info.Env(),
        [lib](Out* o) {
          abi::Lockspace* lss = nullptr;
          int n = 0;
          const int rv = lib->get_lockspaces(&lss, &n, 0);
          if (lss != nullptr) {
            for (int i = 0; i < n && i < kMaxListEntries; ++i) o->lss.push_back(lss[i]);
            std::free(lss);
          }
          return rv;
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          Napi::Array arr = Napi::Array::New(env, o->lss.size());
          for (size_t i = 0; i < o->lss.size(); ++i) arr.Set(static_cast<uint32_t>(i), LockspaceToJs(env, o->lss[i]));
          r.Set("lockspaces", arr);
        });
  });
}

Napi::Value GetHosts(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    const std::string name = ToName(Arg(info, 0), "lockspaceName");
    const uint64_t host_id = Arg(info, 1).IsUndefined() ? 0 : ToUint(Arg(info, 1), "hostId", kMaxHostId);
    struct Out {
      std::vector<abi::Host> hosts;
    };
    return RvCall<Out>(
        info.Env(),
        [lib, name, host_id](Out* o) {
          abi::Host* hss = nullptr;
          int n = 0;
          const int rv = lib->get_hosts(name.c_str(), host_id, &hss, &n, 0);
          if (hss != nullptr) {
            for (int i = 0; i < n && i < kMaxListEntries; ++i) o->hosts.push_back(hss[i]);
            std::free(hss);
          }
          return rv;
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          Napi::Array arr = Napi::Array::New(env, o->hosts.size());
          for (size_t i = 0; i < o->hosts.size(); ++i) arr.Set(static_cast<uint32_t>(i), HostToJs(env, o->hosts[i]));
          r.Set("hosts", arr);
        });
  });
}

Napi::Value RentryResult(Napi::Env env, Napi::Object r, const abi::Rentry& re) {
  Napi::Object e = Napi::Object::New(env);
  e.Set("name", FromName(re.name));
  e.Set("offset", JsNum(env, re.offset));
  r.Set("entry", e);
  return r;
}

Napi::Value FormatRindex(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Rindex rx = ToRindex(Arg(info, 0), "rindex");
    return RvCall<None>(info.Env(), [lib, rx](None*) mutable { return lib->format_rindex(&rx, 0); });
  });
}

Napi::Value LookupRindex(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Rindex rx = ToRindex(Arg(info, 0), "rindex");
    abi::Rentry re = ToRentry(Arg(info, 1), "entry");
    return RvCall<abi::Rentry>(
        info.Env(),
        [lib, rx, re](abi::Rentry* o) mutable {
          *o = re;
          return lib->lookup_rindex(&rx, 0, o);
        },
        [](Napi::Env env, Napi::Object r, abi::Rentry* o) { RentryResult(env, r, *o); });
  });
}

Napi::Value CreateResource(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Rindex rx = ToRindex(Arg(info, 0), "rindex");
    abi::Rentry re;
    std::memset(&re, 0, sizeof(re));
    CopyName(re.name, ToName(Arg(info, 1), "name"));
    const int max_hosts = static_cast<int>(ToUint(Arg(info, 2), "maxHosts", kMaxHostId));
    const int num_hosts = static_cast<int>(ToUint(Arg(info, 3), "numHosts", kMaxHostId));
    return RvCall<abi::Rentry>(
        info.Env(),
        [lib, rx, re, max_hosts, num_hosts](abi::Rentry* o) mutable {
          *o = re;
          return lib->create_resource(&rx, 0, o, max_hosts, num_hosts);
        },
        [](Napi::Env env, Napi::Object r, abi::Rentry* o) { RentryResult(env, r, *o); });
  });
}

Napi::Value DeleteResource(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    abi::Rindex rx = ToRindex(Arg(info, 0), "rindex");
    abi::Rentry re = ToRentry(Arg(info, 1), "entry");
    return RvCall<None>(info.Env(), [lib, rx, re](None*) mutable { return lib->delete_resource(&rx, 0, &re); });
  });
}

Napi::Value Register(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    struct Out {
      std::shared_ptr<Connection> conn;
    };
    return RvCall<Out>(
        info.Env(),
        [lib](Out* o) {
          const int fd = lib->register_client();
          if (fd >= 0) o->conn = AddConnection(fd);
          return fd < 0 ? fd : 0;
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          if (o->conn) r.Set("fd", Napi::Number::New(env, o->conn->fd));
        });
  });
}

Napi::Value Unregister(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    std::shared_ptr<Connection> c = FindConnection(Arg(info, 0), "fd");
    {
      // Out of the table at once, so no new call can find it; calls already queued see
      // `closed` once they get the lock.
      std::lock_guard<std::mutex> lk(g_conn_mu);
      g_conns->erase(c->fd);
    }
    return RvCall<None>(info.Env(), [c](None*) {
      std::lock_guard<std::mutex> lk(c->mu);
      if (c->closed) return 0;
      c->closed = true;
      return close(c->fd) == 0 ? 0 : -errno;
    });
  });
}

Napi::Value Restrict(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t{FindConnection(Arg(info, 0), "fd"), -1};
    const uint32_t flags = ToFlags(Arg(info, 1), "flags", 0x7);  // SANLK_RESTRICT_ALL|SIGKILL|SIGTERM
    return RvCall<None>(info.Env(), [lib, t, flags](None*) {
      return WithTarget(t, [&](int sock, int) { return lib->restrict_client(sock, flags); });
    });
  });
}

Napi::Value Killpath(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t{FindConnection(Arg(info, 0), "fd"), -1};
    const std::string path = ToStr(Arg(info, 1), "path", 1, abi::kHelperPathLen - 1);
    const std::string args = Arg(info, 2).IsUndefined() ? std::string()
                                                         : ToStr(Arg(info, 2), "args", 0, abi::kHelperArgsLen - 1);
    const bool with_pid = ToBool(Arg(info, 3), "appendPid", true);
    return RvCall<None>(info.Env(), [lib, t, path, args, with_pid](None*) {
      std::vector<char> a(abi::kHelperArgsLen, 0);
      std::memcpy(a.data(), args.data(), args.size());
      return WithTarget(t, [&](int sock, int) {
        return lib->killpath(sock, with_pid ? 0x1u /* SANLK_KILLPATH_PID */ : 0u, path.c_str(), a.data());
      });
    });
  });
}

Napi::Value Acquire(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t = ToTarget(Arg(info, 0), "target");
    const uint32_t flags = ToFlags(Arg(info, 1), "flags", 0xf);  // SANLK_ACQUIRE_*
    auto res = std::make_shared<std::vector<ResourceBuf>>(ToResources(Arg(info, 2), "resources"));
    abi::Options opt;
    std::memset(&opt, 0, sizeof(opt));
    const bool has_owner = !Arg(info, 3).IsUndefined();
    if (has_owner) CopyName(opt.owner_name, ToName(Arg(info, 3), "ownerName"));
    return RvCall<None>(info.Env(), [lib, t, flags, res, opt, has_owner](None*) mutable {
      std::vector<abi::Resource*> ptrs;
      for (auto& r : *res) ptrs.push_back(r.get());
      return WithTarget(t, [&](int sock, int pid) {
        return lib->acquire(sock, pid, flags, static_cast<int>(ptrs.size()), ptrs.data(), has_owner ? &opt : nullptr);
      });
    });
  });
}

Napi::Value Release(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t = ToTarget(Arg(info, 0), "target");
    const uint32_t flags = ToFlags(Arg(info, 1), "flags", 0x7);  // SANLK_REL_*
    auto res = std::make_shared<std::vector<ResourceBuf>>();
    if ((flags & 0x1) == 0) *res = ToResources(Arg(info, 2), "resources");  // not SANLK_REL_ALL
    return RvCall<None>(info.Env(), [lib, t, flags, res](None*) {
      std::vector<abi::Resource*> ptrs;
      for (auto& r : *res) ptrs.push_back(r.get());
      return WithTarget(t, [&](int sock, int pid) {
        return lib->release(sock, pid, flags, static_cast<int>(ptrs.size()), ptrs.empty() ? nullptr : ptrs.data());
      });
    });
  });
}

Napi::Value Inquire(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t = ToTarget(Arg(info, 0), "target");
    struct Out {
      int count = 0;
      std::string state;
    };
    return RvCall<Out>(
        info.Env(),
        [lib, t](Out* o) {
          char* state = nullptr;
          const int rv = WithTarget(t, [&](int sock, int pid) { return lib->inquire(sock, pid, 0, &o->count, &state); });
          if (state != nullptr) {
            o->state.assign(state, strnlen(state, kMaxStateBytes));
            std::free(state);
          }
          return rv;
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          r.Set("count", Napi::Number::New(env, o->count));
          r.Set("state", o->state);
        });
  });
}

Napi::Value Convert(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t = ToTarget(Arg(info, 0), "target");
    const uint32_t flags = ToFlags(Arg(info, 1), "flags", 0x8);  // SANLK_CONVERT_OWNER_NOWAIT
    auto res = std::make_shared<ResourceBuf>(ToResource(Arg(info, 2), "resource"));
    return RvCall<None>(info.Env(), [lib, t, flags, res](None*) {
      return WithTarget(t, [&](int sock, int pid) { return lib->convert(sock, pid, flags, res->get()); });
    });
  });
}

Napi::Value Request(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    const uint32_t flags = ToFlags(Arg(info, 0), "flags", 0x1);          // SANLK_REQUEST_NEXT_LVER
    const uint32_t force = ToFlags(Arg(info, 1), "forceMode", 0x3);      // SANLK_REQ_FORCE|GRACEFUL
    auto res = std::make_shared<ResourceBuf>(ToResource(Arg(info, 2), "resource"));
    return RvCall<None>(info.Env(), [lib, flags, force, res](None*) { return lib->request(flags, force, res->get()); });
  });
}

Napi::Value RegEvent(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    const std::string name = ToName(Arg(info, 0), "lockspaceName");
    struct Out {
      std::shared_ptr<Connection> conn;
    };
    return RvCall<Out>(
        info.Env(),
        [lib, name](Out* o) {
          abi::HostEvent he;
          std::memset(&he, 0, sizeof(he));
          const int fd = lib->reg_event(name.c_str(), &he, 0);
          if (fd >= 0) o->conn = AddConnection(fd);
          return fd < 0 ? fd : 0;
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          if (o->conn) r.Set("fd", Napi::Number::New(env, o->conn->fd));
        });
  });
}

Napi::Value GetEvent(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    Target t{FindConnection(Arg(info, 0), "fd"), -1};
    struct Out {
      abi::HostEvent he;
      uint64_t from_host = 0, from_gen = 0;
    };
    return RvCall<Out>(
        info.Env(),
        [lib, t](Out* o) {
          std::memset(&o->he, 0, sizeof(o->he));
          // The event fd is non-blocking on the daemon side: no event gives -EAGAIN.
          return WithTarget(t, [&](int sock, int) { return lib->get_event(sock, 0, &o->he, &o->from_host, &o->from_gen); });
        },
        [](Napi::Env env, Napi::Object r, Out* o) {
          r.Set("event", HostEventToJs(env, o->he));
          r.Set("fromHostId", JsNum(env, o->from_host));
          r.Set("fromGeneration", JsNum(env, o->from_gen));
        });
  });
}

Napi::Value EndEvent(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    std::shared_ptr<Connection> c = FindConnection(Arg(info, 0), "fd");
    const std::string name = ToName(Arg(info, 1), "lockspaceName");
    {
      std::lock_guard<std::mutex> lk(g_conn_mu);
      g_conns->erase(c->fd);
    }
    return RvCall<None>(info.Env(), [lib, c, name](None*) {
      std::lock_guard<std::mutex> lk(c->mu);
      if (c->closed) return 0;
      c->closed = true;
      return lib->end_event(c->fd, name.c_str(), 0);  // closes the fd
    });
  });
}

Napi::Value SetEvent(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const Lib* lib = Library();
    const std::string name = ToName(Arg(info, 0), "lockspaceName");
    abi::HostEvent he = ToHostEvent(Arg(info, 1), "event");
    const uint32_t flags = ToFlags(Arg(info, 2), "flags", 0x1f);  // SANLK_SETEV_*
    return RvCall<None>(info.Env(), [lib, name, he, flags](None*) mutable { return lib->set_event(name.c_str(), &he, flags); });
  });
}

Napi::Value ReadDeltaLease(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const std::string path = ToStr(Arg(info, 0), "path", 1, abi::kPathLen - 1);
    const uint64_t offset = ToUint(Arg(info, 1), "offset");
    const uint64_t host_id = ToUint(Arg(info, 2), "hostId", kMaxHostId);
    const uint32_t sector = static_cast<uint32_t>(ToUint(Arg(info, 3), "sectorSize", 4096));
    auto out = std::make_shared<DeltaLease>();
    return (new TaskWorker(
                info.Env(), [=]() { return DeltaLease::Read(path, offset, host_id, sector, out.get()); },
                [out](Napi::Env env) -> Napi::Value {
                  Napi::Object o = Napi::Object::New(env);
                  o.Set("valid", out->valid);
                  o.Set("ownerId", JsNum(env, out->owner_id));
                  o.Set("generation", JsNum(env, out->generation));
                  o.Set("timestamp", JsNum(env, out->timestamp));
                  o.Set("lockspace", out->lockspace);
                  o.Set("hostName", out->host_name);
                  return o;
                }))
        ->Start();
  });
}

Napi::Value ReadLeaseArea(const Napi::CallbackInfo& info) {
  return Promise(info, [&]() {
    const std::string path = ToStr(Arg(info, 0), "path", 1, abi::kPathLen - 1);
    const uint64_t offset = ToUint(Arg(info, 1), "offset");
    const uint64_t length = ToUint(Arg(info, 2), "length", LeaseArea::kLengthMax);
    auto out = std::make_shared<std::string>();
    return (new TaskWorker(
                info.Env(), [=]() { return LeaseArea::Read(path, offset, length, out.get()); },
                [out](Napi::Env env) -> Napi::Value { return Napi::Buffer<char>::Copy(env, out->data(), out->size()); }))
        ->Start();
  });
}

// ---- local string helpers (no daemon, no I/O: synchronous) ------------------------------

Napi::Value ResToStr(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const Lib* lib = Library();
    ResourceBuf res = ToResource(Arg(info, 0), "resource");
    char* s = nullptr;
    const int rv = lib->res_to_str(res.get(), &s);
    Napi::Object r = Rv(info.Env(), rv);
    if (s != nullptr) {
      r.Set("str", std::string(s, strnlen(s, kMaxStateBytes)));
      std::free(s);
    }
    return r;
  });
}

Napi::Value StrToRes(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const Lib* lib = Library();
    std::string str = ToStr(Arg(info, 0), "str", 1, kMaxStateBytes);
    abi::Resource* res = nullptr;
    const int rv = lib->str_to_res(&str[0], &res);
    Napi::Object r = Rv(info.Env(), rv);
    if (res != nullptr) {
      if (rv >= 0) r.Set("resource", ResourceToJs(info.Env(), res));
      std::free(res);
    }
    return r;
  });
}

Napi::Value ArgsToState(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const Lib* lib = Library();
    std::vector<ResourceBuf> res = ToResources(Arg(info, 0), "resources");
    std::vector<abi::Resource*> ptrs;
    for (auto& r : res) ptrs.push_back(r.get());
    char* s = nullptr;
    const int rv = lib->args_to_state(static_cast<int>(ptrs.size()), ptrs.data(), &s);
    Napi::Object r = Rv(info.Env(), rv);
    if (s != nullptr) {
      r.Set("state", std::string(s, strnlen(s, kMaxStateBytes)));
      std::free(s);
    }
    return r;
  });
}

Napi::Value StateToArgs(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const Lib* lib = Library();
    std::string state = ToStr(Arg(info, 0), "state", 1, kMaxStateBytes);
    int count = 0;
    abi::Resource** res = nullptr;
    const int rv = lib->state_to_args(&state[0], &count, &res);
    Napi::Env env = info.Env();
    Napi::Object r = Rv(env, rv);
    if (res != nullptr) {
      Napi::Array arr = Napi::Array::New(env);
      for (int i = 0; i < count && i < kMaxListEntries; ++i) {
        if (res[i] == nullptr) continue;
        if (rv >= 0) arr.Set(arr.Length(), ResourceToJs(env, res[i]));
        std::free(res[i]);
      }
      std::free(res);
      r.Set("resources", arr);
    }
    return r;
  });
}

// ---- exec (for the lock-exec helper) ---------------------------------------------------

// Replaces this process with `file args...` keeping registered sanlock connections open
// (they have no FD_CLOEXEC), so the daemon sees the new program as the lease holder. Node
// leaves state an exec'd program must not inherit: ignored SIGPIPE, blocked signals, and
// O_NONBLOCK on stdio; all are reset first. Returns only on failure (throws).
Napi::Value Execvp(const Napi::CallbackInfo& info) {
  return Sync(info, [&]() -> Napi::Value {
    const std::string file = ToStr(Arg(info, 0), "file");
    Napi::Value av = Arg(info, 1);
    if (!av.IsArray()) throw ArgError("args", "an array of strings");
    Napi::Array arr = av.As<Napi::Array>();
    if (arr.Length() > kMaxExecArgs) throw ArgError("args", "at most " + std::to_string(kMaxExecArgs) + " strings");
    std::vector<std::string> args{file};
    for (uint32_t i = 0; i < arr.Length(); ++i) args.push_back(ToStr(arr.Get(i), "args[" + std::to_string(i) + "]", 0));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    // Descriptors to close at exec but keep if it fails (the helper's control channel, so
    // an exec failure can still be reported on it).
    std::vector<int> cloexec;
    Napi::Value cv = Arg(info, 2);
    if (!cv.IsUndefined()) {
      if (!cv.IsArray()) throw ArgError("closeOnExec", "an array of fds");
      Napi::Array ca = cv.As<Napi::Array>();
      for (uint32_t i = 0; i < ca.Length() && i < 64; ++i)
        cloexec.push_back(static_cast<int>(ToUint(ca.Get(i), "closeOnExec[" + std::to_string(i) + "]", 1 << 20)));
    }
    for (int fd : cloexec) {
      const int fl = fcntl(fd, F_GETFD);
      if (fl >= 0) fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    }

    // stdio is the program's: a Node child's stdio sockets arrive close-on-exec, and
    // libuv may have made them non-blocking.
    for (int fd = 0; fd <= 2; ++fd) {
      const int fl = fcntl(fd, F_GETFL);
      if (fl >= 0 && (fl & O_NONBLOCK) != 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
      const int fdfl = fcntl(fd, F_GETFD);
      if (fdfl >= 0 && (fdfl & FD_CLOEXEC) != 0) fcntl(fd, F_SETFD, fdfl & ~FD_CLOEXEC);
    }
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig == SIGKILL || sig == SIGSTOP) continue;
      sigaction(sig, &dfl, nullptr);  // fails harmlessly for signals that cannot be changed
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);

    execvp(file.c_str(), argv.data());
    const int err = errno;
    throw JsError(CodeFromErrno(-err), "exec " + file + ": " + std::strerror(err));
  });
}

struct Fn {
  const char* name;
  Napi::Value (*fn)(const Napi::CallbackInfo&);
};

}  // namespace

Napi::Object CreateSanlockBinding(Napi::Env env) {
  Napi::Object o = Napi::Object::New(env);
  static const Fn fns[] = {
      {"load", Load},
      {"strerror", StrError},
      {"version", Version},
      {"writeLockspace", WriteLockspace},
      {"readLockspace", ReadLockspace},
      {"writeResource", WriteResource},
      {"readResource", ReadResource},
      {"align", Align},
      {"addLockspace", AddLockspace},
      {"inqLockspace", InqLockspace},
      {"remLockspace", RemLockspace},
      {"getLockspaces", GetLockspaces},
      {"getHosts", GetHosts},
      {"formatRindex", FormatRindex},
      {"lookupRindex", LookupRindex},
      {"createResource", CreateResource},
      {"deleteResource", DeleteResource},
      {"register", Register},
      {"unregister", Unregister},
      {"restrict", Restrict},
      {"killpath", Killpath},
      {"acquire", Acquire},
      {"release", Release},
      {"inquire", Inquire},
      {"convert", Convert},
      {"request", Request},
      {"regEvent", RegEvent},
      {"getEvent", GetEvent},
      {"endEvent", EndEvent},
      {"setEvent", SetEvent},
      {"readDeltaLease", ReadDeltaLease},
      {"readLeaseArea", ReadLeaseArea},
      {"resToStr", ResToStr},
      {"strToRes", StrToRes},
      {"argsToState", ArgsToState},
      {"stateToArgs", StateToArgs},
      {"execvp", Execvp},
  };
  for (const Fn& f : fns) o.Set(f.name, Napi::Function::New(env, f.fn, f.name));
  return o;
}

}  // namespace mooring
