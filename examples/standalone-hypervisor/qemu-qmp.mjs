// QMP, QEMU's control protocol, over a unix socket: commands answered in order, events
// handed to listeners. The QEMU process itself is started by a host agent
// (host-agent.mjs), so this class only talks to it.
import { createConnection } from 'node:net';

export class Qmp {
  #sock = null;
  #buf = '';
  #waiters = [];
  #listeners = new Set();

  /** `exited` resolves when the QEMU process is gone (its host agent says so). */
  constructor(path, exited) {
    this.path = path;
    this.exited = exited;
    this.gone = false;
    void exited.then(() => {
      this.gone = true;
      for (const w of this.#waiters.splice(0)) w({ error: { desc: 'QEMU exited' } });
    });
  }

  /** Connects once QEMU has created its socket, and negotiates capabilities. */
  async connect(timeoutMs = 30_000) {
    const deadline = Date.now() + timeoutMs;
    while (!this.#sock) {
      try {
        const sock = createConnection(this.path);
        await new Promise((resolve, reject) => sock.once('connect', resolve).once('error', reject));
        sock.setEncoding('utf8').on('data', (d) => this.#onData(d));
        sock.on('error', () => undefined);
        const greeting = new Promise((r) => this.#waiters.push(r));
        this.#sock = sock;
        await greeting;
        await this.execute('qmp_capabilities');
      } catch (err) {
        if (this.gone) throw new Error(`QEMU exited before its QMP socket ${this.path} answered`);
        if (Date.now() > deadline) throw new Error(`QMP at ${this.path} did not answer: ${err.message}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  #onData(d) {
    this.#buf += d;
    for (let nl = this.#buf.indexOf('\n'); nl >= 0; nl = this.#buf.indexOf('\n')) {
      const msg = JSON.parse(this.#buf.slice(0, nl));
      this.#buf = this.#buf.slice(nl + 1);
      if (msg.event) for (const l of this.#listeners) l(msg);
      else this.#waiters.shift()?.(msg);
    }
  }

  async execute(command, args) {
    if (this.gone) throw new Error(`QMP ${command}: QEMU exited`);
    const reply = new Promise((r) => this.#waiters.push(r));
    this.#sock.write(`${JSON.stringify({ execute: command, ...(args ? { arguments: args } : {}) })}\n`);
    const msg = await reply;
    if (msg.error) throw new Error(`QMP ${command}: ${msg.error.desc}`);
    return msg.return;
  }

  /** The next MIGRATION event whose status is one of `statuses`. */
  migrationStatus(statuses, timeoutMs = 120_000) {
    return new Promise((resolve, reject) => {
      const stop = () => {
        clearTimeout(timer);
        this.#listeners.delete(listener);
      };
      const listener = (e) => {
        if (e.event === 'MIGRATION' && statuses.includes(e.data.status)) {
          stop();
          resolve(e.data.status);
        }
      };
      const timer = setTimeout(() => {
        stop();
        reject(new Error(`no MIGRATION event in ${statuses.join('/')} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#listeners.add(listener);
    });
  }

  /** Asks QEMU to quit and waits (bounded) until it has; false if it did not. */
  async quit(timeoutMs = 10_000) {
    if (!this.gone) await this.execute('quit').catch(() => undefined);
    const quit = await Promise.race([this.exited.then(() => true), new Promise((r) => setTimeout(() => r(false), timeoutMs))]);
    this.close();
    return quit;
  }

  close() {
    this.#sock?.destroy();
  }
}
