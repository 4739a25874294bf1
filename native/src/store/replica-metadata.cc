#include "store/replica-metadata.h"

#include <algorithm>
#include <cstdio>
#include <string_view>
#include <limits>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "store/metadata-journal.h"
#include "util/fs-util.h"

namespace mooring {

namespace {

using Json = nlohmann::json;
// Written in a fixed, human-friendly key order.
using OJson = nlohmann::ordered_json;

Status Corrupt(const std::string& msg) {
  return Status::Error(Code::kCorrupt, "replica metadata: " + msg);
}

// Typed field readers: a missing field or a wrong type is a kCorrupt naming the field.
Status GetU64(const Json& obj, const char* key, const std::string& where, uint64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(where + "missing field '" + key + "'");
  if (!it->is_number_unsigned())
    return Corrupt(where + "field '" + key + "' must be a non-negative integer");
  *out = it->get<uint64_t>();
  return Status::Ok();
}

Status GetI64(const Json& obj, const char* key, const std::string& where, int64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(where + "missing field '" + key + "'");
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return Corrupt(where + "field '" + key + "' is out of range");
    *out = static_cast<int64_t>(v);
    return Status::Ok();
  }
  if (!it->is_number_integer()) return Corrupt(where + "field '" + key + "' must be an integer");
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status GetBool(const Json& obj, const char* key, const std::string& where, bool* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(where + "missing field '" + key + "'");
  if (!it->is_boolean()) return Corrupt(where + "field '" + key + "' must be a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

Status GetString(const Json& obj, const char* key, const std::string& where, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(where + "missing field '" + key + "'");
  if (!it->is_string()) return Corrupt(where + "field '" + key + "' must be a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

#define RETURN_IF_ERROR(expr)      \
  do {                             \
    Status _s = (expr);            \
    if (!_s.ok()) return _s;       \
  } while (0)

Status ParseLayer(const Json& j, size_t index, LayerRecord* rec) {
  const std::string where = "layers[" + std::to_string(index) + "]: ";
  if (!j.is_object()) return Corrupt(where + "must be an object");
  RETURN_IF_ERROR(GetString(j, "id", where, &rec->id));
  if (!ReplicaMetadata::ParseLayerId(rec->id, &rec->num))
    return Corrupt(where + "invalid layer id '" + rec->id.substr(0, 64) + "'");
  RETURN_IF_ERROR(GetString(j, "file", where, &rec->file));
  RETURN_IF_ERROR(GetString(j, "parent", where, &rec->parent));
  RETURN_IF_ERROR(GetString(j, "name", where, &rec->name));
  RETURN_IF_ERROR(GetBool(j, "removed", where, &rec->removed));
  RETURN_IF_ERROR(GetBool(j, "userCreated", where, &rec->user_created));
  RETURN_IF_ERROR(GetI64(j, "createdMs", where, &rec->created_ms));
  RETURN_IF_ERROR(GetU64(j, "sizeBytes", where, &rec->size_bytes));
  auto labels = j.find("labels");
  if (labels == j.end()) return Corrupt(where + "missing field 'labels'");
  if (!labels->is_object()) return Corrupt(where + "field 'labels' must be an object");
  for (auto it = labels->begin(); it != labels->end(); ++it) {
    if (!it.value().is_string())
      return Corrupt(where + "label '" + it.key().substr(0, 64) + "' must be a string");
    rec->labels[it.key()] = it.value().get<std::string>();
  }
  return Status::Ok();
}

Status ParseBackingImage(const Json& j, BackingImageRef* out) {
  const std::string where = "backingImage: ";
  if (!j.is_object()) return Corrupt(where + "must be an object");
  RETURN_IF_ERROR(GetString(j, "dir", where, &out->dir));
  RETURN_IF_ERROR(GetString(j, "format", where, &out->format));
  RETURN_IF_ERROR(GetU64(j, "virtualSizeBytes", where, &out->virtual_size_bytes));
  return Status::Ok();
}

Status GetNames(const Json& obj, const char* key, const std::string& where, std::vector<std::string>* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Corrupt(where + "missing field '" + key + "'");
  if (!it->is_array()) return Corrupt(where + "field '" + key + "' must be an array");
  if (it->size() > ReplicaSet::kMaxMembers) return Corrupt(where + "field '" + key + "' lists too many names");
  out->clear();
  for (const Json& v : *it) {
    if (!v.is_string()) return Corrupt(where + "field '" + key + "' must hold strings");
    out->push_back(v.get<std::string>());
  }
  return Status::Ok();
}

Status ParseReplicaSet(const Json& j, ReplicaSet* out) {
  const std::string where = "replicaSet: ";
  if (!j.is_object()) return Corrupt(where + "must be an object");
  RETURN_IF_ERROR(GetU64(j, "epoch", where, &out->epoch));
  RETURN_IF_ERROR(GetU64(j, "generation", where, &out->generation));
  RETURN_IF_ERROR(GetNames(j, "members", where, &out->members));
  RETURN_IF_ERROR(GetNames(j, "rw", where, &out->rw));
  const std::string bad = out->Invalid();
  if (!bad.empty()) return Corrupt(where + bad);
  return Status::Ok();
}

}  // namespace

Status ReplicaMetadata::ValidateBackingImage(const BackingImageRef& ref, uint64_t replica_size_bytes, Code code) {
  const std::string where = "backing image: ";
  // The directory name becomes a path component: only a plain name can never leave
  // DISK/backing-images.
  bool name_ok = !ref.dir.empty() && ref.dir.size() <= kMaxBackingImageDirLength && ref.dir != "." && ref.dir != "..";
  for (char c : ref.dir) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      name_ok = false;
  }
  if (!name_ok)
    return Status::Error(code, where + "dir '" + ref.dir.substr(0, 128) + "' must be 1.." +
                                   std::to_string(kMaxBackingImageDirLength) +
                                   " characters of [A-Za-z0-9._-], not '.' or '..'");
  if (ref.format != "raw" && ref.format != "qcow2")
    return Status::Error(code, where + "format '" + ref.format.substr(0, 32) + "' is not 'raw' or 'qcow2'");
  if (ref.virtual_size_bytes == 0 || ref.virtual_size_bytes % 512 != 0 ||
      ref.virtual_size_bytes > replica_size_bytes)
    return Status::Error(code, where + "virtualSizeBytes " + std::to_string(ref.virtual_size_bytes) +
                                   " must be a positive multiple of 512 at most the replica's size " +
                                   std::to_string(replica_size_bytes));
  return Status::Ok();
}

std::string ReplicaMetadata::BackingImagePath(const std::string& replica_dir, const std::string& image_dir) {
  // DISK is two levels above the replica directory. Lexically when the path has those
  // levels (so messages name a plain path), through ".." otherwise.
  std::string disk = replica_dir;
  for (int up = 0; up < 2; ++up) {
    while (disk.size() > 1 && disk.back() == '/') disk.pop_back();
    const size_t slash = disk.rfind('/');
    const std::string last = slash == std::string::npos ? disk : disk.substr(slash + 1);
    if (slash == std::string::npos || last == "." || last == ".." || last.empty()) {
      disk = fsutil::JoinPath(disk, "..");
    } else {
      disk = slash == 0 ? "/" : disk.substr(0, slash);
    }
  }
  return fsutil::JoinPath(fsutil::JoinPath(fsutil::JoinPath(disk, "backing-images"), image_dir), "image");
}

std::string ReplicaMetadata::LayerId(uint32_t num) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "L%06u", num);
  return buf;
}

bool ReplicaMetadata::ParseLayerId(const std::string& id, uint32_t* num) {
  if (id.size() < 7 || id.size() > 11 || id[0] != 'L') return false;
  uint64_t v = 0;
  for (size_t i = 1; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(id[i] - '0');
  }
  if (v == 0 || v >= std::numeric_limits<uint32_t>::max()) return false;
  // Canonical form only ("L%06u"), so that two spellings cannot name one layer: exactly six
  // digits, or more without a leading zero.
  if (id.size() > 7 && id[1] == '0') return false;
  *num = static_cast<uint32_t>(v);
  return true;
}

bool ReplicaMetadata::ValidSnapshotName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status ReplicaMetadata::ValidateLabels(const Labels& labels, Code code) {
  if (labels.size() > kMaxLabels)
    return Status::Error(code, "too many labels (" + std::to_string(labels.size()) + ", limit " +
                                   std::to_string(kMaxLabels) + ")");
  for (const auto& kv : labels) {
    if (kv.first.empty() || kv.first.size() > kMaxLabelKeyLength)
      return Status::Error(code, "label keys must be 1.." + std::to_string(kMaxLabelKeyLength) +
                                     " bytes");
    if (kv.second.size() > kMaxLabelValueLength)
      return Status::Error(code, "label '" + kv.first.substr(0, 64) + "' value longer than " +
                                     std::to_string(kMaxLabelValueLength) + " bytes");
  }
  return Status::Ok();
}

namespace {

// The top-level fields other than format, journal and layers, shared by the whole document
// and journal records (which carry all of them, so an optional field absent from a record
// is reset). Defaults first: a record replaces every one of them.
Status ParseTop(const Json& j, ReplicaMetadata* m) {
  uint64_t v = 0;
  RETURN_IF_ERROR(GetU64(j, "sizeBytes", "", &m->size_bytes));
  RETURN_IF_ERROR(GetU64(j, "blockSize", "", &v));
  if (v != 4096) return Corrupt("unsupported blockSize " + std::to_string(v));
  m->block_size = 4096;
  RETURN_IF_ERROR(GetU64(j, "epoch", "", &m->epoch));
  RETURN_IF_ERROR(GetBool(j, "clean", "", &m->clean));
  m->rebuilding = false;
  if (j.contains("rebuilding")) RETURN_IF_ERROR(GetBool(j, "rebuilding", "", &m->rebuilding));
  m->backing_image.reset();
  if (j.contains("backingImage")) {
    BackingImageRef ref;
    RETURN_IF_ERROR(ParseBackingImage(j["backingImage"], &ref));
    m->backing_image = std::move(ref);
  }
  m->replica_set = ReplicaSet{};
  if (j.contains("replicaSet")) RETURN_IF_ERROR(ParseReplicaSet(j["replicaSet"], &m->replica_set));
  m->last_rw = ReplicaSetId{};
  if (j.contains("lastRw")) {
    const Json& lr = j["lastRw"];
    if (!lr.is_object()) return Corrupt("lastRw: must be an object");
    RETURN_IF_ERROR(GetU64(lr, "epoch", "lastRw: ", &m->last_rw.epoch));
    RETURN_IF_ERROR(GetU64(lr, "generation", "lastRw: ", &m->last_rw.generation));
    if (m->last_rw.epoch == 0 || m->last_rw.generation == 0) return Corrupt("lastRw: epoch and generation must be positive");
  }
  RETURN_IF_ERROR(GetString(j, "head", "", &m->head));
  RETURN_IF_ERROR(GetU64(j, "nextLayerId", "", &v));
  if (v == 0 || v >= std::numeric_limits<uint32_t>::max())
    return Corrupt("nextLayerId out of range");
  m->next_layer_num = static_cast<uint32_t>(v);
  return Status::Ok();
}

const Json* GetLayerArray(const Json& j, const char* key, Status* s) {
  auto it = j.find(key);
  if (it == j.end()) {
    *s = Corrupt(std::string("missing field '") + key + "'");
    return nullptr;
  }
  if (!it->is_array()) {
    *s = Corrupt(std::string("field '") + key + "' must be an array");
    return nullptr;
  }
  if (it->size() > ReplicaMetadata::kMaxLayers) {
    *s = Corrupt(std::string("too many entries in '") + key + "' (" + std::to_string(it->size()) + ")");
    return nullptr;
  }
  return &*it;
}

// Where the record with this number is or would go in layers (ordered by num).
template <typename Layers>
auto LowerBound(Layers* layers, uint32_t num) {
  return std::lower_bound(layers->begin(), layers->end(), num,
                          [](const LayerRecord& l, uint32_t n) { return l.num < n; });
}

}  // namespace

Status ReplicaMetadata::Parse(const std::string& text, ReplicaMetadata* out) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt("not valid JSON");
  if (!j.is_object()) return Corrupt("top level must be an object");
  ReplicaMetadata m;
  uint64_t v = 0;
  RETURN_IF_ERROR(GetU64(j, "format", "", &v));
  if (v != kFormatVersion && v != kJournalFormatVersion)
    return Corrupt("unknown format version " + std::to_string(v) + " (this build reads " +
                   std::to_string(kFormatVersion) + " and " + std::to_string(kJournalFormatVersion) + ")");
  m.format = static_cast<int>(v);
  if (m.format == kJournalFormatVersion) {
    RETURN_IF_ERROR(GetU64(j, "journal", "", &m.journal));
    if (m.journal == 0 || m.journal >= (1ull << 53)) return Corrupt("journal generation out of range");
  } else if (j.contains("journal")) {
    return Corrupt("format 1 has no journal");
  }
  RETURN_IF_ERROR(ParseTop(j, &m));
  Status s;
  const Json* layers = GetLayerArray(j, "layers", &s);
  if (!layers) return s;
  m.layers.reserve(layers->size());
  for (size_t i = 0; i < layers->size(); ++i) {
    LayerRecord rec;
    RETURN_IF_ERROR(ParseLayer((*layers)[i], i, &rec));
    m.layers.push_back(std::move(rec));
  }
  RETURN_IF_ERROR(m.Validate());
  *out = std::move(m);
  return Status::Ok();
}

Status ReplicaMetadata::ApplyChange(const std::string& payload) {
  Json j = Json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt("journal record: not valid JSON");
  if (!j.is_object()) return Corrupt("journal record: must be an object");
  // In place (a log may hold hundreds of records over thousands of layers): on an error
  // *this is half-changed, and the caller discards it with the kCorrupt.
  ReplicaMetadata& m = *this;
  RETURN_IF_ERROR(ParseTop(j, &m));
  Status s;
  const Json* changed = GetLayerArray(j, "layers", &s);
  if (!changed) return s;
  const Json* dropped = GetLayerArray(j, "drop", &s);
  if (!dropped) return s;
  for (size_t i = 0; i < dropped->size(); ++i) {
    const Json& d = (*dropped)[i];
    uint32_t num = 0;
    if (!d.is_string() || !ParseLayerId(d.get<std::string>(), &num))
      return Corrupt("journal record: drop[" + std::to_string(i) + "] is not a layer id");
    auto it = LowerBound(&m.layers, num);
    if (it == m.layers.end() || it->num != num)
      return Corrupt("journal record: drops layer " + d.get<std::string>() + ", which does not exist");
    m.layers.erase(it);
  }
  for (size_t i = 0; i < changed->size(); ++i) {
    LayerRecord rec;
    RETURN_IF_ERROR(ParseLayer((*changed)[i], i, &rec));
    auto it = LowerBound(&m.layers, rec.num);
    if (it != m.layers.end() && it->num == rec.num) {
      *it = std::move(rec);
    } else {
      if (m.layers.size() >= kMaxLayers) return Corrupt("journal record: too many layers");
      m.layers.insert(it, std::move(rec));
    }
  }
  return Status::Ok();
}

Status ReplicaMetadata::Validate() const {
  if (size_bytes == 0 || size_bytes % 4096 != 0 || size_bytes > kMaxSizeBytes)
    return Corrupt("sizeBytes " + std::to_string(size_bytes) +
                   " is not a positive multiple of 4096 within limits");
  if (backing_image) {
    Status bs = ValidateBackingImage(*backing_image, size_bytes, Code::kCorrupt);
    if (!bs.ok()) return Corrupt(bs.message);
  }
  if (!replica_set.empty()) {
    const std::string bad = replica_set.Invalid();
    if (!bad.empty()) return Corrupt("replicaSet: " + bad);
    if (replica_set.epoch > epoch)
      return Corrupt("replicaSet: epoch " + std::to_string(replica_set.epoch) + " is above the replica's epoch " +
                     std::to_string(epoch));
  }
  if (!last_rw.empty() && (replica_set.empty() || ReplicaSetId::Of(replica_set) < last_rw))
    return Corrupt("lastRw: " + std::to_string(last_rw.epoch) + "/" + std::to_string(last_rw.generation) +
                   " is above the stored replica set");
  if (layers.empty()) return Corrupt("no layers");
  if (!Find(head)) return Corrupt("head '" + head.substr(0, 64) + "' is not a layer");
  // Runs at every commit: no allocation per layer unless something is wrong.
  std::unordered_set<std::string_view> live_names;
  live_names.reserve(layers.size());
  uint32_t prev_num = 0;
  for (const LayerRecord& l : layers) {
    uint32_t num = 0;
    if (!ParseLayerId(l.id, &num) || num != l.num) return Corrupt("layer " + l.id.substr(0, 64) + ": invalid id");
    const std::string where = "layer " + l.id + ": ";
    if (num <= prev_num) return Corrupt(where + "layers are not in ascending id order");
    prev_num = num;
    if (num >= next_layer_num) return Corrupt(where + "id is not below nextLayerId");
    // Only the canonical name is accepted, so no path component ever reaches open().
    if (l.file.size() != l.id.size() + 10 || l.file.compare(0, 6, "layer-") != 0 ||
        l.file.compare(6, l.id.size(), l.id) != 0 || l.file.compare(6 + l.id.size(), 4, ".img") != 0)
      return Corrupt(where + "file name '" + l.file.substr(0, 128) + "' is not '" + LayerFile(l.id) + "'");
    if (l.size_bytes != size_bytes)
      return Corrupt(where + "sizeBytes " + std::to_string(l.size_bytes) +
                     " differs from the replica's " + std::to_string(size_bytes));
    if (!l.labels.empty()) {
      Status ls = ValidateLabels(l.labels, Code::kCorrupt);
      if (!ls.ok()) return Corrupt(where + ls.message);
    }
    if (l.id == head) {
      if (!l.name.empty()) return Corrupt(where + "the head has a snapshot name");
      if (l.removed) return Corrupt(where + "the head is marked removed");
    } else {
      if (!ValidSnapshotName(l.name)) return Corrupt(where + "invalid snapshot name");
      if (!l.removed && !live_names.insert(l.name).second)
        return Corrupt(where + "duplicate snapshot name '" + l.name + "'");
    }
  }
  // Layers are in ascending id order (checked above): FindOrdered may be used.
  for (const LayerRecord& l : layers) {
    if (l.parent.empty()) continue;
    const LayerRecord* p = FindOrdered(l.parent);
    if (!p) return Corrupt("layer " + l.id + ": parent '" + l.parent.substr(0, 64) + "' does not exist");
    if (l.parent == head) return Corrupt("layer " + l.id + ": its parent is the head");
    // Writers only ever give a layer a parent created before it (smaller id), which also
    // rules out cycles; reads and ListLayers rely on that order.
    if (p->num >= l.num)
      return Corrupt("layer " + l.id + ": parent " + l.parent +
                     " is not older than the layer (parent links form a cycle or are reordered)");
  }
  return Status::Ok();
}

namespace {

// Appends s as a JSON string exactly as OJson::dump (no ASCII escaping, invalid UTF-8
// replaced) writes it: printable ASCII without '"' and '\\' as is, anything else through dump.
void AppendJsonString(std::string* out, const std::string& s) {
  bool plain = true;
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      plain = false;
      break;
    }
  }
  if (plain) {
    out->push_back('"');
    out->append(s);
    out->push_back('"');
  } else {
    out->append(OJson(s).dump(-1, ' ', false, OJson::error_handler_t::replace));
  }
}

