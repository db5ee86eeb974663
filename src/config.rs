//! Command line and environment: every flag also reads a `HARVESTER_CLOUD_*` variable.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::store::embedded::Durability;

#[derive(Debug, Parser)]
#[command(
    name = "harvester-cloud",
    version,
    about = "Cloud-config API and load balancers for guest Kubernetes clusters on SUSE Virtualization (Harvester)"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Directory of the embedded store: SQLite database, signing keys, TLS material, admin token.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_DATA_DIR",
        default_value = "./data",
        global = true
    )]
    pub data_dir: PathBuf,
    /// Log line format.
    #[arg(long, env = "HARVESTER_CLOUD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Log filter in tracing's EnvFilter syntax, e.g. `info` or `info,harvester_cloud=debug`.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_LOG",
        default_value = "info",
        global = true
    )]
    pub log: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start; boxing would only complicate matching on it"
)]
pub enum Command {
    /// Run the service: the HTTP API and the reconcilers, on the embedded store or (`--backend
    /// kube`) the Kubernetes API.
    Serve(ServeArgs),
    /// Manage admin API tokens of the embedded store.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Print the CustomResourceDefinitions of LoadBalancer and IPPool as YAML.
    Crds,
    /// Cloud-configs made with your own kubeconfig, without the service.
    Kubeconfig {
        #[command(subcommand)]
        command: KubeconfigCommand,
    },
    /// Run in a guest cluster: map its Services of type LoadBalancer to Harvester LoadBalancers
    /// (the Harvester Cloud Provider's load balancing).
    Ccm(CcmArgs),
    /// Print every command's flags as markdown: the manual's configuration page
    /// (docs/src/configuration.md).
    #[command(hide = true)]
    ConfigReference,
}

/// `harvester-cloud ccm`.
#[derive(Debug, Args, Clone)]
pub struct CcmArgs {
    /// The cloud-config: the kubeconfig the cloud-config API issued for this guest cluster. Its
    /// current context's namespace is where the LoadBalancers go (`default` if it names none).
    #[arg(long, env = "HARVESTER_CLOUD_CLOUD_CONFIG")]
    pub cloud_config: PathBuf,
    /// This guest cluster's name, unique among the guest clusters of the Harvester namespace
    /// (LoadBalancer names and labels carry it).
    #[arg(
        long,
        env = "HARVESTER_CLOUD_CLUSTER_NAME",
        default_value = "kubernetes"
    )]
    pub cluster_name: String,
    /// How to reach the guest cluster's own API (in-cluster by default).
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Harvester network (`namespace/name`, or a name in `default`) recorded on every LoadBalancer
    /// as its management network.
    #[arg(long, env = "HARVESTER_CLOUD_MANAGEMENT_NETWORK")]
    pub management_network: Option<String>,
    /// How many Services are reconciled at once.
    #[arg(long, env = "HARVESTER_CLOUD_CCM_CONCURRENCY", default_value_t = 256)]
    pub concurrency: u16,
    /// How long the LoadBalancer of a deleted DHCP Service is kept for its lease record (MAC
    /// address, leased address, host name), so that a Service recreated under the same name leases
    /// the same address again (`0s`: deleted at once).
    #[arg(long, env = "HARVESTER_CLOUD_DHCP_RECORD_RETENTION", default_value = "10m", value_parser = parse_duration)]
    pub dhcp_record_retention: Duration,
    /// Reconcile only while holding a Lease in the guest cluster, so that several replicas are
    /// safe (`--leader-elect=false` for a single one).
    #[arg(long, env = "HARVESTER_CLOUD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the guest cluster's leader Lease.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_LEASE_NAMESPACE",
        default_value = "kube-system"
    )]
    pub lease_namespace: String,
    /// Name of the guest cluster's leader Lease.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_LEASE_NAME",
        default_value = "harvester-cloud-ccm"
    )]
    pub lease_name: String,
    /// Address of the Prometheus metrics listener (plain HTTP, `GET /metrics`): the leader gauge
    /// and the guest-Service reconciles. Not `serve`'s default port, so both can run on one host.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_METRICS_LISTEN",
        default_value = "127.0.0.1:9091"
    )]
    pub metrics_listen: SocketAddr,
}

