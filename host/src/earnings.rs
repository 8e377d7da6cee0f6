//! Metering, provider earnings and payouts.
//!
//! Money is always an integer number of minor currency units (`i64`, products in `i128`);
//! nothing here is ever a floating-point number.
//!
//! # Accrual
//!
//! A booking row holds one unit over `[start_ms, end_ms)`; a reservation that ends early
//! has its rows clamped to the release instant, so a row always describes the time its
//! unit was really held. At an instant `now` a row has accrued
//! `max(0, min(end_ms, now) - start_ms)` milliseconds.
//!
//! Each row carries `price_per_gpu_hour_minor`, the price of the tenant's offer for the
//! pool when the unit was booked (an offer without a price books at 0). Extending a
//! reservation keeps that price; changing the offer only prices later bookings. Spot
//! bookings are priced at the same offer price.
//!
//! Only units whose device class is `gpu` (whole GPUs) are billed; other device classes
//! (`gpu.mig`, `gpu.slot`, `nic.vf`, `disk`, `node`) are not billed yet and do not appear in
//! earnings. The unit's device class and model are frozen on the row when it is booked, so
//! replacing a node's inventory never drops or re-labels past bookings (rows booked before
//! these terms were stored read the node's current inventory).
//!
//! # Parts and rounding
//!
//! The accrued interval of a row is split at UTC midnights into *parts*, one per UTC day.
//! Each part is rounded on its own, always down:
//!
//! - `grossMinor` of a part = `floor(price_per_gpu_hour_minor × part_ms / 3_600_000)`;
//! - `earnedMinor` of a part = `floor(grossMinor × share / 10_000)`, with the row's share;
//! - `gpuSeconds` of a part = `floor(part_ms / 1_000)`.
//!
//! Every figure of the earnings view (the totals and each row of `byNode`, `byModel` and
//! `byDay`) is the sum of the figures of the parts it covers, so each breakdown adds up
//! exactly to the totals. For a row within one UTC day this is simply
//! `floor(price × accrued_ms / 1h)`. Because parts only grow as time passes and floors are
//! monotone, a provider's earnings never decrease while the share stays the same.
//!
//! A row's share is the server's `--provider-share-bps` when the unit was booked (basis
//! points, default 8000 = 80 %); the remainder of the gross is the platform's. Changing the
//! setting applies to later bookings only and never re-rates what was booked before.
//!
//! # Payouts
//!
//! `availableMinor = earnedMinor - paidOutMinor`. A payout (platform operators only) is
//! written in the same transaction that computes what is available, with the org's row
//! locked, so concurrent payouts for one org never pay out more than was earned.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{AnyConnection, Row as _};

use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::ids::new_id;
use crate::{App, Error, Result, events, validation};

/// One hour in milliseconds: the unit prices are quoted per.
pub const HOUR_MS: i64 = 3_600_000;
/// One UTC day in milliseconds.
pub const DAY_MS: i64 = 86_400_000;
/// Basis points in a whole.
pub const FULL_SHARE_BPS: u32 = 10_000;
/// The provider's share unless the server is told otherwise: 80 %.
pub const DEFAULT_PROVIDER_SHARE_BPS: u32 = 8_000;
/// How many payouts the earnings view lists.
pub const RECENT_PAYOUTS: i64 = 20;
/// The longest payout reference.
pub const MAX_REFERENCE: usize = 256;
/// The event a payout emits.
pub const PAYOUT_EVENT: &str = "provider.payout";

/// Milliseconds a booking over `[start_ms, end_ms)` has accrued at `now`:
/// `max(0, min(end_ms, now) - start_ms)`.
pub fn accrued_ms(start_ms: i64, end_ms: i64, now: i64) -> i64 {
    end_ms.min(now).saturating_sub(start_ms).max(0)
}

/// Splits `[from, to)` at UTC midnights into `(day, milliseconds)` pieces in time order,
/// where `day` counts UTC days since the Unix epoch. Empty when `to <= from`.
pub fn split_by_utc_day(from: i64, to: i64) -> Vec<(i64, i64)> {
    let mut pieces = Vec::new();
    let mut at = from;
    while at < to {
        let day = at.div_euclid(DAY_MS);
        let next_midnight = (day + 1).saturating_mul(DAY_MS);
        let until = to.min(next_midnight);
        pieces.push((day, until - at));
        at = until;
    }
    pieces
}

