//! What a decision reads besides capacity, held per replica: pools' settings, offers'
//! terms, orgs' IAM policies and the plugins pools run.
//!
//! Every write to `pools`, `offers`, `iam_policies` and `pool_policies` bumps one version
//! row in its own transaction (triggers, migration `settings_version`). A reader first
//! reads that version ([`Settings::version`], one row); what it then takes from here was
//! read from the database at that version or later, and what is missing is read and kept
//! for the version. So a reader sees what reading the rows themselves would show, on every
//! replica, for one indexed read instead of one per row.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;

use sqlx::AnyConnection;

use crate::Result;
use crate::policy::World;
use crate::policy::assignment::Resolved;
use crate::pools::store::{Offer, Pool};

/// The settings one version of the database holds, as far as they were read.
#[derive(Default)]
pub struct Settings {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    version: i64,
    pools: HashMap<String, Option<Pool>>,
    terms: HashMap<(String, String), Option<Offer>>,
    policies: HashMap<String, Option<String>>,
    plugins: HashMap<(String, World), Resolved>,
}

/// The settings version a reader read; what it takes is at least this fresh.
#[derive(Clone, Copy, Debug)]
pub struct Version(i64);

impl Settings {
    /// Reads the current version; what was held for an older one is dropped.
    pub async fn version(&self, conn: &mut AnyConnection) -> Result<Version> {
        let version: i64 = sqlx::query_scalar("SELECT version FROM settings_version")
            .fetch_one(conn)
            .await?;
        let mut held = self.held.lock().expect("settings");
        if version > held.version {
            *held = Held {
                version,
                ..Held::default()
            };
        }
        Ok(Version(version))
    }

    /// The pool `id` (its settings, without its member list).
    pub async fn pool(
        &self,
        conn: &mut AnyConnection,
        at: Version,
        id: &str,
    ) -> Result<Option<Pool>> {
        // A pool that does not exist is not kept: any caller can name one.
        let load = crate::pools::store::find_settings(conn, id);
        self.held(at, |h| &mut h.pools, id.to_string(), load, Option::is_some)
            .await
    }

    /// The terms of the offer of `pool_id` to `tenant_id` (without what is used of it).
    pub async fn terms(
        &self,
        conn: &mut AnyConnection,
        at: Version,
        pool_id: &str,
        tenant_id: &str,
    ) -> Result<Option<Offer>> {
        let load = crate::pools::store::find_terms(conn, pool_id, tenant_id);
        let key = (pool_id.to_string(), tenant_id.to_string());
        self.held(at, |h| &mut h.terms, key, load, |_| true).await
    }

    /// The IAM policy text of `org_id`.
    pub async fn policy(
        &self,
        conn: &mut AnyConnection,
        at: Version,
        org_id: &str,
    ) -> Result<Option<String>> {
        let load = crate::iam::policy::find(conn, org_id);
        self.held(at, |h| &mut h.policies, org_id.to_string(), load, |_| true)
            .await
    }

    /// The plugin of `world` that pool `pool_id` runs, resolved with `resolve` when not
    /// held.
    pub async fn plugin(
        &self,
        at: Version,
        pool_id: &str,
        world: World,
        resolve: impl Future<Output = Result<Resolved>>,
    ) -> Result<Resolved> {
        let key = (pool_id.to_string(), world);
        self.held(at, |h| &mut h.plugins, key, resolve, |_| true)
            .await
    }

    /// What `map` holds under `key` for version `at`, or what `load` reads (kept when
    /// `keep` says so and the version is still the one held).
    async fn held<K: Eq + Hash, V: Clone>(
        &self,
        at: Version,
        map: fn(&mut Held) -> &mut HashMap<K, V>,
        key: K,
        load: impl Future<Output = Result<V>>,
        keep: fn(&V) -> bool,
    ) -> Result<V> {
        {
            let mut held = self.held.lock().expect("settings");
            if held.version == at.0
                && let Some(value) = map(&mut held).get(&key)
            {
                return Ok(value.clone());
            }
        }
        let value = load.await?;
        let mut held = self.held.lock().expect("settings");
        if held.version == at.0 && keep(&value) {
            map(&mut held).insert(key, value.clone());
        }
        Ok(value)
    }
}
