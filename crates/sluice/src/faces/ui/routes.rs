//! The dashboard's routes: each checks the admin token first, then its parameters (400 naming the one that is wrong,
//! 404 for an unknown domain), reads the limiter, and hands the shaping to [`super::data`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde_json::{Value, json};

use super::{assets, data};
use crate::breaker::State as Breaker;
use crate::faces::auth::{Refused, allowed};
use crate::faces::errors::dashboard_read_failed;
use crate::limiter::Limiter;
use crate::quota::Quotas;
use crate::store::{Span, Store};

/// How long the health check waits for the store's answer to a ping.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What the dashboard reads: the limiter, the RLQS streams' assignments, and the token it needs (if any).
struct View<S> {
    limiter: Arc<Limiter<S>>,
    quotas: Arc<Quotas<S>>,
    token: Option<Arc<str>>,
}

type Dashboard<S> = Arc<View<S>>;

/// The dashboard's routes, over `limiter` and the RLQS streams of `quotas`, behind `token` when there is one.
pub fn router<S: Store>(limiter: Arc<Limiter<S>>, quotas: Arc<Quotas<S>>, token: Option<Arc<str>>) -> Router {
    Router::new()
        .route("/ui", get(page::<S>))
        .route("/ui/assets/{name}", get(asset::<S>))
        .route("/ui/api/domains", get(domains::<S>))
        .route("/ui/api/overview", get(overview::<S>))
        .route("/ui/api/series", get(series::<S>))
        .route("/ui/", any(unknown::<S>))
        .route("/ui/{*rest}", any(unknown::<S>))
        .with_state(Arc::new(View { limiter, quotas, token }))
}

/// The domain a request names, known to the rules in force: 400 when missing, 404 when unknown.
fn domain<S: Store>(limiter: &Limiter<S>, query: &HashMap<String, String>) -> Result<String, Refused> {
    let name = query
        .get("domain")
        .filter(|d| !d.is_empty())
        .ok_or_else(|| (StatusCode::BAD_REQUEST, "domain: missing (?domain=NAME)\n".to_string()))?;
    if limiter.rules().domain(name).is_none() {
        return Err((
            StatusCode::NOT_FOUND,
            format!("domain: no domain '{name}' is configured\n"),
        ));
    }
    Ok(name.clone())
}

fn json(value: Value) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        value.to_string(),
    )
        .into_response()
}

/// Any other path under `/ui`: 401 without the token (a path is no way around it), 404 with it.
async fn unknown<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    match allowed(state.token.as_deref(), &headers, &query) {
        Ok(()) => (StatusCode::NOT_FOUND, "no such dashboard path\n").into_response(),
        Err(refused) => refused.into_response(),
    }
}

async fn page<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    match allowed(state.token.as_deref(), &headers, &query) {
        Ok(()) => assets::page(&query),
        Err(refused) => refused.into_response(),
    }
}

async fn asset<S: Store>(
    State(state): State<Dashboard<S>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    match allowed(state.token.as_deref(), &headers, &query) {
        Ok(()) => assets::asset(&name, &headers),
        Err(refused) => refused.into_response(),
    }
}

async fn domains<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Err(refused) = allowed(state.token.as_deref(), &headers, &query) {
        return refused.into_response();
    }
    let rules = state.limiter.rules();
    let mut names: Vec<&str> = rules.domains().map(|d| &*d.name).collect();
    names.sort_unstable();
    json(json!(names))
}

/// `/ui/api/series?domain=D&range=S&since=T`: per rule, allowed and denied per second ([`data::series`]).
async fn series<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let limiter = &state.limiter;
    let now = limiter.now_us() / 1_000_000;
    let asked = allowed(state.token.as_deref(), &headers, &query)
        .and_then(|()| domain(limiter, &query))
        .and_then(|d| Ok((d, data::Window::of(now, &query)?)));
    let (domain, window) = match asked {
        Ok(asked) => asked,
        Err(refused) => return refused.into_response(),
    };
    let (read, alive) = tokio::join!(
        limiter.tallies().series(&domain, now + 1 - window.from),
        limiter.tallies().instances_seen(data::ALIVE_SECONDS)
    );
    match read.and_then(|read| Ok((read, alive?))) {
        Ok((read, alive)) => {
            let seen = data::Seen {
                instances: &alive,
                this: limiter.instance(),
            };
            json(data::series(&domain, &window, &read, &seen))
        }
        Err(e) => dashboard_read_failed(e),
    }
}

