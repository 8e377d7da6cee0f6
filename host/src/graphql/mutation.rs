//! Mutations: the main reservation actions, through the same domain functions as REST,
//! with the same validation, semantics and error codes.

use async_graphql::{Context, InputObject, Json, Object, Result};

use super::error::invalid_json;
use super::types::{ComputeReservation, Extended, NodeReservation};
use super::{app, caller};
use crate::booking::CreateRequest;
use crate::booking::create;
use crate::booking::extend::{self, ExtendInput};
use crate::booking::lifecycle::{self, ReservationRef};
use crate::node_reservations::actions::{self, Because, NewNodeReservation, ReleaseUnits};

pub struct Mutation;

/// A reservation of GPU units of a node for an audience (the REST body).
#[derive(InputObject)]
pub struct NewNodeReservationInput {
    pub unit_ids: Vec<String>,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Option<Vec<String>>,
    /// RFC 3339; defaults to now.
    pub starts_at: Option<String>,
    /// RFC 3339; omit for open-ended.
    pub ends_at: Option<String>,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
}

/// A compute reservation of a tenant (by default the caller's org).
#[derive(InputObject)]
pub struct ComputeReservationRef {
    pub tenant_id: Option<String>,
    pub reservation_id: String,
}

fn reference(ctx: &Context<'_>, r: ComputeReservationRef) -> Result<ReservationRef> {
    let caller = caller(ctx)?;
    Ok(ReservationRef {
        tenant_id: r.tenant_id.unwrap_or_else(|| caller.org_id.clone()),
        reservation_id: r.reservation_id,
    })
}

#[Object]
impl Mutation {
    /// Reserves GPU units of a node for orgs (platform admin); overlap is rejected.
    async fn create_node_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: String,
        input: NewNodeReservationInput,
    ) -> Result<NodeReservation> {
        let body = NewNodeReservation {
            unit_ids: input.unit_ids,
            allowed_org_ids: input.allowed_org_ids,
            managing_org_ids: input.managing_org_ids,
            starts_at: input.starts_at,
            ends_at: input.ends_at,
            contract_ref: input.contract_ref,
            reason: input.reason,
        };
        Ok(actions::create(app(ctx), caller(ctx)?, &node_id, body)
            .await?
            .into())
    }

    /// Releases reserved units to the spot market (double sell).
    async fn release_node_reservation_units(
        &self,
        ctx: &Context<'_>,
        node_id: String,
        id: String,
        unit_ids: Vec<String>,
        reason: Option<String>,
    ) -> Result<NodeReservation> {
        let body = ReleaseUnits { unit_ids, reason };
        Ok(
            actions::release(app(ctx), caller(ctx)?, &node_id, &id, body)
                .await?
                .into(),
        )
    }

    /// Ends a node reservation now (platform admin).
    async fn end_node_reservation(
        &self,
        ctx: &Context<'_>,
        node_id: String,
        id: String,
        reason: Option<String>,
    ) -> Result<NodeReservation> {
        Ok(
            actions::end(app(ctx), caller(ctx)?, &node_id, &id, Because { reason })
                .await?
                .into(),
        )
    }

    /// Books devices of one pool: `input` is the RPC's `create` body.
    async fn create_compute_reservation(
        &self,
        ctx: &Context<'_>,
        input: Json<serde_json::Value>,
    ) -> Result<ComputeReservation> {
        let request: CreateRequest =
            serde_json::from_value(input.0).map_err(|e| invalid_json(&e))?;
        Ok(create::create(app(ctx), caller(ctx)?, request)
            .await?
            .into())
    }

    /// Moves the end of a reservation later: `input` is the RPC's `extend` body.
    async fn extend_compute_reservation(
        &self,
        ctx: &Context<'_>,
        input: Json<serde_json::Value>,
    ) -> Result<Extended> {
        let input: ExtendInput = serde_json::from_value(input.0).map_err(|e| invalid_json(&e))?;
        Ok(extend::extend(app(ctx), caller(ctx)?, input).await?.into())
    }

    /// Ends a compute reservation now (a pending one is cancelled).
    async fn release_compute_reservation(
        &self,
        ctx: &Context<'_>,
        input: ComputeReservationRef,
    ) -> Result<ComputeReservation> {
        let reference = reference(ctx, input)?;
        Ok(lifecycle::release(app(ctx), caller(ctx)?, reference)
            .await?
            .into())
    }

    /// Withdraws a compute reservation that has not started.
    async fn cancel_compute_reservation(
        &self,
        ctx: &Context<'_>,
        input: ComputeReservationRef,
    ) -> Result<ComputeReservation> {
        let reference = reference(ctx, input)?;
        Ok(lifecycle::cancel(app(ctx), caller(ctx)?, reference)
            .await?
            .into())
    }
}
