//! Node inventory: what a provider's node reports (host resources and its allocatable
//! units), and the rules that decide when its GPU topology changed.
//!
//! Ingestion is idempotent: the same report changes nothing. Adding or removing a unit, or
//! changing a unit's class or NVLink domain, is a topology change and bumps `topologyGen`.
//!
//! Nodes and units may carry labels (string → string, Kubernetes label syntax). Labels are
//! descriptive, not topology: changing them updates the node but never bumps `topologyGen`.
//! Device selectors match them (`devices[].selector.labels`) and a gang's `topologyKey`
//! may name a node label.

pub mod nodes;

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use regex::Regex;

use serde::{Deserialize, Serialize};

use crate::validation;
use crate::{Error, Result};

/// How a unit is allocated on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum UnitClass {
    /// A whole GPU (or GPU group) passed through with VFIO.
    VfioGroup,
    /// A whole GPU handed out through a device request (container runtimes).
    DeviceRequest,
    /// A MIG instance.
    Mig,
    /// A time-slice or MPS slot.
    Slot,
    /// A NIC virtual function.
    NicVf,
    Disk,
    /// The whole node.
    Node,
}

impl UnitClass {
    pub fn as_str(self) -> &'static str {
        match self {
            UnitClass::VfioGroup => "vfio-group",
            UnitClass::DeviceRequest => "device-request",
            UnitClass::Mig => "mig",
            UnitClass::Slot => "slot",
            UnitClass::NicVf => "nic-vf",
            UnitClass::Disk => "disk",
            UnitClass::Node => "node",
        }
    }

    pub fn parse(s: &str) -> Option<UnitClass> {
        use UnitClass::*;
        [VfioGroup, DeviceRequest, Mig, Slot, NicVf, Disk, Node]
            .into_iter()
            .find(|c| c.as_str() == s)
    }

    /// The device class a unit of this class provides.
    pub fn device_class(self) -> DeviceClass {
        match self {
            UnitClass::VfioGroup | UnitClass::DeviceRequest => DeviceClass::Gpu,
            UnitClass::Mig => DeviceClass::GpuMig,
            UnitClass::Slot => DeviceClass::GpuSlot,
            UnitClass::NicVf => DeviceClass::NicVf,
            UnitClass::Disk => DeviceClass::Disk,
            UnitClass::Node => DeviceClass::Node,
        }
    }

    /// Whole-GPU classes that node reservations may claim.
    pub fn is_reservable(self) -> bool {
        matches!(self, UnitClass::VfioGroup | UnitClass::DeviceRequest)
    }
}

/// What a tenant asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum DeviceClass {
    #[serde(rename = "gpu")]
    Gpu,
    #[serde(rename = "gpu.mig")]
    GpuMig,
    #[serde(rename = "gpu.slot")]
    GpuSlot,
    #[serde(rename = "nic.vf")]
    NicVf,
    #[serde(rename = "disk")]
    Disk,
    #[serde(rename = "node")]
    Node,
}

impl DeviceClass {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "gpu",
            DeviceClass::GpuMig => "gpu.mig",
            DeviceClass::GpuSlot => "gpu.slot",
            DeviceClass::NicVf => "nic.vf",
            DeviceClass::Disk => "disk",
            DeviceClass::Node => "node",
        }
    }

    pub fn parse(s: &str) -> Option<DeviceClass> {
        use DeviceClass::*;
        [Gpu, GpuMig, GpuSlot, NicVf, Disk, Node]
            .into_iter()
            .find(|c| c.as_str() == s)
    }

    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            DeviceClass::Gpu | DeviceClass::GpuMig | DeviceClass::GpuSlot
        )
    }
}

/// The host's allocatable CPU and memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostResources {
    pub vcpu: i64,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
    #[serde(rename = "hugepages1Gi", default)]
    pub hugepages_1gi: i64,
}

/// The indivisible allocation primitive on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Unit {
    pub id: String,
    pub class: UnitClass,
    pub device_class: DeviceClass,
    pub model: String,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    pub sellable: bool,
    /// The unit's labels; a selector looks here first, then at its node's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
}

