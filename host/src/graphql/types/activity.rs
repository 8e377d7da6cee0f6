//! The caller, the event outbox and the audit trail.

use async_graphql::{Json, SimpleObject};

use crate::iam::Principal;
use crate::{audit, events};

/// Who is calling: the key, its org and what it may do.
#[derive(SimpleObject)]
pub struct Viewer {
    pub org_id: String,
    pub key_id: String,
    pub permissions: Vec<String>,
    /// An automated caller acting for a person.
    pub agent: bool,
    /// A member of the platform ops org.
    pub ops: bool,
}

impl From<&Principal> for Viewer {
    fn from(p: &Principal) -> Self {
        Viewer {
            org_id: p.org_id.clone(),
            key_id: p.key_id.clone(),
            permissions: p
                .permissions
                .iter()
                .map(|x| x.as_str().to_string())
                .collect(),
            agent: p.agent,
            ops: p.is_ops(),
        }
    }
}

/// One event of the outbox.
#[derive(Clone, SimpleObject)]
pub struct Event {
    /// Position in the outbox; resume after it.
    pub id: i64,
    #[graphql(name = "type")]
    pub kind: String,
    pub at: String,
    pub object_id: String,
    pub payload: Json<serde_json::Value>,
}

impl From<events::Event> for Event {
    fn from(e: events::Event) -> Self {
        Event {
            id: e.id,
            kind: e.kind,
            at: e.at,
            object_id: e.object_id,
            payload: Json(e.payload),
        }
    }
}

/// One audit entry.
#[derive(SimpleObject)]
pub struct AuditEntry {
    pub id: String,
    pub at: String,
    pub actor_key_id: Option<String>,
    pub actor_org_id: Option<String>,
    pub org_id: Option<String>,
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    pub reason: Option<String>,
    pub details: Option<Json<serde_json::Value>>,
}

impl From<audit::AuditEntry> for AuditEntry {
    fn from(e: audit::AuditEntry) -> Self {
        AuditEntry {
            id: e.id,
            at: e.at,
            actor_key_id: e.actor_key_id,
            actor_org_id: e.actor_org_id,
            org_id: e.org_id,
            action: e.action,
            object_type: e.object_type,
            object_id: e.object_id,
            reason: e.reason,
            details: e.details.map(Json),
        }
    }
}
