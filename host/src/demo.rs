//! `orl serve --demo`: a provider with four NVLink nodes of eight H100s pooled as
//! `h100-demo` and offered to a tenant, keys, and `curl` commands that work as printed.
//! Seeding is idempotent; the keys are created once and kept (mode 0600) in the data
//! directory so a restart prints the same ones.

use std::net::SocketAddr;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::App;
use crate::iam::keys;
use crate::iam::{OPS_ORG, Principal, Role, orgs};
use crate::inventory::nodes;
use crate::inventory::{DeviceClass, HostResources, NodeInventory, Unit, UnitClass};
use crate::pools::store::{self as pools, NewOffer, NewPool, Pool};
use crate::serve::write_private_file;

pub const PROVIDER_ORG: &str = "acme-gpu";
pub const TENANT_ORG: &str = "tenant-a";
pub const POOL_NAME: &str = "h100-demo";
/// The tenant's GPU quota in the demo pool.
pub const POOL_GPU_QUOTA: i64 = 16;
/// Minor currency units (cents) per GPU-hour.
pub const POOL_PRICE_PER_GPU_HOUR: i64 = 250;
/// The key of the demo's compute reservation: re-running its `curl` replays it.
const DEMO_IDEMPOTENCY_KEY: &str = "demo-4xh100-nvlink";
/// Where the demo keeps the keys it created, in the data directory.
const KEYS_FILE: &str = "demo-keys.json";

#[derive(Serialize, Deserialize)]
struct DemoKeys {
    provider: String,
    tenant: String,
}

/// The inventory of demo node `n`: 8 H100 (two NVLink domains of 4), 224 vCPU, 2 TiB.
pub fn h100_node(n: usize) -> NodeInventory {
    NodeInventory {
        region: Some("eu-west-1".into()),
        labels: Default::default(),
        host: HostResources {
            vcpu: 224,
            memory_gib: 2048,
            hugepages_1gi: 1024,
        },
        units: (0..8)
            .map(|g| Unit {
                id: format!("h100-{n}-gpu{g}"),
                class: UnitClass::VfioGroup,
                device_class: DeviceClass::Gpu,
                model: "H100-SXM5-80GB".into(),
                memory_gib: 80,
                nvlink_domain: Some(format!("nvl{}", g / 4)),
                sellable: true,
                labels: Default::default(),
            })
            .collect(),
    }
}

/// Refuses, before writing anything, to seed a database that holds what the demo did not
/// write: orgs or nodes besides its own, or its orgs without the demo keys it keeps in this
/// data directory (someone else created them). Its own seed it may seed again: that
/// changes nothing.
async fn refuse_foreign_data(app: &App) -> anyhow::Result<()> {
    let pool = app.store.pool();
    let orgs: Vec<String> =
        sqlx::query_scalar("SELECT id FROM orgs WHERE id NOT IN ($1, $2, $3) ORDER BY id LIMIT 3")
            .bind(OPS_ORG)
            .bind(PROVIDER_ORG)
            .bind(TENANT_ORG)
            .fetch_all(pool)
            .await?;
    let demo_nodes: Vec<String> = (1..=4).map(|n| format!("h100-{n}")).collect();
    let sql = format!(
        "SELECT id FROM nodes WHERE org_id <> $1 OR id NOT IN ({}) ORDER BY id LIMIT 3",
        crate::store::placeholders(2, demo_nodes.len())
    );
    let mut query = sqlx::query_scalar(&sql).bind(PROVIDER_ORG);
    for id in &demo_nodes {
        query = query.bind(id);
    }
    let nodes: Vec<String> = query.fetch_all(pool).await?;
    let demo_orgs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orgs WHERE id IN ($1, $2)")
        .bind(PROVIDER_ORG)
        .bind(TENANT_ORG)
        .fetch_one(pool)
        .await?;
    let seeded_here = app.data_dir.join(KEYS_FILE).exists();
    let found = if !orgs.is_empty() {
        format!("orgs {}", orgs.join(", "))
    } else if !nodes.is_empty() {
        format!("nodes {}", nodes.join(", "))
    } else if demo_orgs > 0 && !seeded_here {
        format!("orgs {PROVIDER_ORG} or {TENANT_ORG}, not created by the demo")
    } else {
        return Ok(());
    };
    anyhow::bail!(
        "--demo seeds an empty database, and this one already holds {found}; nothing was \
         changed. Run the demo on an empty database (another --data-dir, or a new \
         --database-url), or without --demo."
    )
}

