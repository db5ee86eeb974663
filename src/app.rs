//! Wiring: opens the store of the chosen backend behind admission, prepares TLS, keys and seed
//! objects, builds the HTTP state, runs the reconcilers next to the server, and stops both on one
//! shutdown signal. The subcommands' own work is their modules' (`cli::token`, `cli::kubeconfig`,
//! `cli::ccm`, `crd`).

use std::{
    io::IsTerminal,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use anyhow::Context;
use futures::future::BoxFuture;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    auth::{ApiToken, embedded::EmbeddedAuthenticator, kubernetes::KubeAuthenticator},
    certs,
    config::{BackendKind, Cli, Command, GlobalArgs, LogFormat, ServeArgs},
    controller::leader::{AlwaysLeader, LeaderElector, LeaseElector, LeaseTiming, lead},
    http::{self, AppState},
    issuer::Issuer,
    kubeconfig::{CloudConfig, Settings, seed::seed, service::vip_url},
    lb::admission::{NetworkCheck, admitted},
    store::{
        ObjectStore,
        embedded::{EmbeddedStore, TokenController},
        kubernetes::KubeStore,
    },
};

/// The Lease the load balancer reconcilers' replicas compete for (in `--harvester-namespace`).
pub const LB_LEASE: &str = "harvester-cloud-lb";

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging(&cli.global)?;
    match cli.command {
        Command::Serve(args) => serve(&cli.global, &args).await,
        Command::Token { command } => {
            Ok(crate::cli::token::run(&cli.global.data_dir, command).await?)
        }
        Command::Crds => {
            print!("{}", crate::crd::crds_yaml()?);
            Ok(())
        }
        Command::Kubeconfig { command } => Ok(crate::cli::kubeconfig::run(command).await?),
        Command::ConfigReference => {
            print!("{}", crate::reference::markdown());
            Ok(())
        }
        Command::Ccm(args) => {
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone());
            crate::cli::ccm::run(&args, shutdown).await?;
            info!("stopped");
            Ok(())
        }
    }
}

