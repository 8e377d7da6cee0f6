//! Pools (sets of nodes offered together, with a policy) and offers (a pool made available
//! to a tenant with quota, price and budget). A pool is visible to its owner, to the tenants
//! it is offered to, and to platform operators; to anyone else it does not exist.

pub mod store;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validation;
use crate::{Error, Result};

/// Host resources that ride on each whole GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PerGpu {
    pub vcpu: i64,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
}

/// How a pool decides where requests go when they do not fit at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PlacerMode {
    /// Best fit now; what does not fit is `pending` (`Unschedulable`) and retried every 30 s.
    #[default]
    Default,
    /// What does not fit waits in a queue (`Queued`) and is served in order as capacity frees.
    PoolLease,
}

/// How the pool's devices are shared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    #[default]
    Exclusive,
    Mig,
    Timeslice,
    Mps,
}

/// A pool's policy document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolPolicy {
    /// Host resources booked per whole GPU; defaults to the smallest share any GPU host of
    /// the pool can give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_gpu: Option<PerGpu>,
    /// Nodes may be handed to tenants (`binding: "node"`).
    #[serde(default)]
    pub tenant_root: bool,
    /// The pool's nodes expose devices to a Kubernetes cluster (`binding: "kubernetes"`).
    #[serde(default)]
    pub kubernetes: bool,
    /// Check the tenant's budget before charging.
    #[serde(default)]
    pub budget_check: bool,
    #[serde(default)]
    pub placer: PlacerMode,
    #[serde(default)]
    pub sharing: Sharing,
}

impl PoolPolicy {
    pub fn validate(&self) -> Result<()> {
        if let Some(per_gpu) = self.per_gpu {
            validation::range("policy.perGpu.vcpu", per_gpu.vcpu, 0, 4096)?;
            validation::range("policy.perGpu.memoryGiB", per_gpu.memory_gib, 0, 65536)?;
        }
        Ok(())
    }
}

/// Quota rows of an offer: resource name → limit. Resources are device classes (`gpu`,
/// `gpu.mig`, …), `vcpu` and `memoryGiB`. A missing row grants 0.
pub type Quota = BTreeMap<String, i64>;

/// The resources a quota may name.
pub const QUOTA_RESOURCES: &[&str] = &[
    "gpu",
    "gpu.mig",
    "gpu.slot",
    "nic.vf",
    "disk",
    "node",
    "vcpu",
    "memoryGiB",
];

pub fn validate_quota(quota: &Quota) -> Result<()> {
    for (resource, limit) in quota {
        if !QUOTA_RESOURCES.contains(&resource.as_str()) {
            return Err(Error::invalid(
                format!("quota.{resource}"),
                format!("unknown resource; one of {}", QUOTA_RESOURCES.join(", ")),
            ));
        }
        validation::range(&format!("quota.{resource}"), *limit, 0, 1 << 40)?;
    }
    Ok(())
}

/// Whether `charge` fits in `quota` on top of `used`; names the first resource that does not.
pub fn quota_fits<'a>(
    quota: &Quota,
    used: &BTreeMap<String, i64>,
    charge: &'a BTreeMap<String, i64>,
) -> Result<(), &'a str> {
    for (resource, amount) in charge.iter().filter(|(_, a)| **a > 0) {
        let limit = quota.get(resource).copied().unwrap_or(0);
        let held = used.get(resource).copied().unwrap_or(0);
        if held + amount > limit {
            return Err(resource);
        }
    }
    Ok(())
}

/// The per-GPU share of host resources: the policy's, or else `smallest`, the smallest
/// share any GPU host of the pool can give ([`smallest_share`] of their [`host_share`]s).
/// `None` when neither is known.
pub fn per_gpu_share(policy: &PoolPolicy, smallest: Option<PerGpu>) -> Option<PerGpu> {
    policy.per_gpu.or(smallest)
}

/// The share of host resources one host gives each of its whole GPUs: its CPUs and memory
/// divided by them. `None` for a host without GPUs, or without CPU and memory rows.
pub fn host_share(vcpu: i64, memory_gib: i64, gpus: i64) -> Option<PerGpu> {
    (gpus > 0 && (vcpu > 0 || memory_gib > 0)).then(|| PerGpu {
        vcpu: vcpu / gpus,
        memory_gib: memory_gib / gpus,
    })
}

/// The smallest of `shares`, resource by resource.
pub fn smallest_share(shares: impl IntoIterator<Item = PerGpu>) -> Option<PerGpu> {
    shares.into_iter().reduce(|a, b| PerGpu {
        vcpu: a.vcpu.min(b.vcpu),
        memory_gib: a.memory_gib.min(b.memory_gib),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_missing_quota_row_grants_nothing() {
        let quota = map(&[("gpu", 8)]);
        assert_eq!(quota_fits(&quota, &map(&[]), &map(&[("gpu", 8)])), Ok(()));
        assert_eq!(
            quota_fits(&quota, &map(&[("gpu", 1)]), &map(&[("gpu", 8)])),
            Err("gpu")
        );
        assert_eq!(
            quota_fits(&quota, &map(&[]), &map(&[("vcpu", 1)])),
            Err("vcpu")
        );
        assert_eq!(
            quota_fits(&quota, &map(&[]), &map(&[("vcpu", 0)])),
            Ok(()),
            "zero needs no row"
        );
    }

    #[test]
    fn per_gpu_share_is_the_policy_or_the_smallest_host_share() {
        let hosts = [(224, 2048, 8), (96, 1024, 8), (64, 512, 0)];
        let smallest = smallest_share(hosts.iter().filter_map(|&(c, m, g)| host_share(c, m, g)));
        let derived = per_gpu_share(&PoolPolicy::default(), smallest).unwrap();
        assert_eq!(
            derived,
            PerGpu {
                vcpu: 12,
                memory_gib: 128
            }
        );
        let policy = PoolPolicy {
            per_gpu: Some(PerGpu {
                vcpu: 8,
                memory_gib: 64,
            }),
            ..Default::default()
        };
        assert_eq!(per_gpu_share(&policy, smallest).unwrap().vcpu, 8);
        assert_eq!(
            host_share(0, 0, 8),
            None,
            "a host without CPU or memory rows"
        );
        assert_eq!(host_share(64, 512, 0), None, "a host without GPUs");
        assert_eq!(per_gpu_share(&PoolPolicy::default(), None), None);
    }

    #[test]
    fn unknown_quota_resources_are_refused() {
        assert!(validate_quota(&map(&[("gpu", 4), ("memoryGiB", 512)])).is_ok());
        assert!(validate_quota(&map(&[("tpu", 4)])).is_err());
        assert!(validate_quota(&map(&[("gpu", -1)])).is_err());
    }
}