pub async fn seed_and_print(
    app: &App,
    addr: SocketAddr,
    admin_key: Option<&str>,
) -> anyhow::Result<()> {
    refuse_foreign_data(app).await?;
    let system = Principal::system();
    for (id, name) in [(PROVIDER_ORG, "Acme GPU Cloud"), (TENANT_ORG, "Tenant A")] {
        if orgs::find(app.store.pool(), id).await?.is_none() {
            let new = orgs::NewOrg {
                id: id.into(),
                name: name.into(),
            };
            orgs::create(app, &system, new).await?;
        }
    }
    for n in 1..=4 {
        nodes::register(
            app,
            &system,
            PROVIDER_ORG,
            &format!("h100-{n}"),
            h100_node(n),
        )
        .await?;
    }
    let pool = seed_pool(app).await?;
    let path = app.data_dir.join(KEYS_FILE);
    let keys = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).context("reading the demo keys")?,
        Err(_) => {
            let keys = DemoKeys {
                provider: create_key(app, PROVIDER_ORG, "demo provider", Role::Provider).await?,
                tenant: create_key(app, TENANT_ORG, "demo tenant", Role::Member).await?,
            };
            write_private_file(&path, &serde_json::to_string_pretty(&keys)?)?;
            keys
        }
    };
    let admin = admin_key.unwrap_or("$ORL_ADMIN_KEY");
    let url = format!("http://{addr}");
    println!(
        r#"
orl demo: provider org {PROVIDER_ORG} with nodes h100-1..h100-4 (8 x H100, NVLink domains nvl0/nvl1), tenant org {TENANT_ORG}.
pool {POOL_NAME} ({pool_id}) of the four nodes, offered to {TENANT_ORG} with a quota of {POOL_GPU_QUOTA} GPUs at {POOL_PRICE_PER_GPU_HOUR} cents per GPU-hour.

  admin key (ops):      {admin}
  provider key:         {provider}
  tenant key:           {tenant}

Try:
  # the capacity dashboard: open {url}/ in a browser and sign in with one of the keys above
  # the provider's nodes
  curl -s -H 'Authorization: Bearer {provider}' {url}/v1/orgs/{PROVIDER_ORG}/provider/nodes
  # re-send a node's inventory unchanged: same topologyGen
  curl -s -X PUT -H 'Authorization: Bearer {provider}' -H 'Content-Type: application/json' \
       -d '{inventory}' {url}/v1/orgs/{PROVIDER_ORG}/provider/nodes/h100-1
  # a tenant cannot see the provider's node: 404, not 403
  curl -s -H 'Authorization: Bearer {tenant}' {url}/v1/nodes/h100-1
  # reserve two GPUs of h100-1 for the tenant (platform admin), then release one to spot
  curl -s -X POST -H 'Authorization: Bearer {admin}' -H 'Content-Type: application/json' \
       -d '{{"unitIds":["h100-1-gpu0","h100-1-gpu1"],"allowedOrgIds":["{TENANT_ORG}"]}}' {url}/v1/nodes/h100-1/reservations
  curl -s -H 'Authorization: Bearer {provider}' {url}/v1/nodes/h100-1/reservations
  # what the tenant may place on now (reserved units are theirs alone)
  curl -s -H 'Authorization: Bearer {tenant}' {url}/v1/orgs/{TENANT_ORG}/catalog
  # book 4 NVLink-connected GPUs of the pool for 2 hours as the tenant; run it again: the same
  # idempotencyKey returns the stored reservation
  curl -s -X POST -H 'Authorization: Bearer {tenant}' -H 'Content-Type: application/json' \
       -d '{create}' {url}/api/compute/reservations/create
  # the tenant's compute reservations, newest first, and the same from the CLI
  curl -s -X POST -H 'Authorization: Bearer {tenant}' -H 'Content-Type: application/json' \
       -d '{{"tenantId":"{TENANT_ORG}"}}' {url}/api/compute/reservations/list
  ORL_URL={url} ORL_KEY={tenant} orl compute reservations list --tenant {TENANT_ORG}
  # the audit trail (ops)
  curl -s -H 'Authorization: Bearer {admin}' '{url}/v1/audit?limit=5'
  # the provider's earnings from the booking above (integer cents), and its spot work
  ORL_URL={url} ORL_KEY={provider} orl provider earnings
  ORL_URL={url} ORL_KEY={provider} orl provider spot-workload reclaim h100-1 --dry-run
  # the same objects through GraphQL (GraphiQL at {url}/graphql), and the live event stream
  curl -s -X POST -H 'Authorization: Bearer {tenant}' -H 'Content-Type: application/json' \
       -d '{{"query":"{{ viewer {{ orgId }} computeReservations(tenantId: \"{TENANT_ORG}\") {{ edges {{ node {{ id state }} }} }} }}"}}' {url}/graphql
  curl -sN -H 'Authorization: Bearer {tenant}' {url}/v1/events/stream
  # the API description
  curl -s {url}/openapi.json | head -c 300; echo
"#,
        provider = keys.provider,
        tenant = keys.tenant,
        inventory = inventory_json(1),
        pool_id = pool.id,
        create = serde_json::json!({
            "tenantId": TENANT_ORG,
            "poolId": pool.id,
            "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }],
            "duration": "2h",
            "idempotencyKey": DEMO_IDEMPOTENCY_KEY,
        }),
    );
    Ok(())
}

