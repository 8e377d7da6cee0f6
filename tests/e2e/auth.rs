use reqwest::{Method, StatusCode};

use crate::support::{Db, Server, assert_error, on_both_databases};

on_both_databases!(requests_without_a_valid_key_are_401);

async fn requests_without_a_valid_key_are_401(db: Db) {
    let server = Server::start(db).await;
    let (status, body) = server.anonymous().get("/v1/orgs/ops").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    for key in [
        "or_unknownunknownunknown",
        "vl_unknownunknownunknown",
        "not-a-key",
        "",
    ] {
        let (status, body) = server.as_key(key).get("/v1/orgs/ops").await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    }
    let (status, body) = server
        .anonymous()
        .raw(Method::GET, "/v1/orgs/ops", None, None)
        .await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
}
