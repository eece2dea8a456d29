//! The dashboard, `/ui` on the admin listener: read-only, behind `--admin-token` when the server has one (as
//! `Authorization: Bearer <token>` or `?token=`, on the page, its assets and its data alike).
//!
//! The page (`ui/page/`) and its charting library (uPlot, vendored in `ui/vendor/`) are embedded in the binary: it
//! works offline. It draws a row per rule of a domain, allowed and denied per second, from compact JSON it asks for
//! every two seconds, only for the seconds after those it has:
//!
//! - `/ui/api/series?domain=D&range=S&since=T`: per rule, allowed and denied per second (and the cost reports, which
//!   are no decisions, apart), arrays aligned on epoch seconds, summed across the instances on one store, with the
//!   instances seen (each adds a heartbeat to the per-second outcomes);
//! - `/ui/api/overview?domain=D`: the rules in force (every limit with its own name), the lists, the top offenders of
//!   the last minute, RLQS in words (what this instance's streams were last told, each Envoy's share of a bucket, and
//!   its RLQS metrics), the cost-budget totals, and health: the store, the breakers, the instances;
//! - `/ui/api/domains`: the domains.
//!
//! A missing domain is 400, an unknown one 404, a bad `range` or `since` 400 naming it. Without the token every `/ui`
//! path is 401, one that does not exist included (404 with it).
//!
//! Its parts: `routes` (the handlers: token, parameters, reads), `data` (the JSON shaping, pure and tested), `assets`
//! (the embedded page, script, style and uPlot, served with ETags).

mod assets;
mod data;
mod routes;

pub use routes::router;
