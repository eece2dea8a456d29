#!/usr/bin/env bash
# Runs every check sluice has, on a fresh machine as on a developer's. Installs what is missing: redis-server and
# redis-cli, openssl, promtool and kubectl, Node and npm, Chromium and its driver from Debian; rustfmt and clippy; the Python test dependencies
# into .venv; the Node examples' and the TypeScript client's npm packages. Then runs the format check, clippy with warnings as errors, the API docs
# with broken links as errors, the Rust tests, and the Python tests (interop from Envoy's official stubs, a real Envoy
# in front of sluice, and every client example run against a real sluice), and the TypeScript client's tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# A one-off run (CI's fresh clone) gains nothing from incremental caches but their disk space.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v openssl >/dev/null || missing+=(openssl)
command -v promtool >/dev/null || missing+=(prometheus)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
# The browser tests of the dashboard and the simulator's report: headless Chromium through its WebDriver.
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
# mdBook builds the docs; cached in ~/.cargo/bin once installed (a few minutes the first time).
command -v mdbook >/dev/null || cargo install mdbook --locked --no-default-features --quiet

# The Python dependencies are reinstalled only when requirements.txt changes.
requirements=tests/python/requirements.txt
stamp=.venv/.requirements.sha256
if [ ! -x .venv/bin/python ] || ! sha256sum --status -c "$stamp" 2>/dev/null; then
  echo "== installing Python test dependencies into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r "$requirements"
  # xds-protos ships its own, older copy of the opentelemetry/proto modules in the same package directory; whichever
  # installs last wins. The OTLP test needs opentelemetry-proto's, so install it again, last.
  .venv/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$(grep '^opentelemetry-proto' "$requirements")"
  sha256sum "$requirements" >"$stamp"
fi
# The Python client package (clients/python), reinstalled on every run so its tests see the code as it is: its
# dependencies are in requirements.txt, and building it takes a few seconds.
.venv/bin/pip install -q --disable-pip-version-check --no-deps ./clients/python

# The Node examples' packages (examples/node), installed when missing; no lock file is written into the tree.
if [ ! -d examples/node/node_modules/@grpc/grpc-js ] || [ ! -d examples/node/node_modules/@grpc/proto-loader ]; then
  echo "== installing the Node examples' packages"
  (cd examples/node && npm install --no-audit --no-fund --no-package-lock --silent)
fi
# The TypeScript client's packages (clients/node: grpc-js, proto-loader, TypeScript), installed when missing.
if [ ! -d clients/node/node_modules/@grpc/grpc-js ] || [ ! -d clients/node/node_modules/@grpc/proto-loader ] \
  || [ ! -x clients/node/node_modules/.bin/tsc ]; then
  echo "== installing the TypeScript client's packages"
  (cd clients/node && npm install --no-audit --no-fund --no-package-lock --silent)
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo doc (broken links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked --quiet
echo "== docs: mdbook build, then every link and anchor checked"
mdbook build docs >/dev/null
python3 docs/check_links.py docs/book
echo "== cargo test"
cargo test --workspace --locked
echo "== benches, smoke mode (each criterion benchmark once, the footprint on a few keys)"
cargo test --workspace --benches --locked
echo "== python tests"
cargo build --locked --bin sluice
SLUICE_BIN="$PWD/target/debug/sluice" .venv/bin/python -m pytest tests/python -q
echo "== TypeScript client: build (protos copied, types generated, tsc --strict), then its tests against sluice"
export SLUICE_BIN="$PWD/target/debug/sluice"
(cd clients/node && npm run --silent build && npm test --silent)
