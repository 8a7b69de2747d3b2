//! The operator as a real process, and the loopback ports the processes a test starts listen on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{control_plane, http_get};

/// The ports [`held_port`] gave out. Binds to port 0 draw from half the ephemeral range, so two
/// picks in a row would otherwise return the same port about once in 7,000, and two operators
/// then race for it under one lease identity.
static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A free loopback port (never one given before in this process) held bound without
/// listening, for a process started later to listen on: while the socket is kept, no bind to
/// port 0 and no outgoing connection in this process is given the port, and the process can
/// still bind it by number beside the socket (both reuse the address). Drop the socket once
/// that process listens.
pub fn held_port() -> (u16, tokio::net::TcpSocket) {
    loop {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return (port, socket);
        }
    }
}

/// A `toolgate-operator` process watching one namespace.
pub struct Operator {
    child: Child,
    /// The admin port, held for the operator's lifetime (it listens beside the socket).
    _held: tokio::net::TcpSocket,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

/// The operator's log filter: `TEST_OPERATOR_LOG` (for example `debug,hyper=info`) when set.
fn operator_log() -> String {
    std::env::var("TEST_OPERATOR_LOG").unwrap_or_else(|_| "info,kube_runtime=warn".into())
}

impl Operator {
    /// Starts the operator with `kubeconfig` and exactly `args` (plus a loopback admin port).
    pub fn start_as(kubeconfig: &Path, args: &[&str]) -> Self {
        let (port, held) = held_port();
        let admin = SocketAddr::from(([127, 0, 0, 1], port));
        let log = control_plane().dir.join(format!("operator-sa-{}.log", admin.port()));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate-operator"))
            .args(args)
            .args([
                "--admin-listen",
                &admin.to_string(),
                "--identity",
                &format!("op-{}", admin.port()),
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("TOOLGATE_LOG", operator_log())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start toolgate-operator");
        Self {
            child,
            admin,
            log,
            _held: held,
        }
    }

    /// Starts the operator for `ns` with lease `<ns>/<lease>`.
    pub fn start(ns: &str, lease: &str, extra: &[&str]) -> Self {
        let (port, held) = held_port();
        let admin = SocketAddr::from(([127, 0, 0, 1], port));
        let log = control_plane().dir.join(format!("operator-{ns}-{}.log", admin.port()));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_toolgate-operator"))
            .args(["--namespace", ns, "--lease-namespace", ns, "--lease-name", lease])
            .args([
                "--admin-listen",
                &admin.to_string(),
                "--identity",
                &format!("op-{}", admin.port()),
            ])
            .args(["--lease-duration-seconds", "3"])
            .args(extra)
            .env("KUBECONFIG", &control_plane().kubeconfig)
            .env("TOOLGATE_LOG", operator_log())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start toolgate-operator");
        Self {
            child,
            admin,
            log,
            _held: held,
        }
    }

    /// Sends `signal` and waits for the process to exit.
    pub fn stop_with(&mut self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The operator's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/metrics` as served.
    pub fn metrics_text(&self) -> String {
        http_get(self.admin, "/metrics").unwrap_or_default()
    }

    /// `/metrics`, parsed into `name{labels}` → value.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let body = http_get(self.admin, "/metrics").unwrap_or_default();
        body.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                l.rsplit_once(' ')
                    .and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            })
            .collect()
    }

    /// Sum of every series of `name`.
    pub fn total(&self, name: &str) -> f64 {
        self.metrics()
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name))
            .map(|(_, v)| v)
            .sum()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
