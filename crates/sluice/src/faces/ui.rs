//! The dashboard, `/ui` on the admin listener: read-only, behind `--admin-token` when the server has one (as
//! `Authorization: Bearer <token>` or `?token=`). One page (`ui/index.html`, embedded: it works offline) polls two
//! endpoints every two seconds:
//!
//! - `/ui/chart.svg?domain=D`: allowed and denied per second over the last 15 minutes for the domain's busiest rules,
//!   summed across the instances on one store, drawn as SVG by [`crate::charts`];
//! - `/ui/api/overview?domain=D`: the rules in force (algorithm and limit), the top offenders of the last minute, and
//!   the assignments this instance's RLQS streams last sent (each Envoy's share of a bucket's quota), and from its
//!   metrics its RLQS streams, buckets and assignment counts and its cost-budget totals.
//!
//! `/ui/api/domains` lists the domains. An unknown domain is 404.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::charts::{Series, line_chart};
use crate::faces::auth::{Refused, allowed};
use crate::faces::errors::dashboard_read_failed;
use crate::limiter::Limiter;
use crate::quota::{Quotas, Strategy};
use crate::store::{Span, Store};

/// The page.
const PAGE: &str = include_str!("ui/index.html");
/// The seconds the chart shows.
const WINDOW_SECONDS: u64 = 900;
/// The most rules the chart draws (the busiest).
const CHART_RULES: usize = 6;

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
        .route("/ui/api/domains", get(domains::<S>))
        .route("/ui/api/overview", get(overview::<S>))
        .route("/ui/chart.svg", get(chart::<S>))
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

async fn page<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Err(refused) = allowed(state.token.as_deref(), &headers, &query) {
        return refused.into_response();
    }
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
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
    json(serde_json::json!(names))
}

fn json(value: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

async fn chart<S: Store>(
    State(state): State<Dashboard<S>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let limiter = &state.limiter;
    let domain = match allowed(state.token.as_deref(), &headers, &query).and_then(|()| domain(limiter, &query)) {
        Ok(d) => d,
        Err(refused) => return refused.into_response(),
    };
    let series = match limiter.series(&domain, WINDOW_SECONDS).await {
        Ok(s) => s,
        Err(e) => return dashboard_read_failed(e),
    };
    // The busiest rules, allowed and denied each; seconds counted back from now (0 is now).
    let mut rules: Vec<_> = series.rules.iter().collect();
    rules.sort_by_key(|(_, (a, d))| std::cmp::Reverse(a.iter().sum::<u64>() + d.iter().sum::<u64>()));
    let len = WINDOW_SECONDS as f64;
    let points = |counts: &[u64]| -> Vec<(f64, f64)> {
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as f64 - len + 1.0, n as f64))
            .collect()
    };
    let mut lines = Vec::new();
    for (rule, (allowed, denied)) in rules.into_iter().take(CHART_RULES) {
        lines.push(Series {
            name: format!("{rule} allowed"),
            points: points(allowed),
        });
        lines.push(Series {
            name: format!("{rule} denied"),
            points: points(denied),
        });
    }
    let svg = line_chart(
        &format!("{domain}: decisions per second, last 15 minutes"),
        "seconds (0 is now)",
        "decisions / s",
        &lines,
        (960, 380),
    );
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        svg,
    )
        .into_response()
}

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
    let rule_lines = compiled.rule_lines();
    let list_lines = compiled.lists.lines();
    let offenders = if limiter.settings().top_offenders > 0 {
        match limiter.top_offenders(&domain, Span::Minute, 10).await {
            Ok(rules) => rules,
            Err(e) => return dashboard_read_failed(e),
        }
    } else {
        Vec::new()
    };
    let series = match limiter.series(&domain, 60).await {
        Ok(s) => s,
        Err(e) => return dashboard_read_failed(e),
    };
    let last_minute: serde_json::Value = series
        .rules
        .iter()
        .map(|(rule, (a, d))| {
            (
                rule.clone(),
                serde_json::json!({"allowed": a.iter().sum::<u64>(), "denied": d.iter().sum::<u64>()}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    let metrics = limiter.metrics().render();
    let pairs = |l: &[(String, u64)]| -> Vec<serde_json::Value> {
        l.iter()
            .map(|(v, n)| serde_json::json!({"value": v, "count": n}))
            .collect()
    };
    json(serde_json::json!({
        "domain": domain,
        "rules": rule_lines,
        "lists": list_lines,
        "last_minute": last_minute,
        "offenders": offenders
            .iter()
            .map(|r| serde_json::json!({"rule": r.rule, "hits": pairs(&r.hits), "denied": pairs(&r.denied)}))
            .collect::<Vec<_>>(),
        "rlqs": samples(&metrics, "sluice_rlqs_", None),
        "rlqs_assignments": assignments(&state.quotas, &domain, limiter.now_us()),
        "budgets": samples(&metrics, "sluice_rule_cost_total", Some(&domain)),
    }))
}

/// The assignments this instance's RLQS streams last sent for `domain`'s buckets: per bucket and stream, the
/// strategy, a token bucket's size (the stream's share), and how long ago it was sent.
fn assignments<S: Store>(quotas: &Quotas<S>, domain: &str, now_us: u64) -> Vec<serde_json::Value> {
    quotas
        .assignments()
        .into_iter()
        .filter(|a| a.domain == domain)
        .map(|a| {
            let bucket: Vec<String> = a.bucket.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let tokens = match a.strategy {
                Strategy::TokenBucket { max_tokens, .. } => serde_json::json!(max_tokens),
                _ => serde_json::Value::Null,
            };
            serde_json::json!({
                "bucket": bucket.join(", "),
                "stream": a.holder,
                "strategy": a.strategy.name(),
                "tokens": tokens,
                "ttl_s": a.ttl_s,
                "age_s": now_us.saturating_sub(a.sent_us) / 1_000_000,
            })
        })
        .collect()
}

/// The samples of this instance's metrics whose name starts with `prefix` (and, when `domain` is given, labelled
/// with it): `{"metric": name, "labels": {...}, "value": v}` each.
fn samples(text: &str, prefix: &str, domain: Option<&str>) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels: serde_json::Map<String, serde_json::Value> = labels
                .split("\",")
                .filter_map(|pair| {
                    let (k, v) = pair.split_once("=\"")?;
                    Some((k.to_string(), serde_json::Value::from(v.trim_end_matches('"'))))
                })
                .collect();
            if domain.is_some_and(|d| labels.get("domain").and_then(|v| v.as_str()) != Some(d)) {
                return None;
            }
            Some(serde_json::json!({"metric": name, "labels": labels, "value": value}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_from_prometheus_text() {
        let text = "# HELP x\nsluice_rlqs_streams 2\nsluice_rule_cost_total{domain=\"llm\",rule=\"llm.user\",limit=\"0\",kind=\"reserved\"} 1200\nsluice_rule_cost_total{domain=\"other\",rule=\"o\",limit=\"0\",kind=\"reported\"} 5\n";
        let rlqs = samples(text, "sluice_rlqs_", None);
        assert_eq!(
            rlqs,
            [serde_json::json!({"metric": "sluice_rlqs_streams", "labels": {}, "value": 2.0})]
        );
        let budgets = samples(text, "sluice_rule_cost_total", Some("llm"));
        assert_eq!(budgets.len(), 1);
        assert_eq!(budgets[0]["labels"]["kind"], "reserved");
        assert_eq!(budgets[0]["value"], 1200.0);
    }
}
