//! Compute reservations: a tenant's claim on devices of one pool for a time window.
//!
//! This module holds the request as the API takes it, its validation (the constraints of
//! the reservation API's input tables), the idempotent id, the states, and the arithmetic
//! of host resources and quota; all plain functions. [`engine`] runs them against the
//! database (one module per method family), [`placement`] finds units, [`place`] decides
//! on the capacity view and books, and the reconciler drives reservations in time.
//!
//! # How a reservation changes
//!
//! Every writer (a method, the reconciler on any replica, a node agent's report, a reclaim,
//! a preemption) holds to one rule:
//!
//! - **A transition is one conditional update.** [`store::update`] writes the row only if
//!   it is still at the `version` the decision read, and bumps it; a writer that lost
//!   writes nothing and either answers `CONFLICT` (a method) or leaves the reservation for
//!   its next pass (the reconciler). A stale copy can therefore never overwrite an extend,
//!   a renew or a release that committed in between.
//! - **Side effects follow the update that matched**, in the same transaction: bookings
//!   released, quota refunded (the charge is cleared by the same update, so it is refunded
//!   once), events emitted, audit written ([`lifecycle::terminate`]).
//! - **A booking never starts before the moment it is written** ([`store::insert_bookings`]),
//!   so a reservation placed late never overlaps, nor is billed alongside, the holder that
//!   just left.
//! - **Rights are read again where they are used**: a placement re-reads the node
//!   reservations of the nodes it books under a share lock before it writes
//!   ([`placement::Snapshot::rights_refuse_from`]); a reclaim locks them for update, so one
//!   of the two waits for the other and sees its result. An extend re-reads them for the
//!   time it adds, under its reservation's lock.
//! - **Decisions are made outside the write**: a placement decides on the capacity view
//!   with nothing locked, then books in a short transaction that checks again what the
//!   view may not have seen ([`place`]).
//! - **Locks are taken in one order**: pool (pool-lease pools only), reservation, nodes
//!   (by id), node reservations, bookings, quota. A create books before it charges, so it
//!   never holds quota while waiting for a node reservation that a reclaim holds while it
//!   refunds.

pub mod availability;
pub mod binding;
pub mod create;
pub mod engine;
pub mod extend;
pub mod gang;
#[cfg(debug_assertions)]
mod gate;
pub mod group;
pub mod lifecycle;
pub mod list;
pub mod place;
pub mod placement;
pub mod plan;
pub mod preempt;
pub mod store;

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::capacity::HostAmount;
use crate::inventory::DeviceClass;
use crate::pools::{PerGpu, Sharing};
use crate::validation;
use crate::{Error, Result};

static POOL_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$").unwrap());
static PROJECT_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^prj_[0-9a-hjkmnp-tv-z]{26,52}$").unwrap());
static RESERVATION_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^rsv_[0-9a-hjkmnp-tv-z]{26,52}$").unwrap());
static PROFILE_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9._:/-]{1,128}$").unwrap());

/// The largest `start` or `until` the API accepts (2^47 ms).
pub const MAX_INSTANT_MS: i64 = 140_737_488_355_328;
/// The longest window a reservation may ask for.
pub const MAX_DURATION_MS: i64 = 366 * 24 * 3_600_000;
/// How long `wait.timeoutMs` may hold an answer.
pub const MAX_WAIT_MS: i64 = 30_000;

/// A value that must match `pattern` and be at most `max` characters.
pub fn pattern(field: &str, value: &str, re: &Regex, max: usize, shape: &str) -> Result<()> {
    if value.chars().count() > max {
        return Err(Error::invalid(field, format!("at most {max} characters")));
    }
    if !re.is_match(value) {
        return Err(Error::invalid(field, format!("must match {shape}")));
    }
    Ok(())
}

pub fn check_tenant_id(value: &str) -> Result<()> {
    pattern(
        "tenantId",
        value,
        &validation::ID,
        128,
        "^[A-Za-z0-9._:-]{1,128}$",
    )
}

pub fn check_reservation_id(field: &str, value: &str) -> Result<()> {
    pattern(
        field,
        value,
        &RESERVATION_ID,
        56,
        "^rsv_[0-9a-hjkmnp-tv-z]{26,52}$",
    )
}

