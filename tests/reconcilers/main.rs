//! The reconcilers driven directly, without HTTP, a controller or any waiting: the LoadBalancer
//! reconcile and the IPPool reconcile of `lb`, the pool tasks' allocation rounds, and the guest
//! Service reconcile of `guest`, each called once per step on an embedded store whose caches the
//! test fills ([`world`]). Every test sets up the objects, runs one reconcile (or a few, in order)
//! and checks what it left: the stored objects, the Events it recorded and the action it returned.
//! A reconcile bug fails here at once, naming the outcome, where the end-to-end suites
//! (tests/lb_api, tests/guest_lb) would time out waiting for it.
//!
//! One test per outcome and per refusal reason, in the manner of cilium's LB-IPAM tests (objects in,
//! status and Events out). The VM part of a load balancer is covered as far as it needs no VMI.

#[path = "../support/mod.rs"]
#[macro_use]
#[allow(unused_macros)]
mod support;

mod guest_dhcp;
mod guest_service;
mod guest_sharing;
mod ip_pool;
mod lb_sharing;
mod load_balancer;
mod pool_options;
mod pool_round;
mod vm_load_balancer;
mod world;