/// The charge of one GPU for `ms` milliseconds at `price_per_gpu_hour_minor`, rounded down
/// to the minor unit: `floor(price × ms / 3_600_000)`. Negative inputs charge nothing.
pub fn charge_minor(price_per_gpu_hour_minor: i64, ms: i64) -> i64 {
    if price_per_gpu_hour_minor <= 0 || ms <= 0 {
        return 0;
    }
    let amount = i128::from(price_per_gpu_hour_minor) * i128::from(ms) / i128::from(HOUR_MS);
    i64::try_from(amount).unwrap_or(i64::MAX)
}

/// The provider's share of `amount_minor` at `share_bps` basis points, rounded down:
/// `floor(amount × share_bps / 10_000)`. The rounding remainder stays with the platform.
pub fn provider_share_minor(amount_minor: i64, share_bps: u32) -> i64 {
    if amount_minor <= 0 {
        return 0;
    }
    let bps = i128::from(share_bps.min(FULL_SHARE_BPS));
    let share = i128::from(amount_minor) * bps / i128::from(FULL_SHARE_BPS);
    i64::try_from(share).unwrap_or(i64::MAX)
}

/// A booking of a GPU unit on one of the provider's nodes, as metering reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeteredBooking {
    pub node_id: String,
    pub model: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub price_per_gpu_hour_minor: i64,
    /// The provider's share, in basis points, frozen when the unit was booked.
    pub share_bps: u32,
}

/// What a booking accrued on one UTC day, each figure rounded down on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// UTC days since the Unix epoch.
    pub day: i64,
    pub ms: i64,
    pub gross_minor: i64,
    pub earned_minor: i64,
    pub gpu_seconds: i64,
}

/// The parts of `booking` accrued by `now`, at its share.
pub fn parts(booking: &MeteredBooking, now: i64) -> Vec<Part> {
    let held_until = booking.start_ms + accrued_ms(booking.start_ms, booking.end_ms, now);
    split_by_utc_day(booking.start_ms, held_until)
        .into_iter()
        .map(|(day, ms)| {
            let gross_minor = charge_minor(booking.price_per_gpu_hour_minor, ms);
            Part {
                day,
                ms,
                gross_minor,
                earned_minor: provider_share_minor(gross_minor, booking.share_bps),
                gpu_seconds: ms / 1_000,
            }
        })
        .collect()
}

/// Sums of parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Amounts {
    /// What tenants were charged, in minor units.
    pub gross_minor: i64,
    /// The provider's share of it, in minor units.
    pub earned_minor: i64,
    /// GPU time accrued, in whole seconds.
    pub gpu_seconds: i64,
}

impl Amounts {
    fn add(&mut self, part: &Part) {
        self.gross_minor = self.gross_minor.saturating_add(part.gross_minor);
        self.earned_minor = self.earned_minor.saturating_add(part.earned_minor);
        self.gpu_seconds = self.gpu_seconds.saturating_add(part.gpu_seconds);
    }
}

/// The totals and the three breakdowns of a set of bookings at `now`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub total: Amounts,
    pub by_node: BTreeMap<String, Amounts>,
    pub by_model: BTreeMap<String, Amounts>,
    /// Keyed by UTC days since the Unix epoch.
    pub by_day: BTreeMap<i64, Amounts>,
}

/// Meters `bookings` at `now`: every figure is a sum of parts (see the module docs), so
/// each breakdown adds up to the totals exactly.
pub fn summarize(bookings: &[MeteredBooking], now: i64) -> Summary {
    let mut summary = Summary::default();
    for booking in bookings {
        for part in parts(booking, now) {
            summary.total.add(&part);
            summary
                .by_node
                .entry(booking.node_id.clone())
                .or_default()
                .add(&part);
            summary
                .by_model
                .entry(booking.model.clone())
                .or_default()
                .add(&part);
            summary.by_day.entry(part.day).or_default().add(&part);
        }
    }
    summary
}

/// `YYYY-MM-DD` of a UTC day counted from the Unix epoch.
pub fn format_day(day: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(day.saturating_mul(DAY_MS))
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}

