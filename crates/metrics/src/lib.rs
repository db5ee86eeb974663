//! Prometheus metrics: one process-wide registry, the functions that record into it, and the
//! Prometheus text (0.0.4) encoding that the separate metrics listener (the binary's `http::metrics_listener`) serves at
//! `/metrics` (never on the API port).
//!
//! The registry is a process-wide static, like Prometheus metrics themselves: recording needs no
//! handle threaded through `AppState` or the reconcilers. Every family is registered up front; the
//! Prometheus text format lists a labelled family once it has its first series. All names start with
//! `harvester_cloud_`. Label values come from small fixed sets (route templates, reasons, pools);
//! a raw path, a token or a query value never becomes a label.
//!
//! What records what:
//!
//! | Metric | Labels | Recorded by |
//! |---|---|---|
//! | `http_requests_total` | `method`, `route`, `status` | [`observe_http`] (HTTP middleware) |
//! | `http_request_duration_seconds` (histogram) | `method`, `route`, `status` | [`observe_http`] |
//! | `cloud_config_issued_total` | `operation` (`create`, `get`, `rotate`), `output` (`kubeconfig`, `cloud-init`) | [`cloud_config_issued`] (HTTP handlers) |
//! | `kubeconfig_tokens_total` | `event` (`issued`, `rotated`, `expired`, `retired`, `abandoned`) | [`kubeconfig_token`] (the cloud-config service and its sweeper) |
//! | `cloud_config_failures_total` | `operation`, `reason` | [`cloud_config_failed`] (HTTP handlers) |
//! | `auth_failures_total` | `reason` ([`crate::auth::AuthError::reason`]) | [`auth_failed`] (`Admin` extractor) |
//! | `watch_relists_total` | `kind` (the kinds the reconcilers watch) | [`watch_relisted`] (store watchers, after a `Gone`) |
//! | `ippool_total_addresses`, `ippool_available_addresses`, `ippool_allocated_addresses` | `pool` | [`set_pool_addresses`], [`remove_pool`] (IPPool reconciler) |
//! | `ippool_usage_ratio` | `pool` | [`set_pool_addresses`]: allocated ÷ total, 0 to 1 (alert on `>= 0.9`, the level at which the pool also gets a Warning Event) |
//! | `reconcile_duration_seconds` (histogram) | `controller` | [`observe_reconcile`] (reconcilers) |
//! | `reconcile_errors_total` | `controller`, `reason` | [`observe_reconcile`] |
//! | `leader` | none | [`set_leader`] (leader election: 1 while this replica holds the Lease) |
//! | `guest_clusters` | none | [`set_guest_clusters`] (embedded backend: guest clusters with a running reconciler) |
//! | `tunnel_connected` | none | [`set_tunnel_connected`] (Rancher aggregation tunnel: 1 while a session is up) |
//! | `tunnel_failures_total` | none | [`tunnel_failed`] (failed dials and sessions that ended in an error) |
//! | `tunnel_connections_total` | none | [`tunnel_connection`] (connections Rancher opened through the tunnel) |
//! | `http_connections_refused_total` | `reason` (`at_capacity`, `handshake_timeout`, `no_request`) | [`http_connection_refused`] (listeners) |
//! | `lb_probes_total` | `result` (`success`, `failure`) | [`probe_done`] (VM load balancers' prober) |
//! | `lb_probe_targets` | none | [`set_probe_targets`] (backends the prober probes) |
//! | `kubeconfig_accounts_cleaned_up_total` | none | [`accounts_cleaned_up`] (guest-cluster cleanup: accounts of a removed guest cluster revoked) |
//! | `events_dropped_total` | `reason` (the Event's reason, a fixed set) | [`event_dropped`] (the Event recorder, when its queue is full or its writers have stopped; not failed writes) |
//! | `events_queued` | none | [`events_queued`] (the Event recorders' backlog: recorded, not yet written, failed or dropped) |
//! | `build_info` | `version` | always 1 |
#![forbid(unsafe_code)]

