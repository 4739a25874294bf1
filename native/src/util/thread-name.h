// Names the calling thread (at most 15 characters are kept), so that
// /proc/<pid>/task/*/comm, top -H and gdb tell Mooring's threads apart. Every thread the
// native core starts names itself first thing (docs/architecture.md, "Threads").
// prctl(PR_SET_NAME) rather than pthread_setname_np: the latter binds GLIBC_2.34 when built
// on Debian 12, past the prebuilds' glibc floor (test/package/prebuild-symbols.test.ts).
#pragma once

#include <sys/prctl.h>

namespace mooring {

inline void NameThisThread(const char* name) { prctl(PR_SET_NAME, name, 0, 0, 0); }

}  // namespace mooring
