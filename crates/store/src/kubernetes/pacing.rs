//! Pacing of the process's requests to the Kubernetes API server, so that its API Priority and
//! Fairness has no reason to answer 429: all clones of the client (the reconcilers, the HTTP API,
//! the webhooks' reads, the Event writer) share one limit on requests in flight, and a 429 closes a
//! shared gate for the `Retry-After` the server gave, so every request waits that long instead of
//! each one retrying on its own while the others keep coming.
//!
//! [`paced_client`] builds the stack `Retry → Buffer → Paced → kube's own stack without retry`:
//! kube-rs's server-aware retry (the one its default stack has, `RetryPolicy::server_retry`) sits
//! outside the pacing, so the pacing sees every attempt, 429s included, and a retried request
//! queues for a permit again. A permit is held until the response's head arrives (a watch gives
//! its back at once; a list's body is read after); the inner future sends nothing until it is
//! polled, which is after the permit is taken.
//!
//! Requests for Leases bypass both: leader election must renew on time however long the queue
//! is, as the API server itself gives leader election a priority level of its own.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response, StatusCode};
use kube::{
    Client,
    client::{Body, ClientBuilder, retry::RetryPolicy},
};
use tokio::{sync::Semaphore, time::Instant};
use tower::{BoxError, Layer, Service, buffer::BufferLayer, retry::RetryLayer};
use tracing::{debug, warn};

/// The `Retry-After` assumed when a 429 carries none (the API server's own value).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest pause a `Retry-After` may impose.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// Requests waiting to enter the pacing (past it, callers wait to be queued).
const BUFFER: usize = 1024;

/// How the client paces its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// Requests in flight at once (at least 1).
    pub max_in_flight: usize,
}

/// A client of `config` whose requests are paced by `pacing`.
pub fn paced_client(mut config: kube::Config, pacing: Pacing) -> Result<Client, kube::Error> {
    // The retry goes outside the pacing, below; the default stack's would hide 429s from it.
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&PacingLayer::new(pacing))
        .with_layer(&BufferLayer::new(BUFFER))
        .with_layer(&RetryLayer::new(RetryPolicy::server_retry()))
        .build())
}

/// The shared state of every clone of one paced client.
struct Shared {
    permits: Semaphore,
    /// Until when requests wait (a 429's `Retry-After`), in milliseconds since `epoch`; 0: open.
    resume_at: AtomicU64,
    epoch: Instant,
    /// 429s seen; only a change of the gate is logged at warn.
    throttled: AtomicU64,
}

impl Shared {
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Waits while the gate is closed (it may be closed again meanwhile).
    async fn wait_for_gate(&self) {
        loop {
            let until = self.resume_at.load(Ordering::Acquire);
            if until == 0 {
                return;
            }
            let until = self.epoch + Duration::from_millis(until);
            if until <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(until).await;
        }
    }

    /// A 429: nobody sends anything for `retry_after` (a later deadline already set stays).
    fn close_gate(&self, retry_after: Duration) {
        let until = self.millis(Instant::now() + retry_after);
        let before = self.resume_at.fetch_max(until, Ordering::AcqRel);
        let n = self.throttled.fetch_add(1, Ordering::Relaxed) + 1;
        if until > before {
            warn!(
                ?retry_after,
                throttled = n,
                "the Kubernetes API server asked to slow down (429); pausing requests"
            );
        } else {
            debug!(?retry_after, throttled = n, "429 while paused");
        }
    }
}

/// The layer that puts a service behind the pacing (one shared state per layer).
#[derive(Clone)]
pub struct PacingLayer {
    shared: Arc<Shared>,
}

impl PacingLayer {
    pub fn new(pacing: Pacing) -> Self {
        PacingLayer {
            shared: Arc::new(Shared {
                permits: Semaphore::new(pacing.max_in_flight.clamp(1, Semaphore::MAX_PERMITS)),
                resume_at: AtomicU64::new(0),
                epoch: Instant::now(),
                throttled: AtomicU64::new(0),
            }),
        }
    }
}

impl<S> Layer<S> for PacingLayer {
    type Service = Paced<S>;