/// `/ui/api/overview?domain=D`: the rules, the lists, last minute's counts, the top offenders, RLQS and the cost
/// budgets, and the health of what the counts come from. A store that fails is shown, not an error: its parts are
/// empty and `health` says why.
async fn overview<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let limiter = &state.limiter;
    let domain = match allowed(state.token.as_deref(), &headers, &query).and_then(|()| domain(limiter, &query)) {
        Ok(d) => d,
        Err(refused) => return refused.into_response(),
    };
    let rules = limiter.rules();
    let Some(compiled) = rules.domain(&domain) else {
        return (StatusCode::NOT_FOUND, "domain: reloaded away\n").into_response();
    };
    // What the store holds, read at once: a store that hangs costs its timeout once, not once per read.
    let offenders = async {
        match limiter.settings().top_offenders {
            0 => Ok(Vec::new()),
            _ => limiter.tallies().top_offenders(&domain, Span::Minute, 10).await,
        }
    };
    let (offenders, read, mut health) = tokio::join!(offenders, limiter.tallies().series(&domain, 60), health(limiter));
    let mut problems = Vec::new();
    let offenders = offenders.unwrap_or_else(|e| {
        problems.push(format!("top offenders: {e}"));
        Vec::new()
    });
    let read = read.unwrap_or_else(|e| {
        problems.push(format!("outcomes: {e}"));
        Default::default()
    });
    if let Some(listed) = health["problems"].as_array_mut() {
        listed.extend(problems.into_iter().map(Value::from));
    }
    let mut last_minute: serde_json::Map<String, Value> = read
        .rules
        .iter()
        .map(|(rule, (a, d))| {
            let counts = json!({"allowed": a.iter().sum::<u64>(), "denied": d.iter().sum::<u64>()});
            (rule.clone(), counts)
        })
        .collect();
    // Reported costs apart from the decisions, for the rules that have any.
    for (rule, reported) in &read.reported {
        let counts = last_minute
            .entry(rule.clone())
            .or_insert_with(|| json!({"allowed": 0, "denied": 0}));
        counts["reported"] = json!(reported.iter().sum::<u64>());
    }
    let metrics = limiter.metrics().render();
    let pairs =
        |l: &[(String, u64)]| -> Vec<Value> { l.iter().map(|(v, n)| json!({"value": v, "count": n})).collect() };
    let mut lists = compiled.lists.lines();
    let failed = format!("list {domain}/");
    lists.extend(
        limiter
            .lists()
            .failures()
            .into_iter()
            .filter(|l| l.starts_with(&failed)),
    );
    json(json!({
        "domain": domain,
        "rules": compiled.rule_lines(),
        "rule_limits": data::rules(compiled),
        "lists": lists,
        "last_minute": last_minute,
        "offenders": offenders
            .iter()
            .map(|r| json!({"rule": r.rule, "hits": pairs(&r.hits), "denied": pairs(&r.denied)}))
            .collect::<Vec<_>>(),
        "rlqs": data::samples(&metrics, "sluice_rlqs_", None),
        "rlqs_words": data::rlqs_in_words(&metrics),
        "rlqs_assignments": data::shares(&state.quotas.assignments(), &domain, limiter.now_us()),
        "budgets": data::samples(&metrics, "sluice_rule_cost_total", Some(&domain)),
        "health": health,
    }))
}

