//! The per-pool allocation service (`lb::pools::Pools`), one call or one round at a time: what
//! each operation answers, what it leaves in the pool's status, and whom it wakes.

use std::{net::IpAddr, sync::Arc};

use harvester_cloud::{
    controller::events::{self, Recorded, Recorder},
    crd::{IPPool, LoadBalancer, pool_api},
    lb::pools::{PoolOp, PoolOpError, PoolReply, Pools, Want},
    store::{Api, ObjectStore, Preconditions},
};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    support::lb::{global, mk_pool, range},
    world::{Reported, open_store, typed, warning},
};

/// The pool tasks on a store, and what they report.
struct PoolWorld {
    _dir: tempfile::TempDir,
    store: Arc<dyn ObjectStore>,
    pools: Pools,
    events: mpsc::Receiver<Recorded>,
    woken: mpsc::UnboundedReceiver<ObjectRef<LoadBalancer>>,
    stop: CancellationToken,
}

impl Drop for PoolWorld {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PoolWorld {
    async fn with(pool: Value) -> Self {
        let (dir, store) = open_store().await;
        let (recorder, events) = Recorder::capture(events::COMPONENT, "test");
        let (wake, woken) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let pools = Pools::new(store.clone(), wake, recorder, stop.clone());
        let world = PoolWorld {
            _dir: dir,
            store,
            pools,
            events,
            woken,
            stop,
        };
        world
            .api()
            .create(&typed(pool))
            .await
            .expect("creates the pool");
        world
    }

    fn api(&self) -> Api<IPPool> {
        pool_api(self.store.clone())
    }

    async fn pool(&self, name: &str) -> IPPool {
        self.api()
            .get("", name)
            .await
            .expect("reads")
            .expect("the pool exists")
    }

    async fn call(&self, pool: &str, op: PoolOp) -> Result<PoolReply, PoolOpError> {
        self.pools.call(pool, op).await
    }

    /// The address `lb` gets from `pool` (the call must succeed).
    async fn allocate(&self, pool: &str, lb: &str, want: Want) -> IpAddr {
        match self.call(pool, allocate(lb, want)).await {
            Ok(PoolReply::Allocated(a)) => a.ip,
            other => panic!("allocation for {lb}: {other:?}"),
        }
    }

    fn events(&mut self) -> Vec<Reported> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(warning(
                e.involved_object.name.as_deref().unwrap_or_default(),
                e.reason.as_deref().unwrap_or_default(),
                e.message.as_deref().unwrap_or_default(),
            ));
            assert_eq!(e.type_.as_deref(), Some("Warning"));
        }
        out
    }

    fn woken(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(r) = self.woken.try_recv() {
            out.push(format!("{}/{}", r.namespace.unwrap_or_default(), r.name));
        }
        out.sort();
        out
    }
}

fn allocate(lb: &str, want: Want) -> PoolOp {
    let (ns, name) = lb.split_once('/').expect("namespace/name");
    PoolOp::Allocate {
        id: lb.into(),
        want,
        waiter: ObjectRef::new(name).within(ns),
    }
}

fn release(lb: &str) -> PoolOp {
    PoolOp::Release { id: lb.into() }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

/// .10 to .12.
fn three() -> Value {
    mk_pool(
        "p",
        range("192.168.0.0/24", "192.168.0.10", "192.168.0.12"),
        global(),
    )
}

/// .10 only.
fn one() -> Value {
    mk_pool(
        "p",
        range("192.168.0.0/24", "192.168.0.10", "192.168.0.10"),
        global(),
    )
}

fn held(pool: &IPPool) -> Vec<(String, String)> {
    pool.status
        .as_ref()
        .map(|s| s.allocated.clone().into_iter().collect())
        .unwrap_or_default()
}

fn history(pool: &IPPool) -> Vec<(String, String)> {
    pool.status
        .as_ref()
        .map(|s| s.allocated_history.clone().into_iter().collect())
        .unwrap_or_default()
}

fn version(pool: &IPPool) -> u64 {
    pool.metadata
        .resource_version
        .as_deref()
        .expect("a resourceVersion")
        .parse()
        .expect("a number")
}

fn pair(ip: &str, lb: &str) -> (String, String) {
    (ip.to_string(), lb.to_string())
}

#[tokio::test]
async fn an_allocation_takes_a_free_address_and_is_durable_in_the_status_when_answered() {
    let w = PoolWorld::with(three()).await;

    let reply = w.call("p", allocate("default/a", Want::Any(None))).await;

    let Ok(PoolReply::Allocated(a)) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(a.ip, ip("192.168.0.10"));
    assert_eq!(a.mask, ip("255.255.255.0"));
    let pool = w.pool("p").await;
    assert_eq!(held(&pool), [pair("192.168.0.10", "default/a")]);
    let status = pool.status.expect("status");
    assert_eq!((status.total, status.available), (3, 2));
    assert_eq!(status.last_allocated, "192.168.0.10");
}

#[tokio::test]
async fn allocating_again_for_the_same_holder_answers_its_address_without_a_write() {
    let w = PoolWorld::with(three()).await;
    let first = w.allocate("p", "default/a", Want::Any(None)).await;
    let before = version(&w.pool("p").await);

    let again = w.allocate("p", "default/a", Want::Any(None)).await;

    assert_eq!(again, first);
    assert_eq!(version(&w.pool("p").await), before);
}

#[tokio::test]
async fn an_exact_free_address_is_allocated() {
    let w = PoolWorld::with(three()).await;
    assert_eq!(
        w.allocate("p", "default/a", Want::Exactly(ip("192.168.0.12")))
            .await,
        ip("192.168.0.12")
    );
    assert_eq!(
        held(&w.pool("p").await),
        [pair("192.168.0.12", "default/a")]
    );
}

#[tokio::test]
async fn an_exact_address_held_by_another_fails_naming_the_holder_and_its_release_wakes_the_waiter()
{
    let mut w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Exactly(ip("192.168.0.11")))
        .await;

    let reply = w
        .call(
            "p",
            allocate("default/b", Want::Exactly(ip("192.168.0.11"))),
        )
        .await;
    let Err(e) = reply else { panic!("{reply:?}") };
    assert_eq!(e.holder(), Some("default/a"));
    assert_eq!(w.woken(), Vec::<String>::new());

    w.call("p", release("default/a")).await.expect("releases");
    assert_eq!(w.woken(), ["default/b"]);
}