    fn layer(&self, inner: S) -> Paced<S> {
        Paced {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// A service behind the pacing.
pub struct Paced<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// Leases are leader election's: never held back.
fn exempt<B>(req: &Request<B>) -> bool {
    req.uri().path().starts_with("/apis/coordination.k8s.io/")
}

/// The pause a 429 asks for: its `Retry-After` in seconds, within bounds.
fn retry_after<B>(resp: &Response<B>) -> Duration {
    resp.headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs)
        .clamp(Duration::from_millis(100), MAX_RETRY_AFTER)
}

impl<S, B> Service<Request<Body>> for Paced<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let exempt = exempt(&req);
        // Lazy: nothing is sent before it is polled, below, once a permit is held.
        let sent = self.inner.call(req);
        if exempt {
            return Box::pin(async move { sent.await.map_err(Into::into) });
        }
        let shared = self.shared.clone();
        Box::pin(async move {
            // The semaphore is never closed; should it be, the request goes unpaced.
            let _permit = shared.permits.acquire().await.ok();
            shared.wait_for_gate().await;
            let resp = sent.await.map_err(Into::into)?;
            if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                shared.close_gate(retry_after(&resp));
            }
            Ok(resp)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tower::{ServiceExt, service_fn, util::BoxCloneService};

    fn mk_request(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).expect("request")
    }

    /// What a test server saw.
    #[derive(Default)]
    struct Stats {
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
        requests: AtomicUsize,
    }

    type Server = BoxCloneService<Request<Body>, Response<()>, BoxError>;

    /// A server that answers after `delay` with the status `status` gives its `n`th request.
    fn mk_server(
        delay: Duration,
        status: impl Fn(usize) -> StatusCode + Clone + Send + 'static,
    ) -> (Server, Arc<Stats>) {
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        let svc = service_fn(move |_req: Request<Body>| {
            let (s, status) = (s.clone(), status.clone());
            async move {
                let n = s.requests.fetch_add(1, Ordering::SeqCst);
                let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                s.most_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                s.in_flight.fetch_sub(1, Ordering::SeqCst);
                let mut resp = Response::new(());
                *resp.status_mut() = status(n);
                if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                    resp.headers_mut()
                        .insert(http::header::RETRY_AFTER, "2".parse().expect("a value"));
                }
                Ok::<_, BoxError>(resp)
            }
        });
        (BoxCloneService::new(svc), stats)
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_never_exceed_the_limit() {
        let (server, stats) = mk_server(Duration::from_millis(10), |_| StatusCode::OK);
        let layer = PacingLayer::new(Pacing { max_in_flight: 3 });
        let calls = (0..20).map(|i| {
            let svc = layer.layer(server.clone());
            let path = if i % 2 == 0 {
                "/api/v1/namespaces/a/events"
            } else {
                "/apis/loadbalancer.harvesterhci.io/v1beta1/namespaces/a/loadbalancers/x"
            };
            svc.oneshot(mk_request(path))
        });
        let answers = futures::future::join_all(calls).await;
        assert!(answers.iter().all(|a| a.is_ok()));
        assert_eq!(
            stats.requests.load(Ordering::SeqCst),
            20,
            "every request is sent"
        );
        assert_eq!(
            stats.most_in_flight.load(Ordering::SeqCst),
            3,
            "at most 3 at once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_pauses_every_request_for_its_retry_after_but_leases() {
        // The first request is refused with Retry-After: 2; the rest are answered.
        let (server, stats) = mk_server(Duration::from_millis(1), |n| {
            if n == 0 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            }
        });
        let layer = PacingLayer::new(Pacing { max_in_flight: 8 });
        let first = layer
            .layer(server.clone())
            .oneshot(mk_request("/api/v1/namespaces/a/events"))
            .await
            .expect("an answer");
        assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
        let start = Instant::now();
        let lease = layer
            .layer(server.clone())
            .oneshot(mk_request(
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            ))
            .await
            .expect("an answer");
        assert_eq!(lease.status(), StatusCode::OK);
        // Time is tokio's paused clock: it only moves when every task waits, so this is order,
        // not speed.
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "a lease is not held back"
        );
        let next = layer
            .layer(server.clone())
            .oneshot(mk_request("/api/v1/namespaces/a/events"))
            .await
            .expect("an answer");
        assert_eq!(next.status(), StatusCode::OK);
        assert!(
            start.elapsed() >= Duration::from_secs(2),
            "the next request waited for the Retry-After: {:?}",
            start.elapsed()
        );
        assert_eq!(stats.requests.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn retry_after_is_read_and_bounded() {
        let with = |v: Option<&str>| {
            let mut resp = Response::new(());
            if let Some(v) = v {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, v.parse().expect("a value"));
            }
            retry_after(&resp)
        };
        assert_eq!(with(None), DEFAULT_RETRY_AFTER);
        assert_eq!(with(Some("3")), Duration::from_secs(3));
        assert_eq!(with(Some("3600")), MAX_RETRY_AFTER);
        assert_eq!(with(Some("0")), Duration::from_millis(100));
        // An HTTP date is not worth parsing here: the API server sends seconds.
        assert_eq!(
            with(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            DEFAULT_RETRY_AFTER
        );
    }
}
