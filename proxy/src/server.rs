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
    /// SHA-256 of the bytes of `config_path` the config was parsed from
    /// ([`crate::reload::load_file_with_digest`]): an unchanged file is then not parsed again.
    pub config_sha256: Option<[u8; 32]>,
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
            config_sha256: None,
            reload_interval: Duration::from_secs(1),
            bind_host: None,
        }
    }
}

/// The proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The config is invalid.
    #[error("invalid config {0}")]
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
        // One grace for open connections and for the upstream calls that outlive them, so the
        // whole shutdown is bounded by delay + grace + the audit flush below (5 s), which the
        // operator's termination grace for a gateway pod covers.
        let grace = Duration::from_secs(self.shared.runtime.load().config.server.shutdown_grace_seconds);
        let deadline = tokio::time::Instant::now() + grace;
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        // Then write out the audit records still queued.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !self.shared.in_flight.wait_idle(left).await {
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

/// The Tokio runtime the proxy serves on. `TOOLGATE_WORKER_THREADS` pins the number of worker
/// threads; the default is the CPUs this process may use (`available_parallelism`, which
/// honours a container's CPU quota). With one worker the runtime is a current-thread one: a
/// sidecar limited to one CPU then spends nothing on waking a second worker to steal work that
/// is not there (on the dev machine, a `tools/call` at concurrency 1 costs 79 µs of CPU with a
/// one-worker multi-thread runtime against 104 µs with two; see `bench/proxy-vs-direct.sh`).
pub fn tokio_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let workers = std::env::var("TOOLGATE_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.enable_all().build()
}

/// Compiles `config`, binds both listeners and starts serving in the background.
pub async fn start(config: ProxyConfig, opts: StartOptions) -> Result<Running, StartError> {
    let runtime = Runtime::compile(config, 1)?;
    let grace = Duration::from_secs(runtime.config.server.shutdown_grace_seconds);
    let max_connections = runtime.config.server.max_connections;
    let per_peer = PeerCap {
        limit: runtime.config.server.max_connections_per_ip,
        counts: Arc::default(),
    };
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
    let exempt = shared.clone();
    tasks.push(tokio::spawn(accept_loop(
        mcp_listener,
        stop_rx.clone(),
        grace,
        max_connections,
        Some((per_peer, move |ip: std::net::IpAddr| {
            let rt = exempt.runtime.load();
            rt.trusted_proxies.iter().any(|c| c.contains(ip))
        })),
        move |req, peer| mcp::handle(s.clone(), req, peer),
    )));
    let s = shared.clone();
    tasks.push(tokio::spawn(accept_loop(
        admin_listener,
        stop_rx.clone(),
        grace,
        64,
        NO_PEER_CAP,
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
            NO_PEER_CAP,
            move |req, _| admin::handle(s.clone(), req, admin::Listener::Metrics),
        )));
    }
    tasks.push(tokio::spawn(sweep_sessions(shared.clone(), stop_rx.clone())));
    if let Some(path) = opts.config_path {
        tasks.push(tokio::spawn(reload::watch(
            path,
            shared.clone(),
            opts.reload_interval,
            opts.config_sha256,
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

/// Open connections by client address.
type PeerCounts = Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// Open connections per client address (IPv6: per /64), with a limit.
struct PeerCap {
    limit: usize,
    counts: PeerCounts,
}

/// One connection counted in a [`PeerCap`] until it closes.
struct PeerSlot {
    key: std::net::IpAddr,
    counts: PeerCounts,
}

impl PeerCap {
    /// A slot for a connection from `ip`, or `None` when that address has `limit` open.
    fn admit(&self, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let key = crate::policy::clientip::counting_key(ip);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            key,
            counts: self.counts.clone(),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// A connection in accept order, until it sends its first request.
struct Unused {
    used: Arc<std::sync::atomic::AtomicBool>,
    abort: tokio::task::AbortHandle,
}

/// Closes the oldest connection that has not sent a request; whether there was one.
fn evict_oldest_unused(unused: &mut std::collections::VecDeque<Unused>) -> bool {
    while let Some(u) = unused.pop_front() {
        if !u.used.load(std::sync::atomic::Ordering::Relaxed) && !u.abort.is_finished() {
            u.abort.abort();
            crate::metrics::METRICS
                .connections_refused
                .with_label_values(&["evicted_unused"])
                .inc();
            return true;
        }
    }
    false
}

/// Whether a peer is exempt from the per-address limit (a trusted proxy).
type Exempt = fn(std::net::IpAddr) -> bool;

/// The admin and metrics listeners have no per-address limit (their own total is small).
const NO_PEER_CAP: Option<(PeerCap, Exempt)> = None;

async fn accept_loop<F, Fut, E>(
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
    max_connections: usize,
    per_peer: Option<(PeerCap, E)>,
    handler: F,
) where
    F: Fn(Request<Incoming>, std::net::SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
    E: Fn(std::net::IpAddr) -> bool + Send + Sync + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut conns = tokio::task::JoinSet::new();
    let mut unused: std::collections::VecDeque<Unused> = std::collections::VecDeque::new();
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
                // One address may hold only its share; a trusted proxy is many clients.
                let slot = match &per_peer {
                    Some((cap, exempt)) if !exempt(peer.ip()) => match cap.admit(peer.ip()) {
                        Some(slot) => Some(slot),
                        None => {
                            crate::metrics::METRICS.connections_refused.with_label_values(&["per_ip"]).inc();
                            drop(stream);
                            continue;
                        }
                    },
                    _ => None,
                };
                // At the limit, a connection that has not sent a request yet (idle since it was
                // accepted, or dripping its first headers) makes room: the oldest such one is
                // closed, so idle sockets cannot lock well-behaved clients out.
                let permit = match Arc::clone(&permits).try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) if per_peer.is_some() && evict_oldest_unused(&mut unused) => {
                        tokio::time::timeout(Duration::from_millis(100), Arc::clone(&permits).acquire_owned())
                            .await
                            .ok()
                            .and_then(Result::ok)
                    }
                    Err(_) => None,
                };
                let Some(permit) = permit else {
                    if per_peer.is_some() {
                        crate::metrics::METRICS.connections_refused.with_label_values(&["total"]).inc();
                    }
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
                let used = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let first = used.clone();
                let svc = service_fn(move |req| {
                    first.store(true, std::sync::atomic::Ordering::Relaxed);
                    let h = h.clone();
                    async move { Ok::<_, std::convert::Infallible>(h(req, peer).await) }
                });
                let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
                let abort = conns.spawn(async move {
                    let _permit = permit;
                    let _slot = slot;
                    let _ = conn.await;
                });
                if per_peer.is_some() {
                    // Entries that were used or have ended leave from the front.
                    while unused
                        .front()
                        .is_some_and(|u: &Unused| u.used.load(std::sync::atomic::Ordering::Relaxed) || u.abort.is_finished())
                    {
                        unused.pop_front();
                    }
                    unused.push_back(Unused { used, abort });
                }
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