pub fn check_pool_id(value: &str) -> Result<()> {
    pattern(
        "poolId",
        value,
        &POOL_ID,
        57,
        "^pool_[0-9a-hjkmnp-tv-z]{26,52}$",
    )
}

pub fn check_idempotency_key(value: &str) -> Result<()> {
    pattern(
        "idempotencyKey",
        value,
        &validation::ID,
        128,
        "^[A-Za-z0-9._:-]{1,128}$",
    )
}

/// `any` or `nvlink-all`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    #[default]
    Any,
    NvlinkAll,
}

/// Narrows which units of a class qualify.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Selector {
    /// Exact unit model, e.g. `H100-SXM5-80GB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// At least this much device memory.
    #[serde(default, rename = "memoryGiB", skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<i64>,
    /// Labels the unit must carry: every pair must equal the unit's label, or its node's
    /// label when the unit does not have the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// One entry of `devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceRequest {
    pub class: DeviceClass,
    pub count: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Selector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
}

/// Host resources asked for with the devices (per node for a gang).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub vcpu: i64,
    #[serde(default, rename = "memoryGiB")]
    pub memory_gib: i64,
    #[serde(default, rename = "hugepages1Gi")]
    pub hugepages_1gi: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeProfile {
    pub profile_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_version: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Wait {
    pub timeout_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Gang {
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
}

/// A window length: seconds as an integer, or a string such as `"90m"`, `"2h"`, `"1d 12h"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Duration {
    Seconds(i64),
    Text(String),
}

impl Duration {
    /// Milliseconds, validated as `field`: positive and at most a year.
    pub fn to_ms(&self, field: &str) -> Result<i64> {
        let ms = match self {
            Duration::Seconds(s) => s.checked_mul(1000).unwrap_or(i64::MAX),
            Duration::Text(text) => humantime::parse_duration(text.trim())
                .map_err(|e| {
                    Error::invalid(
                        field,
                        format!("{text:?} is not a duration ({e}); use e.g. \"2h\" or seconds"),
                    )
                })?
                .as_millis()
                .try_into()
                .unwrap_or(i64::MAX),
        };
        if ms <= 0 {
            return Err(Error::invalid(field, "must be positive"));
        }
        if ms > MAX_DURATION_MS {
            return Err(Error::invalid(field, "must be at most 366 days"));
        }
        Ok(ms)
    }
}

/// `POST /api/compute/reservations/create` input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateRequest {
    pub tenant_id: String,
    pub pool_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub devices: Vec<DeviceRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// Epoch milliseconds; defaults to now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    pub duration: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeProfile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<bool>,
    pub idempotency_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Wait>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
}

/// The bindings a reservation may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Binding {
    Hold,
    Node,
    Kubernetes,
}