/// What a provider org earned, as the API shows it. Amounts are integer minor units.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Earnings {
    pub org_id: String,
    /// Always `minor units`: every amount is an integer count of the currency's minor unit.
    pub currency: String,
    /// The instant the figures are computed at (RFC 3339, UTC).
    pub as_of: String,
    /// What tenants were charged for GPU time on the org's nodes.
    pub gross_minor: i64,
    /// The org's share of the gross: the sum of the per-part rounded-down shares.
    pub earned_minor: i64,
    /// The sum of the org's payouts.
    pub paid_out_minor: i64,
    /// `earnedMinor - paidOutMinor`: what a payout may take now.
    pub available_minor: i64,
    /// The provider's share, in basis points (8000 = 80 %), of what is booked from now on;
    /// earlier bookings keep the share they were booked at.
    pub provider_share_bps: u32,
    /// GPU time accrued on the org's nodes, in whole seconds (summed per part).
    pub gpu_seconds: i64,
    /// Compute reservations holding a unit of the org's nodes at `asOf`.
    pub active_rentals: i64,
    /// Per node that accrued GPU time, by node id.
    pub by_node: Vec<NodeAmounts>,
    /// Per GPU model that accrued GPU time, by model.
    pub by_model: Vec<ModelAmounts>,
    /// Per UTC day that accrued GPU time, oldest first.
    pub by_day: Vec<DayAmounts>,
    /// The last payouts, newest first (at most 20).
    pub recent_payouts: Vec<Payout>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAmounts {
    pub node_id: String,
    #[serde(flatten)]
    pub amounts: Amounts,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelAmounts {
    pub model: String,
    #[serde(flatten)]
    pub amounts: Amounts,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DayAmounts {
    /// The UTC date, `YYYY-MM-DD`.
    pub day: String,
    #[serde(flatten)]
    pub amounts: Amounts,
}

/// Money paid out to a provider org.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Payout {
    /// `pay_…`
    pub id: String,
    pub amount_minor: i64,
    pub reference: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// `POST /v1/orgs/{orgId}/provider/payouts` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewPayout {
    /// A positive integer of minor units, at most what is available.
    pub amount_minor: i64,
    /// The transfer's reference (bank or ledger id), at most 256 characters.
    pub reference: Option<String>,
}

/// The earnings of `org_id` now: for callers holding `provider.read` who act for the org
/// (its members, or ops); anyone else is told the org does not exist.
pub async fn get(app: &App, caller: &Principal, org_id: &str) -> Result<Earnings> {
    caller.require_for(
        Permission::ProviderRead,
        org_id,
        format_args!("org {org_id}"),
    )?;
    let mut conn = app.store.pool().acquire().await?;
    if !org_exists(&mut conn, org_id, "").await? {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    // Payouts first, then the clock: every payout read was made at or before `now`
    // against earnings no larger than those at `now`, so `availableMinor` is never
    // understated by a payout that commits while this reads.
    let paid_out_minor = paid_out(&mut conn, org_id).await?;
    let recent_payouts = recent_payouts(&mut conn, org_id).await?;
    let now = app.now_ms();
    let share_bps = app.provider_share_bps;
    let summary = summarize(
        &metered_bookings(&mut conn, org_id, now, share_bps).await?,
        now,
    );
    let active_rentals = active_rentals(&mut conn, org_id, now).await?;
    Ok(Earnings {
        org_id: org_id.to_string(),
        currency: "minor units".into(),
        as_of: format_ms(now),
        gross_minor: summary.total.gross_minor,
        earned_minor: summary.total.earned_minor,
        paid_out_minor,
        available_minor: summary.total.earned_minor.saturating_sub(paid_out_minor),
        provider_share_bps: share_bps,
        gpu_seconds: summary.total.gpu_seconds,
        active_rentals,
        by_node: summary
            .by_node
            .into_iter()
            .map(|(node_id, amounts)| NodeAmounts { node_id, amounts })
            .collect(),
        by_model: summary
            .by_model
            .into_iter()
            .map(|(model, amounts)| ModelAmounts { model, amounts })
            .collect(),
        by_day: summary
            .by_day
            .into_iter()
            .map(|(day, amounts)| DayAmounts {
                day: format_day(day),
                amounts,
            })
            .collect(),
        recent_payouts,
    })
}

/// Records a payout to `org_id` (platform operators holding `provider.write`; anyone else
/// is told the org does not exist). Refused with `INVALID_STATE` when the amount exceeds
/// what is available at this instant; then nothing is written.
pub async fn pay_out(
    app: &App,
    caller: &Principal,
    org_id: &str,
    new: NewPayout,
) -> Result<Payout> {
    caller.require_ops(Permission::ProviderWrite, format_args!("org {org_id}"))?;
    if new.amount_minor <= 0 {
        return Err(Error::invalid(
            "amountMinor",
            format!(
                "must be a positive integer of minor units, got {}",
                new.amount_minor
            ),
        ));
    }
    validation::opt_text("reference", new.reference.as_deref(), MAX_REFERENCE)?;

    let mut tx = app.store.begin().await?;
    // The org's row lock serializes payouts of one org on PostgreSQL; SQLite writers are
    // serialized already.
    if !org_exists(&mut tx, org_id, app.store.for_update()).await? {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    let now = app.now_ms();
    let earned = summarize(
        &metered_bookings(&mut tx, org_id, now, app.provider_share_bps).await?,
        now,
    )
    .total
    .earned_minor;
    let available = earned.saturating_sub(paid_out(&mut tx, org_id).await?);
    if new.amount_minor > available {
        return Err(Error::InvalidState(format!(
            "a payout of {} minor units exceeds the {available} available to org {org_id}",
            new.amount_minor
        )));
    }
    let payout = Payout {
        id: new_id("pay", now),
        amount_minor: new.amount_minor,
        reference: new.reference,
        created_at: format_ms(now),
    };
    sqlx::query(
        "INSERT INTO payouts (id, org_id, amount_minor, reference, created_at, created_by)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&payout.id)
    .bind(org_id)
    .bind(payout.amount_minor)
    .bind(&payout.reference)
    .bind(now)
    .bind(&caller.key_id)
    .execute(&mut **tx)
    .await?;
    let details = json!({
        "amountMinor": payout.amount_minor,
        "reference": payout.reference,
        "availableBeforeMinor": available,
    });
    audit::record(
        &mut tx,
        caller,
        Entry {
            org_id,
            action: "provider.payout",
            object_type: "payout",
            object_id: &payout.id,
            reason: None,
            details: Some(details),
        },
        now,
    )
    .await?;
    let payload = json!({ "orgId": org_id, "payout": payout });
    events::emit(&mut tx, PAYOUT_EVENT, &payout.id, &[org_id], &payload, now).await?;
    tx.commit().await?;
    Ok(payout)
}

async fn org_exists(conn: &mut AnyConnection, org_id: &str, lock: &str) -> Result<bool> {
    let row = sqlx::query(&format!("SELECT id FROM orgs WHERE id = $1{lock}"))
        .bind(org_id)
        .fetch_optional(conn)
        .await?;
    Ok(row.is_some())
}

/// The bookings of GPU units on `org_id`'s nodes that started before `now` and hold a
/// non-empty interval, on the terms they were booked on (bookings older than those terms
/// read their unit as it is now and `current_share_bps`).
pub async fn metered_bookings(
    conn: &mut AnyConnection,
    org_id: &str,
    now: i64,
    current_share_bps: u32,
) -> Result<Vec<MeteredBooking>> {
    let rows = sqlx::query(
        "SELECT b.node_id, COALESCE(b.model, u.model) AS model, b.start_ms,
                COALESCE(b.billable_end_ms, b.end_ms) AS end_ms, b.price_per_gpu_hour_minor,
                COALESCE(b.provider_share_bps, $4) AS share_bps
         FROM bookings b
         JOIN nodes n ON n.id = b.node_id
         LEFT JOIN units u ON u.node_id = b.node_id AND u.id = b.unit_id
         WHERE n.org_id = $1 AND COALESCE(b.device_class, u.device_class) = $2
           AND b.start_ms < $3 AND b.end_ms > b.start_ms
         ORDER BY b.node_id, b.unit_id, b.start_ms",
    )
    .bind(org_id)
    .bind("gpu")
    .bind(now)
    .bind(i64::from(current_share_bps))
    .fetch_all(conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| MeteredBooking {
            node_id: r.get("node_id"),
            model: r.get("model"),
            start_ms: r.get("start_ms"),
            end_ms: r.get("end_ms"),
            price_per_gpu_hour_minor: r.get("price_per_gpu_hour_minor"),
            share_bps: r.get::<i64, _>("share_bps").clamp(0, 10_000) as u32,
        })
        .collect())
}

/// Distinct compute reservations with an active booking on `org_id`'s nodes that holds its
/// unit at `now` (`start_ms <= now < end_ms`).
async fn active_rentals(conn: &mut AnyConnection, org_id: &str, now: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COUNT(DISTINCT b.reservation_id) FROM bookings b JOIN nodes n ON n.id = b.node_id
         WHERE n.org_id = $1 AND b.active = $2 AND b.start_ms <= $3 AND b.end_ms > $3",
    )
    .bind(org_id)
    .bind(true)
    .bind(now)
    .fetch_one(conn)
    .await?)
}

/// The sum of `org_id`'s payouts.
async fn paid_out(conn: &mut AnyConnection, org_id: &str) -> Result<i64> {
    let sum: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(amount_minor) AS BIGINT) FROM payouts WHERE org_id = $1",
    )
    .bind(org_id)
    .fetch_one(conn)
    .await?;
    Ok(sum.unwrap_or(0))
}

