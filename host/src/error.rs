//! The one error type. Domain code returns [`Error`]; [`crate::api::error`] is the one place
//! that turns it into the `{"error": {"code", "message", "details"?}}` envelope.

use serde_json::Value;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist, or the caller may not know that it does.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed or breaks a rule of the domain; `field` names the input.
    #[error("{message}")]
    InvalidInput {
        message: String,
        field: Option<String>,
    },
    /// No credentials, or credentials that do not authenticate.
    #[error("{0}")]
    Unauthenticated(String),
    /// The request collides with the current state of an object.
    #[error("{message}")]
    Conflict {
        message: String,
        details: Option<Value>,
    },
    /// The object is not in a state that allows the operation.
    #[error("{0}")]
    InvalidState(String),
    /// The binding or feature asked for is not served.
    #[error("{0}")]
    Unsupported(String),
    /// The IAM decision refused the request.
    #[error("{0}")]
    AccessDenied(String),
    /// The IAM decision refused an agent and opened a confirmation request for a person.
    #[error("{message}")]
    ConfirmationRequired { message: String, details: Value },
    /// The charge does not fit the tenant's quota.
    #[error("{message}")]
    QuotaExceeded { message: String, details: Value },
    /// The budget does not cover the charge.
    #[error("{0}")]
    SpendLimitReached(String),
    /// A policy plugin failed its decision (trap, deadline, memory cap, invalid answer).
    #[error("{}", .0.message)]
    PolicyFailed(crate::placer::Failure),
    /// The request body is larger than the endpoint accepts.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// A fault of the server or its database; the message is logged, not shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Error::NotFound(format!("{what} not found"))
    }

    /// Invalid input for `field`: the message says what is wrong with it.
    pub fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let field = field.into();
        Error::InvalidInput {
            message: format!("{field}: {message}"),
            field: Some(field),
        }
    }

    pub fn conflict(message: impl Into<String>, details: Option<Value>) -> Self {
        Error::Conflict {
            message: message.into(),
            details,
        }
    }
}

impl Error {
    /// Whether this is a transaction that raced another and was rolled back: trying again
    /// may succeed.
    pub fn is_transaction_conflict(&self) -> bool {
        matches!(self, Error::Conflict { details: Some(d), .. } if d["reason"] == "transaction-conflict")
    }
}

impl From<sqlx::Error> for Error {
    /// A transaction PostgreSQL aborted because it raced another (a deadlock, a
    /// serialization failure, or a lock it gave up waiting for) is the caller's to retry, a
    /// `CONFLICT`; anything else is a fault, logged with its cause.
    fn from(err: sqlx::Error) -> Self {
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        if matches!(code.as_deref(), Some("40P01" | "40001" | "55P03")) {
            return Error::conflict(
                "the request raced a concurrent change and was rolled back; retry",
                Some(serde_json::json!({ "reason": "transaction-conflict" })),
            );
        }
        Error::Internal(anyhow::Error::new(err).context("database"))
    }
}
