//! Queries: each calls the domain function its REST route calls, so visibility is the
//! same; lists are Relay connections capped at [`limits::MAX_PAGE_SIZE`].

use async_graphql::connection::Connection;
use async_graphql::{Context, Object, Result};

use super::error::invalid_json;
use super::types::{
    AuditEntry, Availability, Catalog, ComputeReservation, Earnings, Event, Node, NodeReservation,
    Offer, Plan, Plugin, Pool, PoolCapacity, TimelineRow, TimelineWindow, Viewer,
};
use super::{app, caller, limits, page};
use crate::booking::State;
use crate::booking::lifecycle::{self, ReservationRef};
use crate::booking::list::{self, ListInput, Scope};
use crate::fleet::{counts, timeline};
use crate::iam::{OPS_ORG, Permission};
use crate::inventory::nodes;
use crate::node_reservations::queries;
use crate::policy::registry;
use crate::pools::store;
use crate::{Error, audit, catalog, earnings, events, validation};

pub struct Query;

#[Object]
impl Query {
    /// The caller: its key, org and permissions.
    async fn viewer(&self, ctx: &Context<'_>) -> Result<Viewer> {
        Ok(Viewer::from(caller(ctx)?))
    }

    /// The earliest starts in a window at which a request fits, with the units it would get,
    /// and whether quota and budget would take it now: `input` is the RPC's `availability`
    /// body. Writes nothing.
    async fn availability(
        &self,
        ctx: &Context<'_>,
        input: async_graphql::Json<serde_json::Value>,
    ) -> Result<Availability> {
        let request = serde_json::from_value(input.0).map_err(|e| invalid_json(&e))?;
        Ok(
            crate::booking::availability::availability(app(ctx), caller(ctx)?, request)
                .await?
                .into(),
        )
    }

    /// What `createComputeReservation` would do now, step by step, writing nothing:
    /// `input` is the RPC's `plan` body (a create request).
    async fn plan(
        &self,
        ctx: &Context<'_>,
        input: async_graphql::Json<serde_json::Value>,
    ) -> Result<Plan> {
        let request = serde_json::from_value(input.0).map_err(|e| invalid_json(&e))?;
        Ok(crate::booking::plan::plan(app(ctx), caller(ctx)?, request)
            .await?
            .into())
    }

    /// The nodes an org owns (by default the caller's), by id.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn nodes(
        &self,
        ctx: &Context<'_>,
        org_id: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Node>> {
        let caller = caller(ctx)?;
        let org_id = org_id.unwrap_or_else(|| caller.org_id.clone());
        let first = page::by_id(first, after.as_deref())?;
        let nodes = nodes::list(app(ctx), caller, &org_id, after.as_deref(), first + 1).await?;
        let nodes = nodes.into_iter().map(Node::from).collect();
        Ok(page::of_read(nodes, first, after.is_some(), |n: &Node| {
            n.id.clone()
        }))
    }

    /// One node: readable by ops and the owning org.
    async fn node(&self, ctx: &Context<'_>, id: String) -> Result<Node> {
        Ok(nodes::get(app(ctx), caller(ctx)?, &id).await?.into())
    }

    /// Node reservations, newest first, a page at a time: those on `nodeId` the caller
    /// sees, or those whose audience includes `orgId` (exactly one of the two), optionally
    /// of one `status`.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn node_reservations(
        &self,
        ctx: &Context<'_>,
        node_id: Option<String>,
        org_id: Option<String>,
        status: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, NodeReservation>> {
        let (app, caller) = (app(ctx), caller(ctx)?);
        let status = queries::parse_status(status.as_deref())?;
        let first = page::by_id(first, after.as_deref())?;
        let before = after.as_deref();
        let (found, cursor) = match (node_id, org_id) {
            (Some(node_id), None) => {
                queries::page_for_node(app, caller, &node_id, status, before, first).await?
            }
            (None, Some(org_id)) => {
                queries::page_for_org(app, caller, &org_id, status, before, first).await?
            }
            _ => {
                return Err(
                    Error::invalid("nodeId", "give exactly one of nodeId and orgId").into(),
                );
            }
        };
        let found = found.into_iter().map(NodeReservation::from).collect();
        Ok(page::of_page(
            found,
            after.is_some(),
            cursor.is_some(),
            |r: &NodeReservation| r.id.clone(),
        ))
    }

