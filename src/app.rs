//! Wiring: opens the store, prepares TLS, keys and seed objects, builds the HTTP state, serves until
//! one shutdown signal, and runs the `token` maintenance commands.

use std::{
    io::IsTerminal,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::Arc,
};

use anyhow::{Context, bail};
use k8s_openapi::{
    api::{
        core::v1::ConfigMap,
        rbac::v1::{ClusterRole, PolicyRule},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::{
    auth::kubernetes::KubeAuthenticator,
    auth::{ApiToken, embedded::EmbeddedAuthenticator},
    certs,
    config::{
        BackendKind, Cli, Command, GlobalArgs, KubeArgs, KubeconfigCommand, LogFormat, ServeArgs,
        TokenCommand,
    },
    http::{self, AppState},
    issuer::Issuer,
    kubeconfig::{
        CloudConfig, Settings,
        objects::{MANAGED_BY, MANAGED_BY_LABEL},
        request::{CLOUDPROVIDER_ROLE, CSI_DRIVER_ROLE},
    },
    kubeconfig::{render, request::AccountRequest, service::vip_url},
    lb::{
        admission::{AdmittedStore, NetworkCheck},
        objects::Objects,
    },
    store::{
        Api, ObjectStore,
        embedded::{self, EmbeddedStore, TokenController, tokens},
        kubernetes::KubeStore,
    },
};

pub const ADMIN_TOKEN_FILE: &str = "admin-token";
/// The Lease the load balancer reconcilers' replicas compete for (in `--harvester-namespace`).
pub const LB_LEASE: &str = "harvester-cloud-lb";
const DEFAULT_VIP: &str = "127.0.0.1";

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    init_logging(&cli.global)?;
    match cli.command {
        Command::Serve(args) => serve(&cli.global, &args).await,
        Command::Token { command } => token_command(&cli.global, command).await,
        Command::Crds => {
            print!("{}", crate::crd::crds_yaml()?);
            Ok(())
        }
        Command::Kubeconfig { command } => kubeconfig_command(command).await,
        Command::Ccm(args) => {
            let shutdown = CancellationToken::new();
            cancel_on_signal(shutdown.clone());
            crate::guest::ccm::run(&args, shutdown).await?;
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

/// An opened embedded service, ready to serve.
pub struct Embedded {
    pub store: Arc<EmbeddedStore>,
    pub state: AppState,
    /// Serving certificate chain and key, unless plain HTTP was asked for.
    pub tls: Option<certs::TlsMaterial>,
    /// The admin token created on this start (first start only).
    pub admin_token: Option<ApiToken>,
}

fn public_host(listen: SocketAddr) -> String {
    match listen.ip() {
        ip if ip.is_unspecified() => "localhost".into(),
        IpAddr::V6(ip) => format!("[{ip}]"),
        IpAddr::V4(ip) => ip.to_string(),
    }
}

/// The serving certificate: supplied, or generated (kept in `<data-dir>/tls` when there is a data
/// directory, in memory otherwise); `None` for plain HTTP.
fn serving_tls(
    args: &ServeArgs,
    data_dir: Option<&Path>,
) -> anyhow::Result<Option<certs::TlsMaterial>> {
    if args.http {
        return Ok(None);
    }
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let cert_chain_pem = std::fs::read(cert)
            .with_context(|| format!("cannot read --tls-cert {}", cert.display()))?;
        let key_pem = std::fs::read(key)
            .with_context(|| format!("cannot read --tls-key {}", key.display()))?;
        let ca_pem = certs::last_certificate_pem(&cert_chain_pem)
            .with_context(|| format!("--tls-cert {} holds no PEM certificate", cert.display()))?;
        return Ok(Some(certs::TlsMaterial {
            cert_chain_pem,
            key_pem,
            ca_pem,
        }));
    }
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !args.listen.ip().is_unspecified() && !args.listen.ip().is_loopback() {
        hosts.push(args.listen.ip().to_string());
    }
    if let Ok(pod_ip) = std::env::var("POD_IP") {
        hosts.push(pod_ip);
    }
    Ok(Some(match data_dir {
        Some(dir) => certs::ensure_self_signed(&dir.join("tls"), &hosts)?,
        None => certs::generate(&hosts)?,
    }))
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

/// A Kubernetes client from `--kubeconfig` (and `--context`), else the in-cluster or default config.
pub async fn kube_config(args: &KubeArgs) -> anyhow::Result<kube::Config> {
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read --kubeconfig {}", path.display()))?;
            Ok(kube::Config::from_custom_kubeconfig(kc, &options).await?)
        }
        None if args.context.is_some() => Ok(kube::Config::from_kubeconfig(&options).await?),
        None => Ok(kube::Config::infer().await?),
    }
}

/// The service on the Kubernetes backend: state in the cluster, nothing on local disk.
pub struct Kube {
    pub state: AppState,
    pub tls: Option<certs::TlsMaterial>,
    pub client: kube::Client,
}

/// Connects to the Kubernetes API and prepares everything `serve` needs.
pub async fn open_kube(args: &ServeArgs) -> anyhow::Result<Kube> {
    let config = kube_config(&args.kube).await?;
    let cluster = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let store = Arc::new(KubeStore::new(client.clone()));
    store
        .ping()
        .await
        .with_context(|| format!("cannot reach the Kubernetes API at {cluster}"))?;
    info!(cluster = %cluster, "using the Kubernetes backend");
    let server_url = match (&args.server_url, &args.vip) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(vip)) => Some(vip_url(vip).map_err(|e| anyhow::anyhow!(e))?),
        (None, None) => None,
    };
    let dyn_store: Arc<dyn ObjectStore> = store;
    let cloud_config = Arc::new(CloudConfig::new(
        dyn_store.clone(),
        Settings {
            harvester_namespace: args.harvester_namespace.clone(),
            server_url,
            cluster_ca: read_cluster_ca(args)?,
            token_timeout: args.token_timeout,
        },
    ));
    let state = AppState {
        cloud_config,
        authenticator: Arc::new(KubeAuthenticator::new(
            client.clone(),
            args.allow_restricted_admin,
        )),
        // Pools' networks must name existing NetworkAttachmentDefinitions, as upstream's mutator wants.
        objects: Objects::new(Arc::new(AdmittedStore::new(
            dyn_store.clone(),
            NetworkCheck::Require,
        ))),
        // Guest clusters run `harvester-cloud ccm` themselves.
        guests: None,
        store: dyn_store,
        issuer: None,
    };
    Ok(Kube {
        state,
        tls: serving_tls(args, None)?,
        client,
    })
}

