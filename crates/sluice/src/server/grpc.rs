//! The gRPC listener: its HTTP/2 connections, served by hyper with the settings tonic's server gives them, and each
//! call handed to the tonic service its path names, under the caller's `grpc-timeout` and the trace layer.
//!
//! tonic's own server wraps every call in layers sluice has no use for, and pays for them per call: it clones the
//! whole layered service into a box, stores the connection's addresses in the request's extensions (nothing here
//! reads them), and routes through an axum router that matches the path with a pattern, stores what it matched and
//! boxes the body and the call's future again. Here a call costs one `Arc` clone of the service it names and no
//! wrapping beyond the deadline; in memory that is about a tenth less CPU per decision.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming as RequestBody;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_stream::StreamExt as _;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;
use tower::Service;

use crate::operations::telemetry::{GrpcTrace, GrpcTraceLayer};
use crate::operations::tls::Incoming;

/// What a routed call returns: the future every service tonic generates answers with.
type CallFuture = BoxFuture<http::Response<Body>, Infallible>;

/// The services of the gRPC listener, routed by name: [`Unimplemented`], then each [`Routes::add`]ed one.
pub trait Routes: Send + Sync + 'static {
    /// Starts `request`, a call to the service its path names.
    fn route(&self, request: http::Request<RequestBody>) -> CallFuture;

    /// These routes, with the calls to `service`'s name going to it.
    fn add<A>(self, service: A) -> Route<A, Self>
    where
        Self: Sized,
        A: NamedService,
    {
        Route { service, rest: self }
    }
}

/// One service and the routes to the others.
#[derive(Debug)]
pub struct Route<A, B> {
    service: A,
    rest: B,
}

impl<A, B> Routes for Route<A, B>
where
    A: Service<http::Request<RequestBody>, Response = http::Response<Body>, Error = Infallible, Future = CallFuture>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    B: Routes,
{
    fn route(&self, request: http::Request<RequestBody>) -> CallFuture {
        if names(request.uri().path(), A::NAME) {
            // A generated service is always ready, and its clone is one `Arc`'s.
            self.service.clone().call(request)
        } else {
            self.rest.route(request)
        }
    }
}

/// Whether `path` is a call to a method of `service`: `/service/method`, the method not empty (what tonic's
/// router matches).
fn names(path: &str, service: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(service))
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|method| !method.is_empty())
}

/// The end of the routes: a call to a service not served here is answered `UNIMPLEMENTED`, as tonic's router
/// answers it.
#[derive(Debug, Clone, Copy)]
pub struct Unimplemented;

impl Routes for Unimplemented {
    fn route(&self, _request: http::Request<RequestBody>) -> CallFuture {
        Box::pin(std::future::ready(Ok(status_response(Status::unimplemented("")))))
    }
}

fn status_response(status: Status) -> http::Response<Body> {
    let (parts, ()) = status.into_http::<()>().into_parts();
    http::Response::from_parts(parts, Body::empty())
}

/// The routes as a tower service, for the trace layer: its clone is one `Arc`'s.
struct Shared<R>(Arc<R>);

impl<R> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<R: Routes> Service<http::Request<RequestBody>> for Shared<R> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> CallFuture {
        self.0.route(request)
    }
}

/// One connection's calls: each within its `grpc-timeout`, in the trace layer's span.
struct Calls<R> {
    routes: GrpcTrace<Shared<R>>,
}

impl<R> Clone for Calls<R> {
    fn clone(&self) -> Self {
        Calls {
            routes: self.routes.clone(),
        }
    }
}

impl<R: Routes> hyper::service::Service<http::Request<RequestBody>> for Calls<R> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Deadline<tracing::instrument::Instrumented<CallFuture>>;

    fn call(&self, request: http::Request<RequestBody>) -> Self::Future {
        let timeout = grpc_timeout(request.headers());
        let call = self.routes.clone().call(request);
        Deadline {
            call,
            expires: timeout.map(|t| Box::pin(tokio::time::sleep(t))),
        }
    }
}

/// A call that is answered `CANCELLED` ("Timeout expired") when its deadline passes first, as tonic's server
/// answers it.
struct Deadline<F> {
    call: F,
    expires: Option<Pin<Box<Sleep>>>,
}

