//! Compute reservations and their bookings in the database, and the reservation as the
//! API shows it.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{Binding, CreateRequest, HostBooking, State};
use crate::Result;
use crate::condition::Condition;
use crate::store::{Batch, Value, flag, placeholders, to_json};

/// The last operation applied to a reservation: a method (`create`, `release`, `cancel`,
/// `extend`, `renew`) or a transition the reconciler made (`place`, `activate`,
/// `window-ended`, `lease-lapsed`, `confirmation-timeout`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Operation {
    pub name: String,
    /// Epoch milliseconds.
    pub at: i64,
}

/// A compute reservation as stored.
#[derive(Clone, Debug)]
pub struct Reservation {
    pub id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub project_id: Option<String>,
    pub caller_key_id: String,
    pub idempotency_key: String,
    pub request: CreateRequest,
    pub state: State,
    pub spot: bool,
    pub binding: Binding,
    pub start_ms: i64,
    pub end_ms: i64,
    pub lease_seconds: Option<i64>,
    pub lease_deadline_ms: Option<i64>,
    pub resources: HostBooking,
    /// What quota holds for it; `None` when nothing is charged.
    pub charge: Option<BTreeMap<String, i64>>,
    pub conditions: Vec<Condition>,
    pub reason: Option<String>,
    pub node_id: Option<String>,
    pub placed_by: Option<String>,
    pub confirmation_id: Option<String>,
    pub extend_started_ms: Option<i64>,
    pub next_attempt_ms: Option<i64>,
    pub operation: Option<Operation>,
    pub created_at: i64,
    pub updated_at: i64,
    /// The row's version as read; every write bumps it (see [`update`]).
    pub version: i64,
    /// Units booked, in placement order (after placement); every member's for a gang.
    pub unit_ids: Vec<String>,
    /// The nodes holding its units and the units on each: one member, or one per node of a
    /// gang. The first is the node `node_id` names; the others follow by node id.
    pub members: Vec<Member>,
}

/// The units one reservation holds on one node (a gang has one member per node).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub node_id: String,
    pub unit_ids: Vec<String>,
}

/// Orders `members` as a reservation shows them: `first` (its `node_id`) first, the others
/// by node id.
pub fn order_members(members: &mut [Member], first: Option<&str>) {
    members.sort_by(|a, b| {
        (Some(a.node_id.as_str()) != first, &a.node_id)
            .cmp(&(Some(b.node_id.as_str()) != first, &b.node_id))
    });
}

impl Reservation {
    /// Sets or replaces the condition of `kind`.
    pub fn set_condition(&mut self, kind: &str, reason: &str, message: String, now: i64) {
        self.conditions.retain(|c| c.kind != kind);
        self.conditions.push(Condition {
            kind: kind.into(),
            reason: reason.into(),
            message,
            since: now,
        });
    }

    /// Records `name` as the last operation, at `now`.
    pub fn operate(&mut self, name: &str, now: i64) {
        self.operation = Some(Operation {
            name: name.into(),
            at: now,
        });
        self.updated_at = now;
    }

