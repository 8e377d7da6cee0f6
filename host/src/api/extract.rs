//! Extractors whose rejections answer in the error envelope, and the caller's identity.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::iam::{Principal, keys};
use crate::{App, Error};

/// A JSON body; malformed, mistyped, unknown-field and oversized bodies are enveloped.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(Error))]
pub struct Json<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// Path parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(Error))]
pub struct Path<T>(pub T);

/// Query parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(Error))]
pub struct Query<T>(pub T);

impl From<JsonRejection> for Error {
    fn from(rejection: JsonRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Error::PayloadTooLarge(format!(
                "request body is larger than {} bytes",
                super::MAX_JSON_BODY
            ));
        }
        let message = match &rejection {
            JsonRejection::MissingJsonContentType(_) => {
                "expected a JSON body with Content-Type: application/json".to_string()
            }
            JsonRejection::JsonDataError(err) => strip_axum_prefix(&err.body_text()),
            JsonRejection::JsonSyntaxError(err) => strip_axum_prefix(&err.body_text()),
            other => other.body_text(),
        };
        Error::InvalidInput {
            message,
            field: None,
        }
    }
}

/// Keeps serde's own message (`units[0].memoryGiB: invalid type: …`), which names the field.
fn strip_axum_prefix(text: &str) -> String {
    text.split_once("target type: ")
        .or_else(|| text.split_once("body: "))
        .map_or(text, |(_, rest)| rest)
        .to_string()
}

impl From<PathRejection> for Error {
    fn from(rejection: PathRejection) -> Self {
        Error::InvalidInput {
            message: rejection.body_text(),
            field: None,
        }
    }
}

impl From<QueryRejection> for Error {
    fn from(rejection: QueryRejection) -> Self {
        Error::InvalidInput {
            message: rejection.body_text(),
            field: None,
        }
    }
}

impl FromRequestParts<Arc<App>> for Principal {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Error> {
        let header = parts.headers.get(header::AUTHORIZATION).ok_or_else(|| {
            Error::Unauthenticated("missing Authorization: Bearer <API key>".into())
        })?;
        let secret = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Error::Unauthenticated("Authorization must be Bearer <API key>".into())
            })?;
        keys::authenticate(app.store.pool(), secret)
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown or revoked API key".into()))
    }
}

/// A JSON body that may be omitted: an empty body is `T::default()`.
pub struct JsonOrEmpty<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Default> FromRequest<S> for JsonOrEmpty<T> {
    type Rejection = Error;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Error> {
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    Error::PayloadTooLarge(format!(
                        "request body is larger than {} bytes",
                        super::MAX_JSON_BODY
                    ))
                } else {
                    Error::InvalidInput {
                        message: rejection.body_text(),
                        field: None,
                    }
                }
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonOrEmpty(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(JsonOrEmpty)
            .map_err(|err| Error::InvalidInput {
                message: err.to_string(),
                field: None,
            })
    }
}

/// A raw request body (bounded by the route's body limit), for uploads.
pub struct RawBody(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Error;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Error> {
        axum::body::Bytes::from_request(request, state)
            .await
            .map(RawBody)
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    Error::PayloadTooLarge(
                        "the request body is larger than this route accepts".into(),
                    )
                } else {
                    Error::InvalidInput {
                        message: rejection.body_text(),
                        field: None,
                    }
                }
            })
    }
}