impl<F> Future for Deadline<F>
where
    F: Future<Output = Result<http::Response<Body>, Infallible>> + Unpin,
{
    type Output = Result<http::Response<Body>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(answer) = Pin::new(&mut self.call).poll(cx) {
            return Poll::Ready(answer);
        }
        match self.expires.as_mut().map(|expires| expires.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Ok(status_response(Status::cancelled("Timeout expired")))),
            _ => Poll::Pending,
        }
    }
}

/// The caller's deadline, from the `grpc-timeout` header (`<at most 8 digits><H|M|S|m|u|n>`); none when it is
/// missing or malformed, as tonic reads it.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Serves gRPC on `incoming` until `stop` resolves, then stops accepting, asks every open connection to finish its
/// calls and close (HTTP/2 GOAWAY), and returns once they have.
pub async fn serve<R: Routes>(routes: R, incoming: Incoming, stop: impl Future<Output = ()>) {
    let calls = Calls {
        routes: tower::Layer::layer(&GrpcTraceLayer, Shared(Arc::new(routes))),
    };
    // The HTTP/2 settings tonic's server gives its connections, which the clients have been served with.
    let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
    builder
        .http2()
        .timer(TokioTimer::new())
        .initial_connection_window_size(None)
        .initial_stream_window_size(None)
        .max_concurrent_streams(None)
        .keep_alive_interval(None)
        .keep_alive_timeout(Duration::from_secs(20))
        .adaptive_window(false)
        .max_pending_accept_reset_streams(None)
        .max_local_error_reset_streams(None)
        .max_frame_size(None);
    let (closing, closed) = watch::channel(());
    let mut incoming = incoming;
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            () = &mut stop => break,
            conn = incoming.next() => match conn {
                Some(Ok(conn)) => conn,
                Some(Err(e)) => {
                    tracing::trace!(error = %e, "cannot accept a gRPC connection");
                    continue;
                }
                None => break,
            },
        };
        let (builder, calls, mut closed) = (builder.clone(), calls.clone(), closed.clone());
        tokio::spawn(async move {
            let conn = builder.serve_connection(TokioIo::new(conn), calls);
            tokio::pin!(conn);
            let served = tokio::select! {
                served = conn.as_mut() => served,
                _ = closed.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "gRPC connection closed with an error");
            }
        });
    }
    let _ = closing.send(());
    drop(closed);
    // Every connection task holds a receiver until it ends.
    closing.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_service_and_a_method() {
        let service = "envoy.service.ratelimit.v3.RateLimitService";
        assert!(names(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            service
        ));
        assert!(!names("/envoy.service.ratelimit.v3.RateLimitService/", service));
        assert!(!names("/envoy.service.ratelimit.v3.RateLimitService", service));
        assert!(!names(
            "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit",
            service
        ));
        assert!(!names(
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            service
        ));
        assert!(!names("/sluice.v1.RateLimiter/ShouldRateLimit", service));
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_cancelled() {
        // A deadline already passed: no waiting.
        let never: CallFuture = Box::pin(std::future::pending());
        let expires = Some(Box::pin(tokio::time::sleep(Duration::ZERO)));
        let Ok(answer) = (Deadline { call: never, expires }).await;
        assert_eq!(answer.headers()["grpc-status"], "1");
        assert_eq!(answer.headers()["grpc-message"], "Timeout%20expired");

        let quick: CallFuture = Box::pin(std::future::ready(Ok(http::Response::new(Body::empty()))));
        let expires = Some(Box::pin(tokio::time::sleep(Duration::ZERO)));
        let Ok(answer) = (Deadline { call: quick, expires }).await;
        assert!(answer.headers().get("grpc-status").is_none());
    }

    #[test]
    fn grpc_timeout_reads_as_tonic_reads_it() {
        let timeout = |v: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("grpc-timeout", http::HeaderValue::from_str(v).unwrap());
            grpc_timeout(&headers)
        };
        assert_eq!(timeout("3H"), Some(Duration::from_secs(3 * 3_600)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(timeout("999999999n"), None);
        assert_eq!(timeout("5"), None);
        assert_eq!(timeout("m"), None);
        assert_eq!(timeout("-5S"), None);
        assert_eq!(timeout(""), None);
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }
}
