//! What a test's clients changed: every mutating call the harness's [`crate::support::Api`]
//! made that the server answered with success, and the audit entry each must have left.
//!
//! Each route of the API (taken from the router's own registrations, [`orl::api::routes`])
//! has a rule here saying which audit action(s) a successful call writes and which object
//! they name; a mutating route without a rule fails the check, so a new route cannot go
//! unaudited unnoticed. Read-only RPC methods, dry runs and calls that changed nothing (an
//! extend that did not extend, a reclaim that found nothing) expect no entry.

use std::sync::{Arc, Mutex};

use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Row as _;

/// One successful mutating call.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    /// The path without its query.
    pub path: String,
    pub query: String,
    pub status: StatusCode,
    pub request: Value,
    pub answer: Value,
}

/// The successful mutating calls of every client of one server (and its replicas).
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    /// Records the call when it is mutating and succeeded.
    pub fn record(
        &self,
        method: &Method,
        path_and_query: &str,
        status: StatusCode,
        request: Option<&[u8]>,
        answer: &Value,
    ) {
        let mutating = [Method::POST, Method::PUT, Method::PATCH, Method::DELETE];
        if !status.is_success() || !mutating.contains(method) {
            return;
        }
        let (path, query) = path_and_query
            .split_once('?')
            .unwrap_or((path_and_query, ""));
        let request = request
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        self.0.lock().unwrap().push(Call {
            method: method.clone(),
            path: path.to_string(),
            query: query.to_string(),
            status,
            request,
            answer: answer.clone(),
        });
    }

    /// Every call recorded so far.
    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }
}

/// What a successful call of a route must have written to the audit log: an entry with
/// one of `actions` about each of `objects`.
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    pub actions: Vec<&'static str>,
    pub objects: Vec<String>,
}

/// A route template, with the parameters a path gave it by name.
type Route = (String, Vec<(String, String)>);

/// The route template of `path` among the API's routes, with its parameters by name.
pub fn route_of(method: &Method, path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    // The best match so far, and how many literal segments it matched.
    let mut best: Option<(Route, usize)> = None;
    for (m, template) in orl::api::routes(true) {
        if m != method.as_str() {
            continue;
        }
        let parts: Vec<&str> = template.split('/').collect();
        if parts.len() != segments.len() {
            continue;
        }
        let mut params = Vec::new();
        let mut literal = 0;
        let matched = parts.iter().zip(&segments).all(|(part, segment)| {
            if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                params.push((name.to_string(), segment.to_string()));
                true
            } else {
                literal += 1;
                part == segment
            }
        });
        // A literal segment beats a parameter (`/v1/nodes/availability`).
        if matched && best.as_ref().is_none_or(|(_, l)| literal > *l) {
            best = Some(((template, params), literal));
        }
    }
    best.map(|(route, _)| route)
}

