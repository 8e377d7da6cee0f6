//! `GET /v1/events/stream`: the event outbox as Server-Sent Events, with the visibility of
//! `GET /v1/events`, resumable by `Last-Event-ID` or `?after=` across server restarts, and
//! fed across replicas on PostgreSQL.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::{Api, Db, Server, T0, on_both_databases, register_node};

/// One message of the stream.
#[derive(Debug)]
struct Message {
    id: i64,
    event: String,
    data: Value,
}

/// An open event stream.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    /// Opens the stream at `url` as `key`, resuming after `last_event_id` when given.
    async fn open(url: &str, key: &str, query: &str, last_event_id: Option<i64>) -> Stream {
        let mut request = reqwest::Client::new()
            .get(format!("{url}/v1/events/stream{query}"))
            .bearer_auth(key);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "Server-Sent Events"
        );
        Stream {
            response,
            buffer: String::new(),
        }
    }

    /// The next message within `wait`; `None` when the server ended the stream.
    async fn next_within(&mut self, wait: Duration) -> Option<Message> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), String::new());
                for line in frame.lines() {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => id = value.parse().ok(),
                        "event" => event = value.to_string(),
                        "data" => data.push_str(value),
                        _ => {}
                    }
                }
                if let Some(id) = id {
                    let data = serde_json::from_str(&data).unwrap();
                    return Some(Message { id, event, data });
                }
                continue;
            }
            let chunk = tokio::time::timeout(wait, self.response.chunk())
                .await
                .expect("a message in time")
                .ok()??;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    async fn next(&mut self) -> Message {
        self.next_within(Duration::from_secs(15))
            .await
            .expect("the stream goes on")
    }
}

/// The ids `GET /v1/events` lists to `api`.
async fn listed(api: &Api) -> Vec<i64> {
    let (status, page) = api.get("/v1/events?limit=500").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect()
}

on_both_databases!(
    a_stream_resumed_with_last_event_id_after_a_restart_loses_no_event,
    the_stream_shows_only_what_get_events_shows_the_caller,
    concurrent_writers_never_make_a_stream_skip_an_event,
    an_events_page_carries_a_cursor_only_while_more_events_follow,
);

async fn an_events_page_carries_a_cursor_only_while_more_events_follow(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "viewer").await;
    let key = server.key_in("acme", json!({ "role": "provider" })).await;
    let provider = server.as_key(&key);
    for node in ["n1", "n2", "n3"] {
        register_node(&provider, "acme", node, 1).await;
    }
    let (status, all) = provider.get("/v1/events?limit=500").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    let count = all["items"].as_array().unwrap().len();
    assert!(count >= 3, "{all}");
    assert!(all.get("cursor").is_none(), "nothing follows: {all}");

    let (_, exact) = provider.get(&format!("/v1/events?limit={count}")).await;
    assert_eq!(exact["items"].as_array().unwrap().len(), count);
    assert!(
        exact.get("cursor").is_none(),
        "an exactly full last page: {exact}"
    );

    let (_, first) = provider
        .get(&format!("/v1/events?limit={}", count - 1))
        .await;
    let cursor = first["cursor"]
        .as_str()
        .expect("one more follows")
        .to_string();
    let last = &first["items"][count - 2]["id"];
    let last = last.as_str().map_or_else(|| last.to_string(), String::from);
    assert_eq!(cursor, last, "the cursor is the page's last event");
    let (_, rest) = provider
        .get(&format!("/v1/events?after={cursor}&limit={}", count - 1))
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 1, "{rest}");
    assert!(rest.get("cursor").is_none(), "{rest}");

    let (status, body) = provider
        .post(
            "/graphql",
            json!({ "query": format!("{{ events(first: {count}) {{ pageInfo {{ hasNextPage }} }} }}") }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["data"]["events"]["pageInfo"]["hasNextPage"], false,
        "{body}"
    );
}

async fn a_stream_resumed_with_last_event_id_after_a_restart_loses_no_event(db: Db) {
    let mut server = Server::start(db).await;
    server.org_with_key("acme", "viewer").await;
    let key = server.key_in("acme", json!({ "role": "provider" })).await;
    let provider = server.as_key(&key);
    register_node(&provider, "acme", "n1", 4).await;
    let mut stream = Stream::open(&server.url, &key, "", None).await;
    let first = stream.next().await;
    assert_eq!(first.event, "inventory.node-registered");
    assert_eq!(first.data["objectId"], "n1");
    assert_eq!(first.data["type"], first.event);
    register_node(&provider, "acme", "n2", 4).await;
    let second = stream.next().await;
    assert_eq!(second.data["objectId"], "n2");
    assert!(second.id > first.id);

    // The server stops cleanly with the stream open, and the stream ends.
    server
        .restart_with(crate::support::Options::default())
        .await;
    assert!(stream.next_within(Duration::from_secs(15)).await.is_none());
    let provider = server.as_key(&key);
    register_node(&provider, "acme", "n3", 4).await;
    register_node(&provider, "acme", "n4", 4).await;
    let mut resumed = Stream::open(&server.url, &key, "", Some(second.id)).await;
    let mut received = vec![first.id, second.id];
    for node in ["n3", "n4"] {
        let message = resumed.next().await;
        assert_eq!(message.data["objectId"], node, "missed while disconnected");
        received.push(message.id);
    }
    register_node(&provider, "acme", "n5", 4).await;
    let live = resumed.next().await;
    assert_eq!(live.data["objectId"], "n5");
    received.push(live.id);
    assert_eq!(
        received,
        listed(&provider).await,
        "every event, once, in order"
    );

    let mut by_query =
        Stream::open(&server.url, &key, &format!("?after={}", second.id), None).await;
    assert_eq!(by_query.next().await.data["objectId"], "n3");
    let mut header_wins = Stream::open(&server.url, &key, "?after=0", Some(received[3])).await;
    assert_eq!(header_wins.next().await.data["objectId"], "n5");
}

