//! `/graphql` over HTTP: POST runs queries and mutations, GET serves GraphiQL (embedded,
//! [`crate::dashboard`]), and a GET
//! that upgrades to WebSocket runs subscriptions. Every operation authenticates with the
//! REST API's Bearer key: in the `Authorization` header, or for WebSocket in the
//! `connection_init` payload (`{"Authorization": "Bearer …"}`).

use std::sync::Arc;

use async_graphql::Data;
use async_graphql::http::{ALL_WEBSOCKET_PROTOCOLS, MultipartOptions};
use async_graphql_axum::{GraphQLProtocol, GraphQLResponse, GraphQLWebSocket};
use axum::extract::{DefaultBodyLimit, FromRequestParts as _, Request, State, WebSocketUpgrade};
use axum::http;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use super::limits::MAX_BODY_BYTES;
use super::loaders::{Loaders, QueryCount};
use super::{OrlSchema, schema};
use crate::api::extract::RawBody;
use crate::iam::Principal;
use crate::{App, Error};

const PATH: &str = "/graphql";

/// The `/graphql` route.
pub fn router(app: Arc<App>) -> Router<Arc<App>> {
    Router::new()
        .route(PATH, get(page_or_socket).post(execute))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(Extension(schema(app)))
}

/// Runs one query or mutation as the caller; the response reports in
/// `extensions.loaderQueries` how many batched queries its loaders ran. The body is read
/// whole, up to [`MAX_BODY_BYTES`], before it is decoded.
async fn execute(
    State(app): State<Arc<App>>,
    Extension(schema): Extension<OrlSchema>,
    caller: Result<Principal, Error>,
    headers: http::HeaderMap,
    body: Result<RawBody, Error>,
) -> Response {
    let caller = match caller {
        Ok(caller) => caller,
        Err(err) => return refused(err),
    };
    let body = match body {
        Ok(RawBody(body)) => body,
        Err(Error::PayloadTooLarge(_)) => {
            return refused(Error::PayloadTooLarge(format!(
                "request body is larger than {MAX_BODY_BYTES} bytes"
            )));
        }
        Err(err) => return refused(err),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let request = match async_graphql::http::receive_body(
        content_type,
        futures::io::Cursor::new(body),
        MultipartOptions::default().max_num_files(0),
    )
    .await
    {
        Ok(request) => request,
        Err(err) => {
            return refused(Error::InvalidInput {
                message: format!("not a GraphQL request: {err}"),
                field: None,
            });
        }
    };
    let queries = QueryCount::default();
    let (loaders, batches) = Loaders::driven(app, queries.clone());
    let request = request.data(caller).data(loaders);
    let mut response = batches.beside(schema.execute(request)).await;
    response
        .extensions
        .insert("loaderQueries".into(), (queries.get() as i32).into());
    GraphQLResponse::from(response).into_response()
}

/// An operation refused before it ran (no or a bad key): the GraphQL error shape, with the
/// REST status.
fn refused(err: Error) -> Response {
    let (status, _) = err.status_and_code();
    let error = async_graphql::Error::from(err);
    let mut refusal = async_graphql::ServerError::new(error.message, None);
    refusal.extensions = error.extensions;
    let body = async_graphql::Response::from_errors(vec![refusal]);
    let mut response = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// GraphiQL for a browser; the subscription socket for a WebSocket upgrade.
async fn page_or_socket(
    State(app): State<Arc<App>>,
    Extension(schema): Extension<OrlSchema>,
    request: Request,
) -> Response {
    let (mut parts, _) = request.into_parts();
    if !parts.headers.contains_key(header::UPGRADE) {
        return crate::dashboard::graphiql(&parts.headers);
    }
    let protocol = match GraphQLProtocol::from_request_parts(&mut parts, &app).await {
        Ok(protocol) => protocol,
        Err(status) => return status.into_response(),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &app).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let header_key = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    upgrade
        .max_message_size(MAX_BODY_BYTES)
        .max_frame_size(MAX_BODY_BYTES)
        .protocols(ALL_WEBSOCKET_PROTOCOLS)
        .on_upgrade(move |socket| {
            GraphQLWebSocket::new(socket, schema, protocol)
                .on_connection_init(move |payload| async move {
                    let given = payload
                        .get("Authorization")
                        .or_else(|| payload.get("authorization"))
                        .and_then(|v| v.as_str())
                        .map(str::to_string);
                    let caller = authenticate(&app, given.or(header_key)).await?;
                    let mut data = Data::default();
                    data.insert(caller);
                    data.insert(super::session::OverWebSocket);
                    data.insert(Loaders::spawned(app));
                    Ok(data)
                })
                .serve()
        })
}

/// The caller an `Authorization` value names, authenticated exactly as REST does.
async fn authenticate(app: &Arc<App>, authorization: Option<String>) -> Result<Principal, Error> {
    let mut request = http::Request::builder();
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let (mut parts, ()) = request
        .body(())
        .map_err(|_| Error::Unauthenticated("Authorization must be Bearer <API key>".into()))?
        .into_parts();
    Principal::from_request_parts(&mut parts, app).await
}
