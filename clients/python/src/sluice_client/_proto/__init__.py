"""Stubs generated from proto/sluice/v1/sluice.proto by `generate.sh`; do not edit them by hand.

The Envoy messages they import (`envoy.service.ratelimit.v3`, `envoy.extensions.common.ratelimit.v3`) are
xds-protos' modules, so the package shares Envoy's message classes with every other Envoy-API client in the process.
"""
