//! toolgate-operator: parse flags, start the admin port, win the lease, run the controllers,
//! drain on SIGTERM and give the lease up.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use toolgate_operator::admin::{self, Admin};
use toolgate_operator::controller::{self, RunConfig};
use toolgate_operator::guard::Guard;
use toolgate_operator::inject::ProxyDefaults;
use toolgate_operator::leader::{LeaderElector, LeaseConfig};
use toolgate_operator::metrics::Metrics;
use tracing::{error, info, warn};

const EX_USAGE: u8 = 64;

const USAGE: &str = "usage: toolgate-operator [options]
  --admin-listen ADDR       /healthz, /readyz, /metrics (default 0.0.0.0:8081; env TOOLGATE_ADMIN_LISTEN)
  --proxy-image IMAGE       default proxy image of McpServers (env TOOLGATE_PROXY_IMAGE)
  --namespace NS            watch one namespace (default all; env WATCH_NAMESPACE)
  --lease-namespace NS      namespace of the leader Lease (default env POD_NAMESPACE, else the
                            service account's namespace, else default)
  --lease-name NAME         name of the leader Lease (default toolgate-operator)
  --identity ID             this replica in the Lease (default env POD_NAME, else host-pid)
  --lease-duration-seconds N  how long a lease lasts without renewal (default 15; renewed
                            every third of it)
  --no-leader-election      run without a Lease (one replica only)
  --allowed-proxy-images LIST  comma-separated image repositories (any tag or digest; a
                            trailing * is a prefix) McpServers may run as the proxy (env
                            TOOLGATE_ALLOWED_PROXY_IMAGES; default: the repository of
                            --proxy-image)
  --trust-namespace-secrets mount any Secret an McpServer names in its namespace (default:
                            only Secrets labelled toolgate.dev/usage=proxy)
  --session-key-propagation-seconds N  how long each step of a session-key rotation is held
                            so every pod's mounted Secret is up to date (default 120; 1-3600)
  --protected-namespace NS  never serve McpServers in NS (default env POD_NAMESPACE, else the
                            service account's namespace: the operator's own)
The Kubernetes API is reached through KUBECONFIG or the in-cluster service account.";

struct Flags {
    admin: SocketAddr,
    run: RunConfig,
    lease: Option<LeaseConfig>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn parse(args: &[String]) -> Result<Flags, String> {
    let mut admin = env("TOOLGATE_ADMIN_LISTEN").unwrap_or_else(|| "0.0.0.0:8081".into());
    let mut image = env("TOOLGATE_PROXY_IMAGE");
    let mut namespace = env("WATCH_NAMESPACE");
    let sa_ns = std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok();
    let own_ns = env("POD_NAMESPACE").or(sa_ns.map(|s| s.trim().to_string()));
    let mut lease_ns = own_ns.clone().unwrap_or_else(|| "default".into());
    let mut protected = own_ns;
    let mut allowed_images = env("TOOLGATE_ALLOWED_PROXY_IMAGES");
    let mut trust_secrets = false;
    let mut propagation = None;
    let mut lease_name = "toolgate-operator".to_string();
    let host = env("HOSTNAME").unwrap_or_else(|| "toolgate-operator".into());
    let mut identity = env("POD_NAME").unwrap_or_else(|| format!("{host}-{}", std::process::id()));
    let mut election = true;
    let mut lease_seconds = 15u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{flag} needs a value"))
        };
        match flag {
            "--admin-listen" => admin = value()?,
            "--proxy-image" => image = Some(value()?),
            "--namespace" => namespace = Some(value()?),
            "--lease-namespace" => lease_ns = value()?,
            "--lease-name" => lease_name = value()?,
            "--identity" => identity = value()?,
            "--lease-duration-seconds" => {
                lease_seconds = value()?
                    .parse()
                    .ok()
                    .filter(|s| (3..=300).contains(s))
                    .ok_or("--lease-duration-seconds must be 3-300")?
            }
            "--no-leader-election" => election = false,
            "--allowed-proxy-images" => allowed_images = Some(value()?),
            "--trust-namespace-secrets" => trust_secrets = true,
            "--session-key-propagation-seconds" => {
                propagation = Some(
                    value()?
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (1..=3600).contains(n))
                        .ok_or("--session-key-propagation-seconds must be 1-3600")?,
                )
            }
            "--protected-namespace" => protected = Some(value()?).filter(|n| !n.is_empty()),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let admin = admin
        .parse()
        .map_err(|_| format!("--admin-listen: `{admin}` is not an address like 0.0.0.0:8081"))?;
    let mut defaults = ProxyDefaults::default();
    if let Some(i) = image {
        defaults.image = i;
    }
    if let Some(p) = propagation {
        defaults.session_key_propagation = std::time::Duration::from_secs(p);
    }
    let guard = Guard {
        allowed_images: allowed_images
            .iter()
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .map(str::to_string)
            .collect(),
        trust_namespace_secrets: trust_secrets,
        protected_namespace: protected,
    };
    if !guard.image_allowed(&defaults.image, &defaults.image) {
        return Err(format!(
            "--proxy-image {} is not in --allowed-proxy-images: no McpServer could run",
            defaults.image
        ));
    }
    Ok(Flags {
        admin,
        run: RunConfig {
            namespace,
            defaults,
            guard,
            instance: Some(identity.clone()),
        },
        lease: election.then_some(LeaseConfig {
            namespace: lease_ns,
            name: lease_name,
            identity,
            duration: Duration::from_secs(lease_seconds),
            renew_every: Duration::from_secs(lease_seconds) / 3,
        }),
    })
}

fn init_logging() {
    toolgate_telemetry::log::init("info,kube_runtime=warn");
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags = match parse(&args) {
        Ok(f) => f,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("toolgate-operator: {e}\n{USAGE}");
            return ExitCode::from(EX_USAGE);
        }
    };
    init_logging();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run(flags))
}

