//! Compute reservations over the RPC (seed 004): pools, offers, the IAM decision on a
//! draft, quota, placement, idempotency, the seven methods and the reconciler.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    Api, Db, HOUR, Options, Server, T0, assert_error, component, on_both_databases, register_node,
};

/// Provider `acme` with `nodes` nodes of 8 H100s in pool `pool`, offered to `tenant-a`
/// with `gpu_quota` GPUs; `tenant` is a member key of tenant-a.
struct World {
    server: Server,
    provider: Api,
    tenant: Api,
    pool: String,
}

async fn world(db: Db, nodes: usize, gpu_quota: i64) -> World {
    world_with(db, nodes, json!({ "gpu": gpu_quota }), json!({})).await
}

async fn world_with(db: Db, nodes: usize, quota: Value, policy: Value) -> World {
    world_on(Server::start(db).await, nodes, quota, policy).await
}

async fn world_on(server: Server, nodes: usize, quota: Value, policy: Value) -> World {
    let provider = server.org_with_key("acme", "provider").await;
    let mut node_ids = Vec::new();
    for n in 1..=nodes {
        register_node(&provider, "acme", &format!("n{n}"), 8).await;
        node_ids.push(format!("n{n}"));
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": node_ids, "policy": policy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": quota }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    World {
        server,
        provider,
        tenant,
        pool,
    }
}

async fn rpc(api: &Api, method: &str, body: Value) -> (StatusCode, Value) {
    api.post(&format!("/api/compute/reservations/{method}"), body)
        .await
}

impl World {
    /// Archives the pool (platform admin): it takes no new creates.
    async fn archive_pool(&self) {
        let path = format!("/v1/pools/{}/archive", self.pool);
        let (status, body) = self.server.admin().post(&path, json!({})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    fn ask(&self, key: &str, gpus: i64) -> Value {
        json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h", "idempotencyKey": key })
    }

    /// Makes `nodes` the pool's members.
    async fn set_pool_nodes(&self, nodes: &[&str]) {
        let path = format!("/v1/pools/{}/nodes", self.pool);
        let (status, pool) = self
            .server
            .admin()
            .put(&path, json!({ "nodeIds": nodes }))
            .await;
        assert_eq!(status, StatusCode::OK, "{pool}");
    }

    async fn create(&self, body: Value) -> Value {
        let (status, r) = rpc(&self.tenant, "create", body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    async fn get(&self, id: &Value) -> (StatusCode, Value) {
        rpc(
            &self.tenant,
            "get",
            json!({ "tenantId": "tenant-a", "reservationId": id }),
        )
        .await
    }

    /// `n` creates of 1 GPU (keys `{prefix}-{i}`), sent at once: released together by a
    /// barrier. Their answers, in order.
    async fn create_at_once(&self, prefix: &str, n: usize) -> Vec<(StatusCode, Value)> {
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(n));
        let calls = (0..n).map(|i| {
            let tenant = self.tenant.clone();
            let body = self.ask(&format!("{prefix}-{i}"), 1);
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                rpc(&tenant, "create", body).await
            })
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect()
    }

    async fn used_gpus(&self) -> i64 {
        let (_, offers) = self
            .server
            .admin()
            .get(&format!("/v1/pools/{}/offers", self.pool))
            .await;
        offers["items"][0]["used"]["gpu"].as_i64().unwrap_or(0)
    }

    async fn call(&self, method: &str, id: &Value) -> (StatusCode, Value) {
        rpc(
            &self.tenant,
            method,
            json!({ "tenantId": "tenant-a", "reservationId": id }),
        )
        .await
    }
}

on_both_databases!(
    create_places_whole_gpus_and_a_replay_returns_the_stored_reservation,
    the_same_key_with_a_different_request_is_a_conflict,
    a_replay_answers_with_the_stored_reservation_once_the_pool_takes_no_new_creates,
    input_that_breaks_the_seed_constraints_is_refused,
    pools_not_offered_archived_or_mismatched_are_refused,
    quota_exceeded_leaves_the_draft_for_a_retry,
    quota_is_charged_once_and_refunded_once_on_every_terminal_path,
    what_does_not_fit_is_pending_and_placed_when_capacity_frees,
    pool_lease_serves_the_queue_in_order_and_wait_returns_the_queued_reservation,
    wait_answers_as_soon_as_the_queued_reservation_is_placed,
    list_is_newest_first_paginated_and_scoped,
    another_tenants_reservation_named_under_ones_own_tenant_is_not_found_and_left_as_it_is,
    release_and_cancel_follow_the_state_rules,
    extend_moves_the_end_or_reports_available_until,
    an_extend_reaches_366_days_from_the_start_and_no_further,
    concurrent_extends_are_refused_while_one_is_in_flight,
    a_claim_left_by_an_extend_that_never_finished_holds_others_off_ten_seconds_and_says_how_long,
    a_release_whose_client_goes_away_mid_write_changes_nothing_and_lets_the_writer_go,
    a_pending_reservation_is_retried_thirty_seconds_after_its_refusal_and_not_before,
    pending_reservations_of_a_pool_are_retried_together_oldest_first_and_what_still_waits_waits_thirty_seconds_more,
    a_reservation_still_waiting_for_the_same_reason_keeps_its_conditions_since,
    renew_moves_the_lease_and_a_lapsed_lease_releases,
    the_reconciler_activates_and_expires_with_the_clock,
    iam_policy_refusal_is_access_denied_and_stays_refused,
    an_agents_refused_create_is_confirmed_by_a_person,
    spend_limit_refuses_what_the_budget_cannot_cover,
    a_failing_spend_guard_fails_the_create_or_falls_back_to_the_built_in,
    sixty_four_concurrent_creates_book_exactly_the_last_eight_gpus,
    concurrent_creates_past_the_quota_are_refused_each_alone_and_charge_it_exactly,
    node_reservation_rights_are_honoured_by_placement,
    events_are_written_with_each_change_and_scoped_to_the_tenant,
    the_database_itself_refuses_overlapping_bookings_of_one_unit,
);

async fn create_places_whole_gpus_and_a_replay_returns_the_stored_reservation(db: Db) {
    let w = world(db, 2, 16).await;
    let mut ask = w.ask("k-1", 4);
    ask["devices"][0]["topology"] = json!("nvlink-all");
    let r = w.create(ask.clone()).await;
    assert!(r["id"].as_str().unwrap().starts_with("rsv_"));
    assert_eq!(r["state"], "placed");
    assert_eq!(r["start"], T0);
    assert_eq!(r["end"], T0 + 2 * HOUR);
    let units = r["placement"]["unitIds"].as_array().unwrap();
    assert_eq!(units.len(), 4);
    let node = r["placement"]["nodeId"].as_str().unwrap();
    let (_, node_view) = w.provider.get(&format!("/v1/nodes/{node}")).await;
    let domains: std::collections::HashSet<&str> = node_view["units"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| units.contains(&u["id"]))
        .map(|u| u["nvlinkDomain"].as_str().unwrap())
        .collect();
    assert_eq!(domains.len(), 1, "nvlink-all keeps the units in one domain");
    assert_eq!(
        r["resources"]["vcpu"],
        4 * 28,
        "the per-GPU share of a 224-vCPU, 8-GPU host"
    );
    assert_eq!(w.used_gpus().await, 4);

    ask["wait"] = json!({ "timeoutMs": 50 });
    let replay = w.create(ask).await;
    assert_eq!(replay["id"], r["id"]);
    assert_eq!(replay["placement"], r["placement"]);
    assert_eq!(w.used_gpus().await, 4, "a replay charges nothing");
    let (status, got) = w.get(&r["id"]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["id"], r["id"]);
}

async fn the_same_key_with_a_different_request_is_a_conflict(db: Db) {
    let w = world(db, 1, 16).await;
    let r = w.create(w.ask("k-1", 1)).await;
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-1", 2)).await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(err["error"]["details"]["reservationId"], r["id"]);
    let other_key = w.server.as_key(
        &w.server
            .key_in("tenant-a", json!({ "role": "member" }))
            .await,
    );
    let (status, mine) = rpc(&other_key, "create", w.ask("k-1", 2)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "another caller's key is another reservation: {mine}"
    );
    assert_ne!(mine["id"], r["id"]);
}

/// A replay answers with the stored reservation even after the pool was archived (where a
/// new create is refused), and a new key is refused.
async fn a_replay_answers_with_the_stored_reservation_once_the_pool_takes_no_new_creates(db: Db) {
    let w = world(db, 1, 16).await;
    let r = w.create(w.ask("k-1", 2)).await;
    assert_eq!(r["state"], "placed", "{r}");
    w.archive_pool().await;
    let (status, replay) = rpc(&w.tenant, "create", w.ask("k-1", 2)).await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["id"], r["id"]);
    assert_eq!(replay["placement"], r["placement"]);
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-1", 4)).await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-2", 2)).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    assert_eq!(w.used_gpus().await, 2, "a replay charges nothing");
}

