//! Reading node reservations: by node, by id, by audience, and the catalog of what an org
//! may place on now. Visibility is decided by the rules in the parent module.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{Lifecycle, Rights, Status, Term, may_read};
use crate::clock::{format_ms, parse_rfc3339};
use crate::iam::{Permission, Principal};
use crate::inventory::nodes::{self, Node};
use crate::store::{flag, json_strings};
use crate::{App, Error, Result};

/// Exclusive placement rights for a set of orgs over specific GPU units of one node, for a
/// term. Scoped to units, not GPU counts, because units are the indivisible allocation
/// primitive.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReservation {
    pub id: String,
    pub node_id: String,
    pub reserved_unit_ids: Vec<String>,
    /// The subset of `reservedUnitIds` currently on the spot market (double sell).
    pub released_unit_ids: Vec<String>,
    /// The audience: orgs that may place workloads on the reserved units.
    pub allowed_org_ids: Vec<String>,
    /// Orgs that may release, reclaim and terminate spot work on these units while the
    /// reservation is active and inside its term.
    pub managing_org_ids: Vec<String>,
    pub starts_at: String,
    /// Absent = open-ended until cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<String>,
    pub status: Status,
    /// Node topology generation this reservation was written against.
    pub topology_gen: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// Reclaim only: spot workloads (compute reservation ids) terminated to free the
    /// reclaimed units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminated: Option<Vec<String>>,
    /// Reclaim only: workloads left running because they are not spot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Vec<String>>,
    /// Reclaim dry run only: the spot workloads the call would terminate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_terminate: Option<Vec<String>>,
    /// Reclaim dry run only: the workloads that would be left running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub would_skip: Option<Vec<String>>,
}

/// A reservation as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub node_id: String,
    pub unit_ids: Vec<String>,
    pub released_unit_ids: Vec<String>,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Vec<String>,
    pub term: Term,
    pub lifecycle: Lifecycle,
    pub topology_gen: i64,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Record {
    pub fn status(&self, now: i64) -> Status {
        super::status(self.lifecycle, self.term, now)
    }

    pub fn rights(&self, now: i64) -> Rights {
        Rights {
            id: self.id.clone(),
            status: self.status(now),
            term: self.term,
            allowed_org_ids: self.allowed_org_ids.clone(),
            managing_org_ids: self.managing_org_ids.clone(),
            released_unit_ids: self.released_unit_ids.clone(),
        }
    }

    pub fn view(&self, now: i64) -> NodeReservation {
        NodeReservation {
            id: self.id.clone(),
            node_id: self.node_id.clone(),
            reserved_unit_ids: self.unit_ids.clone(),
            released_unit_ids: self.released_unit_ids.clone(),
            allowed_org_ids: self.allowed_org_ids.clone(),
            managing_org_ids: self.managing_org_ids.clone(),
            starts_at: format_ms(self.term.starts_at),
            ends_at: self.term.ends_at.map(format_ms),
            status: self.status(now),
            topology_gen: self.topology_gen,
            contract_ref: self.contract_ref.clone(),
            reason: self.reason.clone(),
            created_at: format_ms(self.created_at),
            updated_at: format_ms(self.updated_at),
            terminated: None,
            skipped: None,
            would_terminate: None,
            would_skip: None,
        }
    }

    /// Orgs that hear about changes to this reservation (besides the platform operators).
    pub fn interested_orgs<'a>(&'a self, node_owner: &'a str) -> Vec<&'a str> {
        let mut orgs = vec![node_owner];
        for org in self.allowed_org_ids.iter().chain(&self.managing_org_ids) {
            if !orgs.contains(&org.as_str()) {
                orgs.push(org);
            }
        }
        orgs
    }
}

