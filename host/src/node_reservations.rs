//! Node reservations: exclusive placement rights over specific units of one node, for an
//! audience of orgs, for a term. This module holds the rules as plain functions: a
//! reservation's status at an instant, who may read or manage it, and what an org may place
//! on a unit given the reservations that claim it (the catalog and placement both ask here).

pub mod actions;
pub mod free;
pub mod queries;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::iam::{OPS_ORG, Permission, Principal};

/// The stored part of the lifecycle: what the clock cannot tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Granted,
    NeedsReview,
    Cancelled,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Granted => "granted",
            Lifecycle::NeedsReview => "needs-review",
            Lifecycle::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Lifecycle> {
        [
            Lifecycle::Granted,
            Lifecycle::NeedsReview,
            Lifecycle::Cancelled,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }
}

/// A reservation's status as the API shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Pending,
    Active,
    Expired,
    Cancelled,
    NeedsReview,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Active => "active",
            Status::Expired => "expired",
            Status::Cancelled => "cancelled",
            Status::NeedsReview => "needs-review",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        use Status::*;
        [Pending, Active, Expired, Cancelled, NeedsReview]
            .into_iter()
            .find(|st| st.as_str() == s)
    }
}

/// The term `[starts_at, ends_at)` in epoch milliseconds; `None` = open-ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    pub starts_at: i64,
    pub ends_at: Option<i64>,
}

impl Term {
    pub fn contains(&self, now: i64) -> bool {
        self.starts_at <= now && self.ends_at.is_none_or(|end| now < end)
    }

    pub fn has_ended(&self, now: i64) -> bool {
        self.ends_at.is_some_and(|end| end <= now)
    }

    /// Whether two terms share an instant.
    pub fn overlaps(&self, other: &Term) -> bool {
        self.ends_at.is_none_or(|end| end > other.starts_at)
            && other.ends_at.is_none_or(|end| end > self.starts_at)
    }
}

/// The status of a reservation at `now`: cancelled stays cancelled; a term that ended is
/// expired; otherwise needs-review withholds everything; otherwise the clock decides.
pub fn status(lifecycle: Lifecycle, term: Term, now: i64) -> Status {
    match lifecycle {
        Lifecycle::Cancelled => Status::Cancelled,
        _ if term.has_ended(now) => Status::Expired,
        Lifecycle::NeedsReview => Status::NeedsReview,
        Lifecycle::Granted if now < term.starts_at => Status::Pending,
        Lifecycle::Granted => Status::Active,
    }
}

/// What the rules need to know of one reservation.
#[derive(Clone, Debug)]
pub struct Rights {
    pub id: String,
    pub status: Status,
    pub term: Term,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Vec<String>,
    pub released_unit_ids: Vec<String>,
}

impl Rights {
    /// Manages this reservation now: it is active (so inside its term) and `org` is listed.
    pub fn managed_by(&self, org: &str) -> bool {
        self.status == Status::Active && self.managing_org_ids.iter().any(|o| o == org)
    }
}

/// Who may read a node's reservations: a platform operator, the node's owner, and any org
/// managing an active reservation on that node; all with `reservation.read`.
pub fn may_read(caller: &Principal, node_owner: &str, on_node: &[Rights]) -> bool {
    caller.has(Permission::ReservationRead)
        && (caller.acts_for(node_owner) || on_node.iter().any(|r| r.managed_by(&caller.org_id)))
}

/// Who may release units of (and later reclaim) `reservation`: a platform operator, the
/// node's owner, or one of its managing orgs while it is active; with
/// `reservation.capacity`.
pub fn may_manage_capacity(caller: &Principal, node_owner: &str, reservation: &Rights) -> bool {
    caller.has(Permission::ReservationCapacity)
        && (caller.acts_for(node_owner) || reservation.managed_by(&caller.org_id))
}

/// The units of a node whose spot work `org` may terminate: every unit for the node's
/// owner (and platform operators); for an org managing reservations on the node, the
/// released units of those that are active and inside their term; `None` when it reaches
/// nothing there.
pub fn spot_reach(org: &str, node_owner: &str, on_node: &[Rights]) -> Option<Reach> {
    if org == node_owner || org == OPS_ORG {
        return Some(Reach::Node);
    }
    let units: BTreeSet<String> = on_node
        .iter()
        .filter(|r| r.managed_by(org))
        .flat_map(|r| r.released_unit_ids.iter().cloned())
        .collect();
    on_node
        .iter()
        .any(|r| r.managed_by(org))
        .then_some(Reach::Units(units))
}

/// What [`spot_reach`] allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Every unit of the node.
    Node,
    /// Only these units.
    Units(BTreeSet<String>),
}

/// How an org may use one unit now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// No reservation holds the unit now: anyone may place.
    Open,
    /// Reserved to the org's audience: only it (and the platform) may place.
    Reserved,
    /// Released from a reservation to the spot market: anyone, at spot tier only.
    SpotOnly,
}