// The "layers" array as OJson::dump(1, ' ') writes it at the top level's first indent,
// written directly: a snapshot rewrites every layer's record, and building a JSON tree of
// 1,000 layers to print it cost more than writing and syncing the file.
void AppendLayers(std::string* out, const std::vector<LayerRecord>& layers) {
  if (layers.empty()) {
    out->append("[]");
    return;
  }
  out->append("[\n");
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerRecord& l = layers[i];
    auto key = [&](const char* k) {
      out->append("   \"");
      out->append(k);
      out->append("\": ");
    };
    auto text = [&](const char* k, const std::string& v) {
      key(k);
      AppendJsonString(out, v);
      out->append(",\n");
    };
    auto raw = [&](const char* k, const std::string& v) {
      key(k);
      out->append(v);
      out->append(",\n");
    };
    out->append("  {\n");
    text("id", l.id);
    text("file", l.file);
    text("parent", l.parent);
    text("name", l.name);
    raw("removed", l.removed ? "true" : "false");
    raw("userCreated", l.user_created ? "true" : "false");
    raw("createdMs", std::to_string(l.created_ms));
    key("labels");
    if (l.labels.empty()) {
      out->append("{}");
    } else {
      out->append("{\n");
      size_t k = 0;
      for (const auto& kv : l.labels) {
        out->append("    ");
        AppendJsonString(out, kv.first);
        out->append(": ");
        AppendJsonString(out, kv.second);
        out->append(++k < l.labels.size() ? ",\n" : "\n");
      }
      out->append("   }");
    }
    out->append(",\n");
    key("sizeBytes");
    out->append(std::to_string(l.size_bytes));
    out->append(i + 1 < layers.size() ? "\n  },\n" : "\n  }\n");
  }
  out->append(" ]");
}

}  // namespace

