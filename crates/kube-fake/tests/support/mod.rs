//! Shared helpers for the kube-fake integration tests: start a fake, talk to it with reqwest or a
//! kube-rs client, read watch streams line by line.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube_fake::{FakeApiServer, FakeHandle};
use serde_json::Value;

/// A fake with a short token delay.
pub async fn start() -> Result<FakeHandle> {
    Ok(FakeApiServer::builder()
        .token_delay(Duration::from_millis(20))
        .start()
        .await?)
}

/// A reqwest client trusting the fake's CA.
pub fn http(fake: &FakeHandle) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(fake.ca_pem().as_bytes())?)
        .build()?)
}

/// A raw request helper bound to one fake and token.
pub struct Raw {
    pub client: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Raw {
    pub fn admin(fake: &FakeHandle) -> Result<Self> {
        Self::with_token(fake, fake.admin_token())
    }

    pub fn with_token(fake: &FakeHandle, token: &str) -> Result<Self> {
        Ok(Self {
            client: http(fake)?,
            base: fake.base_url().to_string(),
            token: token.to_string(),
        })
    }

    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Sends and returns (status, JSON body).
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Result<(u16, Value)> {
        let resp = rb.send().await?;
        let code = resp.status().as_u16();
        let text = resp.text().await?;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).context(text)?
        };
        Ok((code, body))
    }

    pub async fn get(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.req(reqwest::Method::GET, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        self.send(self.req(reqwest::Method::POST, path).json(body))
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        self.send(self.req(reqwest::Method::PUT, path).json(body))
            .await
    }

    pub async fn patch(
        &self,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> Result<(u16, Value)> {
        let rb = self
            .req(reqwest::Method::PATCH, path)
            .header("content-type", content_type)
            .body(body.to_string());
        self.send(rb).await
    }

    pub async fn delete(&self, path: &str) -> Result<(u16, Value)> {
        self.send(self.req(reqwest::Method::DELETE, path)).await
    }
}

/// Reads newline-delimited JSON watch events from a streaming response.
pub struct WatchLines {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl WatchLines {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next event, or `None` when the server ended the stream. A generous safety timeout keeps
    /// a broken fake from hanging the suite; it is not a timing assertion.
    pub async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Ok(Some(serde_json::from_slice(&line)?));
            }
            match tokio::time::timeout(Duration::from_secs(30), self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => bail!("no watch event within 30s"),
            }
        }
    }

    /// The next non-bookmark event as (type, object).
    pub async fn event(&mut self) -> Result<(String, Value)> {
        loop {
            let Some(ev) = self.next().await? else {
                bail!("watch ended")
            };
            let ty = ev["type"].as_str().unwrap_or_default().to_string();
            if ty != "BOOKMARK" {
                return Ok((ty, ev["object"].clone()));
            }
        }
    }
}

/// A kube-rs client for a bearer token.
pub async fn kube_client_for(fake: &FakeHandle, token: &str) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(&fake.kubeconfig_for_token(token, "default"))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A kube-rs client for the admin.
pub async fn kube_client(fake: &FakeHandle) -> Result<kube::Client> {
    kube_client_for(fake, fake.admin_token()).await
}

/// Polls `f` until it returns `Some` (bounded, for asynchronous controllers).
pub async fn eventually<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    for _ in 0..300 {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("condition not reached within 15s")
}
