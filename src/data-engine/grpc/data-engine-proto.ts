/**
 * The gRPC service of a data engine, as .proto text kept in code (nothing to copy at build
 * time), parsed once with protobufjs and turned into a gRPC service definition by
 * proto-loader. docs/data-engine.md shows the same text.
 *
 * Conventions: field names are snake_case here and camelCase in JavaScript; 64-bit
 * numbers arrive as JavaScript numbers (every value Mooring sends is below 2^53; a larger
 * one fails validation on the server); an empty string stands for "none" (null).
 */
import { fromJSON, type PackageDefinition } from '@grpc/proto-loader';
import protobuf from 'protobufjs';

/** Fully qualified name of the service. */
export const DATA_ENGINE_SERVICE = 'mooring.dataengine.v1.DataEngine';

/** The service definition (proto3). */
export const DATA_ENGINE_PROTO = `syntax = "proto3";

package mooring.dataengine.v1;

service DataEngine {
  rpc Info(Empty) returns (DataEngineInfo);
  rpc CreateReplica(CreateReplicaRequest) returns (HostedReplica);
  rpc DeleteReplica(ReplicaName) returns (Empty);
  // Grows a replica that no engine uses: a detached volume's (docs/data-engine.md, "Resize").
  rpc GrowReplica(GrowReplicaRequest) returns (HostedReplica);
  rpc ListReplicas(Empty) returns (ReplicaList);
  rpc StartEngine(StartEngineRequest) returns (EngineInfo);
  rpc StopEngine(VolumeName) returns (Empty);
  rpc EngineInfo(VolumeName) returns (EngineInfo);
  rpc ListEngines(Empty) returns (EngineList);
  rpc AddReplica(AddReplicaRequest) returns (RebuildResult);
  rpc RemoveReplica(RemoveReplicaRequest) returns (Empty);
  // Grows a running engine's volume: its RW replicas, then the engine and its export.
  rpc ResizeEngine(ResizeEngineRequest) returns (EngineInfo);
  // Migration hand-over (docs/data-engine.md).
  rpc DeactivateEngine(VolumeName) returns (HandOver);
  rpc ActivateEngine(ActivateEngineRequest) returns (EngineInfo);
  // Events of the engines this data engine runs, as they happen (none are replayed).
  rpc Watch(Empty) returns (stream Event);
  // Snapshots, through the volume's engine on this data engine. Export and Copy return
  // when the whole copy is done (progress: snapshot-copy-progress events).
  rpc CreateSnapshot(CreateSnapshotRequest) returns (Snapshot);
  rpc ListSnapshots(VolumeName) returns (SnapshotList);
  rpc DeleteSnapshot(SnapshotRef) returns (Empty);
  rpc RevertSnapshot(SnapshotRef) returns (Empty);
  // Stops this process and starts its successor (an upgrade, docs/upgrade.md); UNSUPPORTED
  // unless the process was started with --allow-successor-exec.
  rpc ReplaceProcess(ReplaceProcessRequest) returns (Empty);
  // Hands every engine, with its NBD clients connected, to a successor process started from
  // argv (an in-place upgrade); "in-place-handoff" in Info.features.
  rpc HandOffProcess(HandOffProcessRequest) returns (HandOffProcessReply);
  rpc ExportSnapshot(ExportSnapshotRequest) returns (SnapshotCopyResult);
  rpc CopySnapshot(CopySnapshotRequest) returns (SnapshotCopyResult);
  // Backing image files on this data engine's disk (docs/data-engine.md, "Backing image
  // files"). Download, Write and Export return when the file is ready (progress:
  // backing-image-file events). Write streams the file: the first message carries the ref
  // and options, every message at most 1 MiB of data. Read streams a ready file in 1 MiB
  // messages.
  rpc ListBackingImageFiles(Empty) returns (BackingImageFileList);
  rpc GetBackingImageFile(BackingImageFileRef) returns (BackingImageFileReply);
  rpc DownloadBackingImageFile(DownloadBackingImageFileRequest) returns (BackingImageFile);
  rpc WriteBackingImageFile(stream WriteBackingImageFileMessage) returns (BackingImageFile);
  rpc ReadBackingImageFile(ReadBackingImageFileRequest) returns (stream DataChunk);
  rpc PullBackingImageFile(PullBackingImageFileRequest) returns (BackingImageFile);
  rpc ExportSnapshotToBackingImageFile(ExportSnapshotToBackingImageFileRequest) returns (BackingImageFile);
  rpc CancelBackingImageFile(BackingImageFileRef) returns (Empty);
  rpc DeleteBackingImageFile(BackingImageFileRef) returns (Empty);
}

message Empty {}

message DataEngineInfo {
  string host_id = 1;
  string version = 2;
  string dir = 3;
  string replica_address = 4;  // "" = serves no replicas
  bool tls = 5;
  string instance_id = 6;  // "" from data engines older than the field
  repeated string features = 7;  // DATA_ENGINE_FEATURES it offers ("successor-exec", "in-place-handoff", "salvage", "backing-file-read")
  string disk_id = 8;  // the disk's identity (data-engine.json); "" from data engines older than the field
}

message ReplaceProcessRequest {
  repeated string argv = 1;  // the new version's command line, before its "data-engine" arguments
}

message HandOffEpochs {
  string volume = 1;
  uint64 epoch = 2;           // the successor's engine claims it
  uint64 rollback_epoch = 3;  // this process's engine claims it if the hand-off is rolled back
}

message HandOffProcessRequest {
  repeated string argv = 1;
  repeated HandOffEpochs epochs = 2;  // one per engine it runs
}

message HandOffProcessReply {
  bool committed = 1;         // false: rolled back, every engine serves here at its rollback_epoch
  string error_code = 2;      // why not (a MooringErrorCode)
  string error_message = 3;
  double pause_ms = 4;        // exports frozen until COMMIT
  uint32 engines = 5;
}

message HostedReplica {
  string name = 1;
  uint64 size_bytes = 2;
  uint64 epoch = 3;
  bool clean = 4;
  bool rebuilding = 5;
  uint64 allocated_bytes = 6;
  bool in_use = 7;
  ReplicaBackingImage backing_image = 8;  // unset = none
}

message ReplicaBackingImage {
  string dir = 1;     // <image name>-<image uuid>
  string format = 2;  // raw or qcow2
  uint64 virtual_size_bytes = 3;
}

message CreateReplicaRequest {
  string name = 1;
  uint64 size_bytes = 2;
  ReplicaBackingImage backing_image = 3;  // unset = none
}

message ReplicaName { string name = 1; }

message GrowReplicaRequest {
  string name = 1;
  uint64 size_bytes = 2;
}

message ReplicaList { repeated HostedReplica replicas = 1; }

message ReplicaRef {
  string id = 1;
  string host_id = 2;
  string name = 3;
  string address = 4;  // "" = null (a replica of the engine's own host)
}

message StartEngineRequest {
  string volume = 1;
  repeated ReplicaRef replicas = 2;
  string nbd = 3;            // "" = no NBD export
  uint32 io_timeout_ms = 4;  // 0 = default
  bool standby = 5;          // a migration standby: serves nothing until ActivateEngine
  // The writer epoch to claim, allocated by the caller (docs/single-writer.md): required
  // unless standby (then 0).
  uint64 epoch = 6;
  uint32 quorum_hold_ms = 7;
  bool has_quorum_hold_ms = 8;  // false = default quorum_hold_ms
  // A salvage start (docs/salvage.md). A data engine without "salvage" in Info.features
  // ignores it and starts normally, so clients send it only to one that announces it.
  bool salvage = 9;
}

message VolumeName { string volume = 1; }

message RebuildProgress {
  uint64 sent_bytes = 1;
  uint64 scanned_bytes = 2;
  uint64 total_bytes = 3;
}

message EngineReplica {
  ReplicaRef ref = 1;
  string mode = 2;  // RW, WO or ERR
  int32 last_error = 3;
  RebuildProgress rebuild = 4;  // set while it is being rebuilt
}

message NbdExport {
  string address = 1;
  string uri = 2;
}

message NbdStats {
  uint64 connections_total = 1;
  uint64 connections_open = 2;
  uint64 requests = 3;
  uint64 bytes_read = 4;
  uint64 bytes_written = 5;
  uint64 protocol_errors = 6;
}

message EngineInfo {
  string volume = 1;
  uint64 size_bytes = 2;
  uint64 epoch = 3;
  repeated EngineReplica replicas = 4;
  NbdExport nbd = 5;  // unset = not exported
  string role = 6;    // active or standby
  NbdStats nbd_stats = 7;  // unset = not exported (or an older data engine)
}

message EngineList { repeated EngineInfo engines = 1; }

message AddReplicaRequest {
  string volume = 1;
  ReplicaRef replica = 2;
}

message RemoveReplicaRequest {
  string volume = 1;
  string replica_id = 2;
  bool even_if_rw = 3;  // a RW replica too, while another is RW (older data engines ignore it and refuse)
}

message ResizeEngineRequest {
  string volume = 1;
  uint64 size_bytes = 2;
}

message HandOver {
  uint64 epoch = 1;
  repeated string rw_replica_ids = 2;
  uint64 generation = 3;  // of the last committed replica set
}

message ActivateEngineRequest {
  string volume = 1;
  HandOver hand_over = 2;
  uint64 epoch = 3;  // the epoch to claim, allocated by the caller (required)
}

message RebuildResult {
  string replica_id = 1;
  uint64 scanned_bytes = 2;
  uint64 sent_bytes = 3;
  uint64 unmapped_bytes = 4;
  uint64 duration_ms = 5;
}

message Snapshot {
  string name = 1;
  string id = 2;
  string parent = 3;  // "" = none (the first snapshot)
  uint64 created_ms = 4;
  map<string, string> labels = 5;
  uint64 size_bytes = 6;
  uint64 allocated_bytes = 7;
  bool user_created = 8;
}

message SnapshotList { repeated Snapshot snapshots = 1; }

message CreateSnapshotRequest {
  string volume = 1;
  string name = 2;
  map<string, string> labels = 3;
}

message SnapshotRef {
  string volume = 1;
  string name = 2;
}

message ExportSnapshotRequest {
  string volume = 1;
  string snapshot = 2;
  string path = 3;  // absolute, on the data engine's host
}

message CopySnapshotRequest {
  string volume = 1;
  string snapshot = 2;
  string to_volume = 3;
}

message SnapshotCopyResult {
  uint64 size_bytes = 1;
  uint64 copied_bytes = 2;
  uint64 duration_ms = 3;
}

// One DataEngineEvent; which fields are set depends on type.
message Event {
  string type = 1;
  string volume = 2;
  string replica_id = 3;
  int32 errno = 4;
  string message = 5;
  uint64 epoch = 6;
  RebuildProgress progress = 7;
  string code = 8;
  uint32 attempt = 9;
  uint64 delay_ms = 10;
  // snapshot-copy-progress
  string snapshot = 11;
  uint64 copied_bytes = 12;
  uint64 total_bytes = 13;
  // backing-image-file (used_by is not sent)
  BackingImageFile file = 14;
  // replica-set-changed (with epoch)
  uint64 generation = 15;
  repeated string rw_replica_ids = 16;
  // salvaged: replica_id, message, the source's last RW set as epoch and generation
  // (epoch 0 = none recorded), and complete
  bool complete = 17;
}

message BackingImageFileRef {
  string name = 1;
  string uuid = 2;
}

message BackingImageFile {
  string name = 1;
  string uuid = 2;
  string state = 3;  // pending, starting, in-progress, ready, failed, unknown
  uint32 progress = 4;
  string message = 5;
  uint64 size_bytes = 6;
  uint64 received_bytes = 7;
  string checksum = 8;  // SHA-512 hex, "" until ready
  string format = 9;    // raw, qcow2, "" = not known yet
  uint64 virtual_size_bytes = 10;
  repeated string used_by = 11;
}

message BackingImageFileList { repeated BackingImageFile files = 1; }

message BackingImageFileReply { BackingImageFile file = 1; }  // unset = no such file

message DownloadBackingImageFileRequest {
  BackingImageFileRef ref = 1;
  string url = 2;
  string expected_checksum = 3;  // "" = none
  uint32 start_timeout_ms = 4;   // 0 = default
  uint32 retries = 5;
  bool has_retries = 6;          // false = default retries
}

message WriteBackingImageFileMessage {
  // First message only:
  BackingImageFileRef ref = 1;
  uint64 size_bytes = 2;
  uint64 offset = 3;
  string expected_checksum = 4;
  // Every message (the first may carry none):
  bytes data = 5;
}

message ReadBackingImageFileRequest {
  BackingImageFileRef ref = 1;
  uint64 offset = 2;
}

message DataChunk { bytes data = 1; }

// The target reads the file from the source data engine itself (its gRPC
// ReadBackingImageFile, with the target's own TLS certificate and cluster secret).
message PullBackingImageFileRequest {
  BackingImageFileRef ref = 1;
  uint64 size_bytes = 2;
  uint64 offset = 3;
  string expected_checksum = 4;  // "" = none
  string source_address = 5;     // tcp:HOST:PORT or unix:PATH of the source's gRPC server
  string source_host_id = 6;
}

message ExportSnapshotToBackingImageFileRequest {
  string volume = 1;
  string snapshot = 2;
  BackingImageFileRef ref = 3;
  string expected_checksum = 4;
}
`;

/** How messages map to JavaScript objects (both ends use the same). */
export const PROTO_LOADER_OPTIONS = { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true } as const;

let cached: PackageDefinition | undefined;

/** The parsed package definition (parsed once). */
export function dataEnginePackageDefinition(): PackageDefinition {
  if (!cached) {
    const parsed = protobuf.parse(DATA_ENGINE_PROTO, { keepCase: false });
    cached = fromJSON(parsed.root.toJSON(), PROTO_LOADER_OPTIONS);
  }
  return cached;
}