/// What a successful `call` of the route `template` must have left in the audit log;
/// `None` for a route no rule covers (a new route needs one).
pub fn expected(template: &str, call: &Call, param: impl Fn(&str) -> String) -> Option<Expected> {
    let one = |actions: Vec<&'static str>, object: String| {
        Some(Expected {
            actions,
            objects: vec![object],
        })
    };
    let nothing = || {
        Some(Expected {
            actions: Vec::new(),
            objects: Vec::new(),
        })
    };
    let answer_id = || call.answer["id"].as_str().unwrap_or_default().to_string();
    let dry_run = call.request["dryRun"] == true;
    let method = call.method.as_str();
    match (method, template) {
        ("POST", "/v1/orgs") => one(vec!["org.create"], answer_id()),
        ("POST", "/v1/orgs/{orgId}/api-keys") => one(vec!["api-key.create"], answer_id()),
        ("DELETE", "/v1/orgs/{orgId}/api-keys/{keyId}") => {
            one(vec!["api-key.revoke"], param("keyId"))
        }
        ("PUT", "/v1/orgs/{orgId}/provider/nodes/{nodeId}") => {
            let actions = if call.status == StatusCode::CREATED {
                vec!["node.register"]
            } else {
                // A report that changed nothing writes nothing; the node's entry stands.
                vec!["node.register", "node.update-inventory"]
            };
            one(actions, param("nodeId"))
        }
        ("POST", "/v1/orgs/{orgId}/provider/nodes/{nodeId}/reclaim-spot") if dry_run => nothing(),
        ("POST", "/v1/orgs/{orgId}/provider/nodes/{nodeId}/reclaim-spot") => Some(Expected {
            actions: vec!["compute-reservation.terminate"],
            objects: strings(&call.answer["terminated"]),
        }),
        ("POST", "/v1/orgs/{orgId}/provider/payouts") => one(vec!["provider.payout"], answer_id()),
        ("PUT", "/v1/orgs/{orgId}/iam/policy") => {
            one(vec!["iam-policy.set", "iam-policy.remove"], param("orgId"))
        }
        ("POST", "/v1/orgs/{orgId}/confirmations/{id}/approve") => {
            one(vec!["confirmation.approve"], param("id"))
        }
        ("POST", "/v1/orgs/{orgId}/confirmations/{id}/deny") => {
            one(vec!["confirmation.deny"], param("id"))
        }
        ("POST", "/v1/nodes/{nodeId}/bindings/{reservationId}") => {
            one(vec!["node.binding-report"], param("reservationId"))
        }
        ("POST", "/v1/nodes/{nodeId}/reservations") => {
            one(vec!["node-reservation.create"], answer_id())
        }
        ("POST", "/v1/nodes/{nodeId}/reservations/{id}/release") => {
            one(vec!["node-reservation.release-units"], param("id"))
        }
        ("POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaim") if dry_run => nothing(),
        ("POST", "/v1/nodes/{nodeId}/reservations/{id}/reclaim") => {
            let mut objects = strings(&call.answer["terminated"]);
            objects.push(param("id"));
            Some(Expected {
                actions: vec![
                    "node-reservation.reclaim-units",
                    "compute-reservation.terminate",
                ],
                objects,
            })
        }
        ("POST", "/v1/nodes/{nodeId}/reservations/{id}/end") => {
            one(vec!["node-reservation.end"], param("id"))
        }
        ("POST", "/v1/nodes/{nodeId}/reservations/{id}/reaffirm") => {
            one(vec!["node-reservation.reaffirm"], param("id"))
        }
        ("POST", "/v1/plugins") => one(vec!["plugin.upload"], answer_id()),
        ("DELETE", "/v1/plugins/{id}") => one(vec!["plugin.delete"], param("id")),
        ("POST", "/v1/pools") => one(vec!["pool.create"], answer_id()),
        ("PUT", "/v1/pools/{poolId}/nodes") => one(vec!["pool.set-nodes"], param("poolId")),
        ("POST", "/v1/pools/{poolId}/archive") => one(vec!["pool.archive"], param("poolId")),
        ("POST", "/v1/pools/{poolId}/offers") => {
            one(vec!["offer.create", "offer.update"], param("poolId"))
        }
        ("PUT", "/v1/pools/{poolId}/policies") => {
            one(vec!["pool.assign-policies"], param("poolId"))
        }
        ("PATCH", "/v1/pools/{poolId}/policies") => {
            one(vec!["pool.patch-policies"], param("poolId"))
        }
        // A replay answers the reservation as it is now; what was created then moved
        // (or waited for a confirmation) shows its draft's entry.
        ("POST", "/api/compute/reservations/create")
            if call.answer["operation"]["name"] == "create" =>
        {
            one(vec!["compute-reservation.create"], answer_id())
        }
        ("POST", "/api/compute/reservations/create") => one(
            vec!["compute-reservation.create", "compute-reservation.draft"],
            answer_id(),
        ),
        // Releasing or cancelling what already ended answers it unchanged: the entry
        // looked for is the one of the method that ended it, when it was one of these.
        ("POST", "/api/compute/reservations/release" | "/api/compute/reservations/cancel") => {
            match call.answer["operation"]["name"].as_str() {
                Some("release") => one(vec!["compute-reservation.release"], answer_id()),
                Some("cancel") => one(vec!["compute-reservation.cancel"], answer_id()),
                _ => nothing(),
            }
        }
        ("POST", "/api/compute/reservations/extend") if call.answer["extended"] == true => one(
            vec!["compute-reservation.extend"],
            call.answer["reservation"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
        ("POST", "/api/compute/reservations/extend") => nothing(),
        ("POST", "/api/compute/reservations/renew") => {
            one(vec!["compute-reservation.renew"], answer_id())
        }
        // Reads over POST, and the test clock.
        (
            "POST",
            "/api/compute/reservations/get"
            | "/api/compute/reservations/list"
            | "/api/compute/reservations/availability"
            | "/api/compute/reservations/plan"
            | "/v1/clock",
        ) => nothing(),
        _ => None,
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// Asserts that each successful mutating call in `calls` left its audit entry in the
/// database `db`.
pub async fn check_audited(db: &mut sqlx::AnyConnection, calls: &[Call]) {
    let rows = sqlx::query("SELECT action, object_id FROM audit_log")
        .fetch_all(&mut *db)
        .await
        .unwrap();
    let entries: std::collections::HashSet<(String, String)> = rows
        .iter()
        .map(|r| (r.get("action"), r.get("object_id")))
        .collect();
    for call in calls {
        let Some((template, params)) = route_of(&call.method, &call.path) else {
            // Not an API route (`/graphql`, …).
            continue;
        };
        let param = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let expected = expected(&template, call, param).unwrap_or_else(|| {
            panic!(
                "no audit rule for {} {template} (tests/e2e/call_log.rs)",
                call.method
            )
        });
        for object in &expected.objects {
            assert!(
                expected
                    .actions
                    .iter()
                    .any(|a| entries.contains(&(a.to_string(), object.clone()))),
                "{} {}{} answered {} but left no audit entry {:?} about {object}: {}",
                call.method,
                call.path,
                if call.query.is_empty() { "" } else { "?…" },
                call.status,
                expected.actions,
                call.answer
            );
        }
    }
}