fn init_logging(global: &GlobalArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&global.log)
        .with_context(|| format!("invalid --log filter {:?}", global.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    // Already initialised (tests): keep the existing subscriber.
    drop(result);
    Ok(())
}

/// What a service must close once it stops serving (the embedded store's writer; nothing on
/// Kubernetes).
pub type Close = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send + Sync>;

/// A service ready to serve, on either backend.
pub struct Service {
    pub state: AppState,
    /// Serving certificate chain and key, unless plain HTTP was asked for.
    pub tls: Option<certs::TlsMaterial>,
    pub close: Close,
    /// The Kubernetes backend's client (for what lives beside the store: the Rancher tunnel).
    pub kube: Option<kube::Client>,
}

/// The embedded backend, opened: the service, and what only this backend has.
pub struct Embedded {
    pub service: Service,
    pub store: Arc<EmbeddedStore>,
    /// The admin token created on this start (first start only).
    pub admin_token: Option<ApiToken>,
}

impl From<Embedded> for Service {
    fn from(e: Embedded) -> Self {
        e.service
    }
}

fn public_host(listen: SocketAddr) -> String {
    match listen.ip() {
        ip if ip.is_unspecified() => "localhost".into(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    }
}

fn read_cluster_ca(args: &ServeArgs) -> anyhow::Result<Option<Vec<u8>>> {
    args.cluster_ca_file
        .as_ref()
        .map(|path| {
            std::fs::read(path)
                .with_context(|| format!("cannot read --cluster-ca-file {}", path.display()))
        })
        .transpose()
}

/// Connects to the Kubernetes API and prepares everything `serve` needs.
pub async fn open_kube(args: &ServeArgs) -> anyhow::Result<Service> {
    let config = args.kube.client_config().await?;
    let cluster = config.cluster_url.to_string();
    let pacing = crate::store::kubernetes::Pacing {
        max_in_flight: args.kube_max_in_flight as usize,
    };
    let client = crate::store::kubernetes::paced_client(config, pacing)
        .context("cannot build a Kubernetes client")?;
    let store = Arc::new(KubeStore::new(client.clone()));
    store
        .ping()
        .await
        .with_context(|| format!("cannot reach the Kubernetes API at {cluster}"))?;
    info!(cluster = %cluster, "using the Kubernetes backend");
    // The load balancer kinds are Harvester's: read how this cluster's CRDs serve them (Harvester's
    // own have no status subresource, the project's earlier ones had one), and refuse to start
    // without them rather than log 404s for every object.
    for kind in [crate::crd::pool_kind(), crate::crd::lb_kind()] {
        let shape = store
            .require(&kind)
            .await
            .with_context(|| format!("cannot reconcile {}.{}", kind.plural, kind.group))?;
        info!(resource = %format!("{}.{}", kind.plural, kind.group), ?shape, "load balancer kind served");
    }
    let server_url = match (&args.server_url, &args.vip) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(vip)) => Some(vip_url(vip).map_err(|e| anyhow::anyhow!(e))?),
        (None, None) => None,
    };
    let store: Arc<dyn ObjectStore> = store;
    let cloud_config = Arc::new(CloudConfig::new(
        store.clone(),
        Settings {
            harvester_namespace: args.harvester_namespace.clone(),
            server_url,
            cluster_ca: read_cluster_ca(args)?,
            token_timeout: args.token_timeout,
            default_grace: args.rotation_grace,
            max_grace: args.max_rotation_grace,
        },
    ));
    // Pools' networks must name existing NetworkAttachmentDefinitions, as upstream's mutator wants.
    let admitted = Arc::new(admitted(store.clone(), NetworkCheck::Require));
    let state = AppState::new(http::StateParts {
        cloud_config,
        authenticator: Arc::new(KubeAuthenticator::new(
            client.clone(),
            args.allow_restricted_admin,
        )),
        admitted,
        // Guest clusters run `harvester-cloud ccm` themselves.
        guests: None,
        webhooks: if args.webhook_client_ca.is_some() {
            http::WebhookAccess::ClientCertificate
        } else {
            http::WebhookAccess::Open
        },
        // KubeVirt and the API server have those.
        vms: None,
        store,
        issuer: None,
    });
    Ok(Service {
        state,
        tls: certs::serving(args, None)?,
        close: Box::new(|| Box::pin(async {})),
        kube: Some(client),
    })
}

