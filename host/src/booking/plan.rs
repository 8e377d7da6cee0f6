//! `plan`: what `create` would do with a request now, step by step, without writing
//! anything: the IAM decision, the quota charge, the spend-guard's answer, the placement the
//! pool's placer chooses on the capacity view, and the spot work its preemptor would end.
//! The same reads and the same plugins decide as in `create`, so a plan and the create
//! right after it agree when nothing changed in between.

use serde::Serialize;

use super::availability::{BudgetCheck, QuotaCheck};
use super::create::{self, Context};
use super::engine::{CREATE, attributes, older_pending_exists};
use super::placement::Snapshot;
use super::store::{self, Member};
use super::{CreateRequest, State, host_resources, quota_charge, reservation_id};
use crate::iam::policy::{self, Decision};
use crate::iam::{Permission, Principal};
use crate::pools::PlacerMode;
use crate::{App, Error, Result};

/// What `create` would answer, and why.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The id the reservation gets.
    pub reservation_id: String,
    /// What `create` would answer: `placed`, `pending` or `queued` (a reservation), the
    /// state of the stored reservation a replay returns (`replayed`), or the error code
    /// (`ACCESS_DENIED`, `CONFIRMATION_REQUIRED`, `SPEND_LIMIT_REACHED`, `QUOTA_EXCEEDED`).
    pub outcome: String,
    /// The key was used before for this request: `create` returns that reservation, in this
    /// state, and decides nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<State>,
    /// IAM on the draft: `allow`, `deny`, or `needs-confirmation` (an agent's request a
    /// person of the tenant must approve). Absent for a replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iam: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaCheck>,
    /// Absent where neither the pool nor the offer asks for a budget check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetCheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementPlan>,
}

/// Where the pool's placer would put the request.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPlan {
    /// `placed`, `pending` or `queued`.
    pub state: &'static str,
    /// One member per node (a gang has several).
    pub members: Vec<Member>,
    /// The plugin that chose the units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placed_by: Option<String>,
    /// Spot reservations that would be ended (`preempted`) to make room.
    pub preempts: Vec<String>,
    /// The plugin that chose them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    /// Why it would wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `plan`: the steps of `create` for `request`, as they would go now.
pub async fn plan(app: &App, caller: &Principal, request: CreateRequest) -> Result<Plan> {
    request.validate()?;
    let binding = request.binding()?;
    if !(caller.has(Permission::ComputeCreate) && caller.acts_for(&request.tenant_id)) {
        return Err(Error::not_found(format_args!("pool {}", request.pool_id)));
    }
    let id = reservation_id(&request.tenant_id, &caller.key_id, &request.idempotency_key);
    let now = app.now_ms();
    let existing = {
        let mut conn = app.store.pool().acquire().await?;
        store::find(&mut conn, &id, "").await?
    };
    let mut plan = Plan {
        reservation_id: id.clone(),
        outcome: String::new(),
        replayed: None,
        iam: None,
        quota: None,
        budget: None,
        placement: None,
    };
    if let Some(existing) = &existing {
        create::check_replay(existing, &request)?;
        if !matches!(existing.state, State::Draft | State::AwaitingConfirmation) {
            plan.outcome = match existing.state {
                State::Denied => "ACCESS_DENIED".into(),
                _ => "replayed".into(),
            };
            plan.replayed = Some(existing.state);
            return Ok(plan);
        }
    }
    let Context {
        existing,
        confirmation,
        at,
        pool,
        offer,
        snapshot,
        policy: policy_text,
    } = create::read_context(app, existing, &request).await?;
    create::check_against_pool(&request, binding, &pool, &snapshot)?;
    let share = snapshot.per_gpu_share(&pool.policy);
    let region = (snapshot.nodes())
        .find_map(|n| n.region.clone())
        .unwrap_or_default();
    drop(snapshot);
    let mut r = match existing {
        Some(existing) => existing,
        None => create::new_draft(caller, &id, &request, binding, share, now)?,
    };
    let decision = match confirmation.as_deref() {
        Some("approved") => Decision::Allow,
        Some("pending") => Decision::NeedsConfirmation,
        Some(_) => Decision::Deny,
        None => {
            let attrs = attributes(&request, &r, &region);
            policy::decide(
                policy_text.as_deref(),
                caller,
                CREATE,
                (&id, &request.tenant_id),
                &attrs,
            )?
        }
    };
    plan.iam = Some(match decision {
        Decision::Allow => "allow",
        Decision::Deny => "deny",
        Decision::NeedsConfirmation => "needs-confirmation",
    });
    let mut conn = app.store.pool().acquire().await?;
    let (_, excess) = host_resources(request.gpu_count(), share, request.resources);
    let charge = quota_charge(&request, excess);
    let limits = offer.as_ref().map(|o| o.quota.clone()).unwrap_or_default();
    let used = crate::pools::store::quota_used(&mut conn, &pool.id, &request.tenant_id).await?;
    let quota = QuotaCheck::of(&charge, &limits, &used);
    plan.budget = create::budget_check(app, &mut conn, (&pool, at), offer.as_ref(), &r).await?;
    let queued = pool.policy.placer == PlacerMode::PoolLease;
    let placement = if queued && older_pending_exists(&mut conn, &r).await? {
        PlacementPlan {
            state: "queued",
            members: Vec::new(),
            placed_by: None,
            preempts: Vec::new(),
            preempted_by: None,
            reason: Some("waiting behind older reservations in the pool's queue".into()),
        }
    } else {
        drop(conn);
        place_plan(app, (&pool, at), &mut r, now).await?
    };
    plan.outcome = match decision {
        Decision::Deny => "ACCESS_DENIED".into(),
        Decision::NeedsConfirmation => "CONFIRMATION_REQUIRED".into(),
        Decision::Allow if plan.budget.as_ref().is_some_and(|b| !b.admits) => {
            "SPEND_LIMIT_REACHED".into()
        }
        Decision::Allow if !quota.admits => "QUOTA_EXCEEDED".into(),
        Decision::Allow => placement.state.into(),
    };
    plan.quota = Some(quota);
    plan.placement = Some(placement);
    Ok(plan)
}