    /// A tenant's compute reservations newest first, drafts skipped, filtered as the RPC's
    /// `list` (`scope` `mine` or `all`); `first` is 1-200.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    #[allow(clippy::too_many_arguments)]
    async fn compute_reservations(
        &self,
        ctx: &Context<'_>,
        tenant_id: Option<String>,
        scope: Option<String>,
        state: Option<String>,
        pool_id: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, ComputeReservation>> {
        let caller = caller(ctx)?;
        let scope = match scope.as_deref() {
            None | Some("mine") => Scope::Mine,
            Some("all") => Scope::All,
            Some(_) => return Err(Error::invalid("scope", "must be mine or all").into()),
        };
        let state = state
            .map(|s| {
                State::parse(&s)
                    .ok_or_else(|| Error::invalid("state", format!("unknown state {s:?}")))
            })
            .transpose()?;
        let after_given = after.is_some();
        let input = ListInput {
            tenant_id: tenant_id.unwrap_or_else(|| caller.org_id.clone()),
            scope: Some(scope),
            state,
            pool_id,
            limit: Some(i64::from(first.unwrap_or(limits::DEFAULT_PAGE_SIZE))),
            cursor: after,
        };
        let found = list::list(app(ctx), caller, input).await?;
        let has_next = found.cursor.is_some();
        let items = found
            .items
            .into_iter()
            .map(ComputeReservation::from)
            .collect();
        Ok(page::of_page(
            items,
            after_given,
            has_next,
            |r: &ComputeReservation| r.id.clone(),
        ))
    }

    /// One compute reservation of a tenant (by default the caller's org).
    async fn compute_reservation(
        &self,
        ctx: &Context<'_>,
        tenant_id: Option<String>,
        id: String,
    ) -> Result<ComputeReservation> {
        let caller = caller(ctx)?;
        let reference = ReservationRef {
            tenant_id: tenant_id.unwrap_or_else(|| caller.org_id.clone()),
            reservation_id: id,
        };
        Ok(lifecycle::get(app(ctx), caller, reference).await?.into())
    }

    /// The pools the caller owns or is offered (all of them, for platform operators), by
    /// id, a page at a time.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn pools(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Pool>> {
        let first = page::by_id(first, after.as_deref())?;
        let pools = store::list(app(ctx), caller(ctx)?, after.as_deref(), first + 1).await?;
        let pools = pools.into_iter().map(Pool::from).collect();
        Ok(page::of_read(pools, first, after.is_some(), |p: &Pool| {
            p.id.clone()
        }))
    }

    /// One pool the caller sees.
    async fn pool(&self, ctx: &Context<'_>, id: String) -> Result<Pool> {
        Ok(store::get(app(ctx), caller(ctx)?, &id).await?.into())
    }

    /// A pool's offers with quota used and remaining, by tenant id, a page at a time (the
    /// cursor is a tenant id): all for its managers, a tenant's own for a tenant.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn offers(
        &self,
        ctx: &Context<'_>,
        pool_id: String,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Offer>> {
        Offer::page(ctx, &pool_id, first, after).await
    }