    /// The nodes it holds units on.
    pub fn node_ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.node_id.clone()).collect()
    }

    pub fn clear_condition(&mut self, kind: &str) {
        self.conditions.retain(|c| c.kind != kind);
    }

    pub fn view(&self) -> ComputeReservation {
        ComputeReservation {
            id: self.id.clone(),
            tenant_id: self.tenant_id.clone(),
            pool_id: self.pool_id.clone(),
            project_id: self.project_id.clone(),
            state: self.state,
            spot: self.spot,
            start: self.start_ms,
            end: self.end_ms,
            lease_seconds: self.lease_seconds,
            lease_deadline: self.lease_deadline_ms,
            resources: self.resources,
            conditions: self.conditions.clone(),
            reason: self.reason.clone(),
            placement: self.node_id.as_ref().map(|node| Placement {
                node_id: node.clone(),
                unit_ids: match self.members.as_slice() {
                    [first, _, ..] => first.unit_ids.clone(),
                    _ => self.unit_ids.clone(),
                },
                members: if self.members.is_empty() {
                    vec![Member {
                        node_id: node.clone(),
                        unit_ids: self.unit_ids.clone(),
                    }]
                } else {
                    self.members.clone()
                },
                placed_by: self.placed_by.clone(),
            }),
            request: self.request.clone(),
            operation: self.operation.clone(),
            binding: None,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// Where a reservation's devices are. `nodeId` and `unitIds` name the first member; a
/// gang lists every member (one per node) in `members`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub node_id: String,
    pub unit_ids: Vec<String>,
    /// Every node the reservation holds units on, with those units; the first is
    /// `nodeId`'s.
    pub members: Vec<Member>,
    /// The policy that chose the units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placed_by: Option<String>,
}

/// A compute reservation as the API shows it. Instants are epoch milliseconds.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeReservation {
    pub id: String,
    pub tenant_id: String,
    pub pool_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub state: State,
    pub spot: bool,
    pub start: i64,
    pub end: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_deadline: Option<i64>,
    /// Host resources booked with the devices.
    pub resources: HostBooking,
    pub conditions: Vec<Condition>,
    /// Why it ended (`release`, `lease-lapsed`, `window-ended`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// The request as created (without `wait`).
    pub request: CreateRequest,
    /// The last operation applied to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    /// Where a `node` or `kubernetes` binding stands, once its node reported it bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<super::binding::BindingView>,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str = "id, tenant_id, pool_id, project_id, caller_key_id, idempotency_key, request, state, spot, binding,
    start_ms, end_ms, lease_seconds, lease_deadline_ms, resources, charge, conditions, reason, node_id, placed_by,
    confirmation_id, extend_started_ms, next_attempt_ms, operation, created_at, updated_at, version";

fn decode<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| anyhow::anyhow!("stored {what}: {e}").into())
}

fn from_row(r: &AnyRow, units: Vec<(String, String)>) -> Result<Reservation> {
    let state: String = r.get("state");
    let node_id: Option<String> = r.get("node_id");
    let mut members: Vec<Member> = Vec::new();
    for (node, unit) in &units {
        match members.iter_mut().find(|m| &m.node_id == node) {
            Some(member) => member.unit_ids.push(unit.clone()),
            None => members.push(Member {
                node_id: node.clone(),
                unit_ids: vec![unit.clone()],
            }),
        }
    }
    order_members(&mut members, node_id.as_deref());
    let unit_ids = members.iter().flat_map(|m| m.unit_ids.clone()).collect();
    let binding: String = r.get("binding");
    Ok(Reservation {
        id: r.get("id"),
        tenant_id: r.get("tenant_id"),
        pool_id: r.get("pool_id"),
        project_id: r.get("project_id"),
        caller_key_id: r.get("caller_key_id"),
        idempotency_key: r.get("idempotency_key"),
        request: decode("request", &r.get::<String, _>("request"))?,
        state: State::parse(&state).ok_or_else(|| anyhow::anyhow!("stored state {state:?}"))?,
        spot: flag(r, "spot"),
        binding: decode("binding", &format!("\"{binding}\""))?,
        start_ms: r.get("start_ms"),
        end_ms: r.get("end_ms"),
        lease_seconds: r.get("lease_seconds"),
        lease_deadline_ms: r.get("lease_deadline_ms"),
        resources: decode("resources", &r.get::<String, _>("resources"))?,
        charge: r
            .get::<Option<String>, _>("charge")
            .map(|c| decode("charge", &c))
            .transpose()?,
        conditions: decode("conditions", &r.get::<String, _>("conditions"))?,
        reason: r.get("reason"),
        node_id,
        placed_by: r.get("placed_by"),
        confirmation_id: r.get("confirmation_id"),
        extend_started_ms: r.get("extend_started_ms"),
        next_attempt_ms: r.get("next_attempt_ms"),
        operation: r
            .get::<Option<String>, _>("operation")
            .map(|o| decode("operation", &o))
            .transpose()?,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
        version: r.get("version"),
        unit_ids,
        members,
    })
}