namespace {

// Appends the fields ParseTop reads, in the document's key order.
void AddTopFields(OJson* j, const ReplicaMetadata& m) {
  (*j)["sizeBytes"] = m.size_bytes;
  (*j)["blockSize"] = m.block_size;
  (*j)["epoch"] = m.epoch;
  (*j)["clean"] = m.clean;
  // Written only while set, so a replica that never rebuilt keeps the original key set.
  if (m.rebuilding) (*j)["rebuilding"] = true;
  // Written only when there is one, for the same reason.
  if (m.backing_image)
    (*j)["backingImage"] = OJson{{"dir", m.backing_image->dir},
                                 {"format", m.backing_image->format},
                                 {"virtualSizeBytes", m.backing_image->virtual_size_bytes}};
  // Written only once an engine stored one, for the same reason.
  if (!m.replica_set.empty())
    (*j)["replicaSet"] = OJson{{"epoch", m.replica_set.epoch},
                               {"generation", m.replica_set.generation},
                               {"members", m.replica_set.members},
                               {"rw", m.replica_set.rw}};
  if (!m.last_rw.empty()) (*j)["lastRw"] = OJson{{"epoch", m.last_rw.epoch}, {"generation", m.last_rw.generation}};
  (*j)["head"] = m.head;
  (*j)["nextLayerId"] = m.next_layer_num;
}

// j dumped with its last key "layers": [] left open; the caller appends the array and "}".
std::string DumpOpen(OJson* j) {
  // The last key: dump() ends the text with `"layers": []` + "\n}", where the array goes.
  (*j)["layers"] = OJson::array();
  // Labels are arbitrary strings: never let invalid UTF-8 throw out of dump().
  std::string text = j->dump(1, ' ', false, OJson::error_handler_t::replace);
  text.resize(text.size() - 4);  // "[]\n}"
  return text;
}

}  // namespace

