/**
 * A description of the machine and software a run measured, for the report.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';

export interface MachineInfo {
  cpuModel: string;
  cores: number;
  memoryGiB: number;
  kernel: string;
  distro: string;
  /** Filesystem of the scratch directory, e.g. 'ext4 on /dev/vda (rw,relatime)'. */
  filesystem: string;
  fio: string;
  qemuNbd: string;
  node: string;
  mooring: string;
}

function firstLine(command: string, args: string[]): string {
  try {
    return execFileSync(command, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 10_000 })
      .split('\n')[0]!
      .trim();
  } catch {
    return 'not available';
  }
}

function cpuModel(): string {
  try {
    const m = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    if (m) return m[1]!.trim();
  } catch {
    // Fall through to what Node reports.
  }
  return os.cpus()[0]?.model ?? 'unknown';
}

function distro(): string {
  try {
    const m = /^PRETTY_NAME="?([^"\n]+)"?$/m.exec(readFileSync('/etc/os-release', 'utf8'));
    if (m) return m[1]!;
  } catch {
    // Not every system has it.
  }
  return 'unknown';
}

/** Collects the machine description; `scratchDir` names the filesystem being measured. */
export function describeMachine(scratchDir: string, mooringVersion: string): MachineInfo {
  const fs = firstLine('findmnt', ['-n', '-o', 'FSTYPE,SOURCE,OPTIONS', '--target', scratchDir]);
  const [fsType, fsSource, fsOptions] = fs.split(/\s+/);
  return {
    cpuModel: cpuModel(),
    cores: os.cpus().length,
    memoryGiB: Math.round((os.totalmem() / 1024 ** 3) * 10) / 10,
    kernel: `${os.type()} ${os.release()} ${os.arch()}`,
    distro: distro(),
    filesystem: fsSource ? `${fsType} on ${fsSource} (${fsOptions ?? ''})` : firstLine('stat', ['-f', '-c', '%T', scratchDir]),
    fio: firstLine('fio', ['--version']),
    qemuNbd: firstLine('qemu-nbd', ['--version']),
    node: process.version,
    mooring: mooringVersion,
  };
}