/// What `org` may do with `unit_id` given `claims` (the non-terminal reservations holding
/// it) at `now`; `None` hides the unit. Rights of an active reservation decide; a
/// needs-review claim in its term withholds the unit from everyone; a reservation that has
/// not started leaves the unit open until its start.
pub fn access(
    org: &str,
    unit_id: &str,
    claims: &[&Rights],
    now: i64,
) -> Option<(Tier, Option<String>)> {
    for claim in claims.iter().filter(|c| c.term.contains(now)) {
        match claim.status {
            Status::NeedsReview => return None,
            Status::Active => {
                let in_audience = org == OPS_ORG || claim.allowed_org_ids.iter().any(|o| o == org);
                return if in_audience {
                    Some((Tier::Reserved, Some(claim.id.clone())))
                } else if claim.released_unit_ids.iter().any(|u| u == unit_id) {
                    Some((Tier::SpotOnly, Some(claim.id.clone())))
                } else {
                    None
                };
            }
            _ => {}
        }
    }
    Some((Tier::Open, None))
}

/// Whether `org` may place a workload on `unit_id` over a window that the `claims` (the
/// non-terminal reservations holding the unit during it) overlap: each claim must have `org`
/// in its audience, or have released the unit and the workload be spot. A needs-review claim
/// refuses everyone.
pub fn may_place(org: &str, unit_id: &str, claims: &[Rights], spot: bool) -> bool {
    claims.iter().all(|claim| match claim.status {
        Status::Cancelled | Status::Expired => true,
        Status::NeedsReview => false,
        Status::Pending | Status::Active => {
            claim.allowed_org_ids.iter().any(|o| o == org)
                || (spot && claim.released_unit_ids.iter().any(|u| u == unit_id))
        }
    })
}