/// Opens the embedded store in the data directory and prepares everything `serve` needs.
pub async fn open_embedded(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<Embedded> {
    let data_dir = &global.data_dir;
    let store = EmbeddedStore::open_with(data_dir, args.durability, args.reinitialize).await?;

    let admin_token = crate::cli::token::ensure_admin_token(store.pool(), data_dir).await?;

    let tls = certs::serving(args, Some(data_dir))?;

    let cluster_ca = read_cluster_ca(args)?;
    // The CA that token Secrets carry: the configured cluster CA, else the one clients trust here.
    let token_ca = match (&cluster_ca, &tls) {
        (Some(ca), _) => ca.clone(),
        (None, Some(tls)) => tls.ca_pem.clone(),
        (None, None) => {
            certs::ensure_self_signed(&data_dir.join("tls"), &["localhost".into()])?.ca_pem
        }
    };

    let scheme = if args.http { "http" } else { "https" };
    let issuer_url = args.issuer_url.clone().unwrap_or_else(|| {
        format!(
            "{scheme}://{}:{}",
            public_host(args.listen),
            args.listen.port()
        )
    });
    let issuer = Arc::new(Issuer::new(issuer_url, &store.signing_keys().await?)?);
    store.set_token_controller(Arc::new(TokenController {
        issuer: issuer.clone(),
        ca_pem: token_ca,
        end_annotation: Some(crate::kubeconfig::objects::EXPIRES_AT_ANNOTATION),
    }));

    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    seed(&dyn_store, &args.harvester_namespace, args.vip.as_deref()).await?;

    let cloud_config = Arc::new(CloudConfig::new(
        dyn_store.clone(),
        Settings {
            harvester_namespace: args.harvester_namespace.clone(),
            server_url: args.server_url.clone(),
            cluster_ca,
            token_timeout: args.token_timeout,
            default_grace: args.rotation_grace,
            max_grace: args.max_rotation_grace,
        },
    ));
    // The embedded backend has no VM networks to look pools' networks up in.
    let admitted = Arc::new(admitted(dyn_store.clone(), NetworkCheck::Skip));
    // Guest clusters' LoadBalancers go through the same admission as the API's.
    let guests = http::rest::kinds::GuestClusters::new(dyn_store.clone(), admitted.clone());
    let state = AppState::new(http::StateParts {
        cloud_config,
        authenticator: Arc::new(
            EmbeddedAuthenticator::new(store.pool().clone(), data_dir)
                .with_service_accounts(issuer.clone(), dyn_store.clone()),
        ),
        admitted,
        guests: Some(guests),
        vms: Some(dyn_store.clone()),
        store: dyn_store,
        issuer: Some(issuer),
        // No API server calls them here, and an open one would only be an oracle of the pools.
        webhooks: http::WebhookAccess::Off,
    });
    let closing = store.clone();
    Ok(Embedded {
        service: Service {
            state,
            tls,
            close: Box::new(move || Box::pin(async move { closing.close().await })),
            kube: None,
        },
        store,
        admin_token,
    })
}

/// Cancels `token` on SIGTERM or Ctrl-C. The handlers are installed before this returns, so a
/// signal that arrives before the spawned task first runs (right after "listening", on a loaded
/// machine) is not left to the default action, which ends the process without a drain.
fn cancel_on_signal(token: CancellationToken) {
    let signal = shutdown_signal();
    tokio::spawn(
        async move {
            signal.await;
            info!("shutdown signal received");
            token.cancel();
        }
        .instrument(info_span!("signals")),
    );
}

/// Resolves when SIGTERM or Ctrl-C (SIGINT) arrives; the handlers are installed when this is
/// called, not when the future is first polled.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let wait = |s: std::io::Result<Signal>| async move {
            match s {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        let term = wait(signal(SignalKind::terminate()));
        let interrupt = wait(signal(SignalKind::interrupt()));
        async move {
            tokio::select! {
                _ = term => {},
                _ = interrupt => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn serve(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<()> {
    // The ports first: a start that cannot listen must not have created a token or a key first.
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on --metrics-listen {}", args.metrics_listen))?;
    let app: Service = match args.backend {
        BackendKind::Embedded => open_embedded(global, args).await?.into(),
        BackendKind::Kube => open_kube(args).await?,
    };
    let shutdown = CancellationToken::new();
    // Metrics stay up until the API has drained, so a scrape during the drain still answers.
    let metrics_stop = CancellationToken::new();
    let metrics = tokio::spawn(
        crate::http::metrics_listener::serve(metrics_listener, metrics_stop.clone())
            .instrument(info_span!("metrics")),
    );
    cancel_on_signal(shutdown.clone());
    let served = serve_on(listener, app, args, shutdown).await;
    metrics_stop.cancel();
    match metrics.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "the metrics listener failed"),
        Err(e) => warn!(error = %e, "the metrics listener task failed"),
    }
    served
}

/// Registers the Rancher APIService and keeps the aggregation tunnel up to whatever Rancher writes
/// into its Secret, serving the router on every connection Rancher opens through it.
fn spawn_tunnel(
    client: kube::Client,
    name: &str,
    args: &ServeArgs,
    state: &AppState,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    use crate::tunnel::{self, rancher};
    let (secret_namespace, secret_name) =
        args.rancher_apiservice_secret.clone().unwrap_or_else(|| {
            (
                args.harvester_namespace.clone(),
                format!("{name}-aggregation"),
            )
        });
    let spec = rancher::ApiServiceSpec {
        name: name.to_string(),
        secret_namespace: secret_namespace.clone(),
        secret_name: secret_name.clone(),
    };
    let (endpoints_tx, endpoints) = tokio::sync::watch::channel(None);
    let register = {
        let (client, stop) = (client.clone(), shutdown.clone());
        async move {
            let mut wait = std::time::Duration::from_secs(1);
            loop {
                match rancher::register(&client, &spec).await {
                    Ok(()) => return,
                    Err(e) => {
                        warn!(error = %e, retry_in = ?wait, "cannot register the Rancher APIService")
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                wait = (wait * 2).min(std::time::Duration::from_secs(60));
            }
        }
    };
    let follow = rancher::follow_secret(
        client,
        secret_namespace,
        secret_name,
        endpoints_tx,
        shutdown.clone(),
    );
    let accept = http::tunnel::acceptor(http::router(state.clone()), shutdown.clone());
    let run = tunnel::run(
        endpoints,
        accept,
        tunnel::Limits::default(),
        Arc::new(tunnel::Stats::default()),
        shutdown.clone(),
    );
    vec![
        tokio::spawn(register.instrument(info_span!("apiservice", name = %name))),
        tokio::spawn(follow.instrument(info_span!("apiservice_secret"))),
        tokio::spawn(run.instrument(info_span!("tunnel"))),
    ]
}

/// Starts the reconcilers next to the API, stopped by the same token: the load balancer's and, where
/// guest clusters are kept here, theirs, under the same leadership. Only one replica writes: the
/// embedded store is owned by this one process (its data directory is locked), so it always leads;
/// on Kubernetes the replicas elect a leader with a Lease unless told not to.
fn spawn_reconcilers(
    state: &AppState,
    args: &ServeArgs,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let store = state.store.clone();
    let settings = crate::lb::Settings {
        concurrency: args.lb_concurrency(),
        // No kube-vip announces VM load balancers' addresses on the embedded store.
        fill_service_ingress: matches!(args.backend, BackendKind::Embedded),
        cluster_accounts: (!args.keep_accounts_of_removed_clusters)
            .then(|| cluster_accounts(store.clone())),
        probe_policy: crate::lb::vm::prober::AddressPolicy::allowing(args.probe_allow_cidr.clone()),
        ..crate::lb::Settings::default()
    };
    let elector: Arc<dyn LeaderElector> = match args.backend {
        BackendKind::Kube if args.leader_elect => Arc::new(LeaseElector::new(
            store.clone(),
            &args.harvester_namespace,
            LB_LEASE,
            &settings.identity,
            LeaseTiming::default(),
        )),
        _ => Arc::new(AlwaysLeader),
    };
    let mut tasks = Vec::new();
    if let Some(guests) = state.guests.clone() {
        let (elector, shutdown, identity) =
            (elector.clone(), shutdown.clone(), settings.identity.clone());
        let guest_settings = crate::guest::reconcile::Settings {
            identity: identity.clone(),
            ..Default::default()
        };
        tasks.push(tokio::spawn(
            async move {
                lead(
                    elector.as_ref(),
                    &shutdown,
                    "guest cluster reconcilers",
                    &identity,
                    |stop| {
                        crate::guest::clusters::run(
                            guests.store().clone(),
                            guests.harvester().clone(),
                            guest_settings.clone(),
                            stop,
                        )
                    },
                )
                .await
            }
            .instrument(info_span!("guest")),
        ));
    }
    tasks.push(tokio::spawn(
        crate::lb::run(store, settings, elector, shutdown.clone()).instrument(info_span!("lb")),
    ));
    // Every replica sweeps ended cloud-config tokens (each deletion is conditional on the
    // Secret's UID, so two replicas never delete more than one would).
    tasks.push(tokio::spawn(
        state
            .cloud_config
            .clone()
            .run_sweeper(shutdown.clone())
            .instrument(info_span!("kubeconfig_sweeper")),
    ));
    tasks
}

/// Serves `app` on `listener` until `shutdown` is cancelled, then drains in-flight requests for at
/// most `--shutdown-timeout`.
pub async fn serve_on(
    listener: TcpListener,
    app: impl Into<Service>,
    args: &ServeArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Service {
        state,
        tls,
        close,
        kube,
    } = app.into();
    let local = listener.local_addr()?;
    let mut reconcilers = spawn_reconcilers(&state, args, &shutdown);
    if let Some(name) = &args.rancher_apiservice {
        let Some(client) = kube else {
            anyhow::bail!("--rancher-apiservice needs the Kubernetes backend (--backend kube)");
        };
        reconcilers.extend(spawn_tunnel(client, name, args, &state, &shutdown));
    }
    // The listener closes at the signal; open connections drain first (see http::drain and
    // http::server).
    let drain = http::drain::Drain::new(shutdown.clone());
    let router = drain.router(http::router(state));
    let limits = http::server::Limits {
        max_connections: args.max_connections as usize,
        header_timeout: args.header_timeout,
        handshake_timeout: args.header_timeout,
        ..Default::default()
    };
    let linger = http::drain::LINGER.min(args.shutdown_timeout);
    let server = async {
        let config = match tls {
            Some(tls) => {
                let client_ca = args
                    .webhook_client_ca
                    .as_ref()
                    .map(|p| {
                        std::fs::read(p).with_context(|| {
                            format!("cannot read --webhook-client-ca {}", p.display())
                        })
                    })
                    .transpose()?;
                let config = http::tls::server_config_with_clients(
                    &tls.cert_chain_pem,
                    &tls.key_pem,
                    client_ca.as_deref(),
                )
                .map_err(|e| anyhow::anyhow!("invalid TLS certificate, key or client CA: {e}"))?;
                info!(address = %local, url = %format!("https://{}:{}", public_host(local), local.port()), "listening (HTTPS)");
                Some(config)
            }
            None => {
                info!(address = %local, url = %format!("http://{}:{}", public_host(local), local.port()), "listening (plain HTTP)");
                None
            }
        };
        http::server::serve(listener, config, router, limits, linger, shutdown.clone()).await?;
        anyhow::Ok(())
    };
    tokio::pin!(server);
    let served = tokio::select! {
        r = &mut server => r,
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(args.shutdown_timeout).await;
        } => {
            warn!(timeout = ?args.shutdown_timeout, "in-flight requests did not finish in time; exiting");
            Ok(())
        }
    };
    // A server that failed stops the reconcilers too; they finish their in-flight reconciles.
    shutdown.cancel();
    let stopped = futures::future::join_all(reconcilers);
    if tokio::time::timeout(args.shutdown_timeout, stopped)
        .await
        .is_err()
    {
        warn!(timeout = ?args.shutdown_timeout, "reconcilers did not stop in time; exiting");
    }
    close().await;
    served?;
    info!("stopped");
    Ok(())
}

/// The cloud-config accounts as the load balancer's guest-cluster cleanup revokes them: the one
/// place where the two domains meet.
pub fn cluster_accounts(store: Arc<dyn ObjectStore>) -> Arc<dyn crate::lb::ClusterAccounts> {
    Arc::new(RevokeAccounts(crate::kubeconfig::accounts::Accounts::new(
        store,
    )))
}

struct RevokeAccounts(crate::kubeconfig::accounts::Accounts);

#[async_trait::async_trait]
impl crate::lb::ClusterAccounts for RevokeAccounts {
    async fn revoke_of_cluster(
        &self,
        namespace: &str,
        cluster: &str,
    ) -> Result<Option<crate::lb::ClusterRevocation>, Box<dyn std::error::Error + Send + Sync>>
    {
        let Some(revocation) = self.0.revoke_of_cluster(namespace, cluster).await? else {
            return Ok(None);
        };
        Ok(Some(crate::lb::ClusterRevocation {
            deleted: revocation.deleted,
            kept: revocation
                .kept
                .into_iter()
                .map(|k| (k.object, k.reason))
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::{process::Command, time::Duration};

    /// The handlers are installed when `shutdown_signal` is called, not when its future is first
    /// polled: a SIGTERM in between is caught (before, it ended the process, here the test binary).
    #[cfg(unix)]
    #[tokio::test]
    async fn a_signal_before_the_first_poll_is_caught_not_fatal() {
        let signal = super::shutdown_signal();
        let sent = Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("runs kill");
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(30), signal)
            .await
            .expect("the SIGTERM sent before the first poll resolves it");
    }
}
