// ReplicaSet: a volume's members and which of them are RW, as an engine committed them
// (docs/single-writer.md), and the quorum rule engines apply to them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace mooring {

// A volume's replica set as an engine committed it (docs/single-writer.md): the members
// (control-plane replica names) and which of them are RW, i.e. hold every write
// acknowledged under this set. Ordered by (epoch, generation); epoch 0 means "none" (a
// replica from before the protocol, or a new one).
struct ReplicaSet {
  static constexpr size_t kMaxMembers = 32;
  static constexpr size_t kMaxNameBytes = 63;  // [A-Za-z0-9._-]{1,63}, not "." or ".."

  uint64_t epoch = 0;
  uint64_t generation = 0;
  std::vector<std::string> members;
  std::vector<std::string> rw;  // a subset of members

  bool empty() const { return epoch == 0; }
  bool operator==(const ReplicaSet& o) const {
    return epoch == o.epoch && generation == o.generation && members == o.members && rw == o.rw;
  }
  bool operator!=(const ReplicaSet& o) const { return !(*this == o); }
  // Strictly newer by (epoch, generation).
  bool NewerThan(const ReplicaSet& o) const {
    return epoch != o.epoch ? epoch > o.epoch : generation > o.generation;
  }
  bool IsMember(const std::string& n) const;
  bool IsRw(const std::string& n) const;
  // Structural checks (names, limits, rw within members, no duplicates, epoch and
  // generation positive); "" when fine, else what is wrong. Input from disk and wire.
  std::string Invalid() const;
  static bool ValidName(const std::string& n);
};

// Names one replica set: (epoch, generation); epoch 0 means none.
struct ReplicaSetId {
  uint64_t epoch = 0;
  uint64_t generation = 0;

  bool empty() const { return epoch == 0; }
  bool operator==(const ReplicaSetId& o) const { return epoch == o.epoch && generation == o.generation; }
  bool operator!=(const ReplicaSetId& o) const { return !(*this == o); }
  bool operator<(const ReplicaSetId& o) const {
    return epoch != o.epoch ? epoch < o.epoch : generation < o.generation;
  }
  static ReplicaSetId Of(const ReplicaSet& s) { return ReplicaSetId{s.epoch, s.generation}; }
};

// True when more than half of `members` are in `answered`.
bool HasMajority(const std::vector<std::string>& members, const std::set<std::string>& answered);

}  // namespace mooring
