//! Domain errors as GraphQL errors: the message the REST envelope shows, the REST code as
//! `extensions.code`, and the envelope's details as `extensions.details`.

use async_graphql::ErrorExtensions as _;
use serde_json::json;

use crate::Error;

impl From<Error> for async_graphql::Error {
    fn from(err: Error) -> Self {
        let (_, code) = err.status_and_code();
        let (message, details) = match &err {
            Error::Internal(fault) => {
                tracing::error!(error = %format_args!("{fault:#}"), "GraphQL operation failed");
                ("internal error".to_string(), None)
            }
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
        async_graphql::Error::new(message).extend_with(|_, extensions| {
            extensions.set("code", code);
            if let Some(details) = details
                && let Ok(value) = async_graphql::Value::from_json(details)
            {
                extensions.set("details", value);
            }
        })
    }
}

/// A JSON argument that does not fit the domain's input type, worded like REST's.
pub fn invalid_json(err: &serde_json::Error) -> Error {
    Error::InvalidInput {
        message: err.to_string(),
        field: None,
    }
}