/// Loads reservations with their booked units.
async fn load(conn: &mut AnyConnection, rows: Vec<AnyRow>) -> Result<Vec<Reservation>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = rows.iter().map(|r| r.get("id")).collect();
    let sql = format!(
        "SELECT reservation_id, node_id, unit_id FROM bookings WHERE reservation_id IN ({}) ORDER BY reservation_id, node_id, unit_id",
        placeholders(1, ids.len())
    );
    let mut query = sqlx::query(&sql);
    for id in &ids {
        query = query.bind(id);
    }
    let mut units: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for row in query.fetch_all(&mut *conn).await? {
        units
            .entry(row.get("reservation_id"))
            .or_default()
            .push((row.get("node_id"), row.get("unit_id")));
    }
    rows.iter()
        .map(|r| {
            from_row(
                r,
                units.remove(&r.get::<String, _>("id")).unwrap_or_default(),
            )
        })
        .collect()
}

/// The reservation with `id`; `lock` is the row-lock clause for a read-then-write (on the
/// reservation's row). One round trip: a row for each unit it booked.
pub async fn find(conn: &mut AnyConnection, id: &str, lock: &str) -> Result<Option<Reservation>> {
    let rows = sqlx::query(&format!(
        "SELECT r.*, b.node_id AS booked_node_id, b.unit_id AS booked_unit_id
         FROM (SELECT {COLUMNS} FROM compute_reservations WHERE id = $1{lock}) r
         LEFT JOIN bookings b ON b.reservation_id = r.id
         ORDER BY b.node_id, b.unit_id"
    ))
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let units = (rows.iter())
        .filter_map(|row| {
            let node: Option<String> = row.get("booked_node_id");
            let unit: Option<String> = row.get("booked_unit_id");
            node.zip(unit)
        })
        .collect();
    from_row(first, units).map(Some)
}

/// The reservations time moves at `now`, oldest first (the reconciler's work list): a
/// confirmation older than `confirmation_window_ms`, a lapsed lease, an ended window, a
/// start reached, a pending retry due (queued ones, without a next attempt, every pass).
/// Each term is a query of its own, served by a partial index on its due time (migrations
/// 0011 and 0017 on SQLite): a pass reads what is due, not every live reservation, which
/// SQLite read for the same terms joined by `OR`.
pub async fn due(
    conn: &mut AnyConnection,
    now: i64,
    confirmation_window_ms: i64,
) -> Result<Vec<Reservation>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM compute_reservations WHERE id IN (
             SELECT id FROM compute_reservations
              WHERE state = 'awaiting-confirmation' AND created_at <= $1
             UNION ALL SELECT id FROM compute_reservations
              WHERE lease_deadline_ms IS NOT NULL AND lease_deadline_ms <= $2
                AND state IN ('placed', 'binding', 'active')
             UNION ALL SELECT id FROM compute_reservations
              WHERE state IN ('pending', 'placed', 'binding', 'active') AND end_ms <= $2
             UNION ALL SELECT id FROM compute_reservations
              WHERE state = 'placed' AND start_ms <= $2
             UNION ALL SELECT id FROM compute_reservations
              WHERE state = 'pending' AND next_attempt_ms <= $2
             UNION ALL SELECT id FROM compute_reservations
              WHERE state = 'pending' AND next_attempt_ms IS NULL)
         ORDER BY position"
    ))
    .bind(now - confirmation_window_ms)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    load(conn, rows).await
}

/// The pending reservations of a pool, oldest first.
pub async fn pending_in_pool(conn: &mut AnyConnection, pool_id: &str) -> Result<Vec<Reservation>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM compute_reservations WHERE pool_id = $1 AND state = 'pending' ORDER BY position"
    ))
    .bind(pool_id)
    .fetch_all(&mut *conn)
    .await?;
    load(conn, rows).await
}

/// A page of a tenant's reservations, newest first, drafts skipped; `before` is the id of
/// the last reservation of the previous page.
pub async fn page(
    conn: &mut AnyConnection,
    tenant_id: &str,
    state: Option<State>,
    pool_id: Option<&str>,
    caller_key_id: Option<&str>,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<Reservation>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM compute_reservations
         WHERE tenant_id = $1 AND state NOT IN ('draft', 'awaiting-confirmation')
           AND ($2 IS NULL OR state = $2) AND ($3 IS NULL OR pool_id = $3)
           AND ($4 IS NULL OR caller_key_id = $4)
           AND ($5 IS NULL OR position < (SELECT position FROM compute_reservations WHERE id = $5))
         ORDER BY position DESC LIMIT $6"
    ))
    .bind(tenant_id)
    .bind(state.map(State::as_str))
    .bind(pool_id)
    .bind(caller_key_id)
    .bind(before)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    load(conn, rows).await
}

