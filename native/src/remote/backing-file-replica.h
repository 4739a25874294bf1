// A backing image file served over the replica protocol (HELLO with rp::kFlagBackingFile):
// a data engine pulls another's ready backing image file through the same authenticated
// (cluster secret, mutual TLS) connection machinery its engines use for replicas, instead
// of a gRPC stream relayed through JavaScript (docs/backing-images.md, "Delivery").
//
// The file looks like a read-only replica of the file's size: Read preads it; every other
// call is refused (EROFS / kUnsupported), so a client that sends anything but READ and PING
// gets an error reply, never a change on disk.
#pragma once

#include <memory>
#include <string>

#include "block/replica-backend.h"
#include "util/status.h"

namespace mooring {

// Opens <root>/<key>/image read-only. kInvalidArgument: `key` is not a backing file key, or
// the file resolves outside root (a symlink); kNotFound: no such ready file (a file still
// being received is image.part, never served); else the errno of realpath/open.
Status OpenBackingFileReplica(const std::string& root, const std::string& key, std::shared_ptr<ReplicaBackend>* out);

}  // namespace mooring
