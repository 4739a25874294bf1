// A TCP relay on loopback that a test can cut, as a partition would: while cut, nothing it
// holds is forwarded either way and new connections are accepted but get no answer (no
// reset: the client finds out by its own timeouts). heal() drops what the cut held, so the
// client reconnects, and forwards again.
import { createServer, connect, type Server, type Socket } from 'node:net';

export class TcpCut {
  #server: Server;
  #pairs = new Set<[Socket, Socket]>();
  #held = new Set<Socket>();
  #cut = false;

  private constructor(server: Server) {
    this.#server = server;
  }

  /** Listens on 127.0.0.1:`port`, relaying to 127.0.0.1:`targetPort`. */
  static async open(port: number, targetPort: number): Promise<TcpCut> {
    const server = createServer();
    const relay = new TcpCut(server);
    server.on('connection', (client) => relay.#accept(client, targetPort));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', resolve);
    });
    return relay;
  }

  get isCut(): boolean {
    return this.#cut;
  }

  #accept(client: Socket, targetPort: number): void {
    client.on('error', () => client.destroy());
    if (this.#cut) {
      this.#held.add(client);
      client.pause();
      return;
    }
    const upstream = connect(targetPort, '127.0.0.1');
    const pair: [Socket, Socket] = [client, upstream];
    this.#pairs.add(pair);
    const end = (): void => {
      this.#pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
    client.pipe(upstream);
    upstream.pipe(client);
  }

  /** Stops forwarding: what is in flight stays undelivered. */
  cut(): void {
    this.#cut = true;
    for (const [a, b] of this.#pairs) {
      a.unpipe(b);
      b.unpipe(a);
      a.pause();
      b.pause();
    }
  }

  /** Drops every connection the cut held; new ones are forwarded. */
  heal(): void {
    this.#cut = false;
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
    }
    this.#pairs.clear();
    for (const s of this.#held) s.destroy();
    this.#held.clear();
  }

  async close(): Promise<void> {
    this.heal();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
