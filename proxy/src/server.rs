//! Listeners, connection handling and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use toolgate_config::ProxyConfig;

use crate::mcp::{Body, Shared};
use crate::runtime::{CompileError, Runtime};
use crate::{admin, mcp, reload};

/// How the proxy is started.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The file the config came from; watched for changes when set.
    pub config_path: Option<PathBuf>,
    /// How often the config file is checked for changes.
    pub reload_interval: Duration,
    /// Bind both listeners on this address instead of the host in `server.listen` and
    /// `server.adminListen` (ports are kept): runs a pod's config outside the pod.
    pub bind_host: Option<std::net::IpAddr>,
}

impl Default for StartOptions {
    fn default() -> Self {
        Self {
            config_path: None,
            reload_interval: Duration::from_secs(1),
            bind_host: None,
        }
    }
}

/// The proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is invalid.
    #[error(transparent)]
    Config(#[from] CompileError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A started proxy.
pub struct Running {
    /// Bound address of the MCP listener.
    pub mcp_addr: SocketAddr,
    /// Bound address of the admin listener.
    pub admin_addr: SocketAddr,
    /// Bound address of the metrics listener (`server.metricsListen`), if any.
    pub metrics_addr: Option<SocketAddr>,
    /// Shared state (live config, sessions).
    pub shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, waits for in-flight requests (up to the grace period), then returns.
    pub async fn shutdown(self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        // Listen streams end first, with a final result, so their clients listen elsewhere.
        self.shared.subscriptions.close_all();
        let delay = self.shared.runtime.load().config.server.shutdown_delay_seconds;
        if delay > 0 {
            tracing::info!(
                delay_seconds = delay,
                "readiness fails; still serving while traffic moves away"
            );
            tokio::time::sleep(Duration::from_secs(delay)).await;
        }
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        // Upstream calls outlive their connections; give them the same grace, then write out
        // the audit records still queued.
        let grace = Duration::from_secs(self.shared.runtime.load().config.server.shutdown_grace_seconds);
        if !self.shared.in_flight.wait_idle(grace).await {
            tracing::warn!("upstream calls still running after the grace period");
        }
        if !self.shared.auditor.load().flush(Duration::from_secs(5)).await {
            tracing::warn!("some audit records could not be written before exit");
        }
    }
}

async fn bind(addr: &str, host: Option<std::net::IpAddr>) -> Result<TcpListener, StartError> {
    let addr = match (host, addr.parse::<std::net::SocketAddr>()) {
        (Some(ip), Ok(a)) => std::net::SocketAddr::new(ip, a.port()).to_string(),
        _ => addr.to_string(),
    };
    TcpListener::bind(&addr).await.map_err(|source| StartError::Bind {
        addr: addr.to_string(),
        source,
    })
}

/// Compiles `config`, binds both listeners and starts serving in the background.
pub async fn start(config: ProxyConfig, opts: StartOptions) -> Result<Running, StartError> {
    let runtime = Runtime::compile(config, 1)?;
    let grace = Duration::from_secs(runtime.config.server.shutdown_grace_seconds);
    let max_connections = runtime.config.server.max_connections;
    let mcp_listener = bind(&runtime.config.server.listen, opts.bind_host).await?;
    let admin_listener = bind(&runtime.config.server.admin_listen, opts.bind_host).await?;
    let mcp_addr = mcp_listener.local_addr().map_err(|source| StartError::Bind {
        addr: "mcp".into(),
        source,
    })?;
    let admin_addr = admin_listener.local_addr().map_err(|source| StartError::Bind {
        addr: "admin".into(),
        source,
    })?;
    let metrics_listener = match &runtime.config.server.metrics_listen {
        Some(addr) => Some(bind(addr, opts.bind_host).await?),
        None => None,
    };
    let metrics_addr = match &metrics_listener {
        Some(l) => Some(l.local_addr().map_err(|source| StartError::Bind {
            addr: "metrics".into(),
            source,
        })?),
        None => None,
    };
    crate::metrics::METRICS
        .config_generation
        .set(i64::try_from(runtime.generation).unwrap_or(i64::MAX));
    let shared = Arc::new(Shared::new(runtime));
    let (stop, stop_rx) = watch::channel(false);

    let mut tasks = Vec::new();
    let s = shared.clone();
    tasks.push(tokio::spawn(accept_loop(
        mcp_listener,
        stop_rx.clone(),
        grace,
        max_connections,
        move |req, peer| mcp::handle(s.clone(), req, peer),
    )));
    let s = shared.clone();
    tasks.push(tokio::spawn(accept_loop(
        admin_listener,
        stop_rx.clone(),
        grace,
        64,
        move |req, _| {
            let listener = admin::Listener::Admin {
                metrics: metrics_addr.is_none(),
            };
            admin::handle(s.clone(), req, listener)
        },
    )));
    if let Some(l) = metrics_listener {
        let s = shared.clone();
        tasks.push(tokio::spawn(accept_loop(
            l,
            stop_rx.clone(),
            grace,
            64,
            move |req, _| admin::handle(s.clone(), req, admin::Listener::Metrics),
        )));
    }
    tasks.push(tokio::spawn(sweep_sessions(shared.clone(), stop_rx.clone())));
    if let Some(path) = opts.config_path {
        tasks.push(tokio::spawn(reload::watch(
            path,
            shared.clone(),
            opts.reload_interval,
            stop_rx,
        )));
    }
    tracing::info!(
        mcp = %mcp_addr,
        admin = %admin_addr,
        tools = shared.runtime.load().tools.len(),
        upstream = %shared.runtime.load().config.upstream.base_url,
        "toolgate-proxy serving"
    );
    Ok(Running {
        mcp_addr,
        admin_addr,
        metrics_addr,
        shared,
        stop,
        tasks,
    })
}

async fn sweep_sessions(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(30)) => {
                let ttl = Duration::from_secs(shared.runtime.load().config.server.session_ttl_seconds);
                shared.sessions.sweep(ttl);
            }
            _ = stop.changed() => return,
        }
    }
}

async fn accept_loop<F, Fut>(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
    max_connections: usize,
    handler: F,
) where
    F: Fn(Request<Incoming>, std::net::SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut conns = tokio::task::JoinSet::new();
    let mut refused_logged = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                while conns.try_join_next().is_some() {}
                // A bounded number of open connections: past it, new ones are closed at once.
                let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                    if !refused_logged {
                        tracing::warn!(max_connections, "connection limit reached; closing new connections");
                        refused_logged = true;
                    }
                    drop(stream);
                    continue;
                };
                refused_logged = false;
                let _ = stream.set_nodelay(true);
                let h = handler.clone();
                let svc = service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, std::convert::Infallible>(h(req, peer).await) }
                });
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
                conns.spawn(async move {
                    let _permit = permit;
                    let _ = conn.await;
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!(grace_seconds = grace.as_secs(), "grace period over; closing remaining connections");
            conns.abort_all();
        }
    }
}
