//! The `spend-guard` world export: converts the WIT records to this crate's types and runs
//! [`crate::decide`].

wit_bindgen::generate!({
    path: "../../wit",
    world: "spend-guard",
});

use orl::policy::log::{Level, log};
use orl::policy::types as wit;

struct DefaultSpendGuard;

impl Guest for DefaultSpendGuard {
    fn decide(charge: wit::Charge, budget: wit::Budget) -> Result<(), String> {
        let charge = crate::Charge {
            amount_minor: charge.amount_minor,
            gpu_count: charge.gpu_count,
            duration_seconds: charge.duration_seconds,
            price_per_gpu_hour_minor: charge.price_per_gpu_hour_minor,
        };
        let budget = crate::Budget {
            limit_minor: budget.limit_minor,
            spent_minor: budget.spent_minor,
            committed_minor: budget.committed_minor,
        };
        crate::decide(&charge, &budget).map_err(|refusal| {
            log(Level::Debug, refusal.reason());
            refusal.into_reason()
        })
    }
}

export!(DefaultSpendGuard);