async fn input_that_breaks_the_seed_constraints_is_refused(db: Db) {
    let w = world(db, 1, 16).await;
    let cases = [
        (json!({ "poolId": "pool_X" }), "INVALID_INPUT"),
        (
            json!({ "devices": vec![json!({ "class": "gpu", "count": 1 }); 9] }),
            "INVALID_INPUT",
        ),
        (
            json!({ "devices": [{ "class": "gpu", "count": 65 }] }),
            "INVALID_INPUT",
        ),
        (json!({ "leaseSeconds": 29 }), "INVALID_INPUT"),
        (json!({ "wait": { "timeoutMs": 30001 } }), "INVALID_INPUT"),
        (json!({ "idempotencyKey": "has space" }), "INVALID_INPUT"),
        (json!({ "duration": "forever" }), "INVALID_INPUT"),
        (json!({ "extra": true }), "INVALID_INPUT"),
        (json!({ "binding": "vm" }), "UNSUPPORTED"),
    ];
    for (patch, code) in cases {
        let mut body = w.ask("k-bad", 1);
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, err) = rpc(&w.tenant, "create", body.clone()).await;
        assert_eq!(err["error"]["code"], code, "{body}: {err}");
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    let (status, err) = rpc(
        &w.tenant,
        "get",
        json!({ "tenantId": "tenant-a", "reservationId": "rsv_1" }),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "limit": 201 }),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "state": "sleeping" }),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(w.used_gpus().await, 0);
}

async fn pools_not_offered_archived_or_mismatched_are_refused(db: Db) {
    let w = world(db, 1, 16).await;
    let stranger = w.server.org_with_key("stranger", "member").await;
    let mut body = w.ask("k-1", 1);
    body["tenantId"] = json!("stranger");
    let (status, err) = rpc(&stranger, "create", body).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = rpc(&stranger, "create", w.ask("k-1", 1)).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");

    let mut mig = w.ask("k-2", 1);
    mig["devices"][0]["class"] = json!("gpu.mig");
    let (status, err) = rpc(&w.tenant, "create", mig).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let mut shared = w.ask("k-3", 1);
    shared["devices"][0]["sharing"] = json!("timeslice");
    let (status, err) = rpc(&w.tenant, "create", shared).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let mut node = w.ask("k-4", 1);
    node["binding"] = json!("node");
    let (status, err) = rpc(&w.tenant, "create", node).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let mut kube = w.ask("k-5", 1);
    kube["binding"] = json!("kubernetes");
    let (status, err) = rpc(&w.tenant, "create", kube).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");

    w.archive_pool().await;
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-6", 1)).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn quota_exceeded_leaves_the_draft_for_a_retry(db: Db) {
    let w = world(db, 1, 4).await;
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-1", 6)).await;
    assert_error(status, &err, StatusCode::CONFLICT, "QUOTA_EXCEEDED");
    assert_eq!(err["error"]["details"]["resource"], "gpu");
    let drafts = || async {
        let drafts: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, state FROM compute_reservations WHERE tenant_id = 'tenant-a' AND idempotency_key = 'k-1'",
        )
        .fetch_all(&mut w.server.database().await)
        .await
        .unwrap();
        drafts
    };
    let draft = drafts().await;
    assert_eq!(draft.len(), 1);
    assert_eq!(draft[0].1, "draft", "the refused request stays as a draft");
    let (_, list) = rpc(&w.tenant, "list", json!({ "tenantId": "tenant-a" })).await;
    assert_eq!(list["items"], json!([]), "a draft is internal");
    let (status, err) = w.call("release", &json!(draft[0].0)).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
    assert_eq!(drafts().await, draft, "a draft is not released");
    let (status, _) = w
        .server
        .admin()
        .post(
            &format!("/v1/pools/{}/offers", w.pool),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 8 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let r = w.create(w.ask("k-1", 6)).await;
    assert_eq!(r["state"], "placed");
    assert_eq!(w.used_gpus().await, 6);
    let mut no_row = w.ask("k-2", 1);
    no_row["resources"] = json!({ "vcpu": 200 });
    let (status, err) = rpc(&w.tenant, "create", no_row).await;
    assert_error(status, &err, StatusCode::CONFLICT, "QUOTA_EXCEEDED");
    assert_eq!(
        err["error"]["details"]["resource"], "vcpu",
        "a missing quota row grants 0"
    );
}

async fn quota_is_charged_once_and_refunded_once_on_every_terminal_path(db: Db) {
    let w = world(db, 2, 16).await;
    let released = w.create(w.ask("k-release", 2)).await;
    let cancelled = w.create(json!({ "tenantId": "tenant-a", "poolId": w.pool, "devices": [{ "class": "gpu", "count": 2 }], "duration": "1h", "start": T0 + 10 * HOUR, "idempotencyKey": "k-cancel" })).await;
    let mut leased = w.ask("k-lease", 2);
    leased["leaseSeconds"] = json!(60);
    let leased = w.create(leased).await;
    let mut ends = w.ask("k-end", 2);
    ends["duration"] = json!(1800);
    let ends = w.create(ends).await;
    assert_eq!(w.used_gpus().await, 8);

    let (_, r) = w.call("release", &released["id"]).await;
    assert_eq!(
        (r["state"].as_str(), r["reason"].as_str()),
        (Some("released"), Some("release"))
    );
    assert_eq!(w.used_gpus().await, 6);
    let (_, again) = w.call("release", &released["id"]).await;
    assert_eq!(again["state"], "released");
    assert_eq!(w.used_gpus().await, 6, "releasing twice refunds once");
    let (_, r) = w.call("cancel", &cancelled["id"]).await;
    assert_eq!(r["state"], "cancelled");
    assert_eq!(w.used_gpus().await, 4);
    w.server.set_clock(T0 + 31 * 60_000).await;
    let (_, r) = w.get(&ends["id"]).await;
    assert_eq!(
        (r["state"].as_str(), r["reason"].as_str()),
        (Some("expired"), Some("window-ended"))
    );
    let (_, r) = w.get(&leased["id"]).await;
    assert_eq!(
        (r["state"].as_str(), r["reason"].as_str()),
        (Some("released"), Some("lease-lapsed"))
    );
    assert_eq!(w.used_gpus().await, 0);
    w.server.set_clock(T0 + 40 * 60_000).await;
    assert_eq!(w.used_gpus().await, 0, "never refunded twice");
}

async fn what_does_not_fit_is_pending_and_placed_when_capacity_frees(db: Db) {
    let w = world(db, 1, 64).await;
    let big = w.create(w.ask("k-big", 6)).await;
    let waiting = w.create(w.ask("k-wait", 4)).await;
    assert_eq!(waiting["state"], "pending");
    assert_eq!(waiting["conditions"][0]["type"], "Unschedulable");
    assert_eq!(
        w.used_gpus().await,
        10,
        "a pending reservation holds its quota"
    );
    let (_, r) = w.call("release", &big["id"]).await;
    assert_eq!(r["state"], "released");
    let (_, placed) = w.get(&waiting["id"]).await;
    assert_eq!(
        placed["state"], "placed",
        "freed capacity wakes the pool's pending reservations"
    );
    assert_eq!(placed["conditions"], json!([]));
    let (_, pending_release) = w
        .call("release", &w.create(w.ask("k-more", 8)).await["id"])
        .await;
    assert_eq!(
        pending_release["state"], "cancelled",
        "releasing a pending reservation cancels it"
    );
}