/// Where the pool's placer would put `r`, decided as a create decides, on the view; when it
/// does not fit, the spot work the preemptor would end and the placement on what that
/// leaves.
async fn place_plan(
    app: &App,
    (pool, at): (&crate::pools::store::Pool, crate::settings::Version),
    r: &mut super::store::Reservation,
    now: i64,
) -> Result<PlacementPlan> {
    let snapshot = Snapshot::load(app, &pool.id, r, now).await?;
    let mut conn = app.store.pool().acquire().await?;
    let queued = pool.policy.placer == PlacerMode::PoolLease;
    let waiting = |reason: String| PlacementPlan {
        state: if queued { "queued" } else { "pending" },
        members: Vec::new(),
        placed_by: None,
        preempts: Vec::new(),
        preempted_by: None,
        reason: Some(reason),
    };
    let (reason, spot_nodes) =
        match super::place::decide_on(app, &mut conn, (pool, at), r, &snapshot).await? {
            super::place::Decided::Chosen(chosen) => {
                return Ok(PlacementPlan {
                    state: "placed",
                    members: chosen.members,
                    placed_by: Some(chosen.decided_by),
                    preempts: Vec::new(),
                    preempted_by: None,
                    reason: None,
                });
            }
            super::place::Decided::NoFit {
                reason,
                census,
                spot_nodes,
            } => (
                super::availability::explain_pending(&reason, census, r, &snapshot, now),
                spot_nodes,
            ),
        };
    if spot_nodes.is_empty() {
        return Ok(waiting(reason));
    }
    let Some(victims) = super::preempt::victims(app, &mut conn, (pool, at), r, &snapshot).await?
    else {
        return Ok(waiting(reason));
    };
    // Placed on what the victims leave, as a create places after ending them.
    let freed = snapshot.without(&victims.ids);
    let super::place::Decided::Chosen(chosen) =
        super::place::decide_on(app, &mut conn, (pool, at), r, &freed).await?
    else {
        return Ok(waiting(reason));
    };
    Ok(PlacementPlan {
        state: "placed",
        members: chosen.members,
        placed_by: Some(chosen.decided_by),
        preempts: victims.ids,
        preempted_by: Some(victims.decided_by),
        reason: None,
    })
}
