// ReplicaSet helpers (block/replica-backend.h; the protocol: docs/single-writer.md).
#include <algorithm>
#include <set>

#include "block/replica-set.h"

namespace mooring {

bool ReplicaSet::IsMember(const std::string& n) const {
  return std::find(members.begin(), members.end(), n) != members.end();
}

bool ReplicaSet::IsRw(const std::string& n) const { return std::find(rw.begin(), rw.end(), n) != rw.end(); }

bool ReplicaSet::ValidName(const std::string& n) {
  if (n.empty() || n.size() > kMaxNameBytes || n == "." || n == "..") return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

std::string ReplicaSet::Invalid() const {
  if (epoch == 0) return "replica set epoch must be positive";
  if (generation == 0) return "replica set generation must be positive";
  if (members.empty() || members.size() > kMaxMembers)
    return "replica set must have 1.." + std::to_string(kMaxMembers) + " members";
  if (rw.size() > members.size()) return "replica set lists more RW replicas than members";
  std::set<std::string> seen;
  for (const std::string& m : members) {
    if (!ValidName(m)) return "replica set member name is not [A-Za-z0-9._-]{1,63}";
    if (!seen.insert(m).second) return "replica set lists member " + m + " twice";
  }
  std::set<std::string> seen_rw;
  for (const std::string& m : rw) {
    if (!seen.count(m)) return "replica set RW replica " + m.substr(0, kMaxNameBytes) + " is not a member";
    if (!seen_rw.insert(m).second) return "replica set lists RW replica " + m + " twice";
  }
  return "";
}

bool HasMajority(const std::vector<std::string>& members, const std::set<std::string>& answered) {
  size_t n = 0;
  for (const std::string& m : members) n += answered.count(m);
  return n * 2 > members.size();
}

}  // namespace mooring