/// Adds the insert of the new reservation `r` to `batch`: one row, none when the id
/// exists.
pub fn push_insert(batch: &mut Batch, r: &Reservation) {
    let sql = format!(
        "INSERT INTO compute_reservations (position, {COLUMNS})
         VALUES ((SELECT COALESCE(MAX(position), 0) + 1 FROM compute_reservations), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27)
         ON CONFLICT DO NOTHING"
    );
    batch.push(
        &sql,
        vec![
            (&r.id).into(),
            (&r.tenant_id).into(),
            (&r.pool_id).into(),
            (&r.project_id).into(),
            (&r.caller_key_id).into(),
            (&r.idempotency_key).into(),
            to_json(&r.request).into(),
            r.state.as_str().into(),
            r.spot.into(),
            binding_str(r.binding).into(),
            r.start_ms.into(),
            r.end_ms.into(),
            r.lease_seconds.into(),
            r.lease_deadline_ms.into(),
            to_json(&r.resources).into(),
            r.charge.as_ref().map(to_json).into(),
            to_json(&r.conditions).into(),
            (&r.reason).into(),
            (&r.node_id).into(),
            (&r.placed_by).into(),
            (&r.confirmation_id).into(),
            r.extend_started_ms.into(),
            r.next_attempt_ms.into(),
            r.operation.as_ref().map(to_json).into(),
            r.created_at.into(),
            r.updated_at.into(),
            r.version.into(),
        ],
    );
}

fn binding_str(binding: Binding) -> &'static str {
    match binding {
        Binding::Hold => "hold",
        Binding::Node => "node",
        Binding::Kubernetes => "kubernetes",
    }
}

/// Writes every mutable column of `r` if the row is still at the version `r` was read at,
/// and moves `r` to the new version. Returns whether it was: `false` means another writer
/// changed the reservation since it was read, and nothing was written. This is the one way
/// a reservation changes; a caller does its side effects only after it answered `true`.
pub async fn update(conn: &mut AnyConnection, r: &mut Reservation) -> Result<bool> {
    update_then(conn, r, |_, _| {}).await
}

/// Writes `r` as [`update`] does and, in the same round trip, what `then` adds for the
/// reservation as written: statements of one row each (its audit entry, its event).
/// `false`: the reservation had changed; the caller rolls back what `then` wrote.
pub async fn update_then(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    then: impl FnOnce(&mut Batch, &Reservation),
) -> Result<bool> {
    let mut batch = Batch::on(conn);
    push_update(&mut batch, r);
    then(&mut batch, r);
    let matched = batch.execute(conn).await?.iter().all(|&rows| rows == 1);
    if matched {
        r.version += 1;
    }
    Ok(matched)
}

/// Adds the write of every mutable column of `r` to `batch`, if the row is still at the
/// version `r` was read at (one row, or none): see [`update`]. The caller moves `r` to the
/// next version once it matched.
pub fn push_update(batch: &mut Batch, r: &Reservation) {
    batch.push(
        "UPDATE compute_reservations SET state = $1, start_ms = $2, end_ms = $3, lease_deadline_ms = $4, resources = $5,
             charge = $6, conditions = $7, reason = $8, node_id = $9, placed_by = $10, confirmation_id = $11,
             extend_started_ms = $12, next_attempt_ms = $13, updated_at = $14, operation = $15, version = version + 1
         WHERE id = $16 AND version = $17",
        vec![
            r.state.as_str().into(),
            r.start_ms.into(),
            r.end_ms.into(),
            r.lease_deadline_ms.into(),
            to_json(&r.resources).into(),
            r.charge.as_ref().map(to_json).into(),
            to_json(&r.conditions).into(),
            (&r.reason).into(),
            (&r.node_id).into(),
            (&r.placed_by).into(),
            (&r.confirmation_id).into(),
            r.extend_started_ms.into(),
            r.next_attempt_ms.into(),
            r.updated_at.into(),
            r.operation.as_ref().map(to_json).into(),
            (&r.id).into(),
            r.version.into(),
        ],
    );
}