/// `PUT /v1/orgs/{orgId}/provider/nodes/{nodeId}` body: the node's whole inventory.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeInventory {
    pub region: Option<String>,
    /// The node's labels (e.g. `rack`), matched by selectors on units without the key and
    /// usable as a gang's `topologyKey`. Not topology: changing them bumps no generation.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, String>)]
    pub labels: Labels,
    pub host: HostResources,
    pub units: Vec<Unit>,
}

/// Labels of a node or unit: key → value.
pub type Labels = BTreeMap<String, String>;

/// At most this many units per node.
pub const MAX_UNITS: usize = 1024;

/// At most this many labels per node, unit or selector.
pub const MAX_LABELS: usize = 64;

/// A label key: an optional DNS-subdomain prefix and `/`, then a name (Kubernetes syntax).
pub const LABEL_KEY_PATTERN: &str =
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// A label value, possibly empty.
pub const LABEL_VALUE_PATTERN: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$";

static LABEL_KEY: LazyLock<Regex> = LazyLock::new(|| Regex::new(LABEL_KEY_PATTERN).unwrap());
static LABEL_VALUE: LazyLock<Regex> = LazyLock::new(|| Regex::new(LABEL_VALUE_PATTERN).unwrap());

/// Whether `key` is a well-formed label key (at most 253 characters).
pub fn is_label_key(key: &str) -> bool {
    key.len() <= 253 && LABEL_KEY.is_match(key)
}

/// Checks labels given as `field`: at most [`MAX_LABELS`], keys of at most 253 characters
/// matching [`LABEL_KEY_PATTERN`], values of at most 63 matching [`LABEL_VALUE_PATTERN`].
/// Errors name `field` and the offending key.
pub fn validate_labels(field: &str, labels: &Labels) -> Result<()> {
    if labels.len() > MAX_LABELS {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_LABELS} labels"),
        ));
    }
    for (key, value) in labels {
        if key.len() > 253 {
            return Err(Error::invalid(
                field,
                format!(
                    "key {:?}…: at most 253 characters",
                    &key[..key.floor_char_boundary(32)]
                ),
            ));
        }
        if !LABEL_KEY.is_match(key) {
            return Err(Error::invalid(
                field,
                format!("key {key:?} must match {LABEL_KEY_PATTERN}"),
            ));
        }
        if value.len() > 63 {
            return Err(Error::invalid(
                field,
                format!("value of {key:?}: at most 63 characters"),
            ));
        }
        if !LABEL_VALUE.is_match(value) {
            return Err(Error::invalid(
                field,
                format!("value {value:?} of {key:?} must match {LABEL_VALUE_PATTERN}"),
            ));
        }
    }
    Ok(())
}

/// Whether every pair of `wanted` is a label of the unit, or of its node when the unit
/// does not have the key (a unit's own label wins over its node's).
pub fn labels_match(wanted: &Labels, unit: &Labels, node: &Labels) -> bool {
    wanted
        .iter()
        .all(|(key, value)| unit.get(key).or_else(|| node.get(key)) == Some(value))
}

/// Checks a report: well-formed ids, unique units, class and device class agreeing, sizes
/// in range. Errors name the offending field (`units[3].deviceClass`).
pub fn validate(inv: &NodeInventory) -> Result<()> {
    if let Some(region) = &inv.region {
        validation::id("region", region)?;
    }
    validate_labels("labels", &inv.labels)?;
    validation::range("host.vcpu", inv.host.vcpu, 0, 1 << 20)?;
    validation::range("host.memoryGiB", inv.host.memory_gib, 0, 1 << 24)?;
    validation::range("host.hugepages1Gi", inv.host.hugepages_1gi, 0, 1 << 24)?;
    if inv.host.hugepages_1gi > inv.host.memory_gib {
        return Err(Error::invalid(
            "host.hugepages1Gi",
            "cannot exceed host.memoryGiB",
        ));
    }
    if inv.units.len() > MAX_UNITS {
        return Err(Error::invalid(
            "units",
            format!("at most {MAX_UNITS} units per node"),
        ));
    }
    let mut seen = HashSet::new();
    for (i, unit) in inv.units.iter().enumerate() {
        let field = |name: &str| format!("units[{i}].{name}");
        validation::id(&field("id"), &unit.id)?;
        if !seen.insert(unit.id.as_str()) {
            return Err(Error::invalid(
                field("id"),
                format!("duplicate unit id {:?}", unit.id),
            ));
        }
        if unit.class.device_class() != unit.device_class {
            return Err(Error::invalid(
                field("deviceClass"),
                format!(
                    "a {} unit provides {}, not {}",
                    unit.class.as_str(),
                    unit.class.device_class().as_str(),
                    unit.device_class.as_str()
                ),
            ));
        }
        validation::text(&field("model"), &unit.model, 128)?;
        if unit.model.trim().is_empty() {
            return Err(Error::invalid(field("model"), "must not be empty"));
        }
        validation::range(&field("memoryGiB"), unit.memory_gib, 0, 1 << 20)?;
        if let Some(domain) = &unit.nvlink_domain {
            validation::id(&field("nvlinkDomain"), domain)?;
        }
        validate_labels(&field("labels"), &unit.labels)?;
    }
    Ok(())
}

