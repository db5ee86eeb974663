//! What a VM load balancer's health check asks for, as the prober takes it: upstream's
//! `spec.healthCheck` (a TCP probe of a backend port every `periodSeconds`, `timeoutSeconds` each,
//! `successThreshold` successes in a row to be healthy and `failureThreshold` failures to be
//! unhealthy; a zero takes upstream's prober fallback), and beyond upstream an HTTP(S) probe of the
//! same port, asked for with the `healthCheckHTTP*` annotations ([`crate::crd::keys`] says why
//! annotations).
//!
//! The admission webhook fills zero thresholds with 2/2/1 s/1 s before the prober sees them, so its
//! fallbacks (1/3/5 s/3 s) only serve objects written around the webhook.
//!
//! Bounds, beyond upstream (which has none): `periodSeconds` at most [`MAX_PERIOD_SECONDS`] and
//! `timeoutSeconds` at most `periodSeconds`, as cloud load balancers bound their health checks (AWS
//! and GCP: an interval of at most 300 s, a timeout no longer than the interval). The kubelet bounds
//! neither, but runs each container's probes one after another, so a long timeout only delays that
//! container's own probes; here one task probes every load balancer's backends, and a timeout of
//! days held its slots for days. Admission refuses values out of bounds; objects stored before the
//! bounds are clamped here, so the prober never waits longer than that.

use std::{collections::BTreeMap, time::Duration};

use crate::crd::{
    LoadBalancer,
    keys::{
        ANNOTATION_HEALTH_CHECK_HTTP_PATH, ANNOTATION_HEALTH_CHECK_HTTP_SCHEME,
        ANNOTATION_HEALTH_CHECK_HTTP_STATUS,
    },
};

/// Upstream's prober fallbacks for thresholds and durations left at zero.
const FALLBACK_SUCCESS: u32 = 1;
const FALLBACK_FAILURE: u32 = 3;
const FALLBACK_TIMEOUT: Duration = Duration::from_secs(3);
const FALLBACK_PERIOD: Duration = Duration::from_secs(5);
/// The longest `periodSeconds`; `timeoutSeconds` may not exceed `periodSeconds`.
pub(crate) const MAX_PERIOD_SECONDS: u64 = 300;
/// What an HTTP probe accepts unless told otherwise: the kubelet's rule (200 ≤ code < 400).
const DEFAULT_STATUS: StatusRange = StatusRange {
    low: 200,
    high: 399,
};

/// How one backend is probed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// Upstream's: a TCP handshake that is never completed towards the backend's application.
    Tcp,
    /// Ours: `GET <path>`, healthy when the answer's status is expected.
    Http(HttpCheck),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HttpCheck {
    /// HTTPS, without verifying the backend's certificate.
    pub tls: bool,
    /// Path and query, as sent.
    pub path: String,
    /// Status codes that count as healthy.
    pub expect: Vec<StatusRange>,
}

/// An inclusive range of HTTP status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatusRange {
    pub low: u16,
    pub high: u16,
}

impl HttpCheck {
    pub fn accepts(&self, status: u16) -> bool {
        self.expect
            .iter()
            .any(|r| (r.low..=r.high).contains(&status))
    }

    /// The expected statuses as the annotation writes them.
    pub fn expected(&self) -> String {
        let parts: Vec<String> = self
            .expect
            .iter()
            .map(|r| {
                if r.low == r.high {
                    r.low.to_string()
                } else {
                    format!("{}-{}", r.low, r.high)
                }
            })
            .collect();
        parts.join(",")
    }
}

/// The whole health check of one load balancer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProbeSettings {
    pub port: u16,
    pub check: Check,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// A health check the prober cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HealthCheckError {
    #[error("healthcheck port {port} is not a port")]
    Port { port: u64 },
    #[error("annotation {key}: {value:?} is not an absolute path (it must start with \"/\")")]
    Path { key: &'static str, value: String },
    #[error("annotation {key}: {value:?} is neither HTTP nor HTTPS")]
    Scheme { key: &'static str, value: String },
    #[error(
        "annotation {key}: {value:?} is not a list of HTTP status codes and ranges between 100 and 599 (e.g. 200-399 or 200,204)"
    )]
    Status { key: &'static str, value: String },
    #[error("annotation {key} needs {needs} (the path to probe)")]
    NoPath {
        key: &'static str,
        needs: &'static str,
    },
}

