//! Preemption: a request that is not spot and does not fit may terminate spot work in its
//! pool. The pool's preemptor plugin (the built-in default unless one is assigned) chooses
//! the victims among the spot bookings that hold units the request could use; the host
//! checks the answer, ends each victim as `released` with reason `preempted`, refunds its
//! quota, emits its event and audits the decision with the plugin that made it. The caller
//! runs this and the placement after it in one savepoint.

use crate::settings::Version;
use std::collections::HashSet;

use serde_json::json;
use sqlx::AnyConnection;

use super::State;
use super::lifecycle::terminate;
use super::placement::{Candidacy, Snapshot};
use super::store::{self, Reservation};
use crate::audit::{self, Entry};
use crate::iam::Principal;
use crate::placer::{Failure, FailureKind};
use crate::policy::{World, assignment};
use crate::pools::store::Pool;
use crate::{App, Error, Result};

/// The reason a preempted reservation records.
pub const PREEMPTED: &str = "preempted";

/// Terminates the spot work the pool's preemptor chooses, on `snapshot` (the one the failed
/// placement saw), so that `r` can fit. Answers
/// whether anything was terminated; `false` when no spot work could help.
pub(super) async fn make_room(
    app: &App,
    conn: &mut AnyConnection,
    (pool, at): (&Pool, Version),
    r: &Reservation,
    snapshot: &Snapshot,
    now: i64,
) -> Result<bool> {
    let Some(Victims {
        ids: victims,
        decided_by,
    }) = victims(app, conn, (pool, at), r, snapshot).await?
    else {
        return Ok(false);
    };
    let mut terminated = false;
    for victim_id in victims {
        let Some(mut victim) = store::find(conn, &victim_id, app.store.for_update()).await? else {
            continue;
        };
        if victim.state.is_terminal()
            || !terminate(conn, &mut victim, State::Released, PREEMPTED, now).await?
        {
            continue;
        }
        let entry = Entry {
            org_id: &pool.owner_org_id,
            action: "compute-reservation.preempt",
            object_type: "compute-reservation",
            object_id: &victim_id,
            reason: None,
            details: Some(json!({
                "reason": PREEMPTED,
                "preemptedFor": r.id,
                "decidedBy": decided_by,
                "tenantId": victim.tenant_id,
                "unitIds": victim.unit_ids,
            })),
        };
        audit::record(conn, &Principal::system(), entry, now).await?;
        terminated = true;
    }
    Ok(terminated)
}

/// The spot reservations the pool's preemptor would end so that `r` fits, and the plugin
/// that chose them.
pub(super) struct Victims {
    pub ids: Vec<String>,
    pub decided_by: String,
}

/// What the pool's preemptor chooses on `snapshot` for `r`, its answer checked; `None` when
/// no spot work could help. Writes nothing.
pub(super) async fn victims(
    app: &App,
    conn: &mut AnyConnection,
    (pool, at): (&Pool, Version),
    r: &Reservation,
    snapshot: &Snapshot,
) -> Result<Option<Victims>> {
    let offer = snapshot.candidates(r, true, None);
    if offer.spot.is_empty() {
        return Ok(None);
    }
    let preemptor = assignment::resolve(app, conn, at, &pool.id, World::Preemptor).await?;
    let decide = async |loaded: &crate::policy::Loaded| {
        let started = std::time::Instant::now();
        let outcome = (app.policy.preempt(
            loaded,
            &offer.request,
            &offer.candidates,
            &|c| snapshot.facts(c),
            &offer.spot,
            preemptor.config.as_ref(),
            preemptor.deadline_ms,
        ))
        .await
        .and_then(|answer| match answer {
            Ok(ids) => check_victims(&offer, &ids)
                .map(|()| Ok(ids))
                .map_err(|message| Failure {
                    plugin_id: loaded.id.clone(),
                    kind: FailureKind::InvalidAnswer,
                    message,
                }),
            Err(reason) => Ok(Err(reason)),
        });
        let label = match &outcome {
            Ok(Ok(ids)) if ids.is_empty() => "nothing",
            Ok(Ok(_)) => "preempted",
            Ok(Err(_)) => "unsatisfiable",
            Err(failure) => {
                app.metrics
                    .observe_policy_failure(&loaded.id, "preemptor", failure.kind.as_str());
                failure.kind.as_str()
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        app.metrics
            .observe_decision(&loaded.id, "preemptor", label, seconds);
        outcome
    };
    let (victims, decided_by) = match decide(&preemptor.loaded).await {
        Ok(answer) => (answer, preemptor.loaded.id.clone()),
        Err(failure) if preemptor.fallback => {
            tracing::warn!(plugin = %failure.plugin_id, kind = failure.kind.as_str(), message = %failure.message, "preemption plugin failed; using the built-in default");
            let default = app
                .policy
                .default_for(World::Preemptor)
                .ok_or_else(|| anyhow::anyhow!("no built-in preemptor"))?;
            (
                decide(&default).await.map_err(Error::PolicyFailed)?,
                default.id.clone(),
            )
        }
        Err(failure) => return Err(Error::PolicyFailed(failure)),
    };
    let Ok(victims) = victims else {
        return Ok(None);
    };
    Ok(Some(Victims {
        ids: (victims.iter())
            .map(|id| offer.spot_reservations[*id as usize].clone())
            .collect(),
        decided_by,
    }))
}

/// Checks a preemptor's answer: each id names one of the offered spot bookings, once.
fn check_victims(offer: &Candidacy, ids: &[u32]) -> std::result::Result<(), String> {
    let mut seen = HashSet::new();
    for id in ids {
        if *id as usize >= offer.spot.len() {
            return Err(format!("spot booking {id} was not offered"));
        }
        if !seen.insert(id) {
            return Err(format!("spot booking {id} chosen twice"));
        }
    }
    Ok(())
}