/// Books `units` of `node_id` and its host resources for the reservation over its window,
/// from `now` at the earliest: a booking never starts before the moment it is written, so
/// a reservation placed late never overlaps the holder that just left. Each unit's booking
/// carries the terms metering needs, frozen as they are now: the price per GPU-hour of the
/// tenant's offer for the pool (0 without a price), the unit's model and device class, and
/// the provider's share. `false` when a unit is no longer on the node: the caller rolls
/// back what was written.
pub async fn insert_bookings(
    conn: &mut AnyConnection,
    r: &Reservation,
    node_id: &str,
    units: &[String],
    provider_share_bps: u32,
    now: i64,
) -> sqlx::Result<bool> {
    let mut batch = Batch::on(conn);
    let rows = push_bookings(
        &mut batch,
        r,
        (node_id, units),
        provider_share_bps,
        now,
        None,
    );
    Ok(batch.execute(conn).await? == rows)
}

/// A condition on the statement that books a node's units ([`push_bookings`]), in its
/// parameters `$1` (the reservation), `$2` (the node), `$3`–`$4` (the window) and, from
/// `$10`, its own `values`. Values go in parameters, not in the text, so that the statement
/// is the same for every reservation of its shape.
pub struct NodeCondition {
    pub sql: String,
    pub values: Vec<Value>,
}

/// Adds [`insert_bookings`]'s writes to `batch`; answers how many rows they change when
/// every unit is still on the node (and `condition` holds).
pub fn push_bookings(
    batch: &mut Batch,
    r: &Reservation,
    (node_id, units): (&str, &[String]),
    provider_share_bps: u32,
    now: i64,
    condition: Option<&NodeCondition>,
) -> Vec<u64> {
    let start = r.start_ms.max(now);
    let own = condition.map_or(&[][..], |c| &c.values[..]);
    // One statement for every unit, with the price of the tenant's offer (none: the pool's
    // owner books its own capacity) and what the unit is.
    let sql = format!(
        "INSERT INTO bookings (reservation_id, node_id, unit_id, start_ms, end_ms, spot, active,
                               price_per_gpu_hour_minor, model, device_class, provider_share_bps)
         SELECT $1, u.node_id, u.id, $3, $4, $5, $6,
                COALESCE((SELECT price_per_gpu_hour_minor FROM offers WHERE pool_id = $7 AND tenant_id = $8), 0),
                u.model, u.device_class, $9
         FROM units u WHERE u.node_id = $2 AND u.id IN ({}){}",
        crate::store::placeholders(10 + own.len(), units.len()),
        condition.map(|c| format!(" AND {}", c.sql)).unwrap_or_default()
    );
    let mut values: Vec<Value> = vec![
        (&r.id).into(),
        node_id.into(),
        start.into(),
        r.end_ms.into(),
        r.spot.into(),
        true.into(),
        (&r.pool_id).into(),
        (&r.tenant_id).into(),
        i64::from(provider_share_bps).into(),
    ];
    values.extend(own.iter().cloned());
    values.extend(units.iter().map(Value::from));
    batch.push(&sql, values);
    let host = r.resources;
    let mut rows = vec![units.len() as u64];
    if host != HostBooking::default() {
        batch.push(
            "INSERT INTO host_bookings (reservation_id, node_id, vcpu, memory_gib, hugepages_1gi, start_ms, end_ms, active)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            vec![
                (&r.id).into(),
                node_id.into(),
                host.vcpu.into(),
                host.memory_gib.into(),
                host.hugepages_1gi.into(),
                start.into(),
                r.end_ms.into(),
                true.into(),
            ],
        );
        rows.push(1);
    }
    rows
}

/// Ends a reservation's bookings at `now` (or drops them if they had not started): they
/// stop claiming their units at once.
pub async fn release_bookings(conn: &mut AnyConnection, id: &str, now: i64) -> Result<()> {
    let mut batch = Batch::on(conn);
    push_release_bookings(&mut batch, id, now);
    batch.execute(conn).await?;
    Ok(())
}

/// Adds [`release_bookings`]'s writes to `batch`.
pub fn push_release_bookings(batch: &mut Batch, id: &str, now: i64) {
    for table in ["bookings", "host_bookings"] {
        batch.push(
            &format!(
                "UPDATE {table} SET active = $1,
                     end_ms = CASE WHEN end_ms < $2 THEN end_ms WHEN start_ms > $2 THEN start_ms ELSE $2 END
                 WHERE reservation_id = $3 AND active = $4"
            ),
            vec![false.into(), now.into(), id.into(), true.into()],
        );
    }
}