impl CreateRequest {
    /// Checks every constraint of the input table, naming the field.
    pub fn validate(&self) -> Result<()> {
        check_tenant_id(&self.tenant_id)?;
        check_pool_id(&self.pool_id)?;
        if let Some(project) = &self.project_id {
            pattern(
                "projectId",
                project,
                &PROJECT_ID,
                56,
                "^prj_[0-9a-hjkmnp-tv-z]{26,52}$",
            )?;
        }
        if !(1..=8).contains(&self.devices.len()) {
            return Err(Error::invalid("devices", "must have 1-8 items"));
        }
        for (i, device) in self.devices.iter().enumerate() {
            validation::range(&format!("devices[{i}].count"), device.count, 1, 64)?;
            if let Some(selector) = &device.selector {
                if let Some(model) = &selector.model {
                    validation::text(&format!("devices[{i}].selector.model"), model, 128)?;
                }
                if let Some(memory) = selector.memory_gib {
                    validation::range(
                        &format!("devices[{i}].selector.memoryGiB"),
                        memory,
                        0,
                        1 << 20,
                    )?;
                }
                if let Some(labels) = &selector.labels {
                    crate::inventory::validate_labels(
                        &format!("devices[{i}].selector.labels"),
                        labels,
                    )?;
                }
            }
        }
        if let Some(start) = self.start {
            validation::range("start", start, 0, MAX_INSTANT_MS)?;
        }
        self.duration.to_ms("duration")?;
        if let Some(resources) = &self.resources {
            validation::range("resources.vcpu", resources.vcpu, 0, 4096)?;
            validation::range("resources.memoryGiB", resources.memory_gib, 0, 65536)?;
            validation::range("resources.hugepages1Gi", resources.hugepages_1gi, 0, 4096)?;
        }
        if let Some(node) = &self.node {
            pattern(
                "node.profileId",
                &node.profile_id,
                &PROFILE_ID,
                128,
                "^[A-Za-z0-9._:/-]{1,128}$",
            )?;
            if let Some(version) = node.profile_version {
                validation::range("node.profileVersion", version, 1, i64::MAX)?;
            }
        }
        if let Some(lease) = self.lease_seconds {
            validation::range("leaseSeconds", lease, 30, 86_400)?;
        }
        check_idempotency_key(&self.idempotency_key)?;
        if let Some(wait) = &self.wait {
            validation::range("wait.timeoutMs", wait.timeout_ms, 0, MAX_WAIT_MS)?;
        }
        if let Some(gang) = &self.gang {
            validation::range("gang.size", gang.size, 2, 64)?;
            if let Some(key) = &gang.topology_key {
                validation::text("gang.topologyKey", key, 128)?;
                if gang::TopologyKey::parse(key).is_none() {
                    return Err(Error::invalid(
                        "gang.topologyKey",
                        format!(
                            "{key:?} is not a supported key; use {} or a node label key (must match {})",
                            gang::TopologyKey::REGION_KEYS.join(" or "),
                            crate::inventory::LABEL_KEY_PATTERN
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The binding asked for; anything but `hold`, `node` or `kubernetes` is `UNSUPPORTED`.
    pub fn binding(&self) -> Result<Binding> {
        match self.binding.as_deref().unwrap_or("hold") {
            "hold" => Ok(Binding::Hold),
            "node" => Ok(Binding::Node),
            "kubernetes" => Ok(Binding::Kubernetes),
            other => Err(Error::Unsupported(format!(
                "binding {other:?} is not supported; use hold, node or kubernetes"
            ))),
        }
    }

    /// The request as compared for idempotency: everything but `wait`.
    pub fn fingerprint(&self) -> String {
        let mut compared = self.clone();
        compared.wait = None;
        serde_json::to_string(&compared).expect("serializing a request cannot fail")
    }

    pub fn is_spot(&self) -> bool {
        self.spot.unwrap_or(false)
    }

    /// How many members a placement has: `gang.size`, or 1 without a gang.
    pub fn gang_size(&self) -> i64 {
        self.gang.as_ref().map_or(1, |g| g.size)
    }

    /// Whole GPUs asked for over every member of a gang.
    pub fn total_gpu_count(&self) -> i64 {
        self.gpu_count() * self.gang_size()
    }

    /// Whole GPUs asked for (per member for a gang).
    pub fn gpu_count(&self) -> i64 {
        self.devices
            .iter()
            .filter(|d| d.class == DeviceClass::Gpu)
            .map(|d| d.count)
            .sum()
    }

    /// The GPU model asked for, when one is named.
    pub fn gpu_model(&self) -> Option<&str> {
        self.devices
            .iter()
            .filter(|d| d.class.is_gpu())
            .find_map(|d| d.selector.as_ref()?.model.as_deref())
    }

    /// Whether a device entry must sit in one NVLink domain (its own or the request's).
    pub fn nvlink_all(&self, device: &DeviceRequest) -> bool {
        device.topology.or(self.topology) == Some(Topology::NvlinkAll)
    }
}

/// The id of the reservation a create makes: derived from the tenant, the caller's
/// identity and the idempotency key, so a retry finds the same row.
pub fn reservation_id(tenant_id: &str, caller_key_id: &str, idempotency_key: &str) -> String {
    let digest =
        Sha256::digest(format!("{tenant_id}\n{caller_key_id}\n{idempotency_key}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    format!(
        "rsv_{}",
        ulid::Ulid::from_bytes(bytes)
            .to_string()
            .to_ascii_lowercase()
    )
}

/// The states of a compute reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Draft,
    Denied,
    AwaitingConfirmation,
    Pending,
    Placed,
    Binding,
    Active,
    Releasing,
    Released,
    Failed,
    Cancelled,
    Expired,
}

impl State {
    pub const ALL: [State; 12] = [
        State::Draft,
        State::Denied,
        State::AwaitingConfirmation,
        State::Pending,
        State::Placed,
        State::Binding,
        State::Active,
        State::Releasing,
        State::Released,
        State::Failed,
        State::Cancelled,
        State::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Draft => "draft",
            State::Denied => "denied",
            State::AwaitingConfirmation => "awaiting-confirmation",
            State::Pending => "pending",
            State::Placed => "placed",
            State::Binding => "binding",
            State::Active => "active",
            State::Releasing => "releasing",
            State::Released => "released",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// No way out: bookings released, quota refunded.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            State::Denied | State::Released | State::Failed | State::Cancelled | State::Expired
        )
    }

    /// Still inside the create decision; internal, invisible to `get` and `list`.
    pub fn is_draft(self) -> bool {
        matches!(self, State::Draft | State::AwaitingConfirmation)
    }

    /// Holds units now or later.
    pub fn holds_units(self) -> bool {
        matches!(self, State::Placed | State::Binding | State::Active)
    }
}

/// Host resources a reservation books, and the part of them charged to quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostBooking {
    pub vcpu: i64,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
    #[serde(rename = "hugepages1Gi")]
    pub hugepages_1gi: i64,
}

impl From<HostBooking> for HostAmount {
    fn from(h: HostBooking) -> HostAmount {
        HostAmount {
            vcpu: h.vcpu,
            memory_gib: h.memory_gib,
            hugepages_1gi: h.hugepages_1gi,
        }
    }
}

impl From<HostAmount> for HostBooking {
    fn from(h: HostAmount) -> HostBooking {
        HostBooking {
            vcpu: h.vcpu,
            memory_gib: h.memory_gib,
            hugepages_1gi: h.hugepages_1gi,
        }
    }
}

impl HostBooking {
    /// Adds `other` to this booking, field by field.
    pub fn add(&mut self, other: HostBooking) {
        self.vcpu += other.vcpu;
        self.memory_gib += other.memory_gib;
        self.hugepages_1gi += other.hugepages_1gi;
    }
}

/// What to book on the node: the per-GPU share of whole GPUs as a floor, raised by what
/// was asked for. Returns the booking and the excess above the share, which is what quota
/// is charged (1 GiB hugepages count as memory).
pub fn host_resources(
    whole_gpus: i64,
    share: Option<PerGpu>,
    asked: Option<Resources>,
) -> (HostBooking, HostBooking) {
    let floor = share
        .filter(|_| whole_gpus > 0)
        .map(|s| HostBooking {
            vcpu: s.vcpu * whole_gpus,
            memory_gib: s.memory_gib * whole_gpus,
            hugepages_1gi: 0,
        })
        .unwrap_or_default();
    let asked = asked.unwrap_or_default();
    let booked = HostBooking {
        vcpu: floor.vcpu.max(asked.vcpu),
        memory_gib: floor.memory_gib.max(asked.memory_gib),
        hugepages_1gi: asked.hugepages_1gi,
    };
    let excess = HostBooking {
        vcpu: booked.vcpu - floor.vcpu,
        memory_gib: (booked.memory_gib - floor.memory_gib) + booked.hugepages_1gi,
        hugepages_1gi: 0,
    };
    (booked, excess)
}

/// The quota a request charges: its devices per class, and host resources above the share
/// (`excess` is per node); a gang charges all of it once per member.
pub fn quota_charge(request: &CreateRequest, excess: HostBooking) -> BTreeMap<String, i64> {
    let members = request.gang_size();
    let mut charge = BTreeMap::new();
    for device in &request.devices {
        *charge.entry(device.class.as_str().to_string()).or_insert(0) += device.count * members;
    }
    if excess.vcpu > 0 {
        charge.insert("vcpu".to_string(), excess.vcpu * members);
    }
    if excess.memory_gib > 0 {
        charge.insert("memoryGiB".to_string(), excess.memory_gib * members);
    }
    charge
}

/// The cost of `gpus` whole GPUs for `duration_ms` at `price_per_gpu_hour` minor units,
/// rounded up to the next minor unit.
pub fn cost_minor(gpus: i64, duration_ms: i64, price_per_gpu_hour: i64) -> i64 {
    let numerator = i128::from(gpus) * i128::from(duration_ms) * i128::from(price_per_gpu_hour);
    let hour = 3_600_000i128;
    i64::try_from((numerator + hour - 1) / hour).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