async fn pool_lease_serves_the_queue_in_order_and_wait_returns_the_queued_reservation(db: Db) {
    let w = world_with(
        db,
        1,
        json!({ "gpu": 64 }),
        json!({ "placer": "pool-lease" }),
    )
    .await;
    let holder = w.create(w.ask("k-hold", 6)).await;
    let mut first = w.ask("k-first", 8);
    first["wait"] = json!({ "timeoutMs": 300 });
    let first = w.create(first).await;
    assert_eq!(
        first["state"], "pending",
        "a wait that times out returns the reservation"
    );
    assert_eq!(first["conditions"][0]["type"], "Queued");
    let second = w.create(w.ask("k-second", 1)).await;
    assert_eq!(
        second["state"], "pending",
        "nothing jumps the queue, even what would fit"
    );
    // Freed, the node fits the first (all 8) or the second, not both: the first goes first.
    w.call("release", &holder["id"]).await;
    assert_eq!(w.get(&first["id"]).await.1["state"], "placed");
    let (_, waits) = w.get(&second["id"]).await;
    assert_eq!(
        waits["state"], "pending",
        "the second waits behind the first"
    );
    let kinds: Vec<&Value> = (waits["conditions"].as_array().unwrap().iter())
        .map(|c| &c["type"])
        .collect();
    assert_eq!(
        kinds,
        ["Queued"],
        "tried again, it is still queued: {waits}"
    );
    assert_ne!(
        waits["conditions"][0]["message"], second["conditions"][0]["message"],
        "no longer behind an older one, it waits for the units"
    );
    // Tried on every pass, it waits for the same reason since the same time.
    w.server.set_clock(T0 + 1_000).await;
    assert_eq!(
        w.get(&second["id"]).await.1["conditions"],
        waits["conditions"]
    );
    w.call("release", &first["id"]).await;
    assert_eq!(w.get(&second["id"]).await.1["state"], "placed");
}

async fn wait_answers_as_soon_as_the_queued_reservation_is_placed(db: Db) {
    let w = world_with(
        db,
        1,
        json!({ "gpu": 64 }),
        json!({ "placer": "pool-lease" }),
    )
    .await;
    let holder = w.create(w.ask("k-hold", 8)).await;
    let mut queued = w.ask("k-queued", 4);
    queued["wait"] = json!({ "timeoutMs": 20000 });
    let tenant = w.tenant.clone();
    let asked = std::time::Instant::now();
    let waiting = tokio::spawn(async move { rpc(&tenant, "create", queued).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "queued behind the holder");
    w.call("release", &holder["id"]).await;
    let (status, placed) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{placed}");
    assert_eq!(placed["state"], "placed", "{placed}");
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(10),
        "answered once placed, not at the end of the wait: {:?}",
        asked.elapsed()
    );
}