#[derive(Debug, Subcommand)]
pub enum KubeconfigCommand {
    /// Ensure the service account of a guest cluster in a Harvester cluster and print its cloud
    /// config and cloud-init user data (the replacement for `generate_addon.sh`).
    Generate {
        /// Service account name (usually the guest cluster name).
        service_account: String,
        /// Namespace of the guest cluster's VMs.
        namespace: String,
        #[command(flatten)]
        kube: KubeArgs,
        /// Server URL for the generated kubeconfig; defaults to your kubeconfig's current server.
        #[arg(long, env = "HARVESTER_CLOUD_SERVER_URL")]
        server_url: Option<String>,
        /// How long to wait for the service-account token.
        #[arg(long, env = "HARVESTER_CLOUD_TOKEN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
        token_timeout: Duration,
    },
    /// List the cloud-config accounts the service issued (never their tokens), from a running
    /// service (`--url`) or from the cluster (`--kubeconfig`).
    List {
        /// Only the accounts of this namespace.
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        #[command(flatten)]
        target: AccountsTarget,
        /// `table` (for people) or `json` (for scripts).
        #[arg(long, short = 'o', value_enum, default_value_t = OutputKind::Table)]
        output: OutputKind,
    },
    /// Rotate a cloud-config account's token: issue a new one and print its kubeconfig; the
    /// replaced token keeps working for `--grace`, any older one stops now. Through a running
    /// service (`--url`) or in the cluster (`--kubeconfig`).
    Rotate {
        /// Service account name (usually the guest cluster name).
        service_account: String,
        /// Namespace of the account.
        namespace: String,
        /// How long the replaced token keeps working (`0` ends it now); default: the service's
        /// `--rotation-grace` (in the cluster, 1h).
        #[arg(long, value_parser = parse_duration)]
        grace: Option<Duration>,
        /// Give the new token a lifetime, e.g. `30d`; default: no end.
        #[arg(long, value_parser = parse_duration)]
        expiration: Option<Duration>,
        /// What to print.
        #[arg(long, short = 'o', value_enum, default_value_t = RotateOutput::Kubeconfig)]
        output: RotateOutput,
        /// With `-o cloud-init`: the one path the user data writes the kubeconfig to.
        #[arg(long)]
        cloud_config_path: Option<String>,
        /// In the cluster: the server URL for the kubeconfig (default: your kubeconfig's server).
        #[arg(long, env = "HARVESTER_CLOUD_SERVER_URL")]
        server_url: Option<String>,
        #[command(flatten)]
        target: AccountsTarget,
    },
    /// Revoke a cloud-config account: delete its bindings, token Secrets and ServiceAccount (what
    /// is not the account's is kept and reported), through a running service (`--url`) or in the
    /// cluster (`--kubeconfig`).
    Revoke {
        /// Service account name (usually the guest cluster name).
        service_account: String,
        /// Namespace of the account.
        namespace: String,
        #[command(flatten)]
        target: AccountsTarget,
        /// `table` (for people) or `json` (for scripts).
        #[arg(long, short = 'o', value_enum, default_value_t = OutputKind::Table)]
        output: OutputKind,
    },
}

/// What `kubeconfig rotate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RotateOutput {
    /// The kubeconfig (the guest cluster's cloud-config).
    Kubeconfig,
    /// Cloud-init user data writing it (to `--cloud-config-path`, or Harvester's two paths).
    CloudInit,
}

