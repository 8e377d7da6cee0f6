//! The one place that turns an [`Error`] into the `{"error": {"code", "message", "details"?}}`
//! envelope and its HTTP status.

use std::sync::Arc;

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::Error;

/// The envelope every failure answers with.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `NOT_FOUND`, `INVALID_INPUT`, `UNAUTHENTICATED`, `CONFLICT`, `INVALID_STATE`, `UNSUPPORTED`, `ACCESS_DENIED`,
    /// `CONFIRMATION_REQUIRED`, `QUOTA_EXCEEDED`, `SPEND_LIMIT_REACHED`, `POLICY_FAILED`, `PAYLOAD_TOO_LARGE`,
    /// `METHOD_NOT_ALLOWED`, `INTERNAL`.
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// A server fault riding on its response, for the logging middleware.
#[derive(Clone)]
pub struct Fault(pub Arc<anyhow::Error>);

impl Error {
    /// The HTTP status and the envelope code.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            Error::InvalidInput { .. } => (StatusCode::BAD_REQUEST, "INVALID_INPUT"),
            Error::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
            Error::Conflict { .. } => (StatusCode::CONFLICT, "CONFLICT"),
            Error::InvalidState(_) => (StatusCode::CONFLICT, "INVALID_STATE"),
            Error::Unsupported(_) => (StatusCode::BAD_REQUEST, "UNSUPPORTED"),
            Error::AccessDenied(_) => (StatusCode::FORBIDDEN, "ACCESS_DENIED"),
            Error::ConfirmationRequired { .. } => (StatusCode::FORBIDDEN, "CONFIRMATION_REQUIRED"),
            Error::QuotaExceeded { .. } => (StatusCode::CONFLICT, "QUOTA_EXCEEDED"),
            Error::SpendLimitReached(_) => (StatusCode::PAYMENT_REQUIRED, "SPEND_LIMIT_REACHED"),
            Error::PolicyFailed(_) => (StatusCode::BAD_GATEWAY, "POLICY_FAILED"),
            Error::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE"),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let (message, details) = match &self {
            Error::Internal(_) => ("internal error".to_string(), None),
            Error::InvalidInput {
                message,
                field: Some(field),
            } => (message.clone(), Some(json!({ "field": field }))),
            Error::Conflict { message, details } => (message.clone(), details.clone()),
            Error::ConfirmationRequired { message, details }
            | Error::QuotaExceeded { message, details } => (message.clone(), Some(details.clone())),
            Error::PolicyFailed(failure) => (
                format!(
                    "policy plugin failed ({}): {}",
                    failure.kind.as_str(),
                    failure.message
                ),
                Some(json!(failure)),
            ),
            other => (other.to_string(), None),
        };
        let envelope = ErrorEnvelope {
            error: ErrorBody {
                code: code.to_string(),
                message,
                details,
            },
        };
        let mut response = (status, Json(envelope)).into_response();
        match self {
            Error::Internal(err) => {
                response.extensions_mut().insert(Fault(Arc::new(err)));
            }
            Error::Unauthenticated(_) => {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    "Bearer".parse().expect("static header"),
                );
            }
            _ => {}
        }
        response
    }
}

/// 405 in the envelope.
pub fn method_not_allowed() -> Response {
    let envelope = ErrorEnvelope {
        error: ErrorBody {
            code: "METHOD_NOT_ALLOWED".into(),
            message: "method not allowed on this route".into(),
            details: None,
        },
    };
    (StatusCode::METHOD_NOT_ALLOWED, Json(envelope)).into_response()
}