/// Which reservations to load.
pub enum Filter<'a> {
    Id(&'a str),
    Node(&'a str),
    /// Those whose audience text mentions the org (refined exactly after loading).
    Audience(&'a str),
}

/// Loads reservations and their units, newest first.
pub async fn load(conn: &mut AnyConnection, filter: Filter<'_>, lock: &str) -> Result<Vec<Record>> {
    let (clause, arg) = match filter {
        Filter::Id(id) => ("id = $1", id.to_string()),
        Filter::Node(node) => ("node_id = $1", node.to_string()),
        Filter::Audience(org) => ("allowed_org_ids LIKE $1", format!("%\"{org}\"%")),
    };
    let reservations_sql = format!(
        "SELECT id, node_id, allowed_org_ids, managing_org_ids, starts_at, ends_at, lifecycle, topology_gen,
                contract_ref, reason, created_at, updated_at
         FROM node_reservations WHERE {clause} ORDER BY created_at DESC, id DESC{lock}"
    );
    let units_sql = format!(
        "SELECT reservation_id, unit_id, released FROM node_reservation_units
         WHERE reservation_id IN (SELECT id FROM node_reservations WHERE {clause})
         ORDER BY reservation_id, position"
    );
    let reservations = sqlx::query(&reservations_sql)
        .bind(&arg)
        .fetch_all(&mut *conn)
        .await?;
    // Units of reservations this read did not return would be passed over anyway.
    if reservations.is_empty() {
        return Ok(Vec::new());
    }
    let units = sqlx::query(&units_sql)
        .bind(&arg)
        .fetch_all(&mut *conn)
        .await?;
    assemble(&reservations, &units)
}

/// Reservation rows with their unit rows (in position order) as records.
fn assemble(reservations: &[AnyRow], units: &[AnyRow]) -> Result<Vec<Record>> {
    let mut by_reservation: HashMap<String, (Vec<String>, Vec<String>)> = HashMap::new();
    for row in units {
        let entry = by_reservation.entry(row.get("reservation_id")).or_default();
        let unit: String = row.get("unit_id");
        if flag(row, "released") {
            entry.1.push(unit.clone());
        }
        entry.0.push(unit);
    }
    reservations
        .iter()
        .map(|row| {
            let (unit_ids, released) = by_reservation
                .remove(&row.get::<String, _>("id"))
                .unwrap_or_default();
            record_from_row(row, unit_ids, released)
        })
        .collect()
}

/// The reservations on `node_ids` that are not cancelled (the capacity view's claims).
pub async fn live_on_nodes(conn: &mut AnyConnection, node_ids: &[String]) -> Result<Vec<Record>> {
    if node_ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = crate::store::placeholders(1, node_ids.len());
    let clause = format!("lifecycle <> 'cancelled' AND node_id IN ({list})");
    let reservations_sql = format!(
        "SELECT id, node_id, allowed_org_ids, managing_org_ids, starts_at, ends_at, lifecycle, topology_gen,
                contract_ref, reason, created_at, updated_at
         FROM node_reservations WHERE {clause}"
    );
    let units_sql = format!(
        "SELECT reservation_id, unit_id, released FROM node_reservation_units
         WHERE reservation_id IN (SELECT id FROM node_reservations WHERE {clause})
         ORDER BY reservation_id, position"
    );
    let mut rows = sqlx::query(&reservations_sql);
    let mut unit_rows = sqlx::query(&units_sql);
    for id in node_ids {
        rows = rows.bind(id);
        unit_rows = unit_rows.bind(id);
    }
    let rows = rows.fetch_all(&mut *conn).await?;
    let units = unit_rows.fetch_all(&mut *conn).await?;
    assemble(&rows, &units)
}

fn record_from_row(
    r: &AnyRow,
    unit_ids: Vec<String>,
    released_unit_ids: Vec<String>,
) -> Result<Record> {
    let lifecycle: String = r.get("lifecycle");
    Ok(Record {
        id: r.get("id"),
        node_id: r.get("node_id"),
        unit_ids,
        released_unit_ids,
        allowed_org_ids: json_strings(&r.get::<String, _>("allowed_org_ids")),
        managing_org_ids: json_strings(&r.get::<String, _>("managing_org_ids")),
        term: Term {
            starts_at: r.get("starts_at"),
            ends_at: r.get("ends_at"),
        },
        lifecycle: Lifecycle::parse(&lifecycle)
            .ok_or_else(|| anyhow::anyhow!("stored lifecycle {lifecycle:?}"))?,
        topology_gen: r.get("topology_gen"),
        contract_ref: r.get("contract_ref"),
        reason: r.get("reason"),
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
    })
}

/// A node and the reservations on it the caller may see, if it may read the node's
/// reservations at all; otherwise the node is not found.
pub async fn node_for_reader(
    app: &App,
    conn: &mut AnyConnection,
    caller: &Principal,
    node_id: &str,
) -> Result<(Node, Vec<Record>)> {
    let now = app.now_ms();
    let not_found = || Error::not_found(format_args!("node {node_id}"));
    let node = nodes::find(conn, node_id).await?.ok_or_else(not_found)?;
    let records = load(conn, Filter::Node(node_id), "").await?;
    let rights: Vec<Rights> = records.iter().map(|r| r.rights(now)).collect();
    if !may_read(caller, &node.org_id, &rights) {
        return Err(not_found());
    }
    let records = records
        .into_iter()
        .zip(&rights)
        .filter(|(_, rights)| sees(caller, &node.org_id, rights))
        .map(|(record, _)| record)
        .collect();
    Ok((node, records))
}

/// Whether a caller who may read a node's reservations sees `reservation` among them:
/// platform operators and the node's owner see every one; an org that reads because it
/// manages reservations there sees only those it manages now (active and inside their
/// term), not other tenants' audiences, contracts or reasons.
fn sees(caller: &Principal, node_owner: &str, reservation: &Rights) -> bool {
    caller.acts_for(node_owner) || reservation.managed_by(&caller.org_id)
}

/// The reservations on a node the caller sees, newest first: every one for platform
/// operators and the node's owner, those it manages for a managing org.
pub async fn list_for_node(
    app: &App,
    caller: &Principal,
    node_id: &str,
) -> Result<Vec<NodeReservation>> {
    let mut conn = app.store.pool().acquire().await?;
    let (_, records) = node_for_reader(app, &mut conn, caller, node_id).await?;
    let now = app.now_ms();
    Ok(records.iter().map(|r| r.view(now)).collect())
}

/// One reservation on a node.
pub async fn get(
    app: &App,
    caller: &Principal,
    node_id: &str,
    id: &str,
) -> Result<NodeReservation> {
    let mut conn = app.store.pool().acquire().await?;
    let (_, records) = node_for_reader(app, &mut conn, caller, node_id).await?;
    records
        .iter()
        .find(|r| r.id == id)
        .map(|r| r.view(app.now_ms()))
        .ok_or_else(|| Error::not_found(format_args!("reservation {id} on node {node_id}")))
}

/// The reservations whose audience includes `org_id`, newest first, optionally of one
/// status. Readable by the org's members and platform operators.
pub async fn list_for_org(
    app: &App,
    caller: &Principal,
    org_id: &str,
    status: Option<Status>,
) -> Result<Vec<NodeReservation>> {
    crate::iam::orgs::require(app, caller, Permission::ReservationRead, org_id).await?;
    let mut conn = app.store.pool().acquire().await?;
    let now = app.now_ms();
    Ok(load(&mut conn, Filter::Audience(org_id), "")
        .await?
        .iter()
        .filter(|r| r.allowed_org_ids.iter().any(|o| o == org_id))
        .map(|r| r.view(now))
        .filter(|v| status.is_none_or(|s| v.status == s))
        .collect())
}

/// One page of the reservations whose audience includes `org_id`, newest first (by id,
/// which is time-ordered): at most `limit` of those older than the reservation `before`,
/// optionally of one status, read as one page from the database; and the cursor of the
/// next page while more remain. Readable by the org's members and platform operators.
pub async fn page_for_org(
    app: &App,
    caller: &Principal,
    org_id: &str,
    status: Option<Status>,
    before: Option<&str>,
    limit: usize,
) -> Result<(Vec<NodeReservation>, Option<String>)> {
    crate::iam::orgs::require(app, caller, Permission::ReservationRead, org_id).await?;
    let mut conn = app.store.pool().acquire().await?;
    let page = Page {
        clause: "allowed_org_ids LIKE $1",
        args: vec![mentioning(org_id)],
        status,
        before,
        limit,
    };
    // `LIKE` reads `_` as any character: the audience is checked exactly after the read.
    read_page(app, &mut conn, page, |r| {
        r.allowed_org_ids.iter().any(|o| o == org_id)
    })
    .await
}

/// One page of the reservations on `node_id` the caller sees, newest first (by id), as
/// [`page_for_org`] reads them: every one for platform operators and the node's owner, for
/// a managing org those it manages now. Whether a managing org may read the node's
/// reservations at all is read from the ones it manages, not from every one on the node.
pub async fn page_for_node(
    app: &App,
    caller: &Principal,
    node_id: &str,
    status: Option<Status>,
    before: Option<&str>,
    limit: usize,
) -> Result<(Vec<NodeReservation>, Option<String>)> {
    let not_found = || Error::not_found(format_args!("node {node_id}"));
    let mut conn = app.store.pool().acquire().await?;
    let node = nodes::find(&mut conn, node_id)
        .await?
        .ok_or_else(not_found)?;
    if !caller.has(Permission::ReservationRead) {
        return Err(not_found());
    }
    let mut page = Page {
        clause: "node_id = $1",
        args: vec![node_id.to_string()],
        status,
        before,
        limit,
    };
    if caller.acts_for(&node.org_id) {
        return read_page(app, &mut conn, page, |_| true).await;
    }
    // A managing org sees what it manages now: active reservations that name it.
    page.clause = "node_id = $1 AND managing_org_ids LIKE $2";
    page.args.push(mentioning(&caller.org_id));
    let now = app.now_ms();
    let manages = |r: &Record| r.rights(now).managed_by(&caller.org_id);
    let any = Page {
        status: Some(Status::Active),
        before: None,
        limit: 1,
        ..page.clone()
    };
    if read_page(app, &mut conn, any, manages).await?.0.is_empty() {
        return Err(not_found());
    }
    if status.is_some_and(|s| s != Status::Active) {
        return Ok((Vec::new(), None));
    }
    page.status = Some(Status::Active);
    read_page(app, &mut conn, page, manages).await
}

/// `LIKE` text matching a JSON array of strings that holds `id`.
fn mentioning(id: &str) -> String {
    format!("%\"{id}\"%")
}

/// Which reservations a page reads: those `clause` selects (its `args` bound as `$1`…),
/// optionally of one `status`, older than the reservation `before`, at most `limit`.
#[derive(Clone)]
struct Page<'a> {
    clause: &'a str,
    args: Vec<String>,
    status: Option<Status>,
    before: Option<&'a str>,
    limit: usize,
}

/// The SQL condition that a reservation has `status` at the instant bound as `now` (a
/// placeholder): what [`super::status`] computes, in SQL.
fn status_clause(status: Option<Status>, now: &str) -> String {
    let open = format!("(ends_at IS NULL OR ends_at > {now})");
    match status {
        None => String::new(),
        Some(Status::Cancelled) => " AND lifecycle = 'cancelled'".to_string(),
        Some(Status::Expired) => {
            format!(" AND lifecycle <> 'cancelled' AND ends_at IS NOT NULL AND ends_at <= {now}")
        }
        Some(Status::NeedsReview) => format!(" AND lifecycle = 'needs-review' AND {open}"),
        Some(Status::Pending) => {
            format!(" AND lifecycle = 'granted' AND {open} AND starts_at > {now}")
        }
        Some(Status::Active) => {
            format!(" AND lifecycle = 'granted' AND {open} AND starts_at <= {now}")
        }
    }
}

/// Reads one page newest first (by id) and the cursor of the next while more remain.
/// `keep` checks each reservation read exactly, so a page may hold fewer than `limit`
/// while its cursor goes on from where the read stopped.
async fn read_page(
    app: &App,
    conn: &mut AnyConnection,
    page: Page<'_>,
    keep: impl Fn(&Record) -> bool,
) -> Result<(Vec<NodeReservation>, Option<String>)> {
    let now = app.now_ms();
    let n = page.args.len();
    let (before_at, limit_at, now_at) = (n + 1, n + 2, n + 3);
    let sql = format!(
        "SELECT id, node_id, allowed_org_ids, managing_org_ids, starts_at, ends_at, lifecycle, topology_gen,
                contract_ref, reason, created_at, updated_at
         FROM node_reservations
         WHERE {} AND (${before_at} = '' OR id < ${before_at}){}
         ORDER BY id DESC LIMIT ${limit_at}",
        page.clause,
        status_clause(page.status, &format!("${now_at}"))
    );
    let mut query = sqlx::query(&sql);
    for arg in &page.args {
        query = query.bind(arg);
    }
    query = query
        .bind(page.before.unwrap_or(""))
        .bind(page.limit as i64 + 1);
    if page.status.is_some() {
        query = query.bind(now);
    }
    let mut rows = query.fetch_all(&mut *conn).await?;
    let more = crate::store::cut(&mut rows, page.limit);
    let cursor = more
        .then(|| rows.last().map(|r| r.get::<String, _>("id")))
        .flatten();
    if rows.is_empty() {
        return Ok((Vec::new(), cursor));
    }
    let ids: Vec<String> = rows.iter().map(|r| r.get("id")).collect();
    let units_sql = format!(
        "SELECT reservation_id, unit_id, released FROM node_reservation_units
         WHERE reservation_id IN ({}) ORDER BY reservation_id, position",
        crate::store::placeholders(1, ids.len())
    );
    let mut units = sqlx::query(&units_sql);
    for id in &ids {
        units = units.bind(id);
    }
    let units = units.fetch_all(&mut *conn).await?;
    let items = assemble(&rows, &units)?
        .iter()
        .filter(|r| keep(r))
        .map(|r| r.view(now))
        .filter(|v| page.status.is_none_or(|s| v.status == s))
        .collect();
    Ok((items, cursor))
}

/// Parses an optional `status` filter.
pub fn parse_status(value: Option<&str>) -> Result<Option<Status>> {
    value
        .map(|s| {
            Status::parse(s).ok_or_else(|| {
                Error::invalid(
                    "status",
                    "must be pending, active, expired, cancelled or needs-review",
                )
            })
        })
        .transpose()
}

/// Parses an RFC 3339 instant of `field`.
pub fn parse_instant(field: &str, value: &str) -> Result<i64> {
    parse_rfc3339(value)
        .ok_or_else(|| Error::invalid(field, format!("{value:?} is not an RFC 3339 timestamp")))
}
