use super::*;
use harvester_cloud::controller::leader::{LeaseElector, LeaseTiming};

fn replica(
    store: Arc<dyn ObjectStore>,
    identity: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let timing = LeaseTiming {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(800),
        retry_period: Duration::from_millis(100),
    };
    let elector = LeaseElector::new(
        store.clone(),
        "harvester-system",
        "harvester-cloud-lb",
        identity,
        timing,
    );
    let settings = lb::Settings {
        concurrency: 32,
        identity: identity.into(),
        ..lb::Settings::default()
    };
    let task = tokio::spawn(lb::run(store, settings, Arc::new(elector), stop.clone()));
    (stop, task)
}

async fn reporters<B: Backend>(b: &B) -> Vec<String> {
    let mut who: Vec<String> = Api::<Event>::new(b.store())
        .list(None, &LabelSelector::everything())
        .await
        .expect("lists events")
        .into_iter()
        // The API server's own controllers report Events too (its Service IP repair).
        .filter(|e| e.reporting_component.as_deref() == Some("harvester-cloud-lb"))
        .filter_map(|e| e.reporting_instance)
        .collect();
    who.sort();
    who.dedup();
    who
}

/// Two replicas on one store: only the Lease holder reconciles; when it dies without releasing
/// the Lease, the other takes over after the Lease expires, and nothing is assigned twice.
pub async fn only_the_leader_reconciles_and_the_other_takes_over<B: Backend>(b: B) {
    let (_a_stop, a) = replica(b.service_store(), "replica-a");
    // `a` leads before `b` starts.
    eventually("replica-a to hold the lease", async || {
        let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::new(b.store())
            .get("harvester-system", "harvester-cloud-lb")
            .await
            .expect("reads")?;
        (lease.spec?.holder_identity.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let (b_stop, b_task) = replica(b.service_store(), "replica-b");
    create_pool(
        &b,
        mk_pool(
            "p",
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.200"),
            global(),
        ),
    )
    .await;
    for i in 0..20 {
        create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
    }
    for i in 0..20 {
        allocated(&b, "default", &format!("lb{i}")).await;
    }
    for i in 0..20 {
        events_about(&b, &format!("lb{i}"), "Allocated").await;
    }
    assert_eq!(reporters(&b).await, ["replica-a"]);

    // `a` dies: no release, no cleanup.
    a.abort();
    let _ = a.await;
    for i in 20..40 {
        create_lb(&b, mk_lb("default", &format!("lb{i}"), json!({}))).await;
    }
    ok(
        call(&b, Method::DELETE, &format!("{LBS}/default/lb0"), None).await,
        StatusCode::OK,
    );
    for i in 20..40 {
        allocated(&b, "default", &format!("lb{i}")).await;
    }
    gone(&b, &format!("{LBS}/default/lb0")).await;
    events_about(&b, "lb39", "Allocated").await;
    assert_eq!(reporters(&b).await, ["replica-a", "replica-b"]);
    assert_consistent(&b).await;
    b_stop.cancel();
    b_task.await.expect("stops");
}