/// A service ready to serve, on either backend.
pub enum Backend {
    Embedded(Embedded),
    Kube(Kube),
}

impl Backend {
    pub fn state(&self) -> &AppState {
        match self {
            Backend::Embedded(e) => &e.state,
            Backend::Kube(k) => &k.state,
        }
    }

    pub fn tls(&self) -> Option<&certs::TlsMaterial> {
        match self {
            Backend::Embedded(e) => e.tls.as_ref(),
            Backend::Kube(k) => k.tls.as_ref(),
        }
    }

    /// Flushes and closes what the backend holds open.
    pub async fn close(&self) {
        if let Backend::Embedded(e) = self {
            e.store.close().await;
        }
    }
}

impl From<Embedded> for Backend {
    fn from(e: Embedded) -> Self {
        Backend::Embedded(e)
    }
}

impl From<Kube> for Backend {
    fn from(k: Kube) -> Self {
        Backend::Kube(k)
    }
}

/// Opens the embedded store in the data directory and prepares everything `serve` needs.
pub async fn open_embedded(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<Embedded> {
    let data_dir = &global.data_dir;
    let store = EmbeddedStore::open(data_dir, args.durability).await?;

    let admin_token = ensure_admin_token(&store, data_dir).await?;

    let tls = serving_tls(args, Some(data_dir))?;

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
        },
    ));
    // The embedded backend has no VM networks to look pools' networks up in.
    let admitted = Arc::new(AdmittedStore::new(dyn_store.clone(), NetworkCheck::Skip));
    // Guest clusters' LoadBalancers go through the same admission as the API's.
    let guests = crate::guest::api::GuestClusters::new(dyn_store.clone(), admitted.clone());
    let state = AppState {
        cloud_config,
        authenticator: Arc::new(EmbeddedAuthenticator::new(store.pool().clone())),
        objects: Objects::new(admitted),
        guests: Some(guests),
        store: dyn_store,
        issuer: Some(issuer),
    };
    Ok(Embedded {
        store,
        state,
        tls,
        admin_token,
    })
}