/// The store (its kind, whether it answers a ping and how fast, whether decisions can reach it), the breakers,
/// the instances alive, and what could not be read (`problems`).
async fn health<S: Store>(limiter: &Limiter<S>) -> Value {
    let mut problems = Vec::new();
    let started = Instant::now();
    let ready = tokio::time::timeout(PING_TIMEOUT, limiter.ready()).await;
    let ping_ms = started.elapsed().as_secs_f64() * 1000.0;
    let ready = match ready {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", PING_TIMEOUT.as_secs())),
    };
    let breaker = match limiter.breaker_state() {
        Breaker::Closed => "closed",
        Breaker::HalfOpen => "half-open",
        Breaker::Open => "open",
    };
    let alive = limiter
        .tallies()
        .instances_seen(data::ALIVE_SECONDS)
        .await
        .unwrap_or_else(|e| {
            problems.push(format!("instances: {e}"));
            Default::default()
        });
    let seen = data::Seen {
        instances: &alive,
        this: limiter.instance(),
    };
    json!({
        "store": {
            "kind": limiter.store().name(),
            "ready": ready.is_ok(),
            "ping_ms": (ping_ms * 100.0).round() / 100.0,
            "error": ready.err(),
        },
        "breaker": breaker,
        "instances": data::instances(&seen),
        "problems": problems,
    })
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::Service;

    use super::*;
    use crate::clock::ManualClock;
    use crate::metrics::Metrics;
    use crate::quota::QuotaCaps;
    use crate::rules::RuleSet;
    use crate::store::memory::MemoryStore;

    const RULES: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limits:\n      - {unit: second, requests_per_unit: 2, name: per_s}\n      - {unit: minute, requests_per_unit: 50, name: per_m}\n";

    async fn get(path: &str) -> (StatusCode, String) {
        let metrics = Metrics::discarded(0.8);
        let file = crate::config::parse(std::path::Path::new("edge.yaml"), RULES).unwrap();
        let rules = RuleSet::compile(&[file], &metrics).unwrap();
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000));
        let limiter = Arc::new(Limiter::new(
            rules,
            MemoryStore::new(),
            clock,
            metrics,
            Default::default(),
        ));
        let quotas = Quotas::new(limiter.clone(), QuotaCaps::default());
        let mut app = router(limiter, quotas, Some("t".into()));
        let response = app.call(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn series_refuse_what_they_cannot_answer() {
        assert_eq!(get("/ui/api/series?domain=edge").await.0, StatusCode::UNAUTHORIZED);
        let (status, body) = get("/ui/api/series?token=t").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::BAD_REQUEST, "domain: missing (?domain=NAME)\n")
        );
        let (status, body) = get("/ui/api/series?token=t&domain=nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let (status, body) = get("/ui/api/series?token=t&domain=edge&range=7").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.starts_with("range: '7'"), "{body}");
        let (status, body) = get("/ui/api/series?token=t&domain=edge&since=x").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.starts_with("since: 'x'"), "{body}");
    }

    #[tokio::test]
    async fn series_answer_the_range_asked() {
        let (status, body) = get("/ui/api/series?token=t&domain=edge&range=1m").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let json: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["to"], 1_700_000_000 - 2);
        assert_eq!(json["from"], 1_700_000_000 - 61);
        assert_eq!(json["rules"], json!({}));
    }

    #[tokio::test]
    async fn the_overview_names_every_limit_and_the_health() {
        let (status, body) = get("/ui/api/overview?token=t&domain=edge").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let json: Value = serde_json::from_str(&body).unwrap();
        let limits = &json["rule_limits"][0]["limits"];
        assert_eq!(limits[0]["name"], "per_s");
        assert_eq!(limits[1]["name"], "per_m");
        assert_eq!(json["health"]["store"]["kind"], "memory");
        assert_eq!(json["health"]["store"]["ready"], true);
        assert_eq!(json["health"]["breaker"], "closed");
        assert_eq!(
            get("/ui/api/overview?token=t&domain=nope").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(get("/ui/api/overview?token=t").await.0, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn every_route_and_asset_needs_the_token() {
        for path in [
            "/ui",
            "/ui/assets/dashboard.js",
            "/ui/assets/uPlot.iife.min.js",
            "/ui/api/domains",
        ] {
            assert_eq!(get(path).await.0, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(get(&format!("{path}?token=t")).await.0, StatusCode::OK, "{path}");
        }
        for path in ["/ui/", "/ui/nope", "/ui/api/nope", "/ui/assets/nope.js", "/ui/a/b/c"] {
            assert_eq!(get(path).await.0, StatusCode::UNAUTHORIZED, "{path}");
            assert_eq!(get(&format!("{path}?token=t")).await.0, StatusCode::NOT_FOUND, "{path}");
        }
        let (_, page) = get("/ui?token=t").await;
        assert!(page.contains("/ui/assets/dashboard.js?token=t"), "{page}");
    }
}