    /// The units an org (by default the caller's) could place on now, per node, on the
    /// nodes of the pools it owns or is offered: `first` nodes (at most 500, default 50) by id
    /// after the node `after`; `cursor` continues it while nodes remain.
    async fn catalog(
        &self,
        ctx: &Context<'_>,
        org_id: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Catalog> {
        let caller = caller(ctx)?;
        let org_id = org_id.unwrap_or_else(|| caller.org_id.clone());
        let first = limits::page_size(first)?;
        if let Some(after) = &after {
            validation::id("after", after)?;
        }
        let found = catalog::page(app(ctx), caller, &org_id, after.as_deref(), first).await?;
        Ok(found.into())
    }

    /// A pool's nodes over `[from, to)` (epoch ms; by default 24 hours back to 7 days
    /// ahead, at most 31 days), one row per node by id: its sellable units (only those of
    /// `model` when given), the bookings the caller sees and the node reservation terms
    /// behind them. `node` keeps nodes whose id contains it. Bookings of other tenants show
    /// only to platform operators and, without their holder, to the node's owner.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    #[allow(clippy::too_many_arguments)]
    async fn timeline(
        &self,
        ctx: &Context<'_>,
        pool_id: String,
        from: Option<i64>,
        to: Option<i64>,
        model: Option<String>,
        node: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, TimelineRow, TimelineWindow>> {
        let now = app(ctx).now_ms();
        let after_given = after.is_some();
        let (from, to) = (
            from.unwrap_or(now - 24 * 3_600_000),
            to.unwrap_or(now + 7 * 24 * 3_600_000),
        );
        let query = timeline::Query {
            pool_id,
            from,
            to,
            model,
            node,
            first: limits::page_size(first)?,
            after,
        };
        let found = timeline::page(app(ctx), caller(ctx)?, query).await?;
        let mut connection = Connection::with_additional_fields(
            after_given,
            found.has_next,
            TimelineWindow {
                total_count: found.total as i64,
                from,
                to,
                now,
            },
        );
        connection.edges.extend(found.rows.into_iter().map(|row| {
            async_graphql::connection::Edge::new(row.node_id.clone(), TimelineRow::from(row))
        }));
        Ok(connection)
    }

    /// Sellable units by pool and model, counted by what holds them now and every 6 hours
    /// for the next 7 days, with their utilization over the last 24 hours: every pool the
    /// caller sees, or only `poolId`.
    async fn capacity(
        &self,
        ctx: &Context<'_>,
        pool_id: Option<String>,
    ) -> Result<Vec<PoolCapacity>> {
        let found = counts::pools(app(ctx), caller(ctx)?, pool_id.as_deref()).await?;
        Ok(found.into_iter().map(PoolCapacity::from).collect())
    }

    /// What a provider org earned, as `GET /v1/orgs/{orgId}/provider/earnings` shows it:
    /// for the org's members holding `provider.read`, and platform operators; anyone else
    /// is told the org does not exist. Amounts are integer minor units.
    async fn earnings(&self, ctx: &Context<'_>, org_id: String) -> Result<Earnings> {
        Ok(earnings::get(app(ctx), caller(ctx)?, &org_id).await?.into())
    }

    /// The plugins, built-in and uploaded, by id, a page at a time (the cursor is a plugin
    /// id), as `GET /v1/plugins` pages them: each with the pools it is assigned to (those
    /// the caller sees) and its decision counts.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn plugins(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Plugin>> {
        let first = page::by_id(first, after.as_deref())?;
        let plugins = registry::list(app(ctx), caller(ctx)?, after.as_deref(), first + 1).await?;
        let plugins = plugins.into_iter().map(Plugin::from).collect();
        Ok(page::of_read(
            plugins,
            first,
            after.is_some(),
            |p: &Plugin| p.id.clone(),
        ))
    }

    /// Events the caller's org may see, oldest first, after the `after` cursor.
    /// `hasNextPage` is true while more events follow the page.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn events(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Event>> {
        let first = limits::page_size(first)?;
        let after_given = after.is_some();
        let after = match after {
            Some(cursor) => cursor
                .parse::<i64>()
                .map_err(|_| Error::invalid("after", "not a cursor from this API"))?,
            None => 0,
        };
        let (found, more) = events::read(app(ctx), caller(ctx)?, after, first as i64).await?;
        let items = found.into_iter().map(Event::from).collect();
        Ok(page::of_page(items, after_given, more, |e: &Event| {
            e.id.to_string()
        }))
    }

    /// Audit entries, newest first: ops see every org's (or `orgId`'s), an org's auditors
    /// their own org's. `first` is 1-200.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn audit(
        &self,
        ctx: &Context<'_>,
        org_id: Option<String>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, AuditEntry>> {
        let caller = caller(ctx)?;
        let limit = i64::from(first.unwrap_or(limits::DEFAULT_PAGE_SIZE));
        validation::range("first", limit, 1, 200)?;
        let org_id = match org_id {
            Some(org) => {
                validation::id("orgId", &org)?;
                Some(org)
            }
            None if caller.is_ops() => None,
            None => Some(caller.org_id.clone()),
        };
        let scope = org_id.as_deref().unwrap_or(OPS_ORG);
        caller.require_for(
            Permission::AuditRead,
            scope,
            format_args!("audit trail of {scope}"),
        )?;
        let after_given = after.is_some();
        let before = after
            .map(|c| {
                c.parse::<i64>()
                    .map_err(|_| Error::invalid("after", "not a cursor from this API"))
            })
            .transpose()?;
        let mut found =
            audit::list(app(ctx).store.pool(), org_id.as_deref(), before, limit + 1).await?;
        let has_next = crate::store::cut(&mut found, limit as usize);
        let items = found.into_iter().map(AuditEntry::from).collect();
        Ok(page::of_page(
            items,
            after_given,
            has_next,
            |e: &AuditEntry| e.id.clone(),
        ))
    }
}