/// On first start (no token at all) creates an admin token and writes it to `<data-dir>/admin-token`.
async fn ensure_admin_token(
    store: &EmbeddedStore,
    data_dir: &Path,
) -> anyhow::Result<Option<ApiToken>> {
    if tokens::count(store.pool()).await? > 0 {
        return Ok(None);
    }
    let (token, rec) = tokens::create(store.pool(), "created on first start", None).await?;
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    certs::write_private(&path, format!("{}\n", token.expose()).as_bytes())?;
    info!(token = %rec.name, path = %path.display(), "created the first admin token");
    // The secret goes to an interactive terminal only, never into logs.
    if std::io::stdout().is_terminal() {
        println!(
            "Admin token (shown once; also in {}):\n{}",
            path.display(),
            token.expose()
        );
    }
    Ok(Some(token))
}

/// Objects a Harvester cluster has that the embedded store must provide: the two ClusterRoles the
/// bindings refer to, and the `vip` ConfigMap.
async fn seed(
    store: &Arc<dyn ObjectStore>,
    harvester_namespace: &str,
    vip: Option<&str>,
) -> anyhow::Result<()> {
    let roles = Api::<ClusterRole>::new(store.clone());
    for (name, rules) in [
        (CLOUDPROVIDER_ROLE, cloudprovider_rules()),
        (CSI_DRIVER_ROLE, csi_driver_rules()),
    ] {
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                ..Default::default()
            },
            rules: Some(rules),
            ..Default::default()
        };
        match roles.create(&role).await {
            Ok(_) => info!(role = name, "seeded cluster role"),
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e).with_context(|| format!("cannot seed ClusterRole {name}")),
        }
    }

    let cms = Api::<ConfigMap>::new(store.clone());
    let current = cms.get(harvester_namespace, "vip").await?;
    let want = match (vip, &current) {
        (Some(vip), _) => vip.to_string(),
        (None, Some(_)) => return Ok(()),
        (None, None) => {
            info!(
                vip = DEFAULT_VIP,
                "no --vip given: kubeconfigs will point at https://127.0.0.1:6443"
            );
            DEFAULT_VIP.to_string()
        }
    };
    let mut cm = current.clone().unwrap_or_else(|| ConfigMap {
        metadata: ObjectMeta {
            name: Some("vip".into()),
            namespace: Some(harvester_namespace.into()),
            ..Default::default()
        },
        ..Default::default()
    });
    cm.data.get_or_insert_default().insert("ip".into(), want);
    if current.is_some() {
        cms.replace(&cm).await?;
    } else {
        cms.create(&cm).await?;
    }
    Ok(())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |xs: &[&str]| Some(xs.iter().map(|s| s.to_string()).collect());
    PolicyRule {
        api_groups: v(groups),
        resources: v(resources),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// As shipped by the Harvester chart (reference §15).
pub fn cloudprovider_rules() -> Vec<PolicyRule> {
    let read = ["get", "list", "watch"];
    vec![
        rule(
            &["loadbalancer.harvesterhci.io"],
            &["loadbalancers"],
            &["*"],
        ),
        rule(
            &["kubevirt.io"],
            &["virtualmachines", "virtualmachineinstances"],
            &read,
        ),
        rule(
            &["subresources.kubevirt.io"],
            &[
                "virtualmachines/addvolume",
                "virtualmachines/removevolume",
                "virtualmachineinstances/guestosinfo",
            ],
            &["update"],
        ),
        rule(&[""], &["pods"], &read),
        rule(&[""], &["persistentvolumeclaims"], &["*"]),
    ]
}

/// As shipped by the Harvester chart (reference §15).
pub fn csi_driver_rules() -> Vec<PolicyRule> {
    let read = ["get", "list", "watch"];
    vec![
        rule(
            &["storage.k8s.io"],
            &["storageclasses", "volumeattachments"],
            &read,
        ),
        rule(
            &["harvesterhci.io"],
            &["networkfilesystems", "volumeremotes"],
            &["*"],
        ),
        rule(&["longhorn.io"], &["volumes"], &read),
        rule(&["snapshot.storage.k8s.io"], &["*"], &["*"]),
        rule(&["kubevirt.io"], &["virtualmachines"], &["patch"]),
    ]
}

/// Cancels `token` on SIGTERM or Ctrl-C.
fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(
        async move {
            shutdown_signal().await;
            info!("shutdown signal received");
            token.cancel();
        }
        .instrument(info_span!("signals")),
    );
}