/// Where `kubeconfig list|revoke` act: a running service over HTTP when `--url` is given, else the
/// cluster that `--kubeconfig` (or the usual kubeconfig) reaches.
#[derive(Debug, Args, Clone, Default)]
pub struct AccountsTarget {
    /// URL of a running service (e.g. `https://harvester-cloud.example:8443`, or Rancher's
    /// `https://rancher.example/k8s/clusters/<id>`); the request paths are appended to it.
    #[arg(long, env = "HARVESTER_CLOUD_URL", requires = "token_file")]
    pub url: Option<String>,
    /// File holding the admin bearer token for `--url`.
    #[arg(long, env = "HARVESTER_CLOUD_TOKEN_FILE", requires = "url")]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle that `--url`'s certificate must chain to (default: the system's roots).
    #[arg(long, env = "HARVESTER_CLOUD_CA_FILE", requires = "url")]
    pub ca_file: Option<PathBuf>,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// How `kubeconfig list|revoke` print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputKind {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (the only time its secret is shown).
    Create {
        /// Lifetime, e.g. `30m`, `12h`, `90d`; without it the token does not expire.
        #[arg(long, env = "HARVESTER_CLOUD_TOKEN_TTL", value_parser = parse_duration)]
        ttl: Option<Duration>,
        /// A note on what the token is for.
        #[arg(long, env = "HARVESTER_CLOUD_TOKEN_DESCRIPTION", default_value = "")]
        description: String,
    },
    /// List tokens (names and state, never secrets).
    List,
    /// Revoke a token by name; requests with it are refused within a second.
    Revoke {
        /// The token name, `token-xxxxx`.
        name: String,
    },
}

/// Where objects live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// SQLite in `--data-dir`: nothing else needed.
    Embedded,
    /// The Kubernetes API (in cluster, or through `--kubeconfig`).
    Kube,
}

