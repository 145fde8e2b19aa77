//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::gateway::{GatewayError, SubmitError};

/// An API error: an HTTP status and OpenAI's `{"error": {...}}` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// `error.message`: what went wrong.
    pub message: String,
    /// `error.type`, e.g. `invalid_request_error`, `server_error`.
    pub kind: &'static str,
    /// `error.param`: the request field at fault.
    pub param: Option<String>,
    /// `error.code`, e.g. `invalid_api_key`.
    pub code: Option<&'static str>,
    /// Sent as the `Retry-After` header, in seconds.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_secs: None,
        }
    }

    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message).with_param(param)
    }

    /// 400 about the request as a whole.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
            .with_code("invalid_api_key")
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message).with_code("not_found")
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this route",
        )
        .with_code("method_not_allowed")
    }

    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    pub(crate) fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code(code)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub(crate) fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull { retry_after_secs } => {
                let mut err = ApiError::unavailable(
                    "the server is busy: its request queue is full; retry later",
                    "queue_full",
                );
                err.retry_after_secs = Some(retry_after_secs);
                err
            }
            SubmitError::TooLarge {
                tokens,
                needed_bytes,
                budget_bytes,
            } => ApiError::bad_request(format!(
                "the request needs {tokens} positions of KV cache ({:.1} MiB: prompt plus \
                 max_tokens), more than the server's KV budget of {:.1} MiB; shorten the \
                 prompt or lower max_tokens",
                needed_bytes as f64 / (1u64 << 20) as f64,
                budget_bytes as f64 / (1u64 << 20) as f64
            ))
            .with_code("context_length_exceeded"),
            SubmitError::ShuttingDown => {
                ApiError::unavailable("the server is shutting down", "shutting_down")
            }
        }
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        let message = e.to_string();
        match e {
            GatewayError::InvalidRequest(_) => ApiError::bad_request(message),
            GatewayError::Unsupported(_) => {
                ApiError::new(StatusCode::NOT_IMPLEMENTED, "server_error", message)
                    .with_code("not_implemented")
            }
            GatewayError::ShuttingDown => ApiError::unavailable(message, "shutting_down"),
            GatewayError::Internal(_) => ApiError::internal(message),
        }
    }
}