/// Resolves when SIGTERM or Ctrl-C arrives.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

async fn serve(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<()> {
    let app: Backend = match args.backend {
        BackendKind::Embedded => open_embedded(global, args).await?.into(),
        BackendKind::Kube => open_kube(args).await?.into(),
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on --metrics-listen {}", args.metrics_listen))?;
    let shutdown = CancellationToken::new();
    // Metrics stay up until the API has drained, so a scrape during the drain still answers.
    let metrics_stop = CancellationToken::new();
    let metrics = tokio::spawn(
        crate::metrics::server::serve(metrics_listener, metrics_stop.clone())
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

/// Serves `app` on `listener` until `shutdown` is cancelled, then drains in-flight requests for at
/// most `--shutdown-timeout`.
pub async fn serve_on(
    listener: TcpListener,
    app: impl Into<Backend>,
    args: &ServeArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app: Backend = app.into();
    let local = listener.local_addr()?;
    // The reconcilers run next to the API, stopped by the same token. Only one replica writes: the
    // embedded store is owned by this one process (its data directory is locked), so it always
    // leads; on Kubernetes the replicas elect a leader with a Lease unless told not to.
    let store = app.state().store.clone();
    let settings = crate::lb::Settings {
        concurrency: args.lb_concurrency,
        ..crate::lb::Settings::default()
    };
    let elector: Arc<dyn crate::controller::leader::LeaderElector> = match &app {
        Backend::Kube(_) if args.leader_elect => {
            Arc::new(crate::controller::leader::LeaseElector::new(
                store.clone(),
                &args.harvester_namespace,
                LB_LEASE,
                &settings.identity,
                crate::controller::leader::LeaseTiming::default(),
            ))
        }
        _ => Arc::new(crate::controller::leader::AlwaysLeader),
    };
    // Guest clusters kept here get their reconcilers next to the load balancer's, under the same
    // leadership.
    let guests = app.state().guests.clone().map(|guests| {
        let (elector, shutdown, identity) =
            (elector.clone(), shutdown.clone(), settings.identity.clone());
        let guest_settings = crate::guest::reconcile::Settings {
            identity: identity.clone(),
            ..Default::default()
        };
        tokio::spawn(
            async move {
                crate::controller::leader::lead(
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
        )
    });
    let reconcilers = tokio::spawn(
        crate::lb::run(store, settings, elector, shutdown.clone()).instrument(info_span!("lb")),
    );
    // The listener closes at the signal; open connections drain first (see http::drain).
    let drain = http::drain::Drain::new(shutdown.clone());
    let router = drain.router(http::router(app.state().clone()));
    let drained = drain.graceful(http::drain::LINGER.min(args.shutdown_timeout));
    let server = async {
        match app.tls() {
            Some(tls) => {
                let config = http::tls::server_config(&tls.cert_chain_pem, &tls.key_pem)
                    .map_err(|e| anyhow::anyhow!("invalid TLS certificate or key: {e}"))?;
                info!(address = %local, url = %format!("https://{}:{}", public_host(local), local.port()), "listening (HTTPS)");
                let listener = drain.listener(http::tls::TlsListener::new(listener, config)?)?;
                axum::serve(listener, router)
                    .with_graceful_shutdown(drained)
                    .await?;
            }
            None => {
                info!(address = %local, url = %format!("http://{}:{}", public_host(local), local.port()), "listening (plain HTTP)");
                axum::serve(drain.listener(listener)?, router)
                    .with_graceful_shutdown(drained)
                    .await?;
            }
        }
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
    let stopped = async {
        let _ = reconcilers.await;
        if let Some(guests) = guests {
            let _ = guests.await;
        }
    };
    if tokio::time::timeout(args.shutdown_timeout, stopped)
        .await
        .is_err()
    {
        warn!(timeout = ?args.shutdown_timeout, "reconcilers did not stop in time; exiting");
    }
    app.close().await;
    served?;
    info!("stopped");
    Ok(())
}

async fn token_command(global: &GlobalArgs, command: TokenCommand) -> anyhow::Result<()> {
    let pool = embedded::open_pool(&global.data_dir).await?;
    match command {
        TokenCommand::Create { ttl, description } => {
            let ttl = ttl
                .map(time::Duration::try_from)
                .transpose()
                .context("--ttl is too long")?;
            let (token, rec) = tokens::create(&pool, &description, ttl).await?;
            match rec.expires_at {
                Some(at) => eprintln!("created {} (expires {at})", rec.name),
                None => eprintln!("created {} (does not expire)", rec.name),
            }
            println!("{}", token.expose());
        }
        TokenCommand::List => {
            let now = time::OffsetDateTime::now_utc();
            println!(
                "{:<12} {:<8} {:<21} {:<21} DESCRIPTION",
                "NAME", "STATUS", "CREATED", "EXPIRES"
            );
            for t in tokens::list(&pool).await? {
                let fmt = |t: time::OffsetDateTime| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default()
                };
                println!(
                    "{:<12} {:<8} {:<21} {:<21} {}",
                    t.name,
                    t.status(now),
                    fmt(t.created_at),
                    t.expires_at.map(fmt).unwrap_or_else(|| "never".into()),
                    t.description
                );
            }
        }
        TokenCommand::Revoke { name } => {
            let rec = match tokens::revoke(&pool, &name).await {
                Ok(rec) => rec,
                Err(tokens::TokenStoreError::NotFound { name }) => bail!("token {name} not found"),
                Err(e) => return Err(e.into()),
            };
            println!("{} revoked", rec.name);
        }
    }
    pool.close().await;
    Ok(())
}

async fn kubeconfig_command(command: KubeconfigCommand) -> anyhow::Result<()> {
    let KubeconfigCommand::Generate {
        service_account,
        namespace,
        kube,
        server_url,
        token_timeout,
    } = command;
    let req = AccountRequest::new(&namespace, &service_account).map_err(|e| anyhow::anyhow!(e))?;
    let config = kube_config(&kube).await?;
    // As generate_addon.sh did: the kubeconfig points where your own kubeconfig points.
    let server = server_url.unwrap_or_else(|| {
        config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string()
    });
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let store: Arc<dyn ObjectStore> = Arc::new(KubeStore::new(client));
    let cloud_config = CloudConfig::new(
        store,
        Settings {
            harvester_namespace: "harvester-system".into(),
            server_url: Some(server),
            cluster_ca: None,
            token_timeout,
        },
    );
    let kubeconfig = cloud_config.ensure(&req).await?;
    print!(
        "########## cloud config ############\n{kubeconfig}\n{}",
        render::cloud_init(&kubeconfig)
    );
    Ok(())
}