std::string ReplicaMetadata::Serialize() const {
  OJson j{{"format", journal == 0 ? kFormatVersion : kJournalFormatVersion}};
  if (journal != 0) j["journal"] = journal;
  AddTopFields(&j, *this);
  std::string text = DumpOpen(&j);
  text.reserve(text.size() + layers.size() * 240);
  AppendLayers(&text, layers);
  text.append("\n}\n");
  return text;
}

std::string ReplicaMetadata::SerializeChange(const ReplicaMetadata& prev) const {
  // Both lists are ordered by num: one merge walk finds what is new, changed or gone.
  std::vector<LayerRecord> changed;
  std::vector<std::string> dropped;
  size_t a = 0, b = 0;
  while (a < prev.layers.size() || b < layers.size()) {
    if (b == layers.size() || (a < prev.layers.size() && prev.layers[a].num < layers[b].num)) {
      dropped.push_back(prev.layers[a++].id);
    } else if (a == prev.layers.size() || layers[b].num < prev.layers[a].num) {
      changed.push_back(layers[b++]);
    } else {
      if (prev.layers[a] != layers[b]) changed.push_back(layers[b]);
      ++a;
      ++b;
    }
  }
  OJson j = OJson::object();
  AddTopFields(&j, *this);
  j["drop"] = dropped;
  std::string text = DumpOpen(&j);
  AppendLayers(&text, changed);
  text.append("\n}\n");
  return text;
}

