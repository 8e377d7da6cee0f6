//! Identity and access: orgs, API keys, permissions and roles, and the rule that a caller
//! who may not see a resource is told it does not exist (404, never 403).

pub mod confirmations;
pub mod key_cache;
pub mod keys;
pub mod orgs;
pub mod policy;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The platform ops org: its admins may do everything, everywhere.
pub const OPS_ORG: &str = "ops";

macro_rules! permissions {
    ($($variant:ident => $name:literal,)*) => {
        /// One thing a key may do. Names are the API's (`reservation.manage`, …).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Permission { $($variant,)* }

        impl Permission {
            pub const ALL: &'static [Permission] = &[$(Permission::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Permission::$variant => $name,)* }
            }
        }

        impl FromStr for Permission {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                match s { $($name => Ok(Permission::$variant),)* _ => Err(()) }
            }
        }
    };
}

permissions! {
    OrgsManage => "orgs.manage",
    KeysManage => "keys.manage",
    IamManage => "iam.manage",
    AuditRead => "audit.read",
    InventoryWrite => "inventory.write",
    ProviderRead => "provider.read",
    ProviderWrite => "provider.write",
    ReservationRead => "reservation.read",
    ReservationManage => "reservation.manage",
    ReservationCapacity => "reservation.capacity",
    PoolsManage => "pools.manage",
    PluginsManage => "plugins.manage",
    EventsRead => "events.read",
    ComputeCreate => "compute:reservations:create",
    ComputeRead => "compute:reservations:read",
    ComputeRelease => "compute:reservations:release",
    ComputeExtend => "compute:reservations:extend",
}

/// A named bundle of permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything. In the ops org, everything on every org.
    Admin,
    /// Runs capacity: reservations, pools, plugins, inventory; not orgs or keys.
    Operator,
    /// Owns nodes: registers inventory, manages its spot capacity, sees earnings.
    Provider,
    /// Books compute and reads what is reserved to its org.
    Member,
    /// Reads.
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Provider => "provider",
            Role::Member => "member",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        [
            Role::Admin,
            Role::Operator,
            Role::Provider,
            Role::Member,
            Role::Viewer,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }

    /// The permissions the role grants.
    pub fn permissions(self) -> BTreeSet<Permission> {
        use Permission::*;
        let list: &[Permission] = match self {
            Role::Admin => Permission::ALL,
            Role::Operator => &[
                AuditRead,
                InventoryWrite,
                ProviderRead,
                ProviderWrite,
                ReservationRead,
                ReservationManage,
                ReservationCapacity,
                PoolsManage,
                PluginsManage,
                EventsRead,
                ComputeCreate,
                ComputeRead,
                ComputeRelease,
                ComputeExtend,
            ],
            Role::Provider => &[
                InventoryWrite,
                ProviderRead,
                ProviderWrite,
                ReservationRead,
                ReservationCapacity,
                EventsRead,
            ],
            Role::Member => &[
                ReservationRead,
                ProviderRead,
                EventsRead,
                ComputeCreate,
                ComputeRead,
                ComputeRelease,
                ComputeExtend,
            ],
            Role::Viewer => &[ReservationRead, ProviderRead, EventsRead, ComputeRead],
        };
        list.iter().copied().collect()
    }
}

/// Parses permission names, naming the first unknown one.
pub fn parse_permissions(field: &str, names: &[String]) -> Result<BTreeSet<Permission>> {
    names
        .iter()
        .map(|n| {
            n.parse()
                .map_err(|()| Error::invalid(field, format!("unknown permission {n:?}")))
        })
        .collect()
}

/// The authenticated caller: one API key of one org.
#[derive(Clone, Debug)]
pub struct Principal {
    pub key_id: String,
    pub org_id: String,
    pub permissions: BTreeSet<Permission>,
    /// An automated caller acting for a person.
    pub agent: bool,
}

impl Principal {
    /// The server itself, for changes it makes on its own (bootstrap, demo, reconciler).
    pub fn system() -> Principal {
        Principal {
            key_id: "system".into(),
            org_id: OPS_ORG.into(),
            permissions: Permission::ALL.iter().copied().collect(),
            agent: false,
        }
    }

    /// Whether the caller belongs to the platform ops org.
    pub fn is_ops(&self) -> bool {
        self.org_id == OPS_ORG
    }

    pub fn has(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }

    /// Whether the caller may act on objects of `org_id`: its own org, or any org for ops.
    pub fn acts_for(&self, org_id: &str) -> bool {
        self.is_ops() || self.org_id == org_id
    }

    /// Holds `permission` for objects of `org_id`; otherwise `what` is not found.
    pub fn require_for(
        &self,
        permission: Permission,
        org_id: &str,
        what: impl fmt::Display,
    ) -> Result<()> {
        if self.has(permission) && self.acts_for(org_id) {
            Ok(())
        } else {
            Err(Error::not_found(what))
        }
    }

    /// A platform operator holding `permission`; otherwise `what` is not found.
    pub fn require_ops(&self, permission: Permission, what: impl fmt::Display) -> Result<()> {
        self.require_for(permission, OPS_ORG, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(org: &str, role: Role) -> Principal {
        Principal {
            key_id: "key_x".into(),
            org_id: org.into(),
            permissions: role.permissions(),
            agent: false,
        }
    }

    #[test]
    fn permission_names_round_trip() {
        for p in Permission::ALL {
            assert_eq!(p.as_str().parse::<Permission>(), Ok(*p));
        }
        assert!("reservation.everything".parse::<Permission>().is_err());
    }

    #[test]
    fn admin_holds_every_permission_and_viewer_only_reads() {
        assert_eq!(Role::Admin.permissions().len(), Permission::ALL.len());
        assert!(
            Role::Viewer
                .permissions()
                .iter()
                .all(|p| p.as_str().ends_with("read"))
        );
    }

    #[test]
    fn a_caller_without_rights_is_told_not_found() {
        let tenant = principal("tenant-a", Role::Admin);
        let err = tenant
            .require_for(Permission::ProviderRead, "acme", "node n1")
            .unwrap_err();
        assert!(matches!(err, Error::NotFound(_)));
        assert!(
            tenant
                .require_for(Permission::ProviderRead, "tenant-a", "x")
                .is_ok()
        );
        let viewer = principal("tenant-a", Role::Viewer);
        assert!(
            viewer
                .require_for(Permission::KeysManage, "tenant-a", "x")
                .is_err()
        );
    }

    #[test]
    fn ops_acts_for_every_org_but_only_with_the_permission() {
        let ops = principal(OPS_ORG, Role::Operator);
        assert!(
            ops.require_for(Permission::ProviderRead, "acme", "x")
                .is_ok()
        );
        assert!(ops.require_ops(Permission::OrgsManage, "x").is_err());
        assert!(
            principal("acme", Role::Admin)
                .require_ops(Permission::ReservationManage, "x")
                .is_err()
        );
    }
}
