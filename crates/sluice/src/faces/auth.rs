//! The admin token (`--admin-token`): who may make the admin calls. On gRPC, Reset, the list calls and
//! GetTopOffenders are refused without a token on the server, and need `authorization: Bearer <token>` with one; on
//! the admin listener, `/offenders` and the dashboard are open without a token on the server, and need it (as
//! `Authorization: Bearer <token>` or `?token=<token>`) with one. Tokens are compared in constant time.

use std::collections::HashMap;

use axum::http::{HeaderMap, StatusCode, header};
use tonic::Status;
use tonic::metadata::MetadataMap;

/// Whether `given` is the admin `token`, compared in constant time.
fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Checks the admin token in a gRPC call's metadata; `rpc` names the call in errors. Without a `token` on the server
/// the call is refused (PERMISSION_DENIED); with one, a call that does not present it is UNAUTHENTICATED.
pub fn authorize_call(token: Option<&str>, metadata: &MetadataMap, rpc: &str) -> Result<(), Status> {
    let Some(token) = token else {
        return Err(Status::permission_denied(format!(
            "{rpc} is disabled: the server has no admin token"
        )));
    };
    let given = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if same_token(given, token) {
        Ok(())
    } else {
        Err(Status::unauthenticated(format!(
            "{rpc} needs the admin token as 'authorization: Bearer <token>'"
        )))
    }
}

/// Why an HTTP request was refused: a status and a message.
pub type Refused = (StatusCode, String);

/// Whether an admin request on the admin listener carries the token (when the server has one), as
/// `Authorization: Bearer <token>` or `?token=<token>` (a browser opening the dashboard): 401 otherwise.
pub fn allowed(token: Option<&str>, headers: &HeaderMap, query: &HashMap<String, String>) -> Result<(), Refused> {
    let Some(token) = token else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or(query.get("token").map(String::as_str))
        .unwrap_or_default();
    if same_token(given, token) {
        Ok(())
    } else {
        Err((
            StatusCode::UNAUTHORIZED,
            "needs the admin token: 'Authorization: Bearer <token>', or ?token=<token> (the dashboard: /ui?token=...)\n"
                .into(),
        ))
    }
}