/// How to reach the Kubernetes API.
#[derive(Debug, Args, Clone, Default)]
pub struct KubeArgs {
    /// Kubeconfig file (`serve`: of the Kubernetes backend; `ccm`: of the guest cluster); without
    /// it, the in-cluster config, then the usual `KUBECONFIG` / `~/.kube/config`.
    #[arg(long, env = "HARVESTER_CLOUD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of `--kubeconfig` to use instead of its current context.
    #[arg(long, env = "HARVESTER_CLOUD_KUBE_CONTEXT")]
    pub context: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    /// Store backend.
    #[arg(long, env = "HARVESTER_CLOUD_BACKEND", value_enum, default_value_t = BackendKind::Embedded)]
    pub backend: BackendKind,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Kubernetes backend: also accept Rancher's `restricted-admin` global role as administrator.
    #[arg(long, env = "HARVESTER_CLOUD_ALLOW_RESTRICTED_ADMIN")]
    pub allow_restricted_admin: bool,
    /// Address to listen on.
    #[arg(long, env = "HARVESTER_CLOUD_LISTEN", default_value = "127.0.0.1:8443")]
    pub listen: SocketAddr,
    /// Serve plain HTTP (behind a TLS-terminating proxy) instead of HTTPS.
    #[arg(long, env = "HARVESTER_CLOUD_HTTP", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub http: bool,
    /// PEM certificate chain to serve instead of the generated self-signed one.
    #[arg(long, env = "HARVESTER_CLOUD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "HARVESTER_CLOUD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Harvester VIP: kubeconfigs point at `https://<vip>:6443`. Stored in the `vip` ConfigMap.
    /// Defaults to 127.0.0.1 on a fresh embedded store.
    #[arg(long, env = "HARVESTER_CLOUD_VIP", value_parser = parse_ip)]
    pub vip: Option<String>,
    /// Server URL written into kubeconfigs verbatim, instead of the VIP's.
    #[arg(long, env = "HARVESTER_CLOUD_SERVER_URL", value_parser = parse_server_url)]
    pub server_url: Option<String>,
    /// PEM CA bundle written into kubeconfigs, instead of the service's own CA.
    #[arg(long, env = "HARVESTER_CLOUD_CLUSTER_CA_FILE")]
    pub cluster_ca_file: Option<PathBuf>,
    /// Issuer (`iss`) of the service-account tokens minted here, and the base URL of the OpenID
    /// discovery documents. Defaults to this service's own URL.
    #[arg(long, env = "HARVESTER_CLOUD_ISSUER_URL")]
    pub issuer_url: Option<String>,
    /// Namespace of Harvester's `vip` ConfigMap.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_HARVESTER_NAMESPACE",
        default_value = "harvester-system"
    )]
    pub harvester_namespace: String,
    /// How long a POST waits for a service-account token before answering 504.
    #[arg(long, env = "HARVESTER_CLOUD_TOKEN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub token_timeout: Duration,
    /// How long a rotated cloud-config token keeps working when the rotation gives no
    /// `gracePeriod`.
    #[arg(long, env = "HARVESTER_CLOUD_ROTATION_GRACE", default_value = "1h", value_parser = parse_duration)]
    pub rotation_grace: Duration,
    /// The longest `gracePeriod` a rotation may ask for (a longer one is a 422).
    #[arg(long, env = "HARVESTER_CLOUD_MAX_ROTATION_GRACE", default_value = "24h", value_parser = parse_duration)]
    pub max_rotation_grace: Duration,
    /// Embedded store: start with a new, empty store when the database is missing or empty although
    /// the data directory was used before (otherwise such a start is refused, so that a lost
    /// database is noticed instead of silently replaced). Everything of the old store is lost.
    #[arg(long, env = "HARVESTER_CLOUD_REINITIALIZE")]
    pub reinitialize: bool,
    /// How the embedded store makes a write durable before it acknowledges it.
    #[arg(long, env = "HARVESTER_CLOUD_DURABILITY", value_enum, default_value_t = Durability::Full)]
    pub durability: Durability,
    /// How many LoadBalancers the reconciler works on at once. Many in flight let the store and
    /// each pool batch their writes. Default: 4096 on the embedded store, 128 on the Kubernetes
    /// backend, where the API server's write latency bounds the rate and more in flight only cost
    /// memory and draw 429s.
    #[arg(long, env = "HARVESTER_CLOUD_LB_CONCURRENCY")]
    pub lb_concurrency: Option<u16>,
    /// Kubernetes backend: requests to the API server in flight at once, shared by all the
    /// process sends (reconcilers, Events, the API, the webhooks' reads); more wait their turn,
    /// and a 429 pauses them all for the Retry-After the server gave. Sized so that the API
    /// server's priority and fairness need not refuse any; leader election is not held back.
    #[arg(long, env = "HARVESTER_CLOUD_KUBE_MAX_IN_FLIGHT", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub kube_max_in_flight: u32,
    /// Keep the cloud-config accounts of a guest cluster that Rancher removes. Without it, when
    /// the cluster's VMs are deleted, the account issued for it (the ServiceAccount named after
    /// the cluster in its VMs' namespace, if this service made it) is revoked.
    #[arg(long, env = "HARVESTER_CLOUD_KEEP_ACCOUNTS_OF_REMOVED_CLUSTERS")]
    pub keep_accounts_of_removed_clusters: bool,
    /// Let the VM load balancers' health checks probe these subnets (CIDR; repeat the flag or
    /// separate with commas) even though no VM can have such an address. By default a backend
    /// whose address is loopback, link-local, unspecified, multicast or broadcast is never
    /// connected to and counts as unhealthy; e.g. `--probe-allow-cidr 127.0.0.0/8` for backends
    /// on loopback in local development.
    #[arg(long, env = "HARVESTER_CLOUD_PROBE_ALLOW_CIDR", value_delimiter = ',', value_parser = parse_cidr)]
    pub probe_allow_cidr: Vec<crate::ipam::Cidr>,
    /// Kubernetes backend: run the reconcilers only while holding the `harvester-cloud-lb` Lease, so
    /// that several replicas are safe (`--leader-elect=false` for a single replica). The embedded
    /// backend always has exactly one.
    #[arg(long, env = "HARVESTER_CLOUD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Kubernetes backend: register Rancher's aggregation `APIService` (management.cattle.io/v3) of
    /// this name for `/v1/harvester/kubeconfig`, and serve the requests Rancher's dashboard sends
    /// there through the tunnel this service dials to Rancher (with the URL, token and CA Rancher
    /// writes into the APIService's Secret).
    #[arg(long, env = "HARVESTER_CLOUD_RANCHER_APISERVICE", value_parser = parse_apiservice_name)]
    pub rancher_apiservice: Option<String>,
    /// The Secret Rancher is to write for the APIService: `namespace/name`. Default:
    /// `<--harvester-namespace>/<APIService name>-aggregation`.
    #[arg(long, env = "HARVESTER_CLOUD_RANCHER_APISERVICE_SECRET", value_parser = parse_namespaced_name)]
    pub rancher_apiservice_secret: Option<(String, String)>,
    /// Kubernetes backend: answer admission reviews only from a client that presents a certificate
    /// signed by a CA in this PEM file (configure kube-apiserver's WebhookAdmissionConfiguration
    /// to present one). Without it they are answered for anyone who reaches the port, as
    /// Harvester's webhooks are, which lets them probe which IPPool ranges exist.
    #[arg(long, env = "HARVESTER_CLOUD_WEBHOOK_CLIENT_CA")]
    pub webhook_client_ca: Option<PathBuf>,
    /// Connections the API listener keeps open at once; past it, new ones wait in the backlog.
    #[arg(long, env = "HARVESTER_CLOUD_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// How long a client may take to send a request's head (and how long an idle keep-alive
    /// connection stays open), and a new connection its first request.
    #[arg(long, env = "HARVESTER_CLOUD_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_positive_duration)]
    pub header_timeout: Duration,
    /// After SIGTERM or Ctrl-C, how long in-flight requests may take before the process exits.
    #[arg(long, env = "HARVESTER_CLOUD_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// Address of the Prometheus metrics listener (plain HTTP, `GET /metrics`); the API port never
    /// serves metrics.
    #[arg(
        long,
        env = "HARVESTER_CLOUD_METRICS_LISTEN",
        default_value = "127.0.0.1:9090"
    )]
    pub metrics_listen: SocketAddr,
}