async fn run(flags: Flags) -> ExitCode {
    let metrics = Arc::new(Metrics::new());
    let admin_state = Arc::new(Admin {
        metrics: metrics.clone(),
        ready: false.into(),
    });
    match admin::serve(flags.admin, admin_state.clone()).await {
        Ok(addr) => info!(%addr, "admin listening"),
        Err(e) => {
            error!(addr = %flags.admin, error = %e, "cannot bind the admin port");
            return ExitCode::FAILURE;
        }
    }
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "no Kubernetes API: set KUBECONFIG or run in a pod with a service account");
            return ExitCode::FAILURE;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let mut elector = flags.lease.map(|cfg| LeaderElector::new(client.clone(), cfg));
    admin_state.ready.store(true, Ordering::Relaxed);
    // Lead until shutdown. Losing the lease (another replica took it, or the API server was
    // unreachable past the renew deadline) stops the controllers and campaigns again, so a
    // kube-apiserver restart costs a pause, not the process.
    loop {
        if let Some(e) = elector.as_mut() {
            let cfg = e.config().clone();
            info!(lease = %format!("{}/{}", cfg.namespace, cfg.name), identity = %cfg.identity, "waiting for the lease");
            loop {
                match e.try_acquire_or_renew().await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(err) => warn!(error = %err, "lease request failed"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(cfg.renew_every) => {}
                    _ = stopped(stop_rx.clone()) => return ExitCode::SUCCESS,
                }
            }
            info!("leading");
        }
        metrics.leader.set(1);
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
        let renew = async {
            let Some(e) = elector.as_mut() else {
                return std::future::pending::<()>().await;
            };
            let cfg = e.config().clone();
            let deadline = cfg.duration.mul_f32(2.0 / 3.0);
            let mut last = Instant::now();
            loop {
                tokio::time::sleep(cfg.renew_every).await;
                // Bounded, so a stalled connection cannot keep a leader past its deadline.
                match tokio::time::timeout(cfg.renew_every, e.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => last = Instant::now(),
                    Ok(Ok(false)) => {
                        error!("the lease was taken by another replica; stepping down");
                        return;
                    }
                    Ok(Err(err)) => warn!(error = %err, "lease renewal failed"),
                    Err(_) => warn!("lease renewal timed out"),
                }
                if last.elapsed() > deadline {
                    error!("could not renew the lease in time; stepping down");
                    return;
                }
            }
        };
        let stop = {
            let stop_rx = stop_rx.clone();
            async move {
                tokio::select! {
                    _ = stopped(stop_rx) => {}
                    _ = stopped(lost_rx) => {}
                }
            }
        };
        let controllers = controller::run(client.clone(), flags.run.clone(), metrics.clone(), stop);
        tokio::pin!(controllers);
        let lost = tokio::select! {
            _ = &mut controllers => false,
            _ = renew => {
                // Stop reconciling now; in-flight reconciles get a moment, then are dropped.
                let _ = lost_tx.send(true);
                let _ = tokio::time::timeout(Duration::from_secs(2), controllers).await;
                true
            }
        };
        metrics.leader.set(0);
        if !lost {
            break;
        }
    }
    if let Some(e) = elector.as_mut() {
        if let Err(err) = e.release().await {
            warn!(error = %err, "could not release the lease");
        }
    }
    info!("stopped");
    ExitCode::SUCCESS
}
