//! Extractors whose rejections answer in the error envelope, and the caller's identity.
//!
//! Input is checked here once for every route: a JSON body must be an object, and a
//! value of the wrong type is named by its path in `details.field` and described in JSON's
//! words (`expected a whole number`), not Rust's; a JSON string with a NUL character is
//! `INVALID_INPUT` naming its path (no stored text may hold one, and PostgreSQL refuses
//! it); a path or query parameter with a control character (NUL included) is
//! `INVALID_INPUT` naming the parameter, since no id the platform issues or accepts has one.

use std::sync::{Arc, LazyLock};

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use regex::Regex;
use serde::de::DeserializeOwned;

use crate::iam::{Principal, keys};
use crate::{App, Error};

mod strict;

/// A JSON object body; malformed, mistyped, unknown-field, non-object and oversized bodies
/// are enveloped.
pub struct Json<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = Error;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Error> {
        if !is_json(request.headers()) {
            return Err(Error::InvalidInput {
                message: "expected a JSON body with Content-Type: application/json".into(),
                field: None,
            });
        }
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(body_rejection)?;
        from_object(&bytes).map(Json)
    }
}

/// `application/json`, or any `application/…+json`.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let mime = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

fn body_rejection(rejection: BytesRejection) -> Error {
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
}

/// Decodes a JSON object into `T`. A struct is read only from an object, at the top and
/// nested ([`strict`]): serde would otherwise read one from an array, field by field in
/// order.
pub fn from_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[') => {
            return Err(Error::InvalidInput {
                message: "the body must be a JSON object, not an array".into(),
                field: None,
            });
        }
        // A syntax error, or a scalar: the parser and the type say what is wrong.
        _ => {}
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| Error::InvalidInput {
            message: format!("not valid JSON: {err}"),
            field: None,
        })?;
    refuse_nul(&value)?;
    let value = serde_path_to_error::deserialize(strict::Strict(&value)).map_err(json_error)?;
    Ok(value)
}

/// Refuses a body with a NUL character in any string (a key or a value), naming its path:
/// no text the platform stores may hold one, and PostgreSQL refuses it.
fn refuse_nul(value: &serde_json::Value) -> Result<(), Error> {
    fn find(value: &serde_json::Value, path: &str) -> Option<String> {
        let at = |key: &str| {
            if path.is_empty() {
                key.to_string()
            } else {
                format!("{path}.{key}")
            }
        };
        match value {
            serde_json::Value::String(s) if s.contains('\0') => Some(path.to_string()),
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| find(item, &format!("{path}[{i}]"))),
            serde_json::Value::Object(fields) => fields.iter().find_map(|(key, item)| {
                if key.contains('\0') {
                    Some(at(&key.replace('\0', "")))
                } else {
                    find(item, &at(key))
                }
            }),
            _ => None,
        }
    }
    match find(value, "") {
        Some(field) if !field.is_empty() => {
            Err(Error::invalid(field, "must not contain a NUL character"))
        }
        Some(_) => Err(Error::InvalidInput {
            message: "the body must not contain a NUL character".into(),
            field: None,
        }),
        None => Ok(()),
    }
}

/// A serde error as `INVALID_INPUT`: the failing path in `details.field` (for a missing or
/// unknown field, the field itself), and the message in JSON's words.
fn json_error(err: serde_path_to_error::Error<serde_json::Error>) -> Error {
    let path = err.path().to_string();
    let path = (path != ".").then_some(path);
    let inner = err.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return Error::InvalidInput {
            message: format!("not valid JSON: {inner}"),
            field: None,
        };
    }
    let text = LOCATION.replace(&inner.to_string(), "").into_owned();
    // The path ends at the field's parent, or (for an unknown field) at the field itself.
    let join = |name: &str| match &path {
        Some(parent) if parent == name || parent.ends_with(&format!(".{name}")) => parent.clone(),
        Some(parent) => format!("{parent}.{name}"),
        None => name.to_string(),
    };
    let (field, message) = if let Some(name) = quoted_after(&text, "missing field ") {
        (Some(join(&name)), "is required".to_string())
    } else if let Some(name) = quoted_after(&text, "unknown field ") {
        let allowed = text
            .split_once(", ")
            .map(|(_, rest)| format!(" ({})", rest.replace('`', "")))
            .unwrap_or_default();
        (Some(join(&name)), format!("unknown field{allowed}"))
    } else if let Some(name) = quoted_after(&text, "duplicate field ") {
        (Some(join(&name)), "given twice".to_string())
    } else {
        (path, in_words(&text))
    };
    match field {
        Some(field) => Error::invalid(field, message),
        None => Error::InvalidInput {
            message,
            field: None,
        },
    }
}

