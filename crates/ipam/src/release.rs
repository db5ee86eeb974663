//! The manual release of a leaked address: the `loadbalancer.harvesterhci.io/manuallyReleaseIP`
//! annotation on an IPPool, e.g. `"192.168.5.12: default/cluster1-lb-3"`.
//!
//! The address is released only if it is held by exactly that `namespace/name` and that LoadBalancer
//! no longer exists; the reconciler removes the annotation afterwards whatever the outcome.

use std::net::IpAddr;

use super::addr::{key, parse_ip};
use super::allocator::PoolAllocator;

/// The annotation key.
pub const MANUALLY_RELEASE_IP: &str = "loadbalancer.harvesterhci.io/manuallyReleaseIP";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManualReleaseError {
    #[error(
        "invalid {MANUALLY_RELEASE_IP} annotation {value:?}, expected \"<ip>: <namespace>/<name>\""
    )]
    Parse { value: String },
}

/// A parsed annotation value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManualRelease {
    pub ip: IpAddr,
    /// The applicant id `<namespace>/<name>`.
    pub id: String,
}

impl ManualRelease {
    pub fn parse(value: &str) -> Result<Self, ManualReleaseError> {
        let invalid = || ManualReleaseError::Parse {
            value: value.into(),
        };
        // Split at the last colon: IPv6 addresses contain colons, Kubernetes names never do.
        let (ip, id) = value.rsplit_once(':').ok_or_else(invalid)?;
        let ip = parse_ip(ip.trim()).ok_or_else(invalid)?;
        let id = id.trim();
        match id.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ManualRelease { ip, id: id.into() })
            }
            _ => Err(invalid()),
        }
    }

    /// The LoadBalancer to look up before releasing.
    pub fn load_balancer(&self) -> (&str, &str) {
        self.id.split_once('/').unwrap_or(("", &self.id))
    }
}

/// What a manual release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManualReleaseOutcome {
    /// The address went to the history of the id.
    Released,
    /// The LoadBalancer still exists: its finalizer will release the address.
    LoadBalancerExists,
    /// Nobody holds the address.
    NotAllocated,
    /// Someone else holds it.
    HeldByOther { holder: String },
}

impl PoolAllocator {
    /// Applies a manual release; `load_balancer_exists` is whether `request.load_balancer()` exists.
    pub fn manual_release(
        &mut self,
        request: &ManualRelease,
        load_balancer_exists: bool,
    ) -> ManualReleaseOutcome {
        let value = key(request.ip);
        match self.holder(request.ip) {
            None => ManualReleaseOutcome::NotAllocated,
            Some(holder) if holder != request.id => ManualReleaseOutcome::HeldByOther {
                holder: holder.into(),
            },
            Some(_) if load_balancer_exists => ManualReleaseOutcome::LoadBalancerExists,
            Some(_) => {
                self.release_ip(value);
                ManualReleaseOutcome::Released
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RangeSpec;

    fn mk_pool() -> PoolAllocator {
        let ranges = [RangeSpec {
            subnet: "192.168.5.0/24".into(),
            ..RangeSpec::default()
        }];
        PoolAllocator::new("pool", &ranges).expect("valid")
    }

    fn mk_request(value: &str) -> ManualRelease {
        ManualRelease::parse(value).expect("valid annotation")
    }

    #[test]
    fn parses_the_documented_form_and_ipv6() {
        let r = mk_request("192.168.5.12: default/cluster1-lb-3");
        assert_eq!(r.ip.to_string(), "192.168.5.12");
        assert_eq!(r.id, "default/cluster1-lb-3");
        assert_eq!(r.load_balancer(), ("default", "cluster1-lb-3"));
        assert_eq!(mk_request("fd00::5:default/lb").ip.to_string(), "fd00::5");
        for bad in [
            "",
            "192.168.5.12",
            "192.168.5.12: lb",
            "x: default/lb",
            "192.168.5.12: /lb",
            "192.168.5.12: a/b/c",
        ] {
            assert!(
                ManualRelease::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }

    #[test]
    fn releases_only_a_leak_of_that_id() {
        let mut pool = mk_pool();
        let ip = pool
            .allocate("default/cluster1-lb-3")
            .expect("allocates")
            .ip;
        pool.allocate("default/other").expect("allocates");
        let request = mk_request(&format!("{ip}: default/cluster1-lb-3"));

        assert_eq!(
            pool.manual_release(&request, true),
            ManualReleaseOutcome::LoadBalancerExists
        );
        assert_eq!(pool.holder(ip), Some("default/cluster1-lb-3"));

        let wrong = mk_request(&format!("{ip}: default/other"));
        assert_eq!(
            pool.manual_release(&wrong, false),
            ManualReleaseOutcome::HeldByOther {
                holder: "default/cluster1-lb-3".into()
            }
        );

        assert_eq!(
            pool.manual_release(&request, false),
            ManualReleaseOutcome::Released
        );
        assert_eq!(pool.holder(ip), None);
        assert_eq!(pool.history_of("default/cluster1-lb-3"), vec![ip]);
        assert_eq!(pool.available(), 252);
        assert_eq!(
            pool.manual_release(&request, false),
            ManualReleaseOutcome::NotAllocated
        );
    }
}