/// Adds the platform ops org to an audience and removes duplicates, keeping order.
pub fn audience_with_ops(orgs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(orgs.len() + 1);
    for org in orgs.iter().map(String::as_str).chain([OPS_ORG]) {
        if !out.iter().any(|o| o == org) {
            out.push(org.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iam::Role;

    const H: i64 = 3_600_000;

    fn term(start: i64, end: Option<i64>) -> Term {
        Term {
            starts_at: start,
            ends_at: end,
        }
    }

    fn rights(status: Status, released: &[&str]) -> Rights {
        Rights {
            id: "nrsv_1".into(),
            status,
            term: term(0, Some(10 * H)),
            allowed_org_ids: vec!["tenant-a".into(), OPS_ORG.into()],
            managing_org_ids: vec!["broker".into()],
            released_unit_ids: released.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn principal(org: &str, role: Role) -> Principal {
        Principal {
            key_id: "key_1".into(),
            org_id: org.into(),
            permissions: role.permissions(),
            agent: false,
        }
    }

    #[test]
    fn the_node_owner_reaches_every_unit_a_manager_only_released_units_of_active_reservations() {
        let on_node = [
            rights(Status::Active, &["u1"]),
            Rights {
                id: "nrsv_2".into(),
                ..rights(Status::Active, &["u5", "u6"])
            },
        ];
        assert_eq!(spot_reach("owner", "owner", &on_node), Some(Reach::Node));
        assert_eq!(spot_reach(OPS_ORG, "owner", &on_node), Some(Reach::Node));
        assert_eq!(
            spot_reach("broker", "owner", &on_node),
            Some(Reach::Units(
                ["u1", "u5", "u6"].iter().map(|u| u.to_string()).collect()
            ))
        );
        assert_eq!(spot_reach("tenant-a", "owner", &on_node), None);
        assert_eq!(spot_reach("stranger", "owner", &on_node), None);
    }

    #[test]
    fn a_manager_reaches_nothing_through_a_reservation_out_of_term_or_in_review() {
        for status in [
            Status::Pending,
            Status::Expired,
            Status::NeedsReview,
            Status::Cancelled,
        ] {
            assert_eq!(
                spot_reach("broker", "owner", &[rights(status, &["u1"])]),
                None,
                "{status:?}"
            );
        }
        assert_eq!(
            spot_reach("broker", "owner", &[rights(Status::Active, &[])]),
            Some(Reach::Units(BTreeSet::new())),
            "managing an active reservation with nothing released reaches no unit"
        );
    }

    #[test]
    fn status_follows_the_clock_inside_a_granted_term() {
        let t = term(10 * H, Some(20 * H));
        assert_eq!(status(Lifecycle::Granted, t, 0), Status::Pending);
        assert_eq!(status(Lifecycle::Granted, t, 10 * H), Status::Active);
        assert_eq!(status(Lifecycle::Granted, t, 20 * H - 1), Status::Active);
        assert_eq!(status(Lifecycle::Granted, t, 20 * H), Status::Expired);
        assert_eq!(
            status(Lifecycle::Granted, term(0, None), i64::MAX),
            Status::Active
        );
    }

    #[test]
    fn cancelled_and_needs_review_override_the_clock() {
        let t = term(10 * H, Some(20 * H));
        assert_eq!(status(Lifecycle::Cancelled, t, 15 * H), Status::Cancelled);
        assert_eq!(status(Lifecycle::Cancelled, t, 30 * H), Status::Cancelled);
        assert_eq!(status(Lifecycle::NeedsReview, t, 0), Status::NeedsReview);
        assert_eq!(status(Lifecycle::NeedsReview, t, 30 * H), Status::Expired);
    }

    #[test]
    fn terms_overlap_when_they_share_an_instant() {
        assert!(term(0, Some(10)).overlaps(&term(5, Some(15))));
        assert!(
            !term(0, Some(10)).overlaps(&term(10, Some(20))),
            "half-open"
        );
        assert!(term(0, None).overlaps(&term(1_000, Some(2_000))));
        assert!(term(5, None).overlaps(&term(0, None)));
        assert!(!term(20, None).overlaps(&term(0, Some(20))));
    }

    #[test]
    fn only_the_audience_sees_active_reserved_units() {
        let r = rights(Status::Active, &[]);
        assert_eq!(
            access("tenant-a", "g0", &[&r], H),
            Some((Tier::Reserved, Some("nrsv_1".into())))
        );
        assert_eq!(access(OPS_ORG, "g0", &[&r], H).unwrap().0, Tier::Reserved);
        assert_eq!(access("stranger", "g0", &[&r], H), None);
    }

    #[test]
    fn released_units_are_spot_only_for_strangers() {
        let r = rights(Status::Active, &["g0"]);
        assert_eq!(
            access("stranger", "g0", &[&r], H).unwrap().0,
            Tier::SpotOnly
        );
        assert_eq!(
            access("stranger", "g1", &[&r], H),
            None,
            "g1 was not released"
        );
        assert_eq!(
            access("tenant-a", "g0", &[&r], H).unwrap().0,
            Tier::Reserved
        );
    }

    #[test]
    fn needs_review_withholds_units_from_everyone() {
        let r = rights(Status::NeedsReview, &["g0"]);
        assert_eq!(access("tenant-a", "g0", &[&r], H), None);
        assert_eq!(access(OPS_ORG, "g0", &[&r], H), None);
        assert_eq!(access("stranger", "g0", &[&r], H), None);
    }

    #[test]
    fn needs_review_withholds_units_only_inside_its_term() {
        let mut r = rights(Status::NeedsReview, &[]);
        r.term = term(5 * H, Some(10 * H));
        assert_eq!(access("stranger", "g0", &[&r], H), Some((Tier::Open, None)));
        assert_eq!(access("stranger", "g0", &[&r], 6 * H), None);
        assert_eq!(
            access("stranger", "g0", &[&r], 10 * H),
            Some((Tier::Open, None))
        );
    }

    #[test]
    fn a_reservation_that_has_not_started_leaves_the_unit_open() {
        let mut r = rights(Status::Pending, &[]);
        r.term = term(5 * H, None);
        assert_eq!(access("stranger", "g0", &[&r], H), Some((Tier::Open, None)));
        assert_eq!(access("stranger", "g0", &[], H), Some((Tier::Open, None)));
    }

    #[test]
    fn managing_orgs_read_and_manage_only_while_active() {
        let broker = principal("broker", Role::Provider);
        let active = rights(Status::Active, &[]);
        assert!(may_read(&broker, "acme", std::slice::from_ref(&active)));
        assert!(may_manage_capacity(&broker, "acme", &active));
        for status in [
            Status::Pending,
            Status::Expired,
            Status::Cancelled,
            Status::NeedsReview,
        ] {
            let r = rights(status, &[]);
            assert!(
                !may_read(&broker, "acme", std::slice::from_ref(&r)),
                "{status:?}"
            );
            assert!(!may_manage_capacity(&broker, "acme", &r), "{status:?}");
        }
    }

    #[test]
    fn the_owner_and_ops_read_but_the_audience_does_not() {
        let r = rights(Status::Active, &[]);
        assert!(may_read(&principal("acme", Role::Provider), "acme", &[]));
        assert!(may_read(&principal(OPS_ORG, Role::Viewer), "acme", &[]));
        assert!(!may_read(
            &principal("tenant-a", Role::Member),
            "acme",
            &[r]
        ));
    }

    #[test]
    fn only_the_audience_or_spot_on_released_units_may_place() {
        let r = rights(Status::Active, &["g1"]);
        assert!(may_place("tenant-a", "g0", std::slice::from_ref(&r), false));
        assert!(!may_place("stranger", "g0", std::slice::from_ref(&r), true));
        assert!(
            !may_place("stranger", "g1", std::slice::from_ref(&r), false),
            "released units are spot-only"
        );
        assert!(may_place("stranger", "g1", std::slice::from_ref(&r), true));
        assert!(!may_place(
            "tenant-a",
            "g0",
            &[rights(Status::NeedsReview, &[])],
            false
        ));
        assert!(may_place("stranger", "g0", &[], false));
    }

    #[test]
    fn the_audience_always_includes_ops_once() {
        let orgs = vec!["b".to_string(), "a".into(), "b".into(), OPS_ORG.into()];
        assert_eq!(audience_with_ops(&orgs), ["b", "a", OPS_ORG]);
        assert_eq!(audience_with_ops(&[]), [OPS_ORG]);
    }
}
