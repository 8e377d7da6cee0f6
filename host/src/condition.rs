//! Conditions, as reservations and nodes carry them: a type, why, a message for people,
//! and since when it holds.

use serde::{Deserialize, Serialize};

/// A condition on a reservation (`Unschedulable`, `Queued`, …) or a node (`NodeLost`, …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// Epoch milliseconds.
    pub since: i64,
}
