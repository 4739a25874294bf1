// Names the calling thread (pthread_setname_np; at most 15 characters are kept), so that
// /proc/<pid>/task/*/comm, top -H and gdb tell Mooring's threads apart. Every thread the
// native core starts names itself first thing (docs/architecture.md, "Threads").
#pragma once

#include <pthread.h>

namespace mooring {

inline void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace mooring