async fn list_is_newest_first_paginated_and_scoped(db: Db) {
    let w = world(db, 2, 64).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        w.server.set_clock(T0 + i * 1000).await;
        ids.push(w.create(w.ask(&format!("k-{i}"), 1)).await["id"].clone());
    }
    let colleague = w.server.as_key(
        &w.server
            .key_in("tenant-a", json!({ "role": "member" }))
            .await,
    );
    let theirs = rpc(&colleague, "create", w.ask("k-x", 1)).await.1["id"].clone();
    let (_, page1) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "limit": 2 }),
    )
    .await;
    assert_eq!(
        page1["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].clone())
            .collect::<Vec<_>>(),
        vec![ids[4].clone(), ids[3].clone()]
    );
    let cursor = page1["cursor"].clone();
    let (_, page2) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "limit": 2, "cursor": cursor }),
    )
    .await;
    assert_eq!(page2["items"][0]["id"], ids[2]);
    let (_, page3) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "limit": 2, "cursor": page2["cursor"] }),
    )
    .await;
    assert_eq!(page3["items"].as_array().unwrap().len(), 1);
    assert!(page3.get("cursor").is_none());
    let (_, mine) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "limit": 200 }),
    )
    .await;
    assert!(
        !mine["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == theirs),
        "scope mine is the caller's own"
    );
    let (_, all) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "scope": "all" }),
    )
    .await;
    assert_eq!(all["items"].as_array().unwrap().len(), 6);
    w.call("release", &ids[0]).await;
    let (_, released) = rpc(
        &w.tenant,
        "list",
        json!({ "tenantId": "tenant-a", "state": "released", "poolId": w.pool }),
    )
    .await;
    assert_eq!(released["items"].as_array().unwrap().len(), 1);
    let stranger = w.server.org_with_key("stranger", "member").await;
    let (status, err) = rpc(&stranger, "list", json!({ "tenantId": "tenant-a" })).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = rpc(
        &stranger,
        "get",
        json!({ "tenantId": "tenant-a", "reservationId": ids[1] }),
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn another_tenants_reservation_named_under_ones_own_tenant_is_not_found_and_left_as_it_is(
    db: Db,
) {
    let w = world(db, 1, 64).await;
    let rival = w.server.org_with_key("tenant-b", "member").await;
    let offer = json!({ "tenantId": "tenant-b", "quota": { "gpu": 64 } });
    let path = format!("/v1/pools/{}/offers", w.pool);
    let (status, body) = w.server.admin().post(&path, offer).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut ask = w.ask("k-b", 2);
    ask["tenantId"] = json!("tenant-b");
    ask["leaseSeconds"] = json!(120);
    let (status, theirs) = rpc(&rival, "create", ask).await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    assert_eq!(theirs["state"], "placed");
    // tenant-a's key names tenant-a, which it acts for, and tenant-b's reservation.
    for method in ["get", "release", "cancel", "renew"] {
        let (status, err) = w.call(method, &theirs["id"]).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    }
    let extend = json!({ "tenantId": "tenant-a", "reservationId": theirs["id"], "by": "1h", "idempotencyKey": "e-1" });
    let (status, err) = rpc(&w.tenant, "extend", extend).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (_, now) = rpc(
        &rival,
        "get",
        json!({ "tenantId": "tenant-b", "reservationId": theirs["id"] }),
    )
    .await;
    assert_eq!(now["state"], "placed", "{now}");
    assert_eq!(now["end"], theirs["end"]);
    assert_eq!(now["leaseDeadline"], theirs["leaseDeadline"]);
}

async fn release_and_cancel_follow_the_state_rules(db: Db) {
    let w = world(db, 1, 64).await;
    let active = w.create(w.ask("k-1", 1)).await;
    w.server.set_clock(T0 + 1000).await;
    assert_eq!(w.get(&active["id"]).await.1["state"], "active");
    let (status, err) = w.call("cancel", &active["id"]).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
    let (_, cancelled) = w
        .call("cancel", &w.create(w.ask("k-2", 1)).await["id"])
        .await;
    assert_eq!(cancelled["state"], "cancelled");
    let (status, again) = w.call("cancel", &cancelled["id"]).await;
    assert_eq!(
        (status, again["state"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, err) = w
        .call("release", &json!("rsv_00000000000000000000000000"))
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    w.server
        .admin()
        .put(
            "/v1/orgs/tenant-a/iam/policy",
            json!({ "policy": "forbid(principal, action, resource);" }),
        )
        .await;
    let (status, _) = rpc(&w.tenant, "create", w.ask("k-denied", 1)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let denied_id =
        json!(crate::support::reservation_id_of(&w.server, "tenant-a", "k-denied").await);
    let (status, err) = w.call("release", &denied_id).await;
    assert_eq!(
        (status, err["state"].as_str()),
        (StatusCode::OK, Some("denied")),
        "a terminal reservation is returned unchanged: {err}"
    );
}

async fn extend_moves_the_end_or_reports_available_until(db: Db) {
    let w = world(db, 1, 64).await;
    let r = w.create(w.ask("k-1", 8)).await;
    let later = w.create(json!({ "tenantId": "tenant-a", "poolId": w.pool, "devices": [{ "class": "gpu", "count": 8 }], "duration": "1h", "start": T0 + 5 * HOUR, "idempotencyKey": "k-later" })).await;
    assert_eq!(later["state"], "placed");
    let extend = |body: Value| rpc(&w.tenant, "extend", body);
    let base = json!({ "tenantId": "tenant-a", "reservationId": r["id"], "idempotencyKey": "e-1" });
    let mut by = base.clone();
    by["by"] = json!("1h");
    let (status, out) = extend(by.clone()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["extended"], true);
    assert_eq!(out["reservation"]["end"], T0 + 3 * HOUR);
    let mut until = base.clone();
    until["until"] = json!(T0 + 3 * HOUR);
    let (_, same) = extend(until.clone()).await;
    assert_eq!(
        same["extended"], false,
        "an until already reached is safe to retry"
    );
    assert!(same.get("availableUntil").is_none());
    until["until"] = json!(T0 + 7 * HOUR);
    let (_, blocked) = extend(until).await;
    assert_eq!(blocked["extended"], false);
    assert_eq!(blocked["availableUntil"], T0 + 5 * HOUR);
    assert_eq!(
        blocked["reservation"]["end"],
        T0 + 3 * HOUR,
        "all or nothing"
    );
    let mut both = by.clone();
    both["until"] = json!(T0 + 4 * HOUR);
    let (status, err) = extend(both).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = extend(base.clone()).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let pending = w.create(w.ask("k-pending", 8)).await;
    assert_eq!(pending["state"], "pending");
    let mut p = by.clone();
    p["reservationId"] = pending["id"].clone();
    let (status, err) = extend(p).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
    w.server.admin().put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": r#"
        permit(principal, action, resource);
        forbid(principal, action == Orl::Action::"compute:reservations:extend", resource) when { context.durationHours > 4 };
    "# })).await;
    let (status, err) = extend(by.clone()).await;
    assert_eq!(status, StatusCode::OK, "{err}");
    let (status, err) = extend(by).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    assert_eq!(
        w.get(&r["id"]).await.1["end"],
        T0 + 4 * HOUR,
        "a policy that caps duration caps extensions"
    );
}

async fn an_extend_reaches_366_days_from_the_start_and_no_further(db: Db) {
    const DAYS_366: i64 = 366 * 24 * HOUR;
    let w = world(db, 1, 64).await;
    let r = w.create(w.ask("k-1", 1)).await;
    let start = r["start"].as_i64().expect("start");
    let extend = |until: i64, key: &str| {
        let body = json!({ "tenantId": "tenant-a", "reservationId": r["id"], "until": until, "idempotencyKey": key });
        rpc(&w.tenant, "extend", body)
    };
    let (status, err) = extend(start + DAYS_366 + 1, "e-over").await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(err["error"]["details"]["field"], "until", "{err}");
    assert_eq!(
        w.get(&r["id"]).await.1["end"],
        r["end"],
        "a refused extend moves nothing"
    );
    let (status, out) = extend(start + DAYS_366, "e-at").await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["extended"], true, "{out}");
    assert_eq!(out["reservation"]["end"], start + DAYS_366);
}

async fn a_claim_left_by_an_extend_that_never_finished_holds_others_off_ten_seconds_and_says_how_long(
    db: Db,
) {
    let w = world(db, 1, 64).await;
    let r = w.create(w.ask("k-1", 1)).await;
    // An extend claimed the reservation at T0 and its server stopped before deciding.
    let mut db = w.server.database().await;
    sqlx::query("UPDATE compute_reservations SET extend_started_ms = $1 WHERE id = $2")
        .bind(T0)
        .bind(r["id"].as_str().unwrap())
        .execute(&mut db)
        .await
        .unwrap();
    let extend = |key: &str| {
        let body = json!({ "tenantId": "tenant-a", "reservationId": r["id"], "by": "1h", "idempotencyKey": key });
        rpc(&w.tenant, "extend", body)
    };
    w.server.set_clock(T0 + 2_500).await;
    let (status, refused) = extend("e-early").await;
    assert_error(status, &refused, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(refused["error"]["details"]["reason"], "extend-in-flight");
    assert_eq!(
        refused["error"]["details"]["retryAfterSeconds"], 8,
        "7.5 s of the claim left, rounded up: {refused}"
    );
    w.server.set_clock(T0 + 9_999).await;
    let (status, refused) = extend("e-held").await;
    assert_error(status, &refused, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(refused["error"]["details"]["retryAfterSeconds"], 1);
    w.server.set_clock(T0 + 10_000).await;
    let (status, out) = extend("e-lapsed").await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["extended"], true, "{out}");
}

/// A world on a server whose extends wait at the debug-build gate `var` (see
/// `extend::hold_at`) until the file `gate` exists, in the directory `gates`.
struct Gated {
    w: World,
    gates: tempfile::TempDir,
    gate: std::path::PathBuf,
}

impl Gated {
    /// Waits until an operation is held at the gate.
    async fn reached(&self) {
        crate::support::reached(&self.gates.path().join("open.reached")).await;
    }
}

async fn gated_world(db: Db, var: &str, nodes: usize) -> Gated {
    let gates = tempfile::tempdir().unwrap();
    let gate = gates.path().join("open");
    let options = Options {
        env: vec![(var.to_string(), gate.display().to_string())],
        ..Options::default()
    };
    let server = Server::start_with(db, options).await;
    let w = world_on(server, nodes, json!({ "gpu": 64 }), json!({})).await;
    Gated { w, gates, gate }
}

async fn concurrent_extends_are_refused_while_one_is_in_flight(db: Db) {
    // The server holds every extend between its claim and its decision until `gate` exists.
    let Gated {
        w,
        gate,
        gates: _gates,
    } = gated_world(db, "ORL_TEST_EXTEND_GATE", 1).await;
    let r = w.create(w.ask("k-1", 1)).await;
    let id = r["id"].as_str().unwrap().to_string();
    let extend = |key: &str| {
        let tenant = w.tenant.clone();
        let body = json!({ "tenantId": "tenant-a", "reservationId": id, "by": 3600, "idempotencyKey": key });
        tokio::spawn(async move { rpc(&tenant, "extend", body).await })
    };
    let first = extend("e-1");
    // The first extend has claimed the reservation and is held before deciding.
    let mut db = w.server.database().await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let claimed: Option<i64> =
            sqlx::query_scalar("SELECT extend_started_ms FROM compute_reservations WHERE id = $1")
                .bind(&id)
                .fetch_one(&mut db)
                .await
                .unwrap();
        if claimed.is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first extend never claimed the reservation"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // A second extend now meets the claim: refused at once, not decided too.
    let (status, refused) = tokio::time::timeout(std::time::Duration::from_secs(10), extend("e-2"))
        .await
        .expect("the second extend is refused while the first is in flight, not held with it")
        .unwrap();
    assert_error(status, &refused, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        refused["error"]["details"]["reason"], "extend-in-flight",
        "{refused}"
    );
    assert_eq!(refused["error"]["details"]["reservationId"], id.as_str());
    assert!(
        refused["error"]["details"]["retryAfterSeconds"]
            .as_i64()
            .unwrap()
            >= 1
    );
    std::fs::write(&gate, b"").unwrap();
    let (status, won) = first.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{won}");
    assert_eq!(won["extended"], true, "{won}");
    assert_eq!(
        w.get(&r["id"]).await.1["end"],
        T0 + 3 * HOUR,
        "exactly one of the two extends moved the end"
    );
    // The winner gave its claim back: the next extend is decided.
    let (status, next) = extend("e-3").await.unwrap();
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(next["reservation"]["end"], T0 + 4 * HOUR, "{next}");
}

/// PostgreSQL only: on SQLite the extend's transaction holds the one writer while it is
/// held, so no create can commit inside its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_units_are_booked_after_its_check_answers_until_when_not_500() {
    // The server holds an extend that found nothing in its way until `gate` exists.
    let Gated { w, gates, gate } = gated_world(Db::Postgres, "ORL_TEST_EXTEND_BOOK_GATE", 1).await;
    let held = w.create(w.ask("k-held", 8)).await;
    let end = held["end"].as_i64().expect("end");
    let body = json!({ "tenantId": "tenant-a", "reservationId": held["id"], "by": "1h", "idempotencyKey": "e-1" });
    let tenant = w.tenant.clone();
    let extend = tokio::spawn(async move { rpc(&tenant, "extend", body).await });
    let reached = gates.path().join("open.reached");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !reached.exists() {
        if extend.is_finished() {
            panic!(
                "the extend answered before its bookings: {:?}",
                extend.await
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the extend never reached its bookings"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The node's eight GPUs are booked from the held reservation's end, after the extend
    // looked and before it moves its bookings.
    let mut later = w.ask("k-later", 8);
    later["start"] = json!(end);
    let later = w.create(later).await;
    assert_eq!(later["state"], "placed", "{later}");
    std::fs::write(&gate, b"").unwrap();
    let (status, out) = extend.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["extended"], false, "{out}");
    assert_eq!(out["availableUntil"], end, "{out}");
    assert_eq!(w.get(&held["id"]).await.1["end"], end, "nothing moved");
}

/// A release held at `ORL_TEST_END_GATE` (its guarded update matched), its answer to come.
struct HeldRelease {
    w: World,
    gates: tempfile::TempDir,
    gate: std::path::PathBuf,
    id: String,
    answer: tokio::task::JoinHandle<(StatusCode, Value)>,
}

/// A world on PostgreSQL whose reservation of 2 GPUs is being released, the release held at
/// its gate. PostgreSQL only: a release there commits alone; on SQLite it writes in the one
/// writer's turn, where no other transaction holds a lock it could wait for.
async fn held_release() -> HeldRelease {
    let Gated { w, gates, gate } = gated_world(Db::Postgres, "ORL_TEST_END_GATE", 1).await;
    let r = w.create(w.ask("k-1", 2)).await;
    assert_eq!(w.used_gpus().await, 2);
    let id = r["id"].as_str().unwrap().to_string();
    let (tenant, body) = (
        w.tenant.clone(),
        json!({ "tenantId": "tenant-a", "reservationId": id }),
    );
    let answer = tokio::spawn(async move { rpc(&tenant, "release", body).await });
    HeldRelease {
        w,
        gates,
        gate,
        id,
        answer,
    }
}

impl HeldRelease {
    /// Waits for the release at its gate, then deadlocks it: another transaction takes the
    /// tenant's quota row, which the release refunds next, lets the release go on, and waits
    /// for the reservation's row, which the release holds. PostgreSQL breaks the deadlock by
    /// aborting the release (the other session detects deadlocks last); the other then rolls
    /// back. With `again`, the gate is closed before the release is aborted, so that its next
    /// attempt is held too.
    async fn deadlock(&self, again: bool) {
        let reached = self.gates.path().join("open.reached");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while !reached.exists() {
            assert!(
                !self.answer.is_finished(),
                "the release answered before its gate"
            );
            assert!(
                tokio::time::Instant::now() < deadline,
                "the release never reached its gate"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut other = self.w.server.database().await;
        for sql in [
            "SET deadlock_timeout = '30s'",
            "BEGIN",
            "SELECT used FROM quota_usage WHERE tenant_id = 'tenant-a' FOR UPDATE",
        ] {
            sqlx::query(sql).execute(&mut other).await.unwrap();
        }
        std::fs::write(&self.gate, b"").unwrap();
        if again {
            // Once the release waits for the quota row, past its gate.
            let mut watch = self.w.server.database().await;
            loop {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                )
                .fetch_one(&mut watch)
                .await
                .unwrap();
                if waiting > 0 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the release never waited"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            std::fs::remove_file(&self.gate).unwrap();
            std::fs::remove_file(&reached).unwrap();
        }
        sqlx::query("UPDATE compute_reservations SET version = version WHERE id = $1")
            .bind(&self.id)
            .execute(&mut other)
            .await
            .expect("the release is the one aborted");
        sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_deadlocks_after_its_guarded_update_is_written_again_and_refunds_once() {
    let held = held_release().await;
    held.deadlock(false).await;
    let (status, released) = held.answer.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released", "{released}");
    assert_eq!(held.w.used_gpus().await, 0, "refunded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_deadlocks_three_times_answers_conflict_and_changes_nothing() {
    let mut held = held_release().await;
    for _ in 0..3 {
        held.deadlock(true).await;
    }
    let (status, err) = (&mut held.answer).await.unwrap();
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        err["error"]["details"]["reason"], "transaction-conflict",
        "{err}"
    );
    let (_, r) = held.w.get(&json!(held.id)).await;
    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(held.w.used_gpus().await, 2, "nothing refunded");
    // Tried again, it releases.
    std::fs::write(&held.gate, b"").unwrap();
    let (status, released) = held.w.call("release", &json!(held.id)).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(held.w.used_gpus().await, 0, "refunded once");
}

/// A release whose client goes away while it writes (held at its gate, its guarded update
/// made) is dropped with the request: its writes are rolled back, the writer it held is let
/// go (on SQLite the one writer's turn, in the group commit; on PostgreSQL its own
/// transaction), and the reservation stays as it was, for a later release.
async fn a_release_whose_client_goes_away_mid_write_changes_nothing_and_lets_the_writer_go(db: Db) {
    let gated = gated_world(db, "ORL_TEST_END_GATE", 1).await;
    let (w, gate) = (&gated.w, &gated.gate);
    let id = w.create(w.ask("k-1", 2)).await["id"].clone();
    let (tenant, body) = (
        w.tenant.clone(),
        json!({ "tenantId": "tenant-a", "reservationId": id }),
    );
    let release = tokio::spawn(async move { rpc(&tenant, "release", body).await });
    gated.reached().await;
    // The client goes away: its connection closes while the release is held.
    release.abort();
    assert!(release.await.unwrap_err().is_cancelled());
    let mut other = w.server.database().await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while holds_writes(db, &mut other, id.as_str().unwrap()).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped release still holds its writes"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    std::fs::write(gate, b"").unwrap();
    let (_, r) = w.get(&id).await;
    assert_eq!(r["state"], "placed", "rolled back: {r}");
    assert_eq!(w.used_gpus().await, 2, "nothing refunded");
    // The writer goes on: a create is placed, and the release asked again releases.
    assert_eq!(w.create(w.ask("k-2", 1)).await["state"], "placed");
    let (status, released) = w.call("release", &id).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released", "{released}");
    assert_eq!(w.used_gpus().await, 1, "refunded once");
}

/// Writes that wait for the turn while one holds it join its group and commit with it, 16
/// writes at most to a commit: a release held in the turn, seventeen creates waiting behind
/// it, make two commits. SQLite only: there a release writes in the group commit; on
/// PostgreSQL it commits alone, and nothing a test can hold holds the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_waiting_for_the_turn_commit_with_the_group_that_holds_it() {
    let gated = gated_world(Db::Sqlite, "ORL_TEST_END_GATE", 3).await;
    let (w, gate) = (&gated.w, &gated.gate);
    let id = w.create(w.ask("k-1", 2)).await["id"].clone();
    let counts = |m: &crate::exposition::Metrics| {
        let get = |name: &str| m.get(name).unwrap_or_else(|| panic!("{name}: {m}"));
        (
            get("orl_write_turn_writes_total"),
            get("orl_write_group_commits_total"),
        )
    };
    let before = counts(&w.server.metrics().await);
    let release = w.call("release", &id);
    let writes = async {
        gated.reached().await;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        let creates =
            futures::future::join_all((0..17).map(|n| w.create(w.ask(&format!("w-{n}"), 1))));
        let opened = async {
            // Every create waits for the turn before the release lets it go.
            while w.server.metrics().await.get("orl_write_turn_waiting") != Some(17.0) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the creates never waited for the turn"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            std::fs::write(gate, b"").unwrap();
        };
        futures::future::join(creates, opened).await.0
    };
    let ((status, released), created) = futures::future::join(release, writes).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert!(
        created.iter().all(|r| r["state"] == "placed"),
        "{created:?}"
    );
    let after = counts(&w.server.metrics().await);
    assert_eq!(
        w.server.metrics().await.get("orl_write_turn_waiting"),
        Some(0.0)
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (18.0, 2.0),
        "eighteen writes, two commits"
    );
}

/// Whether a transaction still holds writes to reservation `id`: its row's lock
/// (PostgreSQL) or the database's (SQLite).
async fn holds_writes(db: Db, conn: &mut sqlx::AnyConnection, id: &str) -> bool {
    match db {
        Db::Postgres => {
            sqlx::query("SELECT id FROM compute_reservations WHERE id = $1 FOR UPDATE NOWAIT")
                .bind(id)
                .execute(conn)
                .await
                .is_err()
        }
        Db::Sqlite => {
            let held = sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *conn)
                .await
                .is_err();
            if !held {
                sqlx::query("ROLLBACK").execute(conn).await.unwrap();
            }
            held
        }
    }
}

async fn a_pending_reservation_is_retried_thirty_seconds_after_its_refusal_and_not_before(db: Db) {
    let w = world(db, 1, 64).await;
    w.create(w.ask("k-fill", 8)).await;
    let waiting = w.create(w.ask("k-wait", 2)).await;
    assert_eq!(waiting["state"], "pending");
    // Capacity appears without anything freeing: a new node joins the pool. Only the
    // retry can find it.
    register_node(&w.provider, "acme", "n2", 8).await;
    w.set_pool_nodes(&["n1", "n2"]).await;
    w.server.set_clock(T0 + 29_999).await;
    assert_eq!(
        w.get(&waiting["id"]).await.1["state"],
        "pending",
        "not retried before 30 s"
    );
    w.server.set_clock(T0 + 30_000).await;
    let (_, placed) = w.get(&waiting["id"]).await;
    assert_eq!(placed["state"], "placed", "retried at 30 s: {placed}");
    assert_eq!(placed["placement"]["nodeId"], "n2");
    assert_eq!(placed["conditions"], json!([]), "no longer unschedulable");
}

async fn pending_reservations_of_a_pool_are_retried_together_oldest_first_and_what_still_waits_waits_thirty_seconds_more(
    db: Db,
) {
    let w = world(db, 1, 64).await;
    w.create(w.ask("k-fill", 8)).await;
    let [four, eight, four_too] = [("k-a", 4), ("k-b", 8), ("k-c", 4)].map(|(k, n)| w.ask(k, n));
    let mut waiting = Vec::new();
    for ask in [four, eight, four_too] {
        let r = w.create(ask).await;
        assert_eq!(r["state"], "pending", "{r}");
        waiting.push(r);
    }
    // Eight GPUs join: the two of four fit, the one of eight (created between them) does
    // not, and does not keep the later one waiting.
    register_node(&w.provider, "acme", "n2", 8).await;
    w.set_pool_nodes(&["n1", "n2"]).await;
    let before = w.server.pending_retries().await;
    w.server.set_clock(T0 + 30_000).await;
    let mut after = Vec::new();
    for r in &waiting {
        after.push(w.get(&r["id"]).await.1);
    }
    assert_eq!(
        after
            .iter()
            .map(|r| r["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["placed", "pending", "placed"],
        "{after:?}"
    );
    assert_eq!(after[0]["placement"]["nodeId"], "n2");
    assert_eq!(after[2]["placement"]["nodeId"], "n2");
    let why = after[1]["conditions"][0]["message"].as_str().unwrap();
    assert!(
        why.contains("of 2 nodes"),
        "waits on what it was tried on: {why}"
    );
    assert_eq!(w.server.pending_retries().await - before, 3.0);
    // The one still waiting is tried again 30 s after its last attempt, not before.
    register_node(&w.provider, "acme", "n3", 8).await;
    w.set_pool_nodes(&["n1", "n2", "n3"]).await;
    w.server.set_clock(T0 + 59_999).await;
    assert_eq!(w.get(&waiting[1]["id"]).await.1["state"], "pending");
    w.server.set_clock(T0 + 60_000).await;
    let (_, placed) = w.get(&waiting[1]["id"]).await;
    assert_eq!(placed["state"], "placed", "{placed}");
    assert_eq!(placed["placement"]["nodeId"], "n3");
}

async fn a_reservation_still_waiting_for_the_same_reason_keeps_its_conditions_since(db: Db) {
    let w = world(db, 1, 64).await;
    w.create(w.ask("k-fill", 8)).await;
    let waiting = w.create(w.ask("k-wait", 2)).await;
    let since = |r: &Value| r["conditions"][0]["since"].as_i64();
    assert_eq!(since(&waiting), Some(T0), "{waiting}");
    let before = w.server.pending_retries().await;
    let retries = || async { w.server.pending_retries().await - before };
    w.server.set_clock(T0 + 30_000).await;
    let (_, r) = w.get(&waiting["id"]).await;
    assert_eq!(retries().await, 1.0, "tried again");
    assert_eq!(r["state"], "pending");
    assert_eq!(
        r["conditions"], waiting["conditions"],
        "the same reason, since {T0}"
    );
    // A node joins that does not take it either: the reason changes, and holds since then.
    register_node(&w.provider, "acme", "n2", 1).await;
    w.set_pool_nodes(&["n1", "n2"]).await;
    w.server.set_clock(T0 + 60_000).await;
    let (_, r) = w.get(&waiting["id"]).await;
    assert_eq!(retries().await, 2.0, "tried again");
    assert_ne!(
        r["conditions"][0]["message"],
        waiting["conditions"][0]["message"]
    );
    assert_eq!(since(&r), Some(T0 + 60_000), "{r}");
}

async fn renew_moves_the_lease_and_a_lapsed_lease_releases(db: Db) {
    let w = world(db, 1, 64).await;
    let plain = w.create(w.ask("k-plain", 1)).await;
    let (status, err) = w.call("renew", &plain["id"]).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
    let mut ask = w.ask("k-lease", 1);
    ask["leaseSeconds"] = json!(120);
    let r = w.create(ask).await;
    assert_eq!(r["leaseDeadline"], T0 + 120_000);
    w.server.set_clock(T0 + 100_000).await;
    let (status, renewed) = w.call("renew", &r["id"]).await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["leaseDeadline"], T0 + 220_000);
    assert_eq!(renewed["end"], r["end"], "renew does not move the window");
    assert_eq!(r["operation"], json!({ "name": "create", "at": T0 }));
    assert_eq!(
        renewed["operation"],
        json!({ "name": "renew", "at": T0 + 100_000 })
    );
    w.server.set_clock(T0 + 200_000).await;
    assert_eq!(w.get(&r["id"]).await.1["state"], "active");
    w.server.set_clock(T0 + 220_000).await;
    let (_, lapsed) = w.get(&r["id"]).await;
    assert_eq!(
        (lapsed["state"].as_str(), lapsed["reason"].as_str()),
        (Some("released"), Some("lease-lapsed"))
    );
    assert_eq!(lapsed["operation"]["name"], "lease-lapsed");
    let (status, err) = w.call("renew", &r["id"]).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
}

async fn the_reconciler_activates_and_expires_with_the_clock(db: Db) {
    let w = world(db, 1, 64).await;
    let r = w.create(json!({ "tenantId": "tenant-a", "poolId": w.pool, "devices": [{ "class": "gpu", "count": 2 }], "duration": 3600, "start": T0 + HOUR, "idempotencyKey": "k-1" })).await;
    assert_eq!(r["state"], "placed");
    w.server.set_clock(T0 + HOUR - 1).await;
    assert_eq!(w.get(&r["id"]).await.1["state"], "placed");
    w.server.set_clock(T0 + HOUR).await;
    assert_eq!(w.get(&r["id"]).await.1["state"], "active");
    w.server.set_clock(T0 + 2 * HOUR).await;
    assert_eq!(w.get(&r["id"]).await.1["state"], "expired");
    assert_eq!(w.used_gpus().await, 0);
}

async fn iam_policy_refusal_is_access_denied_and_stays_refused(db: Db) {
    let w = world(db, 1, 64).await;
    let (status, body) = w
        .server
        .admin()
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": r#"permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.gpuCount <= 2 };"# }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = w
        .server
        .admin()
        .put(
            "/v1/orgs/tenant-a/iam/policy",
            json!({ "policy": "permit(" }),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(w.create(w.ask("k-small", 2)).await["state"], "placed");
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-big", 4)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    w.server
        .admin()
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": "" }))
        .await;
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-big", 4)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    assert_eq!(w.used_gpus().await, 2, "a refused request charges nothing");
    assert_eq!(
        w.create(w.ask("k-big-2", 4)).await["state"],
        "placed",
        "a new key is decided anew"
    );
}

async fn an_agents_refused_create_is_confirmed_by_a_person(db: Db) {
    let w = world(db, 1, 64).await;
    w.server.admin().put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": r#"
        permit(principal, action, resource) when { !principal.agent || context.gpuCount <= 1 };
        permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.confirmed && context.gpuCount <= 8 };
    "# })).await;
    let agent = w.server.as_key(
        &w.server
            .key_in("tenant-a", json!({ "role": "member", "agent": true }))
            .await,
    );
    assert_eq!(
        rpc(&agent, "create", w.ask("a-small", 1)).await.0,
        StatusCode::OK
    );
    let (status, err) = rpc(&agent, "create", w.ask("a-1", 4)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "CONFIRMATION_REQUIRED");
    let confirmation = err["error"]["details"]["confirmationId"]
        .as_str()
        .unwrap()
        .to_string();
    let reservation = err["error"]["details"]["reservationId"].clone();
    let (status, _) = rpc(
        &agent,
        "get",
        json!({ "tenantId": "tenant-a", "reservationId": reservation }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "still a draft");
    let (_, pending) = w.tenant.get("/v1/orgs/tenant-a/confirmations").await;
    assert_eq!(pending["items"][0]["state"], "pending");
    assert_eq!(pending["items"][0]["attributes"]["gpuCount"], 4);
    let (status, err) = agent
        .post(
            &format!("/v1/orgs/tenant-a/confirmations/{confirmation}/approve"),
            json!({}),
        )
        .await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    let (status, err) = rpc(&agent, "create", w.ask("a-1", 4)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "CONFIRMATION_REQUIRED");
    let (status, approved) = w
        .tenant
        .post(
            &format!("/v1/orgs/tenant-a/confirmations/{confirmation}/approve"),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    let (status, placed) = rpc(&agent, "create", w.ask("a-1", 4)).await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    assert_eq!(placed["state"], "placed");
    assert_eq!(placed["id"], reservation);

    let (_, err) = rpc(&agent, "create", w.ask("a-2", 4)).await;
    let second = err["error"]["details"]["confirmationId"]
        .as_str()
        .unwrap()
        .to_string();
    w.tenant
        .post(
            &format!("/v1/orgs/tenant-a/confirmations/{second}/deny"),
            json!({}),
        )
        .await;
    let (status, err) = rpc(&agent, "create", w.ask("a-2", 4)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");

    let (_, err) = rpc(&agent, "create", w.ask("a-3", 4)).await;
    let third = err["error"]["details"]["confirmationId"]
        .as_str()
        .unwrap()
        .to_string();
    w.server.set_clock(T0 + 31 * 60_000).await;
    let (status, err) = w
        .tenant
        .post(
            &format!("/v1/orgs/tenant-a/confirmations/{third}/approve"),
            json!({}),
        )
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
    let (status, expired) = rpc(&agent, "create", w.ask("a-3", 4)).await;
    assert_eq!(
        (status, expired["state"].as_str()),
        (StatusCode::OK, Some("expired")),
        "{expired}"
    );
}

async fn spend_limit_refuses_what_the_budget_cannot_cover(db: Db) {
    let w = world_with(db, 1, json!({ "gpu": 64 }), json!({ "budgetCheck": true })).await;
    w.server
        .admin()
        .post(&format!("/v1/pools/{}/offers", w.pool), json!({ "tenantId": "tenant-a", "quota": { "gpu": 64 }, "pricePerGpuHour": 250, "budget": 3000 }))
        .await;
    // 4 GPUs x 2 h x 250 = 2000 of 3000.
    assert_eq!(w.create(w.ask("k-1", 4)).await["state"], "placed");
    // A plan answers what each create after it does.
    for (key, gpus, outcome, admits) in [
        ("k-2", 4, "SPEND_LIMIT_REACHED", false),
        ("k-3", 2, "placed", true),
    ] {
        let (status, plan) = rpc(&w.tenant, "plan", w.ask(key, gpus)).await;
        assert_eq!(
            (status, plan["outcome"].as_str(), &plan["budget"]["admits"]),
            (StatusCode::OK, Some(outcome), &json!(admits)),
            "{plan}"
        );
    }
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-2", 4)).await;
    assert_error(
        status,
        &err,
        StatusCode::PAYMENT_REQUIRED,
        "SPEND_LIMIT_REACHED",
    );
    assert_eq!(
        w.create(w.ask("k-3", 2)).await["state"],
        "placed",
        "2 x 2 h x 250 = 1000 fits exactly"
    );
    assert_eq!(w.used_gpus().await, 6);
    let metrics = w.server.metrics().await;
    let refused = [("world", "spend-guard"), ("outcome", "refused")];
    assert_eq!(
        metrics.sum("orl_policy_decisions_total", &refused),
        Some(2.0),
        "the built-in spend-guard component decided (the plan, then the create): {metrics}"
    );
}

async fn a_failing_spend_guard_fails_the_create_or_falls_back_to_the_built_in(db: Db) {
    let w = world_with(db, 1, json!({ "gpu": 64 }), json!({ "budgetCheck": true })).await;
    let admin = w.server.admin();
    admin
        .post(&format!("/v1/pools/{}/offers", w.pool), json!({ "tenantId": "tenant-a", "quota": { "gpu": 64 }, "pricePerGpuHour": 250, "budget": 3000 }))
        .await;
    let (status, guard) = admin
        .raw(
            reqwest::Method::POST,
            "/v1/plugins?name=guard-trap&version=1.0.0",
            Some(std::fs::read(component("guard_trap.wasm")).unwrap()),
            Some("application/wasm"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{guard}");
    assert_eq!(guard["world"], "spend-guard", "{guard}");
    let policies = format!("/v1/pools/{}/policies", w.pool);
    let (status, set) = admin
        .put(&policies, json!({ "spendLimit": guard["id"] }))
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    // Failing: the create fails with the plugin's failure, and holds nothing.
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-fail", 4)).await;
    assert_error(status, &err, StatusCode::BAD_GATEWAY, "POLICY_FAILED");
    assert_eq!(err["error"]["details"]["pluginId"], guard["id"], "{err}");
    assert_eq!(err["error"]["details"]["kind"], "trap", "{err}");
    assert_eq!(w.used_gpus().await, 0);
    // Falling back: the built-in spend-guard decides, budget and all.
    let (status, set) = admin
        .put(
            &policies,
            json!({ "spendLimit": guard["id"], "onPolicyFailure": "fallback" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    // 4 GPUs x 2 h x 250 = 2000 of 3000: allowed; 2000 more: refused.
    assert_eq!(w.create(w.ask("k-1", 4)).await["state"], "placed");
    let (status, err) = rpc(&w.tenant, "create", w.ask("k-2", 4)).await;
    assert_error(
        status,
        &err,
        StatusCode::PAYMENT_REQUIRED,
        "SPEND_LIMIT_REACHED",
    );
    assert_eq!(w.used_gpus().await, 4);
    let metrics = w.server.metrics().await;
    let guard_id = guard["id"].as_str().unwrap();
    // It failed the first create and both that fell back.
    let trapped = [("plugin", guard_id), ("kind", "trap")];
    assert_eq!(
        metrics.sum("orl_policy_failures_total", &trapped),
        Some(3.0),
        "{metrics}"
    );
    let refused = [("name", "spend-guard-default"), ("outcome", "refused")];
    assert_eq!(
        metrics.sum("orl_policy_decisions_total", &refused),
        Some(1.0),
        "the built-in decided the refusal: {metrics}"
    );
}

async fn sixty_four_concurrent_creates_book_exactly_the_last_eight_gpus(db: Db) {
    let w = world(db, 2, 128).await;
    let fill = w.create(w.ask("k-fill", 8)).await;
    let filled: Vec<String> = fill["placement"]["unitIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    // The 8 GPUs left: every unit of the two nodes but the fill's.
    let mut last_eight: Vec<String> = (1..=2)
        .flat_map(|n| (0..8).map(move |g| format!("n{n}-gpu{g}")))
        .filter(|u| !filled.contains(u))
        .collect();
    last_eight.sort();
    assert_eq!(last_eight.len(), 8);
    let results = w.create_at_once("race", 64).await;
    assert!(
        results.iter().all(|(s, _)| *s == StatusCode::OK),
        "{results:?}"
    );
    let placed: Vec<&Value> = results
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r["state"] == "placed")
        .collect();
    let pending = results
        .iter()
        .filter(|(_, r)| r["state"] == "pending")
        .count();
    assert_eq!((placed.len(), pending), (8, 56));
    let mut units: Vec<String> = placed
        .iter()
        .flat_map(|r| r["placement"]["unitIds"].as_array().unwrap())
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    units.sort();
    assert_eq!(
        units, last_eight,
        "the 8 winners hold exactly the last 8 GPUs, once each"
    );
    // And so does the database: 16 active bookings, one per unit, none for the pending.
    let mut db = w.server.database().await;
    let mut booked: Vec<String> =
        sqlx::query_scalar("SELECT unit_id FROM bookings WHERE active = $1 ORDER BY unit_id")
            .bind(true)
            .fetch_all(&mut db)
            .await
            .unwrap();
    booked.sort();
    let mut all: Vec<String> = filled.iter().cloned().chain(last_eight).collect();
    all.sort();
    assert_eq!(booked, all);
    assert_eq!(w.used_gpus().await, 8 + 64);
}

async fn node_reservation_rights_are_honoured_by_placement(db: Db) {
    let w = world(db, 1, 64).await;
    w.server.org_with_key("anchor", "member").await;
    let units: Vec<String> = (0..6).map(|g| format!("n1-gpu{g}")).collect();
    let (status, nr) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": units, "allowedOrgIds": ["anchor"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let r = w.create(w.ask("k-1", 2)).await;
    assert_eq!(r["placement"]["unitIds"], json!(["n1-gpu6", "n1-gpu7"]));
    assert_eq!(
        w.create(w.ask("k-2", 1)).await["state"],
        "pending",
        "reserved units are the audience's alone"
    );
    let release = format!(
        "/v1/nodes/n1/reservations/{}/release",
        nr["id"].as_str().unwrap()
    );
    w.server
        .admin()
        .post(&release, json!({ "unitIds": ["n1-gpu0"] }))
        .await;
    assert_eq!(
        w.create(w.ask("k-3", 1)).await["state"],
        "pending",
        "released units are spot-only"
    );
    let mut spot = w.ask("k-spot", 1);
    spot["spot"] = json!(true);
    let spot = w.create(spot).await;
    assert_eq!(
        spot["placement"]["unitIds"],
        json!(["n1-gpu0"]),
        "spot may use released units"
    );
}

async fn events_are_written_with_each_change_and_scoped_to_the_tenant(db: Db) {
    let w = world(db, 1, 64).await;
    let r = w.create(w.ask("k-1", 8)).await;
    let waiting = w.create(w.ask("k-2", 1)).await;
    w.call("release", &r["id"]).await;
    let (_, events) = w.tenant.get("/v1/events").await;
    let kinds: Vec<(String, String)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["objectId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let id = |v: &Value| v["id"].as_str().unwrap().to_string();
    assert_eq!(
        kinds,
        vec![
            ("reservation.placed".to_string(), id(&r)),
            ("reservation.pending".to_string(), id(&waiting)),
            ("reservation.released".to_string(), id(&r)),
            ("reservation.placed".to_string(), id(&waiting)),
        ]
    );
    let stranger = w.server.org_with_key("stranger", "member").await;
    let (_, none) = stranger.get("/v1/events").await;
    assert_eq!(none["items"], json!([]));
    let after = events["items"][1]["id"].as_i64().unwrap();
    let (_, rest) = w.tenant.get(&format!("/v1/events?after={after}")).await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2);
}

/// Creates written together (one commit for several) still charge the quota one by one: the
/// ones past it are refused on their own, with what the quota leaves as the placements
/// before them left it, and the others stay placed.
async fn concurrent_creates_past_the_quota_are_refused_each_alone_and_charge_it_exactly(db: Db) {
    let w = world(db, 4, 12).await;
    let results = w.create_at_once("quota-race", 40).await;
    let placed = results
        .iter()
        .filter(|(s, r)| *s == StatusCode::OK && r["state"] == "placed")
        .count();
    let refused: Vec<&Value> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .map(|(_, e)| e)
        .collect();
    assert_eq!((placed, refused.len()), (12, 28), "{results:?}");
    for err in refused {
        assert_eq!(err["error"]["code"], "QUOTA_EXCEEDED", "{err}");
        let details = &err["error"]["details"];
        assert_eq!(details["limit"], 12, "{err}");
        assert_eq!(
            details["used"], 12,
            "refused only once the quota is used up: {err}"
        );
    }
    assert_eq!(w.used_gpus().await, 12);
}

/// The overlap check under every placement, extend and carry: the database refuses a second
/// active booking of a unit for an overlapping term, whichever reservation writes it, and
/// takes one of another unit, one that ends where the first starts, or one not active.
async fn the_database_itself_refuses_overlapping_bookings_of_one_unit(db: Db) {
    let w = world(db, 1, 8).await;
    let first = w.create(w.ask("k-first", 1)).await;
    let second = w.create(w.ask("k-second", 1)).await;
    let unit = first["placement"]["unitIds"][0].as_str().unwrap();
    let other = second["placement"]["unitIds"][0].as_str().unwrap();
    let second_id = second["id"].as_str().unwrap();
    let mut conn = w.server.database().await;
    let booking = |unit: &str, start_hours: i64, end_hours: i64, active: &str| {
        format!(
            "INSERT INTO bookings (reservation_id, node_id, unit_id, start_ms, end_ms, spot, active)
             VALUES ('{second_id}', 'n1', '{unit}', {}, {}, FALSE, {active})",
            T0 + start_hours * HOUR,
            T0 + end_hours * HOUR
        )
    };
    let err = sqlx::query(&booking(unit, 1, 3, "TRUE"))
        .execute(&mut conn)
        .await
        .expect_err("the first reservation books this unit for hours 0 to 2");
    assert!(err.to_string().contains("bookings_no_overlap"), "{err}");
    let free = ["n1-gpu0", "n1-gpu1", "n1-gpu2"]
        .into_iter()
        .find(|u| *u != unit && *u != other)
        .unwrap();
    for (unit, start, end, active, why) in [
        (free, 1, 3, "TRUE", "another unit"),
        (
            unit,
            2,
            4,
            "TRUE",
            "a term that starts where the booked one ends",
        ),
        (unit, 0, 2, "FALSE", "a booking that is not active"),
    ] {
        let sql = booking(unit, start, end, active);
        let done = sqlx::query(&sql).execute(&mut conn).await;
        assert!(done.is_ok(), "{why}: {done:?}");
        // Gone again: the invariants checked after each test hold every booking to its
        // reservation's state.
        sqlx::query(&format!(
            "DELETE FROM bookings WHERE reservation_id = '{second_id}' AND unit_id = '{unit}'"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}