/// The provider's pool `h100-demo` of the four nodes, created on the first start, and its
/// offer to the tenant, made when the tenant has none.
async fn seed_pool(app: &App) -> anyhow::Result<Pool> {
    let system = Principal::system();
    let existing = pools::every(app, &system)
        .await?
        .into_iter()
        .find(|p| p.owner_org_id == PROVIDER_ORG && p.name == POOL_NAME);
    let pool = match existing {
        Some(pool) => pool,
        None => {
            let new = NewPool {
                name: POOL_NAME.into(),
                owner_org_id: PROVIDER_ORG.into(),
                node_ids: (1..=4).map(|n| format!("h100-{n}")).collect(),
                policy: Default::default(),
            };
            pools::create(app, &system, new).await?
        }
    };
    let offers = pools::every_offer(app, &system, &pool.id).await?;
    if !offers.iter().any(|o| o.tenant_id == TENANT_ORG) {
        let offer = NewOffer {
            tenant_id: TENANT_ORG.into(),
            quota: [("gpu".to_string(), POOL_GPU_QUOTA)].into(),
            price_per_gpu_hour: Some(POOL_PRICE_PER_GPU_HOUR),
            budget: None,
        };
        pools::put_offer(app, &system, &pool.id, offer).await?;
    }
    Ok(pool)
}

fn inventory_json(n: usize) -> String {
    let inv = h100_node(n);
    serde_json::json!({ "region": inv.region, "host": inv.host, "units": inv.units }).to_string()
}

async fn create_key(app: &App, org: &str, name: &str, role: Role) -> anyhow::Result<String> {
    let new = keys::NewKey {
        name: Some(name.into()),
        role: Some(role),
        ..Default::default()
    };
    Ok(keys::create(app, &Principal::system(), org, new).await?.key)
}