/// Moves the end of a reservation's active bookings.
pub async fn extend_bookings(conn: &mut AnyConnection, id: &str, end_ms: i64) -> sqlx::Result<()> {
    for table in ["bookings", "host_bookings"] {
        sqlx::query(&format!(
            "UPDATE {table} SET end_ms = $1 WHERE reservation_id = $2 AND active = $3"
        ))
        .bind(end_ms)
        .bind(id)
        .bind(true)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The earliest start of another active booking of any of `units` on `node_id` that begins
/// at or after `from` and before `until`.
pub async fn next_booking_start(
    conn: &mut AnyConnection,
    id: &str,
    node_id: &str,
    units: &[String],
    from: i64,
    until: i64,
) -> Result<Option<i64>> {
    let sql = format!(
        "SELECT MIN(start_ms) FROM bookings
         WHERE active IS TRUE AND node_id = $1 AND reservation_id <> $2 AND start_ms >= $3 AND start_ms < $4
           AND unit_id IN ({})",
        placeholders(5, units.len())
    );
    let mut query = sqlx::query_scalar::<_, Option<i64>>(&sql)
        .bind(node_id)
        .bind(id)
        .bind(from)
        .bind(until);
    for unit in units {
        query = query.bind(unit);
    }
    Ok(query.fetch_one(conn).await?)
}

/// Adds `charge` to (or, negated, removes it from) a tenant's quota usage. With `limits`,
/// the addition only happens where it fits; returns the first resource that did not.
pub async fn apply_charge(
    conn: &mut AnyConnection,
    pool_id: &str,
    tenant_id: &str,
    charge: &BTreeMap<String, i64>,
    sign: i64,
    limits: Option<&BTreeMap<String, i64>>,
) -> Result<Option<String>> {
    let mut batch = Batch::on(conn);
    let resources = push_charge(&mut batch, (pool_id, tenant_id), charge, sign, limits);
    let rows = batch.execute(conn).await?;
    Ok(unfitting(resources, &rows))
}

/// Adds [`apply_charge`]'s writes to `batch`, one row each, and answers the resource each
/// writes, in order: [`unfitting`] tells from their counts which did not fit.
pub fn push_charge(
    batch: &mut Batch,
    (pool_id, tenant_id): (&str, &str),
    charge: &BTreeMap<String, i64>,
    sign: i64,
    limits: Option<&BTreeMap<String, i64>>,
) -> Vec<String> {
    let mut resources = Vec::new();
    for (resource, amount) in charge.iter().filter(|(_, a)| **a != 0) {
        let limit = limits.map(|l| l.get(resource).copied().unwrap_or(0));
        // A charge inserts the usage row or adds to it, only where it fits (usage is never
        // below 0, so a charge above the limit never fits); a refund takes from the row its
        // charge wrote.
        let sql = if sign * amount > 0 {
            "INSERT INTO quota_usage (pool_id, tenant_id, resource, used)
             SELECT $2, $3, $4, $1 WHERE $5 IS NULL OR $1 <= $5
             ON CONFLICT (pool_id, tenant_id, resource)
             DO UPDATE SET used = quota_usage.used + excluded.used
             WHERE $5 IS NULL OR quota_usage.used + excluded.used <= $5"
        } else {
            "UPDATE quota_usage SET used = used + $1
             WHERE pool_id = $2 AND tenant_id = $3 AND resource = $4 AND ($5 IS NULL OR used + $1 <= $5)"
        };
        batch.push(
            sql,
            vec![
                (sign * amount).into(),
                pool_id.into(),
                tenant_id.into(),
                resource.as_str().into(),
                limit.into(),
            ],
        );
        resources.push(resource.clone());
    }
    resources
}

/// The first of `resources` (as [`push_charge`] answered) whose write changed no row.
pub fn unfitting(resources: Vec<String>, rows: &[u64]) -> Option<String> {
    resources
        .into_iter()
        .zip(rows)
        .find(|(_, rows)| **rows == 0)
        .map(|(resource, _)| resource)
}
