//! Metering, provider earnings and payouts: charge accrues per booked GPU while the booking
//! holds its unit, each UTC-day part rounded down to the minor unit; the provider earns its
//! share (8000 bps by default), and platform operators pay out what is available.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{
    Api, Db, HOUR, Options, Server, T0, assert_error, audit_count, h100_inventory,
    on_both_databases, register_node,
};

const MINUTE: i64 = 60_000;
const DAY: i64 = 86_400_000;
/// The tenant's offer: 250 minor units per GPU-hour, so 7 minutes of one GPU is 29.1666…
const PRICE: i64 = 250;
const EARNINGS: &str = "/v1/orgs/acme/provider/earnings";
const PAYOUTS: &str = "/v1/orgs/acme/provider/payouts";

/// Provider `acme` with node `n1` (8 × H100) and, with `a100`, node `n2` (8 × A100) in one
/// pool offered to `tenant-a` at [`PRICE`].
struct World {
    server: Server,
    provider: Api,
    tenant: Api,
    pool: String,
}

async fn world(db: Db, a100: bool) -> World {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let mut node_ids = vec!["n1"];
    if a100 {
        let mut inventory = h100_inventory("n2", 8);
        for unit in inventory["units"].as_array_mut().unwrap() {
            unit["model"] = json!("A100-SXM4-80GB");
        }
        let (status, body) = provider
            .put("/v1/orgs/acme/provider/nodes/n2", inventory)
            .await;
        assert!(status.is_success(), "{body}");
        node_ids.push("n2");
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "gpus", "ownerOrgId": "acme", "nodeIds": node_ids, "policy": {} }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let w = World {
        server,
        provider,
        tenant,
        pool,
    };
    w.offer(PRICE).await;
    w
}

impl World {
    async fn offer(&self, price: i64) {
        let (status, offer) = self
            .server
            .admin()
            .post(
                &format!("/v1/pools/{}/offers", self.pool),
                json!({ "tenantId": "tenant-a", "quota": { "gpu": 64 }, "pricePerGpuHour": price }),
            )
            .await;
        assert!(status.is_success(), "{offer}");
    }

