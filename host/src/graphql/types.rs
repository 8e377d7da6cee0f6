//! The GraphQL views of domain objects: plain copies of what REST shows, plus the fields
//! a dashboard resolves per object (bookings, utilization, offers, decision counts).

mod activity;
mod earnings;
mod fleet;
mod inventory;
mod pools;
mod reservations;

pub use activity::{AuditEntry, Event, Viewer};
pub use earnings::Earnings;
pub use fleet::{PoolCapacity, TimelineRow, TimelineWindow};
pub(super) use inventory::Booking;
pub use inventory::Node;
pub use pools::{Offer, Plugin, Pool};
pub use reservations::{
    Availability, Catalog, ComputeReservation, Extended, NodeReservation, Plan,
};

use async_graphql::Json;
use serde::Serialize;

/// A domain enum by its API name (`active`, `spot-only`, …).
fn api_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// Any serializable domain value as a JSON scalar.
fn json<T: Serialize>(value: &T) -> Json<serde_json::Value> {
    Json(serde_json::to_value(value).unwrap_or_default())
}
