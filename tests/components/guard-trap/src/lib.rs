//! A spend-guard that traps on every call: `decide` panics, which on wasm32-wasip2 aborts
//! with an `unreachable` trap.

use orl_policy_kit::types::{Budget, Charge};

struct GuardTrap;

impl orl_policy_kit::SpendGuard for GuardTrap {
    fn decide(charge: Charge, _budget: Budget) -> Result<(), String> {
        panic!("guard-trap: refusing to judge {} minor units", charge.amount_minor)
    }
}

orl_policy_kit::export_spend_guard!(GuardTrap);