#[tokio::test]
async fn a_full_pool_fails_exhausted_and_its_next_release_wakes_the_waiter() {
    let mut w = PoolWorld::with(one()).await;
    w.allocate("p", "default/a", Want::Any(None)).await;

    let reply = w.call("p", allocate("default/b", Want::Any(None))).await;
    let Err(e) = reply else { panic!("{reply:?}") };
    assert!(e.is_exhausted(), "{e}");
    assert_eq!(
        e.to_string(),
        "fail to get ip from pool p, error: no IP addresses available in range set: 192.168.0.10-192.168.0.10"
    );

    w.call("p", release("default/a")).await.expect("releases");
    assert_eq!(w.woken(), ["default/b"]);
    assert_eq!(
        w.allocate("p", "default/b", Want::Any(None)).await,
        ip("192.168.0.10")
    );
}

#[tokio::test]
async fn a_release_moves_the_address_to_the_history() {
    let w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Any(None)).await;

    let reply = w.call("p", release("default/a")).await;

    let Ok(PoolReply::Released(ips)) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(ips, [ip("192.168.0.10")]);
    let pool = w.pool("p").await;
    assert!(held(&pool).is_empty());
    assert_eq!(history(&pool), [pair("192.168.0.10", "default/a")]);
    assert_eq!(pool.status.expect("status").available, 3);
}

#[tokio::test]
async fn a_released_holder_gets_its_old_address_back() {
    let w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Exactly(ip("192.168.0.12")))
        .await;
    w.call("p", release("default/a")).await.expect("releases");

    assert_eq!(
        w.allocate("p", "default/a", Want::Any(None)).await,
        ip("192.168.0.12")
    );
}

#[tokio::test]
async fn releasing_for_a_holder_of_nothing_releases_nothing_and_writes_nothing() {
    let mut w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Any(None)).await;
    let before = version(&w.pool("p").await);

    let reply = w.call("p", release("default/nobody")).await;

    let Ok(PoolReply::Released(ips)) = reply else {
        panic!("{reply:?}")
    };
    assert!(ips.is_empty());
    assert_eq!(version(&w.pool("p").await), before);
    assert_eq!(w.woken(), Vec::<String>::new());
}

#[tokio::test]
async fn a_pool_the_store_does_not_have_fails_missing() {
    let w = PoolWorld::with(three()).await;
    let reply = w.call("nope", allocate("default/a", Want::Any(None))).await;
    assert!(
        matches!(&reply, Err(PoolOpError::Missing { pool }) if pool == "nope"),
        "{reply:?}"
    );
    assert_eq!(
        reply.expect_err("missing").to_string(),
        "fail to get allocator nope"
    );
}

#[tokio::test]
async fn a_pool_being_deleted_keeps_serving_its_holders_and_refuses_newcomers() {
    let mut pool = three();
    pool["metadata"]["finalizers"] = json!(["test/keep"]);
    let w = PoolWorld::with(pool).await;
    let held_ip = w.allocate("p", "default/a", Want::Any(None)).await;
    w.api()
        .delete("", "p", &Preconditions::default())
        .await
        .expect("deletes the pool");
    // A sync reads the pool afresh: that is how the deletion reaches its task.
    w.call(
        "p",
        PoolOp::Sync {
            manual_release: None,
        },
    )
    .await
    .expect("syncs");

    assert_eq!(w.allocate("p", "default/a", Want::Any(None)).await, held_ip);
    let reply = w.call("p", allocate("default/b", Want::Any(None))).await;
    assert!(
        matches!(&reply, Err(PoolOpError::Deleting { pool }) if pool == "p"),
        "{reply:?}"
    );
}

