//! One IPPool reconcile at a time (`lb::ippool::reconcile`): its finalizer, its status, the manual
//! release annotation, and a deletion that waits for the pool's last address.

use harvester_cloud::controller::Action;
use harvester_cloud::{crd::POOL_FINALIZER, ipam::MANUALLY_RELEASE_IP};

use crate::{
    load_balancer::{default_pool, mk_lb},
    world::LbWorld,
};

fn has_finalizer(pool: &harvester_cloud::crd::IPPool) -> bool {
    pool.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == POOL_FINALIZER))
}

#[tokio::test]
async fn a_new_pool_gets_its_finalizer_its_counters_and_ready() {
    let mut w = LbWorld::with_pools([default_pool()]).await;

    assert_eq!(w.reconcile_pool("default").await, Action::await_change());

    let pool = w.pool("default").await;
    assert!(has_finalizer(&pool));
    let status = pool.status.expect("status");
    assert_eq!((status.total, status.available), (3, 3));
    let ready = status
        .conditions
        .iter()
        .find(|c| c.r#type == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "True");
    assert_eq!(w.events(), []);
}

#[tokio::test]
async fn a_pool_being_deleted_waits_for_its_last_address_then_goes() {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.reconcile_pool("default").await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile("default", "lb1").await;

    w.delete_pool("default").await;
    assert_eq!(w.reconcile_pool("default").await, Action::await_change());
    assert!(
        has_finalizer(&w.pool("default").await),
        "it still holds an address"
    );

    w.delete_lb("default", "lb1").await;
    w.reconcile("default", "lb1").await;
    assert_eq!(w.reconcile_pool("default").await, Action::await_change());
    assert!(
        w.pools_api()
            .get("", "default")
            .await
            .expect("reads")
            .is_none(),
        "the pool is gone"
    );
}

#[tokio::test]
async fn a_manual_release_frees_the_address_of_a_load_balancer_that_is_gone_and_drops_the_annotation()
 {
    let mut w = LbWorld::with_pools([default_pool()]).await;
    w.reconcile_pool("default").await;
    // An address held by a load balancer that no longer exists (a crash, a hand edit).
    let mut pool = w.pool("default").await;
    let status = pool.status.as_mut().expect("status");
    status
        .allocated
        .insert("192.168.0.11".into(), "default/gone".into());
    status.available -= 1;
    w.pools_api().replace_status(&pool).await.expect("writes");

    let mut pool = w.pool("default").await;
    pool.metadata.annotations.get_or_insert_default().insert(
        MANUALLY_RELEASE_IP.into(),
        "192.168.0.11: default/gone".into(),
    );
    w.pools_api().replace(&pool).await.expect("annotates");
    w.sync_pools().await;

    assert_eq!(w.reconcile_pool("default").await, Action::await_change());

    let pool = w.pool("default").await;
    let status = pool.status.clone().expect("status");
    assert!(status.allocated.is_empty(), "{:?}", status.allocated);
    assert_eq!(status.available, 3);
    assert!(
        !pool
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(MANUALLY_RELEASE_IP),
        "the annotation is removed"
    );
}

#[tokio::test]
async fn a_manual_release_of_a_load_balancer_that_still_exists_keeps_the_address_and_drops_the_annotation()
 {
    let w = LbWorld::with_pools([default_pool()]).await;
    w.reconcile_pool("default").await;
    w.add_lb(mk_lb("lb1", &[])).await;
    w.reconcile("default", "lb1").await;

    let mut pool = w.pool("default").await;
    pool.metadata.annotations.get_or_insert_default().insert(
        MANUALLY_RELEASE_IP.into(),
        "192.168.0.10: default/lb1".into(),
    );
    w.pools_api().replace(&pool).await.expect("annotates");

    assert_eq!(w.reconcile_pool("default").await, Action::await_change());

    let pool = w.pool("default").await;
    assert_eq!(
        pool.status.clone().expect("status").allocated,
        [("192.168.0.10".to_string(), "default/lb1".to_string())].into()
    );
    assert!(
        !pool
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(MANUALLY_RELEASE_IP)
    );
}