/// Whether going from `old` to `new` changes the GPU topology: a unit added or removed, or
/// a unit's class or NVLink domain changed. Order, model, memory, `sellable` and labels
/// do not: labels describe units, they do not change how GPUs are wired.
pub fn topology_changed(old: &[Unit], new: &[Unit]) -> bool {
    let shape = |units: &[Unit]| -> BTreeMap<String, (UnitClass, Option<String>)> {
        units
            .iter()
            .map(|u| (u.id.clone(), (u.class, u.nvlink_domain.clone())))
            .collect()
    };
    shape(old) != shape(new)
}

/// Whether all GPU units of a node share one unit class (vacuously true without GPUs).
pub fn single_class(units: &[Unit]) -> bool {
    let mut classes = units
        .iter()
        .filter(|u| u.device_class.is_gpu())
        .map(|u| u.class);
    let first = classes.next();
    classes.all(|c| Some(c) == first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, domain: &str) -> Unit {
        Unit {
            id: id.into(),
            class: UnitClass::VfioGroup,
            device_class: DeviceClass::Gpu,
            model: "H100-SXM5-80GB".into(),
            memory_gib: 80,
            nvlink_domain: Some(domain.into()),
            sellable: true,
            labels: Labels::new(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn inventory(units: Vec<Unit>) -> NodeInventory {
        NodeInventory {
            region: Some("eu-west".into()),
            labels: Labels::new(),
            host: HostResources {
                vcpu: 224,
                memory_gib: 2048,
                hugepages_1gi: 512,
            },
            units,
        }
    }

    #[test]
    fn same_units_in_another_order_is_no_topology_change() {
        let a = vec![gpu("g0", "nv0"), gpu("g1", "nv0")];
        let b = vec![gpu("g1", "nv0"), gpu("g0", "nv0")];
        assert!(!topology_changed(&a, &b));
    }

    #[test]
    fn model_memory_and_sellable_are_not_topology() {
        let a = vec![gpu("g0", "nv0")];
        let mut b = a.clone();
        b[0].model = "H200".into();
        b[0].memory_gib = 141;
        b[0].sellable = false;
        b[0].labels = labels(&[("rack", "r1")]);
        assert!(!topology_changed(&a, &b));
    }

    #[test]
    fn adding_removing_or_moving_a_unit_is_a_topology_change() {
        let a = vec![gpu("g0", "nv0"), gpu("g1", "nv0")];
        assert!(topology_changed(&a, &a[..1]));
        assert!(topology_changed(&a[..1], &a));
        let mut moved = a.clone();
        moved[1].nvlink_domain = Some("nv1".into());
        assert!(topology_changed(&a, &moved));
        let mut reclassed = a.clone();
        reclassed[0].class = UnitClass::DeviceRequest;
        assert!(topology_changed(&a, &reclassed));
    }

    #[test]
    fn single_class_looks_only_at_gpu_units() {
        let mut units = vec![gpu("g0", "nv0"), gpu("g1", "nv0")];
        units.push(Unit {
            id: "nic0".into(),
            class: UnitClass::NicVf,
            device_class: DeviceClass::NicVf,
            model: "CX7".into(),
            memory_gib: 0,
            nvlink_domain: None,
            sellable: true,
            labels: Labels::new(),
        });
        assert!(single_class(&units));
        units[1].class = UnitClass::DeviceRequest;
        assert!(!single_class(&units));
        assert!(single_class(&[]));
    }

    #[test]
    fn a_well_formed_report_validates() {
        assert!(validate(&inventory(vec![gpu("g0", "nv0"), gpu("g1", "nv1")])).is_ok());
    }

    #[test]
    fn duplicate_units_are_named() {
        let err = validate(&inventory(vec![gpu("g0", "nv0"), gpu("g0", "nv0")])).unwrap_err();
        assert_eq!(err.to_string(), "units[1].id: duplicate unit id \"g0\"");
    }

    #[test]
    fn class_and_device_class_must_agree() {
        let mut unit = gpu("g0", "nv0");
        unit.device_class = DeviceClass::GpuMig;
        let err = validate(&inventory(vec![unit])).unwrap_err();
        assert!(
            err.to_string().starts_with("units[0].deviceClass:"),
            "{err}"
        );
    }

    #[test]
    fn out_of_range_sizes_are_refused() {
        let mut inv = inventory(vec![]);
        inv.host.vcpu = -1;
        assert!(
            validate(&inv)
                .unwrap_err()
                .to_string()
                .starts_with("host.vcpu:")
        );
        let mut inv = inventory(vec![]);
        inv.host.hugepages_1gi = inv.host.memory_gib + 1;
        assert!(validate(&inv).is_err());
    }

    #[test]
    fn well_formed_labels_validate() {
        let mut unit = gpu("g0", "nv0");
        unit.labels = labels(&[
            ("rack", "r1"),
            ("example.com/tier", "gold"),
            ("topology.kubernetes.io/zone", "eu-west-1a"),
            ("empty", ""),
            ("A_b.c-D", "x_Y.z-1"),
        ]);
        let mut inv = inventory(vec![unit]);
        inv.labels = labels(&[("rack", "r1"), ("row", "7")]);
        assert!(validate(&inv).is_ok());
    }

    #[test]
    fn bad_labels_are_refused_naming_the_field() {
        let long_key = format!("{}/k", "a".repeat(252));
        let long_value = "v".repeat(64);
        for (key, value) in [
            ("", "x"),
            ("-rack", "x"),
            ("rack-", "x"),
            ("Example.com/rack", "x"),
            ("a/b/c", "x"),
            ("has space", "x"),
            (long_key.as_str(), "x"),
            ("rack", "-r1"),
            ("rack", "r 1"),
            ("rack", long_value.as_str()),
        ] {
            let mut unit = gpu("g0", "nv0");
            let extra = gpu("g1", "nv0");
            unit.labels = labels(&[(key, value)]);
            let err = validate(&inventory(vec![extra.clone(), unit])).unwrap_err();
            assert!(
                err.to_string().starts_with("units[1].labels:"),
                "{key:?}={value:?}: {err}"
            );
            let mut inv = inventory(vec![extra]);
            inv.labels = labels(&[(key, value)]);
            let err = validate(&inv).unwrap_err();
            assert!(
                err.to_string().starts_with("labels:"),
                "{key:?}={value:?}: {err}"
            );
        }
        let mut inv = inventory(vec![]);
        inv.labels = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(
            validate(&inv)
                .unwrap_err()
                .to_string()
                .contains("at most 64 labels")
        );
        inv.labels.pop_first();
        assert!(validate(&inv).is_ok());
        assert!(is_label_key(&"k".repeat(63)));
        assert!(!is_label_key(&"k".repeat(254)));
    }

    #[test]
    fn selector_labels_match_the_unit_then_its_node() {
        let unit = labels(&[("tier", "gold"), ("rack", "r9")]);
        let node = labels(&[("rack", "r1"), ("row", "7")]);
        assert!(labels_match(&Labels::new(), &unit, &node));
        assert!(labels_match(&labels(&[("tier", "gold")]), &unit, &node));
        assert!(labels_match(&labels(&[("row", "7")]), &unit, &node));
        assert!(labels_match(
            &labels(&[("tier", "gold"), ("row", "7")]),
            &unit,
            &node
        ));
        assert!(
            labels_match(&labels(&[("rack", "r9")]), &unit, &node),
            "the unit's own label wins"
        );
        assert!(!labels_match(&labels(&[("rack", "r1")]), &unit, &node));
        assert!(!labels_match(&labels(&[("tier", "silver")]), &unit, &node));
        assert!(!labels_match(&labels(&[("zone", "a")]), &unit, &node));
        assert!(!labels_match(&labels(&[("row", "")]), &unit, &node));
    }
}
