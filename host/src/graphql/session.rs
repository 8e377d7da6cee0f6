//! A WebSocket authenticates once, at `connection_init`, but may carry operations for as
//! long as it stays open: each query or mutation sent over one checks again that the key is
//! not revoked, so a revoked key's socket can do no more than a revoked key's request.
//! (Subscriptions end on revocation by themselves; see [`crate::events`].)

use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextExecute};
use async_graphql::{ErrorExtensions as _, Response, ServerError};

use crate::App;
use crate::iam::{Principal, keys};

/// Marks the data of an operation that arrived over a WebSocket.
pub struct OverWebSocket;

/// The extension that re-checks a WebSocket's key before each operation.
pub struct Session;

impl ExtensionFactory for Session {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(Session)
    }
}

#[async_graphql::async_trait::async_trait]
impl Extension for Session {
    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        if let (Some(OverWebSocket), Some(caller), Some(app)) = (
            ctx.data_opt::<OverWebSocket>(),
            ctx.data_opt::<Principal>(),
            ctx.data_opt::<Arc<App>>(),
        ) {
            let refused = match keys::is_live(app.store.pool(), &caller.key_id).await {
                Ok(true) => None,
                Ok(false) => Some(("the API key was revoked", "UNAUTHENTICATED")),
                Err(err) => {
                    tracing::error!(error = %format_args!("{err:#}"), "GraphQL: cannot check a socket's key");
                    Some(("internal error", "INTERNAL"))
                }
            };
            if let Some((message, code)) = refused {
                let error =
                    async_graphql::Error::new(message).extend_with(|_, e| e.set("code", code));
                return Response::from_errors(vec![ServerError {
                    extensions: error.extensions,
                    ..ServerError::new(message, None)
                }]);
            }
        }
        next.run(ctx, operation_name).await
    }
}
