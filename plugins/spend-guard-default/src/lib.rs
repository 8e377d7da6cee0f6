//! The default spend-limit policy of orl: a charge is allowed when what is left of the
//! budget covers it.
//!
//! What is left is `limit - spent - committed`; a charge of `amount` is refused when what is
//! left is less than `amount`, and allowed otherwise (so a budget can be spent to exactly
//! zero). All money is in integer minor units of one currency and the arithmetic is exact:
//! no floats, no overflow, whatever the inputs.
//!
//! Plain Rust, so the host runs it natively too (as the fallback when a pool's spend guard
//! fails); its WebAssembly component is `orl-spend-guard-default-component`.

use std::fmt;

/// A charge about to be committed against a budget (WIT `charge`). Money in minor units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    /// The amount to charge, in minor units.
    pub amount_minor: i64,
    /// How many GPUs the charge is for.
    pub gpu_count: u32,
    /// How long the charge covers, in seconds.
    pub duration_seconds: u64,
    /// Minor units per GPU-hour the amount was computed from.
    pub price_per_gpu_hour_minor: i64,
}

/// The state of a budget (WIT `budget`), in minor units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The most that may be spent in the budget's period.
    pub limit_minor: i64,
    /// Spent so far in the period.
    pub spent_minor: i64,
    /// Promised to placed reservations that have not finished.
    pub committed_minor: i64,
}

impl Budget {
    /// What is left to spend: `limit - spent - committed`, exactly; negative when the budget
    /// is already overdrawn.
    pub fn remaining_minor(&self) -> i128 {
        i128::from(self.limit_minor)
            - i128::from(self.spent_minor)
            - i128::from(self.committed_minor)
    }
}

/// Why a charge was refused. The reason names the charge and every figure of the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    reason: String,
}

impl Refusal {
    /// The reason, naming the amounts.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The reason, as the WIT `err` payload.
    pub fn into_reason(self) -> String {
        self.reason
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refusal {}

/// Allows `charge` when `budget` has at least its amount left, refuses it otherwise.
pub fn decide(charge: &Charge, budget: &Budget) -> Result<(), Refusal> {
    let remaining = budget.remaining_minor();
    if remaining >= i128::from(charge.amount_minor) {
        return Ok(());
    }
    Err(Refusal {
        reason: format!(
            "spend limit reached: the charge of {} exceeds the {} left of the budget \
             (limit {} - spent {} - committed {}), in minor units",
            charge.amount_minor,
            remaining,
            budget.limit_minor,
            budget.spent_minor,
            budget.committed_minor,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(amount_minor: i64) -> Charge {
        Charge {
            amount_minor,
            gpu_count: 8,
            duration_seconds: 3600,
            price_per_gpu_hour_minor: amount_minor / 8,
        }
    }

    fn budget(limit_minor: i64, spent_minor: i64, committed_minor: i64) -> Budget {
        Budget {
            limit_minor,
            spent_minor,
            committed_minor,
        }
    }

    #[test]
    fn a_charge_within_what_is_left_is_allowed() {
        assert_eq!(
            decide(&charge(1_000), &budget(10_000, 4_000, 2_000)),
            Ok(())
        );
    }

    #[test]
    fn a_charge_may_spend_the_budget_to_exactly_zero() {
        assert_eq!(
            decide(&charge(4_000), &budget(10_000, 4_000, 2_000)),
            Ok(())
        );
    }

    #[test]
    fn a_charge_one_minor_unit_over_is_refused_with_the_numbers() {
        let refusal = decide(&charge(4_001), &budget(10_000, 4_000, 2_000)).unwrap_err();

        assert_eq!(
            refusal.reason(),
            "spend limit reached: the charge of 4001 exceeds the 4000 left of the budget \
             (limit 10000 - spent 4000 - committed 2000), in minor units"
        );
    }

    #[test]
    fn committed_spend_counts_against_the_budget() {
        assert!(decide(&charge(1), &budget(10_000, 0, 10_000)).is_err());
        assert!(decide(&charge(1), &budget(10_000, 10_000, 0)).is_err());
    }

    #[test]
    fn an_overdrawn_budget_refuses_any_positive_charge() {
        let refusal = decide(&charge(1), &budget(100, 150, 0)).unwrap_err();

        assert!(
            refusal.reason().contains("exceeds the -50 left"),
            "{refusal}"
        );
    }

    #[test]
    fn a_zero_charge_is_allowed_unless_the_budget_is_overdrawn() {
        assert!(decide(&charge(0), &budget(0, 0, 0)).is_ok());
        assert!(decide(&charge(0), &budget(100, 101, 0)).is_err());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        assert!(decide(&charge(i64::MAX), &budget(i64::MAX, i64::MIN, i64::MIN)).is_ok());
        assert!(decide(&charge(i64::MAX), &budget(i64::MIN, i64::MAX, i64::MAX)).is_err());
        assert!(decide(&charge(i64::MIN), &budget(i64::MIN, i64::MAX, i64::MAX)).is_err());
        assert_eq!(
            budget(i64::MIN, i64::MAX, i64::MAX).remaining_minor(),
            i128::from(i64::MIN) - 2 * i128::from(i64::MAX)
        );
    }
}
