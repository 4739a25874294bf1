// ReplicaRegistry: the replicas this process has open, shared by everything in it that
// uses them (engines, the replica server). A replica directory is flock'd by whoever opens
// it, so without sharing a replica server could not serve a replica that a local engine
// of the same data engine also uses (or, in a migration, two engines use).
//
// Acquire() hands out a handle (a ReplicaBackend forwarding to the shared Replica); the
// replica is opened by the first Acquire and closed when the last handle is closed or
// destroyed. One registry per process (Global()): flock is per process anyway.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "store/replica.h"

namespace mooring {

class ReplicaRegistry {
 public:
  static ReplicaRegistry& Global();

  // Opens (or shares) the replica in `dir` (absolute; normalised by realpath, so two
  // spellings of one directory share). Errors as Replica::Open. If the last handle of
  // that replica is being closed right now, waits for the close (it holds the directory
  // lock until then) and opens it again.
  Status Acquire(const std::string& dir, std::shared_ptr<ReplicaBackend>* out);
  // Number of handles open on `dir` (0 if not open here).
  size_t Users(const std::string& dir);

 private:
  struct Entry {
    std::shared_ptr<Replica> replica;
    size_t users = 0;
    bool closing = false;  // the last handle went; Close() runs outside mu_
  };
  class Handle;
  void Release(const std::string& key);

  std::mutex mu_;
  std::condition_variable closed_cv_;  // an entry that was closing is gone
  std::map<std::string, Entry> open_;
};

}  // namespace mooring