async fn recent_payouts(conn: &mut AnyConnection, org_id: &str) -> Result<Vec<Payout>> {
    let rows = sqlx::query(
        "SELECT id, amount_minor, reference, created_at FROM payouts
         WHERE org_id = $1 ORDER BY seq DESC LIMIT $2",
    )
    .bind(org_id)
    .bind(RECENT_PAYOUTS)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| Payout {
            id: r.get("id"),
            amount_minor: r.get("amount_minor"),
            reference: r.get("reference"),
            created_at: format_ms(r.get("created_at")),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T00:00:00Z.
    const DEC_1: i64 = 1_796_083_200_000;
    const MINUTE: i64 = 60_000;

    fn booking(node: &str, model: &str, start_ms: i64, end_ms: i64, price: i64) -> MeteredBooking {
        MeteredBooking {
            node_id: node.into(),
            model: model.into(),
            start_ms,
            end_ms,
            price_per_gpu_hour_minor: price,
            share_bps: 8_000,
        }
    }

    #[test]
    fn accrual_runs_from_the_start_to_the_earlier_of_end_and_now() {
        assert_eq!(accrued_ms(1_000, 5_000, 500), 0, "not started");
        assert_eq!(accrued_ms(1_000, 5_000, 1_000), 0);
        assert_eq!(accrued_ms(1_000, 5_000, 3_500), 2_500, "running");
        assert_eq!(accrued_ms(1_000, 5_000, 9_000), 4_000, "ended");
        assert_eq!(accrued_ms(1_000, 1_000, 9_000), 0, "dropped before start");
    }

    #[test]
    fn charges_round_down_to_the_minor_unit() {
        // 250 per GPU-hour for 7 minutes: 29.1666… → 29.
        assert_eq!(charge_minor(250, 7 * MINUTE), 29);
        assert_eq!(charge_minor(250, HOUR_MS), 250);
        assert_eq!(charge_minor(250, HOUR_MS - 1), 249);
        assert_eq!(charge_minor(1, HOUR_MS - 1), 0);
        assert_eq!(charge_minor(0, HOUR_MS), 0);
        assert_eq!(charge_minor(-5, HOUR_MS), 0);
        // The largest offer price over a whole day does not overflow.
        assert_eq!(charge_minor(1 << 40, DAY_MS), 24 << 40);
    }

    #[test]
    fn the_provider_share_rounds_down_and_the_remainder_is_the_platforms() {
        assert_eq!(provider_share_minor(29, 8_000), 23); // 23.2
        assert_eq!(provider_share_minor(87, 8_000), 69); // 69.6
        assert_eq!(provider_share_minor(100, 8_000), 80);
        assert_eq!(provider_share_minor(100, 0), 0);
        assert_eq!(provider_share_minor(100, 10_000), 100);
        assert_eq!(
            provider_share_minor(100, 20_000),
            100,
            "capped at the whole"
        );
        assert_eq!(provider_share_minor(1, 9_999), 0);
        assert_eq!(provider_share_minor(i64::MAX, 10_000), i64::MAX);
    }

    #[test]
    fn intervals_split_at_utc_midnights() {
        assert_eq!(split_by_utc_day(DEC_1, DEC_1), vec![]);
        let day = DEC_1 / DAY_MS;
        assert_eq!(
            split_by_utc_day(DEC_1 - 10 * MINUTE, DEC_1 + 20 * MINUTE),
            vec![(day - 1, 10 * MINUTE), (day, 20 * MINUTE)]
        );
        assert_eq!(
            split_by_utc_day(DEC_1 - 1, DEC_1 + 2 * DAY_MS + 1),
            vec![(day - 1, 1), (day, DAY_MS), (day + 1, DAY_MS), (day + 2, 1)]
        );
        assert_eq!(format_day(day), "2026-12-01");
        assert_eq!(format_day(day - 1), "2026-11-30");
        assert_eq!(format_day(-1), "1969-12-31");
    }

    #[test]
    fn each_day_of_a_booking_is_rounded_on_its_own() {
        // 250 per GPU-hour from 23:53 to 00:11: 7 min (29.16 → 29) + 11 min (45.83 → 45).
        let b = booking("n1", "H100", DEC_1 - 7 * MINUTE, DEC_1 + 11 * MINUTE, 250);
        let day = DEC_1 / DAY_MS;
        assert_eq!(
            parts(&b, DEC_1 + HOUR_MS),
            vec![
                Part {
                    day: day - 1,
                    ms: 7 * MINUTE,
                    gross_minor: 29,
                    earned_minor: 23,
                    gpu_seconds: 420
                },
                Part {
                    day,
                    ms: 11 * MINUTE,
                    gross_minor: 45,
                    earned_minor: 36,
                    gpu_seconds: 660
                },
            ]
        );
        // Before midnight only the first part exists, and it grows with the clock.
        let early = parts(&b, DEC_1 - 3 * MINUTE);
        assert_eq!(early.len(), 1);
        assert_eq!(early[0].gross_minor, charge_minor(250, 4 * MINUTE));
    }

    #[test]
    fn every_breakdown_adds_up_to_the_totals() {
        let now = DEC_1 + 6 * HOUR_MS;
        let bookings = vec![
            booking("n1", "H100", DEC_1, DEC_1 + 7 * MINUTE, 250),
            booking("n1", "H100", DEC_1, DEC_1 + 7 * MINUTE, 250),
            booking("n1", "H100", DEC_1, DEC_1 + 7 * MINUTE, 250),
            booking("n2", "A100", DEC_1 - 7 * MINUTE, DEC_1 + 11 * MINUTE, 333),
            booking("n2", "H100", DEC_1 + HOUR_MS, DEC_1 + 100 * HOUR_MS, 1_001),
            booking("n3", "H100", now + 1, now + HOUR_MS, 9_999),
        ];
        let s = summarize(&bookings, now);
        // 3 × 29, then 38 (38.85) + 61 (61.05), then 5 hours × 1001.
        assert_eq!(s.total.gross_minor, 3 * 29 + 38 + 61 + 5 * 1_001);
        // 3 × 23 (23.2), 30 (30.4) + 48 (48.8), 4004.
        assert_eq!(s.total.earned_minor, 3 * 23 + 30 + 48 + 4_004);
        assert_eq!(s.total.gpu_seconds, 3 * 420 + 18 * 60 + 5 * 3_600);
        for breakdown in [
            s.by_node.values().copied().collect::<Vec<_>>(),
            s.by_model.values().copied().collect(),
            s.by_day.values().copied().collect(),
        ] {
            let mut sum = Amounts::default();
            for a in &breakdown {
                sum.gross_minor += a.gross_minor;
                sum.earned_minor += a.earned_minor;
                sum.gpu_seconds += a.gpu_seconds;
            }
            assert_eq!(sum, s.total);
        }
        assert!(!s.by_node.contains_key("n3"), "not started: absent");
        assert_eq!(s.by_day.len(), 2);
        assert_eq!(s.by_model["A100"].gross_minor, 38 + 61);
    }

    #[test]
    fn earnings_never_decrease_as_time_passes() {
        let b = [MeteredBooking {
            share_bps: 7_777,
            ..booking("n1", "H100", DEC_1 - 13 * MINUTE, DEC_1 + 2 * HOUR_MS, 77)
        }];
        let mut last = Amounts::default();
        for step in 0..200 {
            let now = DEC_1 - 13 * MINUTE + step * 47_311;
            let total = summarize(&b, now).total;
            assert!(total.gross_minor >= last.gross_minor);
            assert!(total.earned_minor >= last.earned_minor);
            last = total;
        }
    }
}