#[tokio::test]
async fn finalizing_answers_how_many_addresses_the_pool_still_holds() {
    let w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Any(None)).await;
    w.allocate("p", "default/b", Want::Any(None)).await;

    let reply = w.call("p", PoolOp::Finalize).await;
    assert!(matches!(reply, Ok(PoolReply::NotEmpty(2))), "{reply:?}");

    w.call("p", release("default/a")).await.expect("releases");
    w.call("p", release("default/b")).await.expect("releases");
    let reply = w.call("p", PoolOp::Finalize).await;
    assert!(matches!(reply, Ok(PoolReply::Empty)), "{reply:?}");
}

#[tokio::test]
async fn a_sync_counts_the_addresses_and_sets_ready() {
    let w = PoolWorld::with(three()).await;

    let reply = w
        .call(
            "p",
            PoolOp::Sync {
                manual_release: None,
            },
        )
        .await;

    assert!(
        matches!(
            reply,
            Ok(PoolReply::Synced {
                total: 3,
                available: 3,
                manual: None
            })
        ),
        "{reply:?}"
    );
    let status = w.pool("p").await.status.expect("status");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        ("True", "")
    );
    assert_eq!((status.total, status.available), (3, 3));
}

#[tokio::test]
async fn a_sync_of_ranges_that_do_not_parse_sets_ready_false_with_the_reason_and_allocations_fail()
{
    let w = PoolWorld::with(mk_pool(
        "p",
        range("192.168.0.0/24", "192.168.1.10", "192.168.1.12"),
        global(),
    ))
    .await;

    w.call(
        "p",
        PoolOp::Sync {
            manual_release: None,
        },
    )
    .await
    .expect("syncs");

    let status = w.pool("p").await.status.expect("status");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.message.as_str()),
        (
            "False",
            "invalid ranges for IP pool p: invalid range start 192.168.1.10: IP 192.168.1.10 is out of subnet 192.168.0.0/24"
        )
    );
    let reply = w.call("p", allocate("default/a", Want::Any(None))).await;
    assert!(matches!(&reply, Err(PoolOpError::Pool(_))), "{reply:?}");
}

#[tokio::test]
async fn requests_that_arrive_together_are_applied_in_one_round_with_one_status_write() {
    let w = PoolWorld::with(three()).await;
    let before = version(&w.pool("p").await);

    let (a, b, c) = tokio::join!(
        w.allocate("p", "default/a", Want::Any(None)),
        w.allocate("p", "default/b", Want::Any(None)),
        w.allocate("p", "default/c", Want::Any(None)),
    );

    assert_eq!(
        [a, b, c],
        [ip("192.168.0.10"), ip("192.168.0.11"), ip("192.168.0.12")]
    );
    let pool = w.pool("p").await;
    assert_eq!(version(&pool), before + 1, "one write for the round");
    assert_eq!(held(&pool).len(), 3);
}

#[tokio::test]
async fn a_status_changed_behind_the_task_s_back_is_read_again_and_nothing_is_given_twice() {
    let w = PoolWorld::with(three()).await;
    w.allocate("p", "default/a", Want::Any(None)).await;
    // Another writer (a replica, a hand edit) gives .11 away.
    let mut pool = w.pool("p").await;
    let status = pool.status.as_mut().expect("status");
    status
        .allocated
        .insert("192.168.0.11".into(), "default/elsewhere".into());
    status.available -= 1;
    w.api().replace_status(&pool).await.expect("writes");

    let b = w.allocate("p", "default/b", Want::Any(None)).await;

    assert_eq!(b, ip("192.168.0.12"));
    assert_eq!(
        held(&w.pool("p").await),
        [
            pair("192.168.0.10", "default/a"),
            pair("192.168.0.11", "default/elsewhere"),
            pair("192.168.0.12", "default/b"),
        ]
    );
}

#[tokio::test]
async fn a_pool_that_fills_to_90_percent_warns_once() {
    let mut w = PoolWorld::with(one()).await;

    w.allocate("p", "default/a", Want::Any(None)).await;
    assert_eq!(
        w.events(),
        [warning(
            "p",
            "PoolNearlyFull",
            "IP pool p is 100% used: 1 of 1 addresses allocated, 0 available"
        )]
    );

    // Still full: no second warning; emptied and full again: a new one.
    w.allocate("p", "default/a", Want::Any(None)).await;
    assert_eq!(w.events(), []);
    w.call("p", release("default/a")).await.expect("releases");
    w.allocate("p", "default/b", Want::Any(None)).await;
    assert_eq!(w.events().len(), 1);
}