/// The health check of `lb`, `None` when it has none (no `healthCheck`, or port 0).
pub fn settings(lb: &LoadBalancer) -> Result<Option<ProbeSettings>, HealthCheckError> {
    let Some(hc) = lb.spec.health_check.as_ref().filter(|hc| hc.port != 0) else {
        return Ok(None);
    };
    let port = u16::try_from(hc.port).map_err(|_| HealthCheckError::Port { port: hc.port })?;
    let count = |v: u64, fallback: u32| {
        if v == 0 {
            fallback
        } else {
            u32::try_from(v).unwrap_or(u32::MAX)
        }
    };
    let seconds = |v: u64, fallback: Duration| {
        if v == 0 {
            fallback
        } else {
            Duration::from_secs(v)
        }
    };
    // Clamped to the bounds admission enforces, for objects stored before them.
    let period =
        seconds(hc.period_seconds, FALLBACK_PERIOD).min(Duration::from_secs(MAX_PERIOD_SECONDS));
    let timeout = seconds(hc.timeout_seconds, FALLBACK_TIMEOUT).min(period);
    Ok(Some(ProbeSettings {
        port,
        check: check_of(lb.metadata.annotations.as_ref())?,
        period,
        timeout,
        success_threshold: count(hc.success_threshold, FALLBACK_SUCCESS),
        failure_threshold: count(hc.failure_threshold, FALLBACK_FAILURE),
    }))
}

