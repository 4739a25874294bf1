// A stand-in VM for the lock tests: it writes and checks a deterministic pattern on its
// disk file, one command per stdin line, answering one line each on stdout:
//   write OFFSET LENGTH SEED  -> ok        (pwrite + fdatasync)
//   check OFFSET LENGTH SEED  -> ok | bad  (the bytes equal the pattern for SEED)
//   pid                       -> its pid (the lock holder's pid, after exec)
import { openSync, readSync, writeSync, fdatasyncSync } from 'node:fs';
import { createInterface } from 'node:readline';

const fd = openSync(process.argv[2], 'r+');
const pattern = (off, len, seed) => {
  const b = Buffer.alloc(len);
  for (let i = 0; i < len; i++) b[i] = ((off + i) * 131 + seed * 7919 + ((off + i) >> 9)) & 0xff;
  return b;
};
createInterface({ input: process.stdin }).on('line', (line) => {
  const [cmd, a, b, c] = line.trim().split(/\s+/);
  const off = Number(a);
  const len = Number(b);
  const seed = Number(c);
  if (cmd === 'write') {
    writeSync(fd, pattern(off, len, seed), 0, len, off);
    fdatasyncSync(fd);
    process.stdout.write('ok\n');
  } else if (cmd === 'check') {
    const got = Buffer.alloc(len);
    readSync(fd, got, 0, len, off);
    process.stdout.write(got.equals(pattern(off, len, seed)) ? 'ok\n' : 'bad\n');
  } else if (cmd === 'pid') {
    process.stdout.write(`${process.pid}\n`);
  } else {
    process.stdout.write(`unknown ${cmd}\n`);
  }
});
