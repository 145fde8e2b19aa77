//! `--api-key`: every route but `/health` needs `Authorization: Bearer <key>`
//! (or Anthropic's `x-api-key: <key>`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::AppState;

/// Compares without an early exit, so timing does not reveal the key.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks an `Authorization` header value against the `expected` key: `Ok` for
/// `Bearer <expected>`, else 401.
pub fn authorized(expected: &str, header: Option<&str>) -> Result<(), ApiError> {
    let Some(value) = header else {
        return Err(ApiError::unauthorized(
            "missing API key: send an Authorization: Bearer <key> header",
        ));
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim);
    match token {
        Some(t) if same_secret(t.as_bytes(), expected.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized("invalid API key")),
    }
}

pub(crate) async fn require_api_key(
    State(app): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(expected) = &app.config.api_key {
        // The chat page is static; it sends the key with its API calls.
        if !matches!(request.uri().path(), "/health" | "/") {
            let headers = request.headers();
            let header = match headers.get(AUTHORIZATION) {
                Some(v) => v.to_str().ok().map(str::to_string),
                None => headers
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
                    .map(|k| format!("Bearer {k}")),
            };
            if let Err(e) = authorized(expected, header.as_deref()) {
                return e.into_response();
            }
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_checks() {
        assert!(authorized("k1", Some("Bearer k1")).is_ok());
        assert!(authorized("k1", Some("Bearer k2")).is_err());
        assert!(authorized("k1", Some("k1")).is_err());
        assert!(authorized("k1", None).is_err());
        assert!(authorized("k1", Some("Bearer k1x")).is_err());
    }
}
