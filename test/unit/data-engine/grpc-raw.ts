// A raw unary call to the data engine's gRPC service with the bytes and metadata a test
// chooses, through grpc-js's generic client: what a hostile or broken client would send.
import { Client, Metadata, credentials, type ServiceError } from '@grpc/grpc-js';

/** The service's path prefix for raw calls. */
export const SERVICE = '/mooring.dataengine.v1.DataEngine';

/** The reply's bytes, or the error the call ended with. */
export function rawCall(target: string, method: string, body: Buffer = Buffer.alloc(0), md: Metadata = new Metadata()): Promise<ServiceError | Buffer> {
  const client = new Client(target, credentials.createInsecure(), { 'grpc.max_send_message_length': 64 * 1024 * 1024 });
  return new Promise((res) => {
    client.makeUnaryRequest(`${SERVICE}/${method}`, (b: Buffer) => b, (b: Buffer) => b, body, md, { deadline: Date.now() + 10_000 }, (err, reply) => {
      client.close();
      res(err ?? reply!);
    });
  });
}