Status ReplicaMetadata::Load(const std::string& dir, ReplicaMetadata* out) {
  std::string text;
  Status s = fsutil::ReadFileLimited(fsutil::JoinPath(dir, kFileName),
                                     fsutil::kMaxMetadataFileBytes, &text);
  if (!s.ok()) {
    if (s.code == Code::kNotFound)
      return Status::Error(Code::kNotFound, "no replica at " + dir + " (" + s.message + ")", s.sys_errno);
    return s;
  }
  s = Parse(text, out);
  if (s.ok() && out->journal != 0) s = MetadataJournal::Replay(dir, out);
  if (!s.ok()) s.message = dir + ": " + s.message;
  return s;
}

Status ReplicaMetadata::Save(const std::string& dir) const {
  Status s = Validate();
  if (!s.ok()) return Status::Error(Code::kInvalidState, "refusing to write bad metadata: " + s.message);
  return fsutil::WriteFileAtomic(dir, kFileName, Serialize());
}

LayerRecord* ReplicaMetadata::Find(const std::string& id) {
  for (LayerRecord& l : layers)
    if (l.id == id) return &l;
  return nullptr;
}

const LayerRecord* ReplicaMetadata::Find(const std::string& id) const {
  for (const LayerRecord& l : layers)
    if (l.id == id) return &l;
  return nullptr;
}

const LayerRecord* ReplicaMetadata::FindOrdered(const std::string& id) const {
  uint32_t num = 0;
  if (!ParseLayerId(id, &num)) return nullptr;
  auto it = LowerBound(&layers, num);
  return it != layers.end() && it->id == id ? &*it : nullptr;
}

const LayerRecord* ReplicaMetadata::FindSnapshot(const std::string& name) const {
  for (const LayerRecord& l : layers)
    if (l.id != head && !l.removed && l.name == name) return &l;
  return nullptr;
}

std::vector<const LayerRecord*> ReplicaMetadata::Children(const std::string& id) const {
  std::vector<const LayerRecord*> out;
  for (const LayerRecord& l : layers)
    if (l.parent == id) out.push_back(&l);
  return out;
}

LayerRecord ReplicaMetadata::NewLayer(const std::string& parent, int64_t created_ms) {
  LayerRecord r;
  r.num = next_layer_num++;
  r.id = LayerId(r.num);
  r.file = LayerFile(r.id);
  r.parent = parent;
  r.user_created = true;
  r.created_ms = created_ms;
  r.size_bytes = size_bytes;
  return r;
}

}  // namespace mooring