async fn the_stream_shows_only_what_get_events_shows_the_caller(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    server.org_with_key("stranger", "viewer").await;
    let stranger = server.key_in("stranger", json!({ "role": "member" })).await;
    let mut stream = Stream::open(&server.url, &stranger, "", None).await;
    register_node(&provider, "acme", "n1", 4).await;
    let (status, held) = server
        .admin()
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["stranger"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let message = stream.next().await;
    assert_eq!(
        message.event, "node-reservation.created",
        "acme's node registration is not shown to another org"
    );
    assert_eq!(message.data["objectId"], held["id"]);
    assert_eq!(vec![message.id], listed(&server.as_key(&stranger)).await);

    let client = reqwest::Client::new();
    let url = format!("{}/v1/events/stream", server.url);
    let answer = |request: reqwest::RequestBuilder| async move {
        let response = request.send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        (status, body["error"]["code"].as_str().unwrap().to_string())
    };
    assert_eq!(
        answer(client.get(&url)).await,
        (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED".to_string())
    );
    let no_events = server
        .key_in("stranger", json!({ "permissions": ["provider.read"] }))
        .await;
    assert_eq!(
        answer(client.get(&url).bearer_auth(&no_events)).await,
        (StatusCode::NOT_FOUND, "NOT_FOUND".to_string())
    );
    assert_eq!(
        answer(
            client
                .get(&url)
                .bearer_auth(&stranger)
                .header("Last-Event-ID", "yesterday")
        )
        .await,
        (StatusCode::BAD_REQUEST, "INVALID_INPUT".to_string())
    );
    assert_eq!(
        answer(client.get(format!("{url}?after=-1")).bearer_auth(&stranger)).await,
        (StatusCode::BAD_REQUEST, "INVALID_INPUT".to_string())
    );
}

/// Many transactions writing events at once must not let a stream pass an event that
/// commits after a later one (on PostgreSQL, `seq` is taken before commit).
async fn concurrent_writers_never_make_a_stream_skip_an_event(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let mut stream = Stream::open(&server.url, &server.admin, "", None).await;
    futures::future::join_all((0..48).map(|n| {
        let api = provider.clone();
        async move { register_node(&api, "acme", &format!("c{n:02}"), 2).await }
    }))
    .await;
    let expected = listed(&server.admin()).await;
    assert_eq!(expected.len(), 48);
    let mut received = Vec::new();
    while received.len() < expected.len() {
        received.push(stream.next().await.id);
    }
    assert_eq!(received, expected);
}

/// A second `orl serve` on the database of `server`, as another replica; its URL.
async fn replica(server: &Server) -> (tokio::process::Child, tempfile::TempDir, String) {
    let data_dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir.path())
        .args(["--database-url", server.db.url.as_deref().unwrap()])
        .env_remove("DATABASE_URL")
        .env_remove("ORL_ADMIN_KEY")
        .env("ORL_TEST_CLOCK_MS", T0.to_string())
        .env("ORL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the replica starts");
            if let Some(url) = line.strip_prefix("orl listening on ") {
                return url.to_string();
            }
        }
    })
    .await
    .expect("the replica listens within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, data_dir, url)
}

/// On PostgreSQL a stream on one replica hears at once (by `LISTEN/NOTIFY`, well before
/// its 5 s safety-net poll) of an event another replica wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_on_one_replica_reach_a_stream_on_another_at_once() {
    let server = Server::start(Db::Postgres).await;
    server.org_with_key("acme", "viewer").await;
    let key = server.key_in("acme", json!({ "role": "provider" })).await;
    let (_replica, _dir, other) = replica(&server).await;
    let mut stream = Stream::open(&other, &key, "", None).await;
    for node in ["n1", "n2"] {
        register_node(&server.as_key(&key), "acme", node, 2).await;
        let message = stream
            .next_within(Duration::from_secs(3))
            .await
            .expect("the stream goes on");
        assert_eq!(message.data["objectId"], node);
    }
}