impl ServeArgs {
    /// The LoadBalancer reconciles in flight: `--lb-concurrency`, else the backend's default (the
    /// lb crate's constants say why each).
    pub fn lb_concurrency(&self) -> u16 {
        self.lb_concurrency.unwrap_or(match self.backend {
            BackendKind::Embedded => crate::lb::CONCURRENCY_EMBEDDED,
            BackendKind::Kube => crate::lb::CONCURRENCY_KUBE,
        })
    }
}

fn parse_apiservice_name(s: &str) -> Result<String, String> {
    crate::validation::dns1123_subdomain(s)?;
    Ok(s.to_string())
}

/// `namespace/name`, both valid Kubernetes names.
fn parse_namespaced_name(s: &str) -> Result<(String, String), String> {
    let (ns, name) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not namespace/name"))?;
    crate::validation::dns1123_label(ns)?;
    crate::validation::dns1123_subdomain(name)?;
    Ok((ns.to_string(), name.to_string()))
}

/// A [`parse_duration`] that is not zero.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// `500ms`, `30s`, `5m`, `12h`, `90d`, or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 5m, 12h or 90d"))?;
    let secs = |k: u64| n.checked_mul(k).map(Duration::from_secs);
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => None,
    }
    .ok_or_else(|| format!("{s:?} is not a duration like 30s, 5m, 12h or 90d"))
}

fn parse_ip(s: &str) -> Result<String, String> {
    s.parse::<std::net::IpAddr>()
        .map(|ip| ip.to_string())
        .map_err(|_| format!("invalid vip {s}: it must be an IPv4 or IPv6 address"))
}

fn parse_cidr(s: &str) -> Result<crate::ipam::Cidr, String> {
    crate::ipam::Cidr::parse(s.trim())
        .ok_or_else(|| format!("{s:?} is not a subnet in CIDR notation (e.g. 127.0.0.0/8)"))
}

