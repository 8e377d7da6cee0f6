//! Provider earnings: the figures REST's earnings view shows, with the same names.
//! Amounts are integer minor units (`Int`, 64-bit like every other integer here).

use async_graphql::SimpleObject;

use crate::earnings;

/// What a provider org earned from GPU time on its nodes, what is available for payout,
/// breakdowns by node, GPU model and UTC day, and its recent payouts.
#[derive(SimpleObject)]
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
    /// The provider's share in basis points (8000 = 80 %).
    pub provider_share_bps: u32,
    /// GPU time accrued on the org's nodes, in whole seconds (summed per part).
    pub gpu_seconds: i64,
    /// Compute reservations holding a unit of the org's nodes at `asOf`.
    pub active_rentals: i64,
    /// Per node that accrued GPU time, by node id.
    pub by_node: Vec<NodeEarnings>,
    /// Per GPU model that accrued GPU time, by model.
    pub by_model: Vec<ModelEarnings>,
    /// Per UTC day that accrued GPU time, oldest first.
    pub by_day: Vec<DayEarnings>,
    /// The last payouts, newest first (at most 20).
    pub recent_payouts: Vec<Payout>,
}

/// What one node accrued.
#[derive(SimpleObject)]
pub struct NodeEarnings {
    pub node_id: String,
    pub gross_minor: i64,
    pub earned_minor: i64,
    pub gpu_seconds: i64,
}

/// What one GPU model accrued.
#[derive(SimpleObject)]
pub struct ModelEarnings {
    pub model: String,
    pub gross_minor: i64,
    pub earned_minor: i64,
    pub gpu_seconds: i64,
}

/// What one UTC day accrued.
#[derive(SimpleObject)]
pub struct DayEarnings {
    /// The UTC date, `YYYY-MM-DD`.
    pub day: String,
    pub gross_minor: i64,
    pub earned_minor: i64,
    pub gpu_seconds: i64,
}

/// Money paid out to a provider org.
#[derive(SimpleObject)]
pub struct Payout {
    /// `pay_…`
    pub id: String,
    pub amount_minor: i64,
    pub reference: Option<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
}

impl From<earnings::Earnings> for Earnings {
    fn from(e: earnings::Earnings) -> Self {
        Earnings {
            org_id: e.org_id,
            currency: e.currency,
            as_of: e.as_of,
            gross_minor: e.gross_minor,
            earned_minor: e.earned_minor,
            paid_out_minor: e.paid_out_minor,
            available_minor: e.available_minor,
            provider_share_bps: e.provider_share_bps,
            gpu_seconds: e.gpu_seconds,
            active_rentals: e.active_rentals,
            by_node: e
                .by_node
                .into_iter()
                .map(|n| NodeEarnings {
                    node_id: n.node_id,
                    gross_minor: n.amounts.gross_minor,
                    earned_minor: n.amounts.earned_minor,
                    gpu_seconds: n.amounts.gpu_seconds,
                })
                .collect(),
            by_model: e
                .by_model
                .into_iter()
                .map(|m| ModelEarnings {
                    model: m.model,
                    gross_minor: m.amounts.gross_minor,
                    earned_minor: m.amounts.earned_minor,
                    gpu_seconds: m.amounts.gpu_seconds,
                })
                .collect(),
            by_day: e
                .by_day
                .into_iter()
                .map(|d| DayEarnings {
                    day: d.day,
                    gross_minor: d.amounts.gross_minor,
                    earned_minor: d.amounts.earned_minor,
                    gpu_seconds: d.amounts.gpu_seconds,
                })
                .collect(),
            recent_payouts: e
                .recent_payouts
                .into_iter()
                .map(|p| Payout {
                    id: p.id,
                    amount_minor: p.amount_minor,
                    reference: p.reference,
                    created_at: p.created_at,
                })
                .collect(),
        }
    }
}