    /// Books `gpus` GPUs (of `model`, if given) from now for `duration`; returns its id.
    async fn book(&self, key: &str, gpus: i64, model: Option<&str>, duration: &str) -> Value {
        let mut device = json!({ "class": "gpu", "count": gpus });
        if let Some(model) = model {
            device["selector"] = json!({ "model": model });
        }
        let (status, r) = self
            .tenant
            .post(
                "/api/compute/reservations/create",
                json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [device],
                        "duration": duration, "idempotencyKey": key }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["state"], "placed", "{r}");
        r["id"].clone()
    }

    async fn release(&self, id: &Value) {
        let (status, r) = self
            .tenant
            .post(
                "/api/compute/reservations/release",
                json!({ "tenantId": "tenant-a", "reservationId": id }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["state"], "released", "{r}");
    }

    async fn earnings(&self) -> Value {
        let (status, body) = self.provider.get(EARNINGS).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

/// `{grossMinor, earnedMinor, gpuSeconds}` of a total or a breakdown row.
fn amounts(v: &Value) -> (i64, i64, i64) {
    (
        v["grossMinor"].as_i64().unwrap(),
        v["earnedMinor"].as_i64().unwrap(),
        v["gpuSeconds"].as_i64().unwrap(),
    )
}

on_both_databases!(
    a_booking_accrues_per_gpu_rounded_down_to_the_minor_unit_as_the_clock_moves,
    a_reservation_released_early_accrues_only_until_its_release,
    a_booking_across_utc_midnight_is_rounded_per_day,
    breakdowns_by_node_model_and_day_add_up_exactly_to_the_totals,
    payouts_reduce_what_is_available_and_are_listed_newest_first,
    a_payout_over_what_is_available_is_refused_and_writes_nothing,
    concurrent_payouts_never_pay_out_more_than_was_earned,
    only_platform_operators_record_payouts,
    earnings_are_shown_to_the_org_with_provider_read_and_to_ops_only,
    the_cli_shows_the_earnings_of_the_keys_own_org,
    a_booking_keeps_the_share_and_unit_model_it_was_booked_on,
);

async fn a_booking_accrues_per_gpu_rounded_down_to_the_minor_unit_as_the_clock_moves(db: Db) {
    let w = world(db, false).await;
    let empty = w.earnings().await;
    assert_eq!(empty["orgId"], "acme");
    assert_eq!(empty["currency"], "minor units");
    assert_eq!(empty["providerShareBps"], 8000);
    assert_eq!(amounts(&empty), (0, 0, 0));
    assert_eq!(empty["byNode"], json!([]));

    w.book("k-1", 5, None, "1h").await;
    let at_start = w.earnings().await;
    assert_eq!(
        amounts(&at_start),
        (0, 0, 0),
        "nothing accrued at the start"
    );
    assert_eq!(at_start["activeRentals"], 1);

    w.server.set_clock(T0 + 7 * MINUTE).await;
    let e = w.earnings().await;
    assert_eq!(e["asOf"], "2026-12-01T00:07:00.000Z");
    // Per GPU: 250 × 7/60 = 29.17 → 29 gross; 29 × 0.8 = 23.2 → 23 earned. Rounding the
    // 5-GPU total instead would give 145.83 → 145 and 116.
    assert_eq!(amounts(&e), (5 * 29, 5 * 23, 5 * 420));
    assert_eq!(e["paidOutMinor"], 0);
    assert_eq!(e["availableMinor"], 5 * 23);
    assert_eq!(e["activeRentals"], 1);
    assert_eq!(e["byNode"][0]["nodeId"], "n1");
    assert_eq!(amounts(&e["byNode"][0]), (145, 115, 2100));
    assert_eq!(e["byModel"][0]["model"], "H100-SXM5-80GB");
    assert_eq!(e["byDay"][0]["day"], "2026-12-01");
    assert_eq!(e["recentPayouts"], json!([]));

    // The price is frozen when the unit is booked: a new offer prices later bookings only.
    w.offer(1_000).await;
    assert_eq!(amounts(&w.earnings().await), (145, 115, 2100));

    w.server.set_clock(T0 + 3 * HOUR).await;
    let ended = w.earnings().await;
    assert_eq!(
        amounts(&ended),
        (5 * 250, 5 * 200, 5 * 3600),
        "1 h × 5 GPUs"
    );
    assert_eq!(ended["activeRentals"], 0, "the window ended");
}

async fn a_reservation_released_early_accrues_only_until_its_release(db: Db) {
    let w = world(db, false).await;
    w.book("k-kept", 1, None, "2h").await;
    let released = w.book("k-released", 2, None, "2h").await;
    w.server.set_clock(T0 + 11 * MINUTE).await;
    assert_eq!(w.earnings().await["activeRentals"], 2);
    w.release(&released).await;
    assert_eq!(w.earnings().await["activeRentals"], 1);

    w.server.set_clock(T0 + 5 * HOUR).await;
    let e = w.earnings().await;
    // Released: 2 × (250 × 11/60 = 45.83 → 45; × 0.8 = 36). Kept: 2 h = 500; 400.
    assert_eq!(amounts(&e), (2 * 45 + 500, 2 * 36 + 400, 2 * 660 + 7200));
    assert_eq!(e["activeRentals"], 0);
}

async fn a_booking_across_utc_midnight_is_rounded_per_day(db: Db) {
    let w = world(db, false).await;
    w.server.set_clock(T0 + DAY - 7 * MINUTE).await;
    w.book("k-night", 1, None, "18m").await;
    w.server.set_clock(T0 + DAY + 2 * HOUR).await;
    let e = w.earnings().await;
    // 23:53-24:00 is 29.17 → 29 (earned 23); 00:00-00:11 is 45.83 → 45 (earned 36). The
    // 18 minutes rounded as one would be 75.
    assert_eq!(amounts(&e), (29 + 45, 23 + 36, 1080));
    assert_eq!(
        e["byDay"],
        json!([
            { "day": "2026-12-01", "grossMinor": 29, "earnedMinor": 23, "gpuSeconds": 420 },
            { "day": "2026-12-02", "grossMinor": 45, "earnedMinor": 36, "gpuSeconds": 660 },
        ])
    );
}

async fn breakdowns_by_node_model_and_day_add_up_exactly_to_the_totals(db: Db) {
    let w = world(db, true).await;
    w.book("k-h100", 3, Some("H100-SXM5-80GB"), "7m").await;
    w.book("k-a100", 2, Some("A100-SXM4-80GB"), "1h").await;
    w.server.set_clock(T0 + DAY - 7 * MINUTE).await;
    w.book("k-night", 1, Some("A100-SXM4-80GB"), "18m").await;
    w.server.set_clock(T0 + DAY + 2 * HOUR).await;
    let e = w.earnings().await;

    // H100 on n1: 3 × 29 gross, 3 × 23 earned. A100 on n2: 2 × 250 and 2 × 200 on Dec 1,
    // plus 29/23 before and 45/36 after midnight.
    assert_eq!(
        amounts(&e),
        (87 + 500 + 29 + 45, 69 + 400 + 23 + 36, 1260 + 7200 + 1080)
    );
    assert_eq!(
        e["byNode"],
        json!([
            { "nodeId": "n1", "grossMinor": 87, "earnedMinor": 69, "gpuSeconds": 1260 },
            { "nodeId": "n2", "grossMinor": 574, "earnedMinor": 459, "gpuSeconds": 8280 },
        ])
    );
    assert_eq!(
        e["byModel"],
        json!([
            { "model": "A100-SXM4-80GB", "grossMinor": 574, "earnedMinor": 459, "gpuSeconds": 8280 },
            { "model": "H100-SXM5-80GB", "grossMinor": 87, "earnedMinor": 69, "gpuSeconds": 1260 },
        ])
    );
    assert_eq!(
        e["byDay"],
        json!([
            { "day": "2026-12-01", "grossMinor": 616, "earnedMinor": 492, "gpuSeconds": 8880 },
            { "day": "2026-12-02", "grossMinor": 45, "earnedMinor": 36, "gpuSeconds": 660 },
        ])
    );
    for breakdown in ["byNode", "byModel", "byDay"] {
        let rows = e[breakdown].as_array().unwrap();
        let sum = rows
            .iter()
            .map(amounts)
            .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        assert_eq!(sum, amounts(&e), "{breakdown} adds up to the totals");
    }
    // Another provider's earnings hold none of it.
    let other = w.server.org_with_key("other-provider", "provider").await;
    let (status, theirs) = other.get("/v1/orgs/other-provider/provider/earnings").await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    assert_eq!(amounts(&theirs), (0, 0, 0));
}

async fn payouts_reduce_what_is_available_and_are_listed_newest_first(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 2 * HOUR).await;
    assert_eq!(w.earnings().await["availableMinor"], 1000);

    let admin = w.server.admin();
    let (status, first) = admin
        .post(
            PAYOUTS,
            json!({ "amountMinor": 300, "reference": "wire-2026-12-001" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(first["id"].as_str().unwrap().starts_with("pay_"));
    assert_eq!(first["amountMinor"], 300);
    assert_eq!(first["reference"], "wire-2026-12-001");
    assert_eq!(first["createdAt"], "2026-12-01T02:00:00.000Z");
    let (status, second) = admin.post(PAYOUTS, json!({ "amountMinor": 700 })).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert_eq!(second["reference"], Value::Null);

    let e = w.earnings().await;
    assert_eq!(e["earnedMinor"], 1000);
    assert_eq!(e["paidOutMinor"], 1000);
    assert_eq!(e["availableMinor"], 0);
    assert_eq!(e["recentPayouts"], json!([second, first]));
    let (_, openapi) = w.server.anonymous().get("/openapi.json").await;
    for path in [EARNINGS, PAYOUTS] {
        let documented = path.replace("acme", "{orgId}");
        assert!(openapi["paths"][&documented].is_object(), "{documented}");
    }

    // Each payout is audited and emitted to the provider.
    let (_, audit) = admin.get("/v1/audit?orgId=acme&limit=200").await;
    let audited: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "provider.payout")
        .collect();
    assert_eq!(audited.len(), 2);
    assert_eq!(audited[0]["objectId"], second["id"]);
    assert_eq!(audited[1]["details"]["amountMinor"], 300);
    let (_, events) = w.provider.get("/v1/events").await;
    let paid: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "provider.payout")
        .collect();
    assert_eq!(paid.len(), 2);
    assert_eq!(paid[0]["objectId"], first["id"]);
    assert_eq!(paid[0]["payload"]["payout"], first);
    let (_, tenant_events) = w.tenant.get("/v1/events").await;
    assert!(
        tenant_events["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] != "provider.payout"),
        "payouts are the provider's business"
    );
}

async fn a_payout_over_what_is_available_is_refused_and_writes_nothing(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 7 * MINUTE).await;
    let admin = w.server.admin();
    let before = w.earnings().await;
    assert_eq!(before["availableMinor"], 115);
    let audited = audit_count(&w.server).await;

    let message = admin
        .expect_error(
            Method::POST,
            PAYOUTS,
            Some(json!({ "amountMinor": 116 })),
            StatusCode::CONFLICT,
            "INVALID_STATE",
        )
        .await;
    assert!(message.contains("115"), "{message}");
    for (body, field) in [
        (json!({ "amountMinor": 0 }), "amountMinor"),
        (json!({ "amountMinor": -5 }), "amountMinor"),
        (json!({ "amountMinor": 1.5 }), "amountMinor"),
        (json!({ "amountMinor": "10" }), "amountMinor"),
        (json!({}), "amountMinor"),
        (
            json!({ "amountMinor": 1, "reference": "r".repeat(257) }),
            "reference",
        ),
        (json!({ "amountMinor": 1, "currency": "EUR" }), "currency"),
    ] {
        let message = admin
            .expect_error(
                Method::POST,
                PAYOUTS,
                Some(body.clone()),
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
            )
            .await;
        assert!(message.contains(field), "{body}: {message}");
    }
    admin
        .expect_error(
            Method::POST,
            "/v1/orgs/nobody/provider/payouts",
            Some(json!({ "amountMinor": 1 })),
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;

    assert_eq!(w.earnings().await, before, "nothing was paid out");
    assert_eq!(audit_count(&w.server).await, audited, "nothing was audited");
    let (status, exact) = admin.post(PAYOUTS, json!({ "amountMinor": 115 })).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "all of it may be paid: {exact}"
    );
    assert_eq!(w.earnings().await["availableMinor"], 0);
    admin
        .expect_error(
            Method::POST,
            PAYOUTS,
            Some(json!({ "amountMinor": 1 })),
            StatusCode::CONFLICT,
            "INVALID_STATE",
        )
        .await;
}

async fn concurrent_payouts_never_pay_out_more_than_was_earned(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 2 * HOUR).await;
    let admin = w.server.admin();
    let attempts = (0..8).map(|_| {
        let admin = admin.clone();
        tokio::spawn(async move { admin.post(PAYOUTS, json!({ "amountMinor": 300 })).await })
    });
    let mut paid = 0;
    for attempt in attempts {
        let (status, body) = attempt.await.unwrap();
        match status {
            StatusCode::CREATED => paid += 1,
            _ => assert_error(status, &body, StatusCode::CONFLICT, "INVALID_STATE"),
        }
    }
    assert_eq!(paid, 3, "1000 available pays three payouts of 300");
    let e = w.earnings().await;
    assert_eq!(e["paidOutMinor"], 900);
    assert_eq!(e["availableMinor"], 100);
    assert_eq!(e["recentPayouts"].as_array().unwrap().len(), 3);
}

async fn only_platform_operators_record_payouts(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 2 * HOUR).await;
    let provider_admin = w
        .server
        .as_key(&w.server.key_in("acme", json!({ "role": "admin" })).await);
    for caller in [&w.provider, &provider_admin, &w.tenant] {
        caller
            .expect_error(
                Method::POST,
                PAYOUTS,
                Some(json!({ "amountMinor": 10 })),
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
            )
            .await;
    }
    let ops_viewer = w
        .server
        .as_key(&w.server.key_in("ops", json!({ "role": "viewer" })).await);
    ops_viewer
        .expect_error(
            Method::POST,
            PAYOUTS,
            Some(json!({ "amountMinor": 10 })),
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let (status, _) = w
        .server
        .anonymous()
        .post(PAYOUTS, json!({ "amountMinor": 10 }))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(w.earnings().await["paidOutMinor"], 0);

    let ops_operator = w
        .server
        .as_key(&w.server.key_in("ops", json!({ "role": "operator" })).await);
    let (status, payout) = ops_operator
        .post(PAYOUTS, json!({ "amountMinor": 10 }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{payout}");
    assert_eq!(w.earnings().await["paidOutMinor"], 10);
}

async fn earnings_are_shown_to_the_org_with_provider_read_and_to_ops_only(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 7 * MINUTE).await;
    let own = w.earnings().await;
    let viewer = w
        .server
        .as_key(&w.server.key_in("acme", json!({ "role": "viewer" })).await);
    let (status, seen) = viewer.get(EARNINGS).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen, own);
    let (status, seen) = w.server.admin().get(EARNINGS).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen, own);

    // Another org, even the tenant renting the GPUs and holding provider.read for its
    // own org, is told the org does not exist; so is a member without provider.read.
    let without = w.server.as_key(
        &w.server
            .key_in("acme", json!({ "permissions": ["events.read"] }))
            .await,
    );
    for caller in [&w.tenant, &without] {
        caller
            .expect_error(
                Method::GET,
                EARNINGS,
                None,
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
            )
            .await;
    }
    w.server
        .admin()
        .expect_error(
            Method::GET,
            "/v1/orgs/nobody/provider/earnings",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let (status, body) = w.server.anonymous().get(EARNINGS).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
}

/// Runs `orl args…` as `key` against `server`; returns stdout, or panics with stderr.
async fn orl(server: &Server, key: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(args)
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", key)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "orl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

async fn the_cli_shows_the_earnings_of_the_keys_own_org(db: Db) {
    let w = world(db, false).await;
    w.book("k-1", 5, None, "1h").await;
    w.server.set_clock(T0 + 2 * HOUR).await;
    let provider_key = w.server.key_in("acme", json!({ "role": "provider" })).await;

    let json_out = orl(
        &w.server,
        &provider_key,
        &["provider", "earnings", "--json"],
    )
    .await;
    let shown: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(
        shown,
        w.earnings().await,
        "the API's JSON, for the key's own org"
    );
    assert_eq!(amounts(&shown), (1250, 1000, 18000));

    let admin = w.server.admin.clone();
    let paid = orl(
        &w.server,
        &admin,
        &[
            "--json",
            "provider",
            "payout",
            "acme",
            "--amount-minor",
            "400",
            "--reference",
            "wire-7",
        ],
    )
    .await;
    let paid: Value = serde_json::from_str(&paid).unwrap();
    assert_eq!(paid["amountMinor"], 400);

    let table = orl(
        &w.server,
        &admin,
        &["provider", "earnings", "--org", "acme"],
    )
    .await;
    for expected in [
        "available",
        "600",
        "1250",
        "n1",
        "H100-SXM5-80GB",
        "2026-12-01",
        "wire-7",
    ] {
        assert!(table.contains(expected), "{expected} in\n{table}");
    }
}

async fn a_booking_keeps_the_share_and_unit_model_it_was_booked_on(db: Db) {
    let mut w = world(db, false).await;
    w.book("before", 1, None, "1h").await;
    w.server
        .restart_with(Options {
            admin_key: Some(w.server.admin.clone()),
            args: vec!["--provider-share-bps".into(), "5000".into()],
            ..Options::default()
        })
        .await;
    w.provider = w.provider.on(&w.server);
    w.tenant = w.tenant.on(&w.server);
    w.book("after", 1, None, "1h").await;
    // The node's inventory is replaced: its GPUs now report another model.
    let mut inventory = h100_inventory("n1", 8);
    for unit in inventory["units"].as_array_mut().unwrap() {
        unit["model"] = json!("H200-SXM5-141GB");
    }
    let (status, body) = w
        .provider
        .put("/v1/orgs/acme/provider/nodes/n1", inventory)
        .await;
    assert!(status.is_success(), "{body}");
    w.server.set_clock(T0 + HOUR).await;

    let earnings = w.earnings().await;

    // One GPU-hour at 250 each: earned 200 at the 8000 bps it was booked at, 125 at 5000.
    assert_eq!(amounts(&earnings), (500, 200 + 125, 2 * 3_600));
    assert_eq!(earnings["providerShareBps"], 5_000, "what new bookings get");
    assert_eq!(
        earnings["byModel"],
        json!([{ "model": "H100-SXM5-80GB", "grossMinor": 500, "earnedMinor": 325, "gpuSeconds": 7_200 }]),
        "bookings keep the model their unit had when booked"
    );
}
