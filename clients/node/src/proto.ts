/**
 * The two gRPC services, loaded at run time from the .proto files shipped in the package's `proto/` directory (copied
 * from the repository's by `scripts/protos.mjs`, which also generates `generated/`, their types).
 *
 * The loader's options here are the generator's: the types in `generated/` describe exactly what the loader builds,
 * so the one cast below is the only place the compiler takes the loader's word.
 */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { fileURLToPath } from 'node:url';

import type { RateLimitServiceClient } from './generated/envoy/service/ratelimit/v3/RateLimitService.js';
import type { ProtoGrpcType as RlsTypes } from './generated/rls.js';
import type { ProtoGrpcType as SluiceTypes } from './generated/sluice.js';
import type { RateLimiterClient } from './generated/sluice/v1/RateLimiter.js';

/** The stubs of both services, on one channel. */
export interface Stubs {
  /** `sluice.v1.RateLimiter`. */
  readonly sluice: RateLimiterClient;
  /** `envoy.service.ratelimit.v3.RateLimitService`. */
  readonly envoy: RateLimitServiceClient;
}

type Services = SluiceTypes & RlsTypes;

let services: Services | undefined;

function load(): Services {
  if (services === undefined) {
    const definition = protoLoader.loadSync(['sluice/v1/sluice.proto', 'envoy/service/ratelimit/v3/rls.proto'], {
      includeDirs: [fileURLToPath(new URL('../proto/', import.meta.url))],
      keepCase: true,
      longs: String,
      enums: String,
      defaults: true,
      oneofs: true,
    });
    services = grpc.loadPackageDefinition(definition) as unknown as Services;
  }
  return services;
}

/** Both stubs over `channel`, which the caller owns. */
export function stubs(channel: grpc.Channel): Stubs {
  const s = load();
  const options = { channelOverride: channel };
  // The channel's own target and credentials are the ones used; these two arguments are not read with an override.
  const credentials = grpc.credentials.createInsecure();
  return {
    sluice: new s.sluice.v1.RateLimiter(channel.getTarget(), credentials, options),
    envoy: new s.envoy.service.ratelimit.v3.RateLimitService(channel.getTarget(), credentials, options),
  };
}
