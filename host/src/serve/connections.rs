//! The HTTP/1.1 listener: at most `max_connections` connections at once (past that the
//! listener stops accepting and the kernel queues them), a deadline for each request head
//! (which also closes a kept-alive connection idle between requests), a deadline for each
//! request body, and a graceful stop. Upgraded connections (WebSocket) and response
//! streams (Server-Sent Events) are not bound by any of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// How long clients may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From when the server is ready for a request (a new connection, or a kept-alive one
    /// after its last response) until that request's head has arrived.
    pub header_timeout: Duration,
    /// From the request head until its whole body has arrived.
    pub body_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `stop` resolves, then lets in-flight requests
/// finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let body_timeout = limits.body_timeout;
    let router = router.layer(middleware::from_fn(move |request, next| {
        body_deadline(body_timeout, request, next)
    }));
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stopping, stopped) = watch::channel(());
    let mut stop = std::pin::pin!(stop);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(error = %err, "connection ended");
                    }
                }
                _ = stopped.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stopping.send(());
    // Every connection holds a slot until it ends.
    let _ = slots
        .acquire_many(u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX))
        .await;
    Ok(())
}

/// Gives a request with a body `timeout` to deliver all of it; past that the body fails,
/// and the answer is 408 with the connection closed.
async fn body_deadline(timeout: Duration, request: Request, next: Next) -> Response {
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|len| len.as_bytes() != b"0");
    if !has_body {
        return next.run(request).await;
    }
    let expired = Arc::new(AtomicBool::new(false));
    let deadline = tokio::time::Instant::now() + timeout;
    let (parts, body) = request.into_parts();
    let flag = expired.clone();
    let chunks = futures::stream::unfold(
        (body.into_data_stream(), false),
        move |(mut chunks, done)| {
            let flag = flag.clone();
            async move {
                if done {
                    return None;
                }
                match tokio::time::timeout_at(deadline, chunks.next()).await {
                    Ok(Some(chunk)) => Some((chunk, (chunks, false))),
                    Ok(None) => None,
                    Err(_) => {
                        flag.store(true, Ordering::Relaxed);
                        let err = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the request body did not arrive in time",
                        );
                        Some((Err(axum::Error::new(err)), (chunks, true)))
                    }
                }
            }
        },
    );
    let response = next
        .run(Request::from_parts(parts, Body::from_stream(chunks)))
        .await;
    if !expired.load(Ordering::Relaxed) {
        return response;
    }
    let mut response = (
        StatusCode::REQUEST_TIMEOUT,
        axum::Json(serde_json::json!({ "error": {
            "code": "REQUEST_TIMEOUT",
            "message": format!("the request body did not arrive within {}", humantime::format_duration(timeout)),
        }})),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
