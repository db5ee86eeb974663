//! Watch streams: initial ADDED events or replay from a resourceVersion, then live changes filtered
//! by namespace and selectors (with the ADDED/DELETED transitions the real server sends when an
//! object starts or stops matching), bookmarks on request, `Expired` for a too-old resourceVersion,
//! and `timeoutSeconds`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tracing::{Instrument, debug, info_span};

use crate::ops;
use crate::registry::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::Shared;
use crate::status::ApiError;
use crate::store::{Change, EventType};
use crate::table::{self, IncludeObject};

/// How watch event objects are rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Render {
    /// The object.
    Object,
    /// A one-row Table.
    Table(IncludeObject, &'static str),
    /// PartialObjectMetadata.
    Metadata(&'static str),
}

/// The parsed watch request.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The type watched, and the version to render.
    pub rt: ResourceType,
    /// Requested version.
    pub version: String,
    /// Namespace filter.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// `resourceVersion` parameter.
    pub resource_version: Option<String>,
    /// `sendInitialEvents`.
    pub send_initial: Option<bool>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Output rendering.
    pub render: Render,
}

impl WatchRequest {
    fn visible(&self, stored: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            stored
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && self.labels.matches(stored) && self.fields.matches(stored)
    }

    fn render(&self, stored: &Value) -> Value {
        let obj = ops::to_version(&self.rt, &self.version, stored);
        match self.render {
            Render::Object => obj,
            Render::Metadata(v) => table::partial_metadata(&obj, v),
            Render::Table(include, v) => {
                table::render(&self.rt, &self.version, &[obj], json!({}), include, v)
            }
        }
    }

    fn event_line(&self, kind: &str, stored: &Value) -> Bytes {
        let mut line = json!({"type": kind, "object": self.render(stored)}).to_string();
        line.push('\n');
        Bytes::from(line)
    }

    /// The event (if any) this watcher sees for a change.
    fn translate(&self, c: &Change) -> Option<Bytes> {
        if c.key.0 != self.rt.storage.0 || c.key.1 != self.rt.storage.1 {
            return None;
        }
        let now = self.visible(&c.object);
        let kind = match c.kind {
            EventType::Added => now.then_some("ADDED")?,
            EventType::Deleted => now.then_some("DELETED")?,
            EventType::Modified => {
                let before = c.old.as_ref().is_some_and(|o| self.visible(o));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
        };
        Some(self.event_line(kind, &c.object))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(&self.version), "metadata": meta});
        let mut line = json!({"type": "BOOKMARK", "object": obj}).to_string();
        line.push('\n');
        Bytes::from(line)
    }
}

fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// Starts a watch and returns its streaming response.
pub fn start(shared: Arc<Shared>, req: WatchRequest) -> Result<Response, ApiError> {
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let mut initial: Vec<Bytes> = Vec::new();
    let (live, start_rv) = {
        let inner = shared.lock();
        let store = &inner.store;
        let rv_param = req.resource_version.as_deref().filter(|s| !s.is_empty());
        let from_state = matches!(
            (rv_param, req.send_initial),
            (_, Some(true)) | (None | Some("0"), None)
        );
        if from_state {
            let ns = if req.rt.namespaced {
                req.namespace.as_deref()
            } else {
                None
            };
            for (_, obj) in store.list(&req.rt.storage.0, &req.rt.storage.1, ns) {
                if req.visible(obj) {
                    initial.push(req.event_line("ADDED", obj));
                }
            }
            if req.send_initial == Some(true) && req.bookmarks {
                initial.push(req.bookmark(store.current_rv(), true));
            }
        } else if let Some(rv) = rv_param {
            let rv: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
            match store.changes_since(rv, &req.rt.storage.0, &req.rt.storage.1) {
                Ok(changes) => initial.extend(changes.iter().filter_map(|c| req.translate(c))),
                Err(floor) => {
                    let status = ApiError::expired(rv, floor).body();
                    let mut line = json!({"type": "ERROR", "object": status}).to_string();
                    line.push('\n');
                    // The channel is fresh and large enough; a failure only means the client left.
                    let _ = tx.try_send(Bytes::from(line));
                    drop(tx);
                    return Ok(stream_response(rx));
                }
            }
        }
        (store.subscribe(), store.current_rv())
    };
    let span = info_span!("watch", resource = %req.rt.plural, namespace = ?req.namespace);
    tokio::spawn(run(shared, req, tx, initial, live, start_rv).instrument(span));
    Ok(stream_response(rx))
}

async fn run(
    shared: Arc<Shared>,
    req: WatchRequest,
    tx: mpsc::Sender<Bytes>,
    initial: Vec<Bytes>,
    mut live: broadcast::Receiver<Arc<Change>>,
    start_rv: u64,
) {
    let mut shutdown = shared.shutdown.clone();
    for line in initial {
        if tx.send(line).await.is_err() {
            return;
        }
    }
    let mut last_rv = start_rv;
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut bookmark_tick = tokio::time::interval(Duration::from_secs(2));
    bookmark_tick.tick().await;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            change = live.recv() => match change {
                Ok(c) => {
                    if c.rv <= last_rv {
                        continue;
                    }
                    last_rv = c.rv;
                    if let Some(line) = req.translate(&c)
                        && tx.send(line).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    debug!(skipped = n, "watcher lagged; closing so the client resumes");
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = bookmark_tick.tick(), if req.bookmarks => {
                if tx.send(req.bookmark(last_rv, false)).await.is_err() {
                    return;
                }
            }
            _ = timeout => return,
            _ = shutdown.changed() => return,
            _ = tx.closed() => return,
        }
    }
}