/// The text in backquotes right after `prefix`, when `text` starts with it.
fn quoted_after(text: &str, prefix: &str) -> Option<String> {
    let rest = text.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split_once('`').map(|(name, _)| name.to_string())
}

/// ` at line 1 column 7`.
static LOCATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r" at line \d+ column \d+$").unwrap());

/// Rust's names for what serde expected, and JSON's words for them.
static RUST_WORDS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (
            r"\b(?:struct variant|struct|map) `?[A-Za-z0-9_:]*`?",
            "an object",
        ),
        (r"\ba map\b", "an object"),
        (r"\bmap\b", "an object"),
        (r"\btuple struct `?[A-Za-z0-9_:]*`?", "an array"),
        (r"\bunit struct `?[A-Za-z0-9_:]*`?", "null"),
        (r"\btuple variant `?[A-Za-z0-9_:]*`?", "an array"),
        (r"\ba tuple of size (\d+)", "an array of $1 items"),
        (r"\ba sequence\b", "an array"),
        (r"\bsequence\b", "array"),
        (r"\benum `?[A-Za-z0-9_:]*`?", "one of the allowed values"),
        (
            r"\b(?:u8|u16|u32|u64|u128|usize)\b",
            "a non-negative whole number",
        ),
        (r"\b(?:i8|i16|i32|i64|i128|isize)\b", "a whole number"),
        (r"\b(?:f32|f64)\b", "a number"),
        (r"\bfloating point\b", "number"),
        (r"\ba borrowed string\b", "a string"),
        (r"\bchar\b", "a single character"),
        (r"\bunit value\b", "null"),
        (r"\bOption<[^>]*>", "an optional value"),
    ]
    .into_iter()
    .map(|(pattern, words)| (Regex::new(pattern).unwrap(), words))
    .collect()
});

/// `text` with Rust's type names in JSON's words.
fn in_words(text: &str) -> String {
    let mut text = text.to_string();
    for (pattern, words) in RUST_WORDS.iter() {
        text = pattern.replace_all(&text, *words).into_owned();
    }
    text
}

/// Refuses a parameter (`what` of the request) whose name or value has a control
/// character, naming it.
fn no_control_chars<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<(), Error> {
    for (name, value) in pairs {
        if value.chars().any(char::is_control) || name.chars().any(char::is_control) {
            let name: String = name.chars().filter(|c| !c.is_control()).collect();
            return Err(Error::invalid(name, "must not contain control characters"));
        }
    }
    Ok(())
}

/// Path parameters. A parameter with a control character is `INVALID_INPUT` naming it.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| Error::InvalidInput {
                message: rejection.body_text(),
                field: None,
            })?;
        no_control_chars(&raw)?;
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(Error::from)
    }
}

/// Query parameters. A parameter with a control character is `INVALID_INPUT` naming it.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Error> {
        let axum::extract::Query(pairs) =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)?;
        no_control_chars(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let query = parts.uri.query().unwrap_or_default();
        let parameters =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(parameters)
            .map(Query)
            .map_err(query_error)
    }
}

/// A query parameter that does not decode as `INVALID_INPUT`, naming it.
fn query_error(err: serde_path_to_error::Error<serde::de::value::Error>) -> Error {
    let path = err.path().to_string();
    let text = err.into_inner().to_string();
    let (field, message) = if let Some(name) = quoted_after(&text, "missing field ") {
        (name, "is required".to_string())
    } else if let Some(name) = quoted_after(&text, "unknown field ") {
        let allowed = text
            .split_once(", ")
            .map(|(_, rest)| format!(" ({})", rest.replace('`', "")))
            .unwrap_or_default();
        (name, format!("unknown query parameter{allowed}"))
    } else {
        (path, in_words(&text))
    };
    Error::invalid(field, message)
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
            message: in_words(&rejection.body_text()),
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
        let secret = header.to_str().ok().and_then(bearer_token).ok_or_else(|| {
            Error::Unauthenticated("Authorization must be Bearer <API key>".into())
        })?;
        keys::authenticate(app, secret)
            .await?
            .ok_or_else(|| Error::Unauthenticated("unknown or revoked API key".into()))
    }
}

/// The credentials of `Bearer <token>`; the scheme is case-insensitive (RFC 7235), and
/// one or more spaces separate it from the token.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A JSON body that may be omitted: an empty body is `T::default()`.
pub struct JsonOrEmpty<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Default> FromRequest<S> for JsonOrEmpty<T> {
    type Rejection = Error;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, Error> {
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(body_rejection)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonOrEmpty(T::default()));
        }
        from_object(&bytes).map(JsonOrEmpty)
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
