//! The default spend-limit policy of orl (`orl-spend-guard-default`) as a WebAssembly
//! component of the `spend-guard` world: the records the kit hands over become the
//! policy's, [`orl_spend_guard_default::decide`] decides, and the answer goes back.
//!
//! Built for `wasm32-wasip2` by the host's build script, which embeds the result in the
//! `orl` binary.

use orl_policy_kit::log::{Level, log};
use orl_policy_kit::types as wit;
use orl_spend_guard_default as policy;

struct DefaultSpendGuard;

impl orl_policy_kit::SpendGuard for DefaultSpendGuard {
    fn decide(charge: wit::Charge, budget: wit::Budget) -> Result<(), String> {
        let charge = policy::Charge {
            amount_minor: charge.amount_minor,
            gpu_count: charge.gpu_count,
            duration_seconds: charge.duration_seconds,
            price_per_gpu_hour_minor: charge.price_per_gpu_hour_minor,
        };
        let budget = policy::Budget {
            limit_minor: budget.limit_minor,
            spent_minor: budget.spent_minor,
            committed_minor: budget.committed_minor,
        };
        policy::decide(&charge, &budget).map_err(|refusal| {
            log(Level::Debug, refusal.reason());
            refusal.into_reason()
        })
    }
}

orl_policy_kit::export_spend_guard!(DefaultSpendGuard);