/// The probe the annotations ask for: HTTP(S) when the path is set, else upstream's TCP probe.
pub(crate) fn check_of(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Check, HealthCheckError> {
    let get = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let Some(path) = get(ANNOTATION_HEALTH_CHECK_HTTP_PATH) else {
        for key in [
            ANNOTATION_HEALTH_CHECK_HTTP_SCHEME,
            ANNOTATION_HEALTH_CHECK_HTTP_STATUS,
        ] {
            if get(key).is_some() {
                return Err(HealthCheckError::NoPath {
                    key,
                    needs: ANNOTATION_HEALTH_CHECK_HTTP_PATH,
                });
            }
        }
        return Ok(Check::Tcp);
    };
    let path_ok = path.starts_with('/')
        && path
            .parse::<hyper::Uri>()
            .is_ok_and(|u| u.scheme().is_none() && u.authority().is_none());
    if !path_ok {
        return Err(HealthCheckError::Path {
            key: ANNOTATION_HEALTH_CHECK_HTTP_PATH,
            value: path.into(),
        });
    }
    let tls = match get(ANNOTATION_HEALTH_CHECK_HTTP_SCHEME) {
        None => false,
        Some(s) if s.eq_ignore_ascii_case("http") => false,
        Some(s) if s.eq_ignore_ascii_case("https") => true,
        Some(s) => {
            return Err(HealthCheckError::Scheme {
                key: ANNOTATION_HEALTH_CHECK_HTTP_SCHEME,
                value: s.into(),
            });
        }
    };
    let expect = match get(ANNOTATION_HEALTH_CHECK_HTTP_STATUS) {
        None => vec![DEFAULT_STATUS],
        Some(s) => parse_status(s).ok_or_else(|| HealthCheckError::Status {
            key: ANNOTATION_HEALTH_CHECK_HTTP_STATUS,
            value: s.into(),
        })?,
    };
    Ok(Check::Http(HttpCheck {
        tls,
        path: path.into(),
        expect,
    }))
}

/// `200-399`, `200,204`, `200, 300-302`: codes and inclusive ranges between 100 and 599.
fn parse_status(text: &str) -> Option<Vec<StatusRange>> {
    let code = |s: &str| {
        s.trim()
            .parse::<u16>()
            .ok()
            .filter(|c| (100..=599).contains(c))
    };
    text.split(',')
        .map(|part| {
            let (low, high) = match part.split_once('-') {
                Some((a, b)) => (code(a)?, code(b)?),
                None => {
                    let c = code(part)?;
                    (c, c)
                }
            };
            (low <= high).then_some(StatusRange { low, high })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{HealthCheck, LoadBalancerSpec};

    fn mk_lb(hc: Option<HealthCheck>, annotations: &[(&str, &str)]) -> LoadBalancer {
        let mut lb = LoadBalancer::new(
            "lb1",
            LoadBalancerSpec {
                health_check: hc,
                ..Default::default()
            },
        );
        lb.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        lb
    }

    fn mk_hc(port: u64) -> HealthCheck {
        HealthCheck {
            port,
            ..Default::default()
        }
    }

    #[test]
    fn no_port_is_no_health_check_and_zeros_take_upstreams_fallbacks() {
        assert_eq!(settings(&mk_lb(None, &[])), Ok(None));
        assert_eq!(settings(&mk_lb(Some(mk_hc(0)), &[])), Ok(None));
        let s = settings(&mk_lb(Some(mk_hc(8080)), &[]))
            .expect("valid")
            .expect("on");
        assert_eq!(
            s,
            ProbeSettings {
                port: 8080,
                check: Check::Tcp,
                period: Duration::from_secs(5),
                timeout: Duration::from_secs(3),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
        let given = HealthCheck {
            port: 80,
            success_threshold: 2,
            failure_threshold: 4,
            period_seconds: 3,
            timeout_seconds: 2,
        };
        let s = settings(&mk_lb(Some(given), &[]))
            .expect("valid")
            .expect("on");
        assert_eq!(
            (
                s.success_threshold,
                s.failure_threshold,
                s.period,
                s.timeout
            ),
            (2, 4, Duration::from_secs(3), Duration::from_secs(2))
        );
        assert_eq!(
            settings(&mk_lb(Some(mk_hc(70_000)), &[])),
            Err(HealthCheckError::Port { port: 70_000 })
        );
    }

    #[test]
    fn settings_stored_out_of_bounds_are_clamped() {
        let on = |period_seconds, timeout_seconds| {
            let hc = HealthCheck {
                port: 80,
                period_seconds,
                timeout_seconds,
                ..Default::default()
            };
            let s = settings(&mk_lb(Some(hc), &[])).expect("valid").expect("on");
            (s.period.as_secs(), s.timeout.as_secs())
        };
        // The issue's: a timeout of 35 days.
        assert_eq!(on(1, 3_000_000), (1, 1));
        assert_eq!(on(3_000_000, 3_000_000), (300, 300));
        assert_eq!(on(u64::MAX, 10), (300, 10));
        assert_eq!(on(10, 20), (10, 10));
        // Zeros take the fallbacks, and a fallback timeout is no longer than the period either.
        assert_eq!(on(2, 0), (2, 2));
        assert_eq!(on(0, 0), (5, 3));
        assert_eq!(on(300, 300), (300, 300));
    }

    #[test]
    fn annotations_ask_for_http() {
        let http =
            |pairs: &[(&str, &str)]| check_of(mk_lb(None, pairs).metadata.annotations.as_ref());
        assert_eq!(http(&[]), Ok(Check::Tcp));
        let Ok(Check::Http(c)) = http(&[(ANNOTATION_HEALTH_CHECK_HTTP_PATH, "/healthz?full=1")])
        else {
            panic!("an HTTP check");
        };
        assert!(!c.tls);
        assert_eq!(c.path, "/healthz?full=1");
        assert!(c.accepts(200) && c.accepts(399) && !c.accepts(400) && !c.accepts(199));
        assert_eq!(c.expected(), "200-399");
        let Ok(Check::Http(c)) = http(&[
            (ANNOTATION_HEALTH_CHECK_HTTP_PATH, "/"),
            (ANNOTATION_HEALTH_CHECK_HTTP_SCHEME, "https"),
            (ANNOTATION_HEALTH_CHECK_HTTP_STATUS, "200, 204,300-302"),
        ]) else {
            panic!("an HTTPS check");
        };
        assert!(c.tls);
        assert!(c.accepts(204) && c.accepts(301) && !c.accepts(201));
        assert_eq!(c.expected(), "200,204,300-302");
    }

    #[test]
    fn bad_annotations_are_refused_with_the_key() {
        let http =
            |pairs: &[(&str, &str)]| check_of(mk_lb(None, pairs).metadata.annotations.as_ref());
        for path in ["healthz", "http://x/healthz", "/a b"] {
            assert!(
                matches!(
                    http(&[(ANNOTATION_HEALTH_CHECK_HTTP_PATH, path)]),
                    Err(HealthCheckError::Path { .. })
                ),
                "{path}"
            );
        }
        assert!(matches!(
            http(&[
                (ANNOTATION_HEALTH_CHECK_HTTP_PATH, "/"),
                (ANNOTATION_HEALTH_CHECK_HTTP_SCHEME, "gopher")
            ]),
            Err(HealthCheckError::Scheme { .. })
        ));
        for status in ["", "x", "399-200", "99", "600", "200-", "200,,204"] {
            let r = http(&[
                (ANNOTATION_HEALTH_CHECK_HTTP_PATH, "/"),
                (ANNOTATION_HEALTH_CHECK_HTTP_STATUS, status),
            ]);
            // An empty value is as good as none.
            if status.is_empty() {
                assert!(r.is_ok());
            } else {
                assert!(
                    matches!(r, Err(HealthCheckError::Status { .. })),
                    "{status}"
                );
            }
        }
        let e = http(&[(ANNOTATION_HEALTH_CHECK_HTTP_SCHEME, "HTTPS")]).expect_err("no path");
        assert_eq!(
            e.to_string(),
            "annotation loadbalancer.harvesterhci.io/healthCheckHTTPScheme needs loadbalancer.harvesterhci.io/healthCheckHTTPPath (the path to probe)"
        );
    }
}
