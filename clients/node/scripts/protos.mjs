// Copies the .proto files the client loads from the repository's proto/ into the package (proto/, shipped with it and
// read at run time), then generates the TypeScript types of their messages and services into src/generated/ with
// @grpc/proto-loader's generator, so the compiler checks every request and answer against the protos as they are.
//
// Only the files the two services need are copied: sluice/v1/sluice.proto, Envoy's rls.proto, and what they import,
// followed import by import. google/protobuf/* is left out: proto-loader carries the well-known types itself.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const source = resolve(process.env.SLUICE_PROTO_DIR ?? join(here, '..', '..', 'proto'));
const target = join(here, 'proto');
const generated = join(here, 'src', 'generated');
const ENTRIES = ['sluice/v1/sluice.proto', 'envoy/service/ratelimit/v3/rls.proto'];

if (!existsSync(join(source, ENTRIES[0]))) {
  console.error(`protos: ${source} holds no ${ENTRIES[0]}; set SLUICE_PROTO_DIR to the repository's proto/ directory`);
  process.exit(1);
}

rmSync(target, { recursive: true, force: true });
const pending = [...ENTRIES];
const copied = new Set();
while (pending.length > 0) {
  const file = pending.pop();
  if (copied.has(file) || file.startsWith('google/protobuf/')) continue;
  const from = join(source, file);
  if (!existsSync(from)) {
    console.error(`protos: '${file}' is imported but not found under ${source}`);
    process.exit(1);
  }
  mkdirSync(dirname(join(target, file)), { recursive: true });
  copyFileSync(from, join(target, file));
  copied.add(file);
  for (const [, imported] of readFileSync(from, 'utf8').matchAll(/^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;/gm)) {
    pending.push(imported);
  }
}

rmSync(generated, { recursive: true, force: true });
const require = createRequire(import.meta.url);
const generator = join(dirname(require.resolve('@grpc/proto-loader/package.json')), 'build', 'bin', 'proto-loader-gen-types.js');
// The same options as the loader's at run time (src/proto.ts): field names as in the protos, 64-bit integers as
// strings (exact), enums as their names, defaults filled in, oneofs named.
execFileSync(
  process.execPath,
  [
    generator,
    '--keepCase', '--longs=String', '--enums=String', '--defaults', '--oneofs', '--includeComments',
    '--grpcLib=@grpc/grpc-js', '--importFileExtension=.js',
    '-I', 'proto', '-O', 'src/generated', ...ENTRIES,
  ],
  { cwd: here, stdio: 'inherit' },
);
console.log(`protos: ${copied.size} files copied into proto/, their types generated into src/generated/`);
