//! Cross-origin requests from browsers: only allowed origins get the CORS
//! headers (by default loopback pages, any port), and preflight `OPTIONS`
//! requests are answered before authentication, as browsers send them
//! without credentials.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

/// Origins a browser page may call the API from.
#[derive(Clone, Debug)]
pub enum AllowedOrigins {
    /// `http(s)://localhost`, `127.0.0.1` and `[::1]`, any port.
    Loopback,
    /// Every origin (`*`).
    Any,
    /// Exactly these origins, e.g. `https://example.com:8080`.
    List(Vec<String>),
}

impl AllowedOrigins {
    /// From `--allowed-origins`: `*`, `loopback`, or a comma-separated list.
    pub fn parse(spec: &str) -> Self {
        match spec.trim() {
            "*" => AllowedOrigins::Any,
            "" | "loopback" => AllowedOrigins::Loopback,
            list => AllowedOrigins::List(
                list.split(',')
                    .map(|o| o.trim().trim_end_matches('/').to_string())
                    .filter(|o| !o.is_empty())
                    .collect(),
            ),
        }
    }

    /// Whether a page from `origin` (the `Origin` header's value) may call the API.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            AllowedOrigins::Any => true,
            AllowedOrigins::List(list) => list.iter().any(|o| o == origin),
            AllowedOrigins::Loopback => {
                let rest = origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"));
                let Some(rest) = rest else { return false };
                let (host, port) = match rest.strip_prefix('[') {
                    Some(v6) => match v6.split_once(']') {
                        Some((h, port)) => (format!("[{h}]"), port),
                        None => return false,
                    },
                    None => match rest.split_once(':') {
                        Some((h, p)) => (h.to_string(), &rest[h.len()..][..1 + p.len()]),
                        None => (rest.to_string(), ""),
                    },
                };
                let port_ok = port.is_empty()
                    || port
                        .strip_prefix(':')
                        .is_some_and(|p| p.parse::<u16>().is_ok());
                port_ok && matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]")
            }
        }
    }
}

fn allow(response: &mut Response, origin: &HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
}

pub(crate) async fn cors(
    State(app): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    let allowed = origin
        .as_ref()
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| app.config.cors.allows(o));
    if request.method() == Method::OPTIONS {
        let mut response = StatusCode::NO_CONTENT.into_response();
        if let (true, Some(origin)) = (allowed, &origin) {
            allow(&mut response, origin);
            let headers = response.headers_mut();
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("authorization, content-type"),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
        return response;
    }
    let mut response = next.run(request).await;
    if let (true, Some(origin)) = (allowed, &origin) {
        allow(&mut response, origin);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins_only_by_default() {
        let l = AllowedOrigins::parse("loopback");
        assert!(l.allows("http://localhost:3000"));
        assert!(l.allows("http://127.0.0.1"));
        assert!(l.allows("https://[::1]:8443"));
        assert!(!l.allows("http://localhost.evil.com"));
        assert!(!l.allows("http://example.com"));
        assert!(!l.allows("null"));
        let list = AllowedOrigins::parse("https://app.example.com, http://x:1/");
        assert!(list.allows("https://app.example.com"));
        assert!(list.allows("http://x:1"));
        assert!(!list.allows("http://localhost"));
        assert!(AllowedOrigins::parse("*").allows("http://anything"));
    }
}
