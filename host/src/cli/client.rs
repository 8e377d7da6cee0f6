//! A thin HTTP client that turns the API's error envelope into a readable error.

use anyhow::{Context as _, anyhow};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// What a request carries.
enum Body<'a> {
    None,
    Json(&'a Value),
    /// Bytes sent as they are, with their content type.
    Bytes(Vec<u8>, &'static str),
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Client {
    /// A client of the server at `base`; a base without a scheme (`127.0.0.1:8080`) is
    /// taken as `http://`.
    pub fn new(base: &str, key: Option<&str>) -> anyhow::Result<Client> {
        let base = base.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        reqwest::Url::parse(&base).with_context(|| format!("--url {base:?} is not a URL"))?;
        Ok(Client {
            http: reqwest::Client::builder().build()?,
            base,
            key: key.map(str::to_string),
        })
    }

    /// The id of the pool `pool` names: an id (`pool_…`) as it is, or the name of exactly
    /// one of the pools the key sees (every page of them is read).
    pub async fn pool_id(&self, pool: &str) -> anyhow::Result<String> {
        if pool.starts_with("pool_") {
            return Ok(pool.to_string());
        }
        let mut named: Vec<String> = Vec::new();
        let mut path = "/v1/pools?limit=200".to_string();
        loop {
            let page = self.get(&path).await?;
            named.extend(
                (page["items"].as_array().into_iter().flatten())
                    .filter(|p| p["name"] == pool)
                    .filter_map(|p| p["id"].as_str().map(str::to_string)),
            );
            match page["cursor"].as_str() {
                Some(cursor) => path = format!("/v1/pools?limit=200&cursor={cursor}"),
                None => break,
            }
        }
        match named.as_slice() {
            [id] => Ok(id.clone()),
            [] => Err(anyhow!("no pool named {pool:?} is visible to this key")),
            ids => Err(anyhow!(
                "{} pools are named {pool:?} ({}): give the id",
                ids.len(),
                ids.join(", ")
            )),
        }
    }

    /// The id of the plugin `plugin` names: an id (`sha256:…`) as it is, or the name of
    /// exactly one of the plugins the key sees, built-ins included (every page is read).
    pub async fn plugin_id(&self, plugin: &str) -> anyhow::Result<String> {
        if plugin.starts_with("sha256:") {
            return Ok(plugin.to_string());
        }
        let mut named: Vec<(String, String)> = Vec::new();
        let mut path = "/v1/plugins?limit=200".to_string();
        loop {
            let page = self.get(&path).await?;
            named.extend(
                (page["items"].as_array().into_iter().flatten())
                    .filter(|p| p["name"] == plugin)
                    .filter_map(|p| {
                        let id = p["id"].as_str()?.to_string();
                        Some((id, p["version"].as_str().unwrap_or("").to_string()))
                    }),
            );
            match page["cursor"].as_str() {
                Some(cursor) => path = format!("/v1/plugins?limit=200&cursor={cursor}"),
                None => break,
            }
        }
        match named.as_slice() {
            [(id, _)] => Ok(id.clone()),
            [] => Err(anyhow!("no plugin named {plugin:?} is visible to this key")),
            found => Err(anyhow!(
                "{} plugins are named {plugin:?} ({}): give the id",
                found.len(),
                (found.iter())
                    .map(|(id, version)| format!("{id} version {version}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(Method::GET, path, Body::None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(Method::POST, path, Body::Json(body)).await
    }

    /// POSTs `bytes` as the body, as `content_type`.
    pub async fn post_bytes(
        &self,
        path: &str,
        bytes: Vec<u8>,
        content_type: &'static str,
    ) -> anyhow::Result<Value> {
        self.send(Method::POST, path, Body::Bytes(bytes, content_type))
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(Method::PUT, path, Body::Json(body)).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        self.send(Method::DELETE, path, Body::None).await
    }

    async fn send(&self, method: Method, path: &str, body: Body<'_>) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        request = match body {
            Body::None => request,
            Body::Json(body) => request.json(body),
            Body::Bytes(bytes, content_type) => request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes),
        };
        let response = request.send().await.map_err(|err| {
            if err.is_connect() {
                anyhow!(
                    "cannot reach the orl server at {} (is it running? set --url or ORL_URL)",
                    self.base
                )
            } else if err.is_timeout() {
                anyhow!("the orl server at {} did not answer in time", self.base)
            } else {
                anyhow!("calling {url}: {err}")
            }
        })?;
        let status = response.status();
        if status == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        let value: Value = response
            .json()
            .await
            .with_context(|| format!("reading the answer of {url}"))?;
        if status.is_success() {
            return Ok(value);
        }
        let error = &value["error"];
        Err(anyhow!(
            "{} {}: {}{}",
            status.as_u16(),
            error["code"].as_str().unwrap_or("ERROR"),
            error["message"].as_str().unwrap_or("(no message)"),
            error
                .get("details")
                .map(|d| format!(" {d}"))
                .unwrap_or_default()
        ))
    }
}