fn parse_server_url(s: &str) -> Result<String, String> {
    let uri: axum::http::Uri = s
        .parse()
        .map_err(|e| format!("invalid server URL {s:?}: {e}"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("https" | "http"), Some(_)) => Ok(s.to_string()),
        _ => Err(format!(
            "invalid server URL {s:?}: it must be an absolute http(s) URL"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        for bad in ["", "x", "5w", "-1s", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_urls_and_vips() {
        assert!(parse_server_url("https://rancher.example/k8s/clusters/local").is_ok());
        assert!(parse_server_url("rancher.example").is_err());
        assert!(parse_server_url("ftp://x").is_err());
        assert_eq!(parse_ip("2001:db8::1"), Ok("2001:db8::1".into()));
        assert!(parse_ip("not-an-ip").is_err());
    }

    /// `--lb-concurrency` unset: 4096 on the embedded store, 128 on Kubernetes; given, it wins on
    /// either.
    #[test]
    fn lb_concurrency_defaults_by_backend() {
        let serve = |args: &[&str]| {
            let cli = Cli::try_parse_from(["harvester-cloud", "serve"].iter().chain(args)).unwrap();
            let Command::Serve(args) = cli.command else {
                panic!("serve")
            };
            args.lb_concurrency()
        };
        assert_eq!(serve(&[]), 4096);
        assert_eq!(serve(&["--backend", "embedded"]), 4096);
        assert_eq!(serve(&["--backend", "kube"]), 128);
        assert_eq!(
            serve(&["--backend", "kube", "--lb-concurrency", "2000"]),
            2000
        );
        assert_eq!(serve(&["--lb-concurrency", "16"]), 16);
    }

    #[test]
    fn cli_parses_with_defaults() {
        let cli = Cli::try_parse_from(["harvester-cloud", "serve"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve")
        };
        assert_eq!(args.listen, "127.0.0.1:8443".parse().unwrap());
        assert_eq!(cli.global.data_dir, PathBuf::from("./data"));
        assert!(
            Cli::try_parse_from([
                "harvester-cloud",
                "serve",
                "--http",
                "--tls-cert",
                "x",
                "--tls-key",
                "y"
            ])
            .is_err()
        );
        assert!(Cli::try_parse_from(["harvester-cloud", "serve", "--tls-cert", "x"]).is_err());
    }

    #[test]
    fn probe_allow_cidrs_are_a_list_of_subnets() {
        let serve = |extra: &[&str]| {
            let argv = ["harvester-cloud", "serve"].iter().chain(extra).copied();
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Serve(args)) => Ok(args.probe_allow_cidr),
                Ok(_) => panic!("serve"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(serve(&[]), Ok(vec![]));
        let parsed = serve(&[
            "--probe-allow-cidr",
            "127.0.0.0/8,::1/128",
            "--probe-allow-cidr",
            "169.254.0.0/16",
        ])
        .expect("parses");
        let shown: Vec<String> = parsed.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["127.0.0.0/8", "::1/128", "169.254.0.0/16"]);
        let e = serve(&["--probe-allow-cidr", "127.0.0.1"]).expect_err("not a CIDR");
        assert!(
            e.contains("\"127.0.0.1\" is not a subnet in CIDR notation"),
            "{e}"
        );
    }
}

/// Why no Kubernetes client configuration could be made from [`KubeArgs`].
#[derive(Debug, thiserror::Error)]
pub enum KubeConfigError {
    #[error("cannot read --kubeconfig {path}: {source}")]
    Read {
        path: String,
        source: kube::config::KubeconfigError,
    },
    /// `--context` of the default kubeconfig files.
    #[error("cannot use --context {context}: {source}")]
    Context {
        context: String,
        source: kube::config::KubeconfigError,
    },
    #[error(transparent)]
    Infer(#[from] kube::config::InferConfigError),
}

impl KubeArgs {
    /// The client configuration: `--kubeconfig` (and `--context`), else the in-cluster config or
    /// the usual files.
    pub async fn client_config(&self) -> Result<kube::Config, KubeConfigError> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let read = |source| KubeConfigError::Read {
                    path: path.display().to_string(),
                    source,
                };
                let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(read)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(read)
            }
            (None, Some(context)) => {
                kube::Config::from_kubeconfig(&options)
                    .await
                    .map_err(|source| KubeConfigError::Context {
                        context: context.clone(),
                        source,
                    })
            }
            (None, None) => Ok(kube::Config::infer().await?),
        }
    }
}