use std::{
    sync::{LazyLock, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    encoding::{EncodeLabelSet, prometheus_text},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// Seconds. Requests answer in milliseconds, a POST waits for an fsync (tens of ms), and a token can
/// take up to `--token-timeout` (30 s by default).
const HTTP_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Seconds. A reconcile is a few store round trips, or an API request or two on Kubernetes.
const RECONCILE_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IssuedLabels {
    operation: &'static str,
    output: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    operation: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerErrorLabels {
    controller: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
/// Address counts can exceed `i64` (an IPv6 /64 pool), so pool gauges hold an `f64`.
type FloatGauge = Gauge<f64, AtomicU64>;

struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: HistogramFamily<HttpLabels>,
    cloud_config_issued: Family<IssuedLabels, Counter>,
    kubeconfig_tokens: Family<EventLabels, Counter>,
    cloud_config_failures: Family<FailureLabels, Counter>,
    auth_failures: Family<ReasonLabels, Counter>,
    watch_relists: Family<KindLabels, Counter>,
    pool_total: Family<PoolLabels, FloatGauge>,
    pool_available: Family<PoolLabels, FloatGauge>,
    pool_allocated: Family<PoolLabels, FloatGauge>,
    pool_usage: Family<PoolLabels, FloatGauge>,
    reconcile_duration: HistogramFamily<ControllerLabels>,
    reconcile_errors: Family<ControllerErrorLabels, Counter>,
    leader: Gauge,
    guest_clusters: Gauge,
    tunnel_connected: Gauge,
    tunnel_failures: Counter,
    tunnel_connections: Counter,
    connections_refused: Family<ReasonLabels, Counter>,
    probes: Family<ResultLabels, Counter>,
    probe_targets: Gauge,
    accounts_cleaned_up: Counter,
    events_dropped: Family<ReasonLabels, Counter>,
    events_queued: Gauge,
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("harvester_cloud");
        let m = Metrics {
            registry: Registry::default(),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(|| Histogram::new(HTTP_BUCKETS)),
            cloud_config_issued: Family::default(),
            kubeconfig_tokens: Family::default(),
            cloud_config_failures: Family::default(),
            auth_failures: Family::default(),
            watch_relists: Family::default(),
            pool_total: Family::default(),
            pool_available: Family::default(),
            pool_allocated: Family::default(),
            pool_usage: Family::default(),
            reconcile_duration: Family::new_with_constructor(|| Histogram::new(RECONCILE_BUCKETS)),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
            guest_clusters: Gauge::default(),
            tunnel_connected: Gauge::default(),
            tunnel_failures: Counter::default(),
            tunnel_connections: Counter::default(),
            connections_refused: Family::default(),
            probes: Family::default(),
            probe_targets: Gauge::default(),
            accounts_cleaned_up: Counter::default(),
            events_dropped: Family::default(),
            events_queued: Gauge::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status",
            m.http_requests.clone(),
        );
        registry.register_with_unit(
            "http_request_duration",
            "Time to answer an HTTP request (to its response head), by method, route template and status",
            Unit::Seconds,
            m.http_duration.clone(),
        );
        registry.register(
            "cloud_config_issued",
            "Cloud-configs returned, by operation (create: POST, get: GET, rotate) and output format",
            m.cloud_config_issued.clone(),
        );
        registry.register(
            "kubeconfig_tokens",
            "Cloud-config tokens issued, rotated, expired (at their expirationSeconds) and retired (at the end of a rotation's grace)",
            m.kubeconfig_tokens.clone(),
        );
        registry.register(
            "cloud_config_failures",
            "Cloud-config requests that failed after authentication, by operation and reason",
            m.cloud_config_failures.clone(),
        );
        registry.register(
            "auth_failures",
            "Requests refused by authentication, by reason",
            m.auth_failures.clone(),
        );
        registry.register(
            "watch_relists",
            "Lists a watcher made again because its watch position was gone (it fell behind the changes the store retains), by kind",
            m.watch_relists.clone(),
        );
        registry.register(
            "ippool_total_addresses",
            "Addresses an IPPool's ranges hold, by pool",
            m.pool_total.clone(),
        );
        registry.register(
            "ippool_available_addresses",
            "Addresses an IPPool can still allocate, by pool",
            m.pool_available.clone(),
        );
        registry.register(
            "ippool_allocated_addresses",
            "Addresses an IPPool has allocated, by pool",
            m.pool_allocated.clone(),
        );
        registry.register(
            "ippool_usage_ratio",
            "Share of an IPPool's addresses allocated (0 to 1), by pool; at 0.9 or more the pool gets a Warning Event",
            m.pool_usage.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took, by controller",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and reason",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and runs the reconcilers, else 0",
            m.leader.clone(),
        );
        registry.register(
            "guest_clusters",
            "Guest clusters of the embedded store whose reconciler runs (from their first Service until they have nothing left)",
            m.guest_clusters.clone(),
        );
        registry.register(
            "tunnel_connected",
            "1 while the Rancher aggregation tunnel has a session up, else 0",
            m.tunnel_connected.clone(),
        );
        registry.register(
            "tunnel_failures",
            "Rancher aggregation tunnel dials that failed and sessions that ended in an error",
            m.tunnel_failures.clone(),
        );
        registry.register(
            "tunnel_connections",
            "Connections Rancher opened through the aggregation tunnel",
            m.tunnel_connections.clone(),
        );
        registry.register(
            "http_connections_refused",
            "Connections a listener limited: paused at the connection limit, TLS handshakes that timed out, connections closed without a request",
            m.connections_refused.clone(),
        );
        registry.register(
            "lb_probes",
            "Health probes of VM load balancers' backends, by result",
            m.probes.clone(),
        );
        registry.register(
            "lb_probe_targets",
            "Backends of VM load balancers the prober probes",
            m.probe_targets.clone(),
        );
        registry.register(
            "kubeconfig_accounts_cleaned_up",
            "Cloud-config accounts revoked because Rancher removed their guest cluster",
            m.accounts_cleaned_up.clone(),
        );
        registry.register(
            "events_dropped",
            "Kubernetes Events the reconcilers recorded but dropped unwritten: their queue was full (a burst), or their writers had stopped (failed writes, and Events still queued 5 s after a stop, are logged, not counted)",
            m.events_dropped.clone(),
        );
        registry.register(
            "events_queued",
            "Kubernetes Events the reconcilers recorded that are not yet written: queued, or being written (a write that fails, or an Event given up at a stop, leaves it)",
            m.events_queued.clone(),
        );
        let build_info = Family::<VersionLabels, Gauge>::default();
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "build_info",
            "Always 1; the version label says which build runs",
            build_info,
        );
        Metrics { registry, ..m }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Every metric in the Prometheus text format, version 0.0.4.
pub fn encode() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail, and every label value is a plain string or number.
    if let Err(e) = prometheus_text::encode(&mut out, &METRICS.registry) {
        tracing::error!(error = %e, "cannot encode metrics");
    }
    out
}

/// A method label from a small fixed set, so that made-up methods cannot grow the label space.
fn method_label(method: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE",
    ];
    KNOWN
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or("other")
}

/// One answered HTTP request. `route` is the matched route template (`None` when no route matched).
pub fn observe_http(method: &str, route: Option<&str>, status: u16, elapsed: Duration) {
    let labels = HttpLabels {
        method: method_label(method),
        route: route.unwrap_or("unmatched").to_string(),
        status,
    };
    METRICS.http_requests.get_or_create(&labels).inc();
    METRICS
        .http_duration
        .get_or_create(&labels)
        .observe(elapsed.as_secs_f64());
}

/// A cloud-config returned: `operation` is `create` (POST) or `get` (GET), `output` is
/// `kubeconfig` or `cloud-init`.
pub fn cloud_config_issued(operation: &'static str, output: &'static str) {
    METRICS
        .cloud_config_issued
        .get_or_create(&IssuedLabels { operation, output })
        .inc();
}

/// A cloud-config token's life: `issued` (a token Secret made, by POST or a rotation), `rotated`
/// (a rotation done), `expired` (deleted at its `expirationSeconds`), `retired` (a replaced token
/// deleted at the end of its grace).
pub fn kubeconfig_token(event: &'static str) {
    METRICS
        .kubeconfig_tokens
        .get_or_create(&EventLabels { event })
        .inc();
}

/// A cloud-config request that failed after authentication, with a short reason label.
pub fn cloud_config_failed(operation: &'static str, reason: &'static str) {
    METRICS
        .cloud_config_failures
        .get_or_create(&FailureLabels { operation, reason })
        .inc();
}

/// One cloud-config account revoked because Rancher removed its guest cluster.
pub fn accounts_cleaned_up() {
    METRICS.accounts_cleaned_up.inc();
}

/// One Event of `reason` (one of the recorder's fixed reasons) recorded but not written.
pub fn event_dropped(reason: &'static str) {
    METRICS
        .events_dropped
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// The Event recorders' backlog grew (`delta` > 0: recorded) or shrank (written, failed, or given
/// up at a stop).
pub fn events_queued(delta: i64) {
    METRICS.events_queued.inc_by(delta);
}

/// A request refused by authentication; `reason` is [`crate::auth::AuthError::reason`].
pub fn auth_failed(reason: &'static str) {
    METRICS
        .auth_failures
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// A watcher of `kind` lists again: its watch position was gone.
pub fn watch_relisted(kind: &str) {
    METRICS
        .watch_relists
        .get_or_create(&KindLabels {
            kind: kind.to_string(),
        })
        .inc();
}

/// The address counts of one IPPool, as its status reports them. Call after each reconcile of the
/// pool; call [`remove_pool`] when the pool is deleted.
pub fn set_pool_addresses(pool: &str, total: f64, available: f64, allocated: f64) {
    let labels = PoolLabels { pool: pool.into() };
    METRICS.pool_total.get_or_create(&labels).set(total);
    METRICS.pool_available.get_or_create(&labels).set(available);
    METRICS.pool_allocated.get_or_create(&labels).set(allocated);
    let usage = if total > 0.0 { allocated / total } else { 0.0 };
    METRICS.pool_usage.get_or_create(&labels).set(usage);
}

/// Forgets a deleted IPPool, so its series end instead of repeating the last value.
pub fn remove_pool(pool: &str) {
    let labels = PoolLabels { pool: pool.into() };
    METRICS.pool_total.remove(&labels);
    METRICS.pool_available.remove(&labels);
    METRICS.pool_allocated.remove(&labels);
    METRICS.pool_usage.remove(&labels);
}

/// One reconcile of `controller` (e.g. `loadbalancer`, `ippool`) that took `elapsed`; `error` is a
/// short reason label when it failed (e.g. the error enum variant), `None` when it succeeded.
pub fn observe_reconcile(controller: &'static str, elapsed: Duration, error: Option<&'static str>) {
    METRICS
        .reconcile_duration
        .get_or_create(&ControllerLabels { controller })
        .observe(elapsed.as_secs_f64());
    if let Some(reason) = error {
        METRICS
            .reconcile_errors
            .get_or_create(&ControllerErrorLabels { controller, reason })
            .inc();
    }
}

/// Whether this replica holds the leader Lease (and so runs the reconcilers).
pub fn set_leader(is_leader: bool) {
    METRICS.leader.set(i64::from(is_leader));
}

/// How many guest clusters of the embedded store have a running reconciler.
pub fn set_guest_clusters(count: usize) {
    METRICS
        .guest_clusters
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// A listener limited a connection (`reason` from a fixed set).
pub fn http_connection_refused(reason: &'static str) {
    METRICS
        .connections_refused
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// Whether the Rancher aggregation tunnel has a session up.
pub fn set_tunnel_connected(up: bool) {
    METRICS.tunnel_connected.set(i64::from(up));
}

/// A tunnel dial failed, or a session ended in an error.
pub fn tunnel_failed() {
    METRICS.tunnel_failures.inc();
}

/// Rancher opened a connection through the tunnel.
/// One health probe of a VM load balancer's backend finished.
pub fn probe_done(ok: bool) {
    METRICS
        .probes
        .get_or_create(&ResultLabels {
            result: if ok { "success" } else { "failure" },
        })
        .inc();
}

/// How many backends the prober probes.
pub fn set_probe_targets(count: usize) {
    METRICS
        .probe_targets
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

pub fn tunnel_connection() {
    METRICS.tunnel_connections.inc();
}

/// The current value of a counter or gauge sample, read back from [`encode`]'s output; for tests.
pub fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name_and_labels)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_value(name_and_labels: &str) -> f64 {
        sample(&encode(), name_and_labels).unwrap_or(0.0)
    }

    #[test]
    fn every_family_is_registered_with_its_prometheus_name() {
        observe_http("GET", Some("/unit"), 200, Duration::from_millis(1));
        cloud_config_issued("create", "kubeconfig");
        cloud_config_failed("get", "not_found");
        auth_failed("invalid");
        set_pool_addresses("unit-names", 4.0, 3.0, 1.0);
        observe_reconcile("unit-names", Duration::from_millis(1), Some("unit"));
        event_dropped("UnitNames");
        let text = encode();
        for name in [
            "harvester_cloud_http_requests_total",
            "harvester_cloud_http_request_duration_seconds",
            "harvester_cloud_cloud_config_issued_total",
            "harvester_cloud_cloud_config_failures_total",
            "harvester_cloud_auth_failures_total",
            "harvester_cloud_ippool_total_addresses",
            "harvester_cloud_ippool_available_addresses",
            "harvester_cloud_ippool_allocated_addresses",
            "harvester_cloud_reconcile_duration_seconds",
            "harvester_cloud_reconcile_errors_total",
            "harvester_cloud_events_dropped_total",
            "harvester_cloud_events_queued",
            "harvester_cloud_leader",
            "harvester_cloud_guest_clusters",
            "harvester_cloud_build_info",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}:\n{text}");
        }
        assert!(!text.contains("# EOF"), "Prometheus text, not OpenMetrics");
    }

    #[test]
    fn http_requests_are_counted_by_route_template() {
        let key =
            r#"harvester_cloud_http_requests_total{method="GET",route="/unit/{id}",status="200"}"#;
        let before = mk_value(key);
        observe_http("GET", Some("/unit/{id}"), 200, Duration::from_millis(3));
        observe_http("BREW", None, 404, Duration::from_millis(1));
        assert_eq!(mk_value(key), before + 1.0);
        let text = encode();
        assert!(text.contains(r#"method="other",route="unmatched",status="404""#));
        assert!(
            text.contains(
                r#"harvester_cloud_http_request_duration_seconds_bucket{method="GET",route="/unit/{id}",status="200",le="0.005"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn pools_reconciles_and_leadership() {
        set_pool_addresses("unit-pool", 2f64.powi(64), 2f64.powi(64) - 3.0, 3.0);
        assert_eq!(
            mk_value(r#"harvester_cloud_ippool_allocated_addresses{pool="unit-pool"}"#),
            3.0
        );
        assert_eq!(
            mk_value(r#"harvester_cloud_ippool_total_addresses{pool="unit-pool"}"#),
            2f64.powi(64)
        );
        remove_pool("unit-pool");
        assert!(!encode().contains("unit-pool"));

        let key = r#"harvester_cloud_reconcile_errors_total{controller="unit",reason="conflict"}"#;
        let before = mk_value(key);
        observe_reconcile("unit", Duration::from_millis(2), None);
        observe_reconcile("unit", Duration::from_millis(2), Some("conflict"));
        assert_eq!(mk_value(key), before + 1.0);
        assert!(
            mk_value(r#"harvester_cloud_reconcile_duration_seconds_count{controller="unit"}"#)
                >= 2.0
        );

        set_leader(true);
        assert_eq!(mk_value("harvester_cloud_leader"), 1.0);
        set_leader(false);
        assert_eq!(mk_value("harvester_cloud_leader"), 0.0);
    }
}
