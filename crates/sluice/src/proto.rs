//! The generated protobuf types and gRPC services: Envoy's rate limit and rate limit quota APIs, `sluice.v1`, and
//! what the xDS client speaks (Envoy's aggregated discovery service, the reference's `RateLimitConfig`,
//! `google.rpc.Status`), in modules that mirror their packages.

#![allow(clippy::all, missing_docs)]

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            include!(concat!(env!("OUT_DIR"), "/envoy.r#type.v3.rs"));
        }
    }
}

pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

pub mod sluice {
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}

/// Every compiled `.proto` file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
