//! The capacity dashboard and GraphiQL, served by `orl serve` from the binary: its files
//! over HTTP, and the pages in a real browser — headless Chromium driven over WebDriver by
//! Debian's `chromedriver` — against `orl serve --demo`. A screenshot of the timeline is
//! saved under `target/screenshots/`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::support::{Api, Db, Options, Server, on_both_databases};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long the page may take to show what a step waits for.
const PATIENCE: Duration = Duration::from_secs(20);

/// A headless Chromium session; chromedriver is killed with it.
struct Browser {
    client: Client,
    _driver: Child,
}

impl Browser {
    async fn start() -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "{program} is missing: the dashboard's browser tests need Debian's chromium and \
                 chromium-driver (apt-get install -y chromium chromium-driver; .ci/run installs them)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting chromedriver");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1600,1000", "--lang=en-GB"],
            }
        });
        let capabilities = match capabilities {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let started = std::time::Instant::now();
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(err) if started.elapsed() < PATIENCE => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(err) => panic!("chromedriver did not start a Chromium session: {err}"),
            }
        };
        Browser {
            client,
            _driver: driver,
        }
    }

    async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Signs in on the dashboard's form with `key`.
    async fn sign_in(&self, server: &Server, key: &str) {
        self.open(&format!("{}/", server.url)).await;
        let field = self.wait_visible("#api-key").await;
        assert!(
            self.client.current_url().await.unwrap().path() == "/ui/",
            "/ leads to the dashboard"
        );
        field.send_keys(key).await.unwrap();
        self.client
            .find(Locator::Css("#sign-in-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        self.wait_text("#viewer", "key").await;
    }

    async fn wait(&self, locator: Locator<'_>) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(PATIENCE)
            .for_element(locator)
            .await
            .unwrap_or_else(|e| panic!("the page never showed {locator:?}: {e}"))
    }

    /// The element at `css` once the page shows it.
    async fn wait_visible(&self, css: &str) -> fantoccini::elements::Element {
        let started = std::time::Instant::now();
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && element.is_displayed().await.unwrap_or(false)
            {
                return element;
            }
            assert!(started.elapsed() < PATIENCE, "the page never showed {css}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the element at `css`.
    async fn text(&self, css: &str) -> String {
        let script =
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;";
        let value = self.client.execute(script, vec![json!(css)]).await.unwrap();
        value.as_str().unwrap_or_default().to_string()
    }

    /// Waits until the text of `css` contains `wanted`; returns that text.
    async fn wait_text(&self, css: &str, wanted: &str) -> String {
        let started = std::time::Instant::now();
        loop {
            let text = self.text(css).await;
            if text.contains(wanted) {
                return text;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{css} never said {wanted:?}; it says {text:?}; page errors: {}",
                self.text("#tl-message, #res-body .error, #overview-body .error, #sign-in-error")
                    .await
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    async fn go_to_view(&self, view: &str) {
        self.client
            .find(Locator::Css(&format!("#tabs a[data-view=\"{view}\"]")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Saves a PNG of the window as `target/screenshots/<name>.png`.
    async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .unwrap()
            .join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// The keys `--demo` created, from its data directory.
fn demo_keys(server: &Server) -> (String, String) {
    let keys: Value = serde_json::from_str(
        &std::fs::read_to_string(server.data_dir.path().join("demo-keys.json")).unwrap(),
    )
    .unwrap();
    (
        keys["provider"].as_str().unwrap().to_string(),
        keys["tenant"].as_str().unwrap().to_string(),
    )
}

async fn demo_pool(api: &Api) -> String {
    let (status, pools) = api.get("/v1/pools").await;
    assert_eq!(status, StatusCode::OK, "{pools}");
    pools["items"].as_array().unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Books `gpus` GPUs of the demo pool for `hours` as `tenant`; returns the reservation id.
async fn book(api: &Api, tenant: &str, pool: &str, gpus: i64, hours: i64, key: &str) -> String {
    let mut device = json!({ "class": "gpu", "count": gpus });
    if gpus <= 4 {
        // As the demo's own example: the GPUs of one NVLink domain.
        device["topology"] = json!("nvlink-all");
    }
    let body = json!({ "tenantId": tenant, "poolId": pool, "devices": [device],
        "duration": format!("{hours}h"), "idempotencyKey": key });
    let (status, r) = api.post("/api/compute/reservations/create", body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r["id"].as_str().unwrap().to_string()
}

on_both_databases!(
    a_new_user_signs_in_and_sees_the_demos_nodes_and_bookings_change_live,
    a_tenant_key_sees_none_of_another_tenants_bookings,
);

async fn a_new_user_signs_in_and_sees_the_demos_nodes_and_bookings_change_live(db: Db) {
    let server = Server::start_with(
        db,
        Options {
            demo: true,
            ..Options::default()
        },
    )
    .await;
    let (_, tenant_key) = demo_keys(&server);
    let tenant = server.as_key(&tenant_key);
    let pool = demo_pool(&tenant).await;
    // Half of h100-4's GPUs reserved to the tenant, two of them released to spot.
    let (status, term) = server
        .admin()
        .post(
            "/v1/nodes/h100-4/reservations",
            json!({ "unitIds": ["h100-4-gpu4", "h100-4-gpu5", "h100-4-gpu6", "h100-4-gpu7"],
                    "allowedOrgIds": ["tenant-a"], "reason": "annual contract" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{term}");
    let (status, released) = server
        .admin()
        .post(
            &format!(
                "/v1/nodes/h100-4/reservations/{}/release",
                term["id"].as_str().unwrap()
            ),
            json!({ "unitIds": ["h100-4-gpu6", "h100-4-gpu7"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    let first = book(&tenant, "tenant-a", &pool, 4, 2, "demo-4xh100-nvlink").await;
    book(&tenant, "tenant-a", &pool, 8, 30, "two-days").await;
    let (status, spot) = tenant
        .post(
            "/api/compute/reservations/create",
            json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 2 }],
                    "duration": "20h", "spot": true, "idempotencyKey": "spot" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{spot}");

    let browser = Browser::start().await;
    browser.sign_in(&server, &server.admin).await;

    // Overview: the demo pool's 32 H100s.
    let overview = browser.wait_text("#overview-body", "H100-SXM5-80GB").await;
    assert!(overview.contains("h100-demo"), "{overview}");
    let cells = browser.text("#overview-body table.counts tbody tr").await;
    assert!(cells.contains("32"), "{cells}");

    // Timeline: the four nodes, the bookings, the tenant in the legend.
    browser.go_to_view("timeline").await;
    browser.wait_text("#tl-range", "of 4").await;
    browser.wait_text("#tl-bookings", &first).await;
    let nodes = browser.text("#tl-bookings").await;
    assert!(nodes.contains("h100-"), "{nodes}");
    browser.wait_text("#tl-legend", "tenant-a").await;
    drawn_bars(&browser).await;
    let shot = browser
        .screenshot(&format!("timeline-{db:?}").to_lowercase())
        .await;
    assert!(std::fs::metadata(shot).unwrap().len() > 10_000);

    // A reservation created through the API appears without a reload: on the timeline…
    browser
        .client
        .execute("window.stillTheSamePage = true;", vec![])
        .await
        .unwrap();
    let live = book(&tenant, "tenant-a", &pool, 2, 3, "made-while-watching").await;
    browser.wait_text("#tl-bookings", &live).await;
    // …and in the reservation list.
    browser.go_to_view("reservations").await;
    browser.wait_text("#res-body", &live).await;
    let row = browser
        .text(&format!("#res-body tr[data-id=\"{live}\"]"))
        .await;
    assert!(row.contains("placed") || row.contains("active"), "{row}");
    assert!(row.contains(&pool), "{row}");
    let same = browser
        .client
        .execute("return window.stillTheSamePage === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same, json!(true), "the page was not reloaded");

    // Policies: the built-in placer decided every booking.
    browser.go_to_view("policies").await;
    let policies = browser.wait_text("#policies-body", "placement").await;
    assert!(policies.contains("built-in default"), "{policies}");

    // GraphiQL: embedded, with a key field that signs its requests.
    browser.open(&format!("{}/graphql", server.url)).await;
    browser.wait(Locator::Css(".graphiql-container")).await;
    let status = browser.wait_text("#key-status", "Signed in as ops").await;
    assert!(!status.contains("refused"), "{status}");
    browser.client.close().await.unwrap();
}

/// Checks that the canvas drew bars: pixels that are neither background nor grid.
async fn drawn_bars(browser: &Browser) {
    let script = "const c = document.getElementById('tl-canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let coloured = 0;
        for (let i = 0; i < d.length; i += 4) {
          const [r, g, b] = [d[i], d[i + 1], d[i + 2]];
          if (Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured++;
        }
        return coloured;";
    let coloured = browser.client.execute(script, vec![]).await.unwrap();
    assert!(
        coloured.as_i64().unwrap() > 2_000,
        "the timeline draws booking bars ({coloured} coloured pixels)"
    );
}

async fn a_tenant_key_sees_none_of_another_tenants_bookings(db: Db) {
    let server = Server::start_with(
        db,
        Options {
            demo: true,
            ..Options::default()
        },
    )
    .await;
    let (_, tenant_key) = demo_keys(&server);
    let tenant = server.as_key(&tenant_key);
    let pool = demo_pool(&tenant).await;
    let other = server.org_with_key("tenant-b", "member").await;
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-b", "quota": { "gpu": 16 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    let mine = book(&tenant, "tenant-a", &pool, 4, 2, "a").await;
    let theirs = book(&other, "tenant-b", &pool, 4, 2, "b").await;

    let browser = Browser::start().await;
    browser.sign_in(&server, &tenant_key).await;
    browser.go_to_view("timeline").await;
    browser.wait_text("#tl-bookings", &mine).await;
    let page = browser
        .client
        .execute("return document.body.innerHTML;", vec![])
        .await
        .unwrap();
    let page = page.as_str().unwrap();
    assert!(
        !page.contains(&theirs),
        "tenant-a's page names tenant-b's booking"
    );
    assert!(!browser.text("#tl-legend").await.contains("tenant-b"));
    assert!(!browser.text("#tl-bookings").await.contains("tenant-b"));
    browser
        .screenshot(&format!("timeline-tenant-{db:?}").to_lowercase())
        .await;

    // Asking for tenant-b's reservations is refused in words.
    browser.go_to_view("reservations").await;
    browser.wait_text("#res-body", &mine).await;
    let field = browser.wait_visible("#res-tenant").await;
    field.clear().await.unwrap();
    field.send_keys("tenant-b\n").await.unwrap();
    let refused = browser.wait_text("#res-body", "cannot be shown").await;
    assert!(
        refused.contains("not found") || refused.contains("Not visible"),
        "{refused}"
    );
    assert!(!refused.contains(&theirs));

    // The platform admin sees both tenants' bookings.
    browser
        .client
        .execute("sessionStorage.clear();", vec![])
        .await
        .unwrap();
    browser.sign_in(&server, &server.admin).await;
    browser.go_to_view("timeline").await;
    browser.wait_text("#tl-bookings", &theirs).await;
    browser.wait_text("#tl-legend", "tenant-b").await;
    // The reservations view offers every tenant of the pools, read page by page.
    browser.go_to_view("reservations").await;
    browser.wait_visible("#res-tenant").await;
    let started = std::time::Instant::now();
    loop {
        let offered = browser
            .client
            .execute(
                "return [...document.querySelectorAll('#res-tenants option')].map((o) => o.value);",
                vec![],
            )
            .await
            .unwrap();
        let offered: Vec<&str> = offered
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if offered.contains(&"tenant-a") && offered.contains(&"tenant-b") {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "tenants offered: {offered:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    browser.client.close().await.unwrap();
}

on_both_databases!(the_dashboard_and_graphiql_are_served_from_the_binary);

async fn the_dashboard_and_graphiql_are_served_from_the_binary(db: Db) {
    let server = Server::start(db).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = http.get(format!("{}/", server.url)).send().await.unwrap();
    assert!(root.status().is_redirection());
    assert_eq!(root.headers()["location"], "/ui/");

    let page = http
        .get(format!("{}/ui/", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let etag = page.headers()["etag"].clone();
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"sign-in-form\""));
    let again = http
        .get(format!("{}/ui/", server.url))
        .header("If-None-Match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);

    // Every file a page loads is local; none comes from a CDN.
    let graphiql = http
        .get(format!("{}/graphql", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(graphiql.status(), StatusCode::OK);
    let graphiql = graphiql.text().await.unwrap();
    for html in [&html, &graphiql] {
        for src in html
            .split(['"', '\''])
            .filter(|s| s.ends_with(".js") || s.ends_with(".css"))
        {
            assert!(src.starts_with("/ui/"), "{src} is not served by orl");
            let file = http
                .get(format!("{}{src}", server.url))
                .send()
                .await
                .unwrap();
            assert_eq!(file.status(), StatusCode::OK, "{src}");
            let kind = file.headers()["content-type"].to_str().unwrap().to_string();
            assert!(
                kind.starts_with(if src.ends_with(".js") {
                    "text/javascript"
                } else {
                    "text/css"
                }),
                "{src}: {kind}"
            );
        }
        assert!(!html.contains("unpkg.com") && !html.contains("cdn."));
    }
    let licence = http
        .get(format!("{}/ui/vendor/licenses/uplot.LICENSE", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(licence.status(), StatusCode::OK);

    let missing = http
        .get(format!("{}/ui/no-such-file.js", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "NOT_FOUND");
}
