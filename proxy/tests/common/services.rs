//! Real servers from the distribution, started and stopped by the tests on loopback: Redis
//! (`redis-server`) and an nginx round-robin load balancer. Their absence is a failure, not a
//! skip: `test.sh` installs them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, hold};

fn binary(name: &str, hint: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let p = PathBuf::from(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: {hint} (test.sh installs it)");
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolgate-{tag}-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A `redis-server` on a loopback port with a password, no persistence; with TLS, only a TLS
/// port (certificate for `localhost` and 127.0.0.1, from a CA of its own) and an ACL user
/// `toolgate` holding the password.
pub struct Redis {
    pub port: u16,
    pub password: String,
    /// The CA that signed the server's certificate (PEM), when TLS.
    pub ca: Option<PathBuf>,
    dir: PathBuf,
    child: Option<Child>,
    /// While stopped, the port stays bound without a listener: connections are refused as
    /// with nothing there, and no other test's listener can take the port before `restart`.
    held: Option<tokio::net::TcpSocket>,
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let bin = binary("openssl", "apt-get install openssl");
    let out = Command::new(bin).current_dir(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<ca>.crt`, `<ca>.key`) and a certificate it signs for `localhost` and 127.0.0.1
/// (`server.crt`, `server.key`), in `dir`.
pub fn certificates(dir: &std::path::Path, ca: &str) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca_key = format!("{ca}.key");
    let ca_crt = format!("{ca}.crt");
    openssl(
        dir,
        &[
            &["req", "-x509"],
            &ec[..],
            &[
                "-keyout",
                &ca_key,
                "-out",
                &ca_crt,
                "-subj",
                "/CN=toolgate test CA",
                "-days",
                "2",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            &["req"],
            &ec[..],
            &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
}

impl Redis {
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// TLS only, with the ACL user `toolgate`.
    pub async fn start_tls() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> Self {
        let dir = tempdir("redis");
        let ca = tls.then(|| {
            certificates(&dir, "ca");
            dir.join("ca.crt")
        });
        let mut r = Self {
            port: 0,
            password: format!("redis-pw-{}", unique()),
            ca,
            dir,
            child: None,
            held: None,
        };
        // A port taken between choosing and binding makes redis-server exit: choose again.
        for _ in 0..5 {
            r.port = free_port();
            if r.spawn().await {
                return r;
            }
        }
        panic!("redis-server did not start; see {}", r.dir.display());
    }

    async fn spawn(&mut self) -> bool {
        let bin = binary("redis-server", "apt-get install redis-server");
        let log = std::fs::File::create(self.dir.join("redis.log")).unwrap();
        let port = self.port.to_string();
        let mut cmd = Command::new(bin);
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir"])
            .arg(&self.dir);
        if self.ca.is_some() {
            let pass = format!(">{}", self.password);
            cmd.args(["--port", "0", "--tls-port", &port, "--tls-auth-clients", "no"])
                .args([
                    "--tls-cert-file",
                    "server.crt",
                    "--tls-key-file",
                    "server.key",
                    "--tls-ca-cert-file",
                    "ca.crt",
                ])
                .args([
                    "--user", "toolgate", "on", &pass, "~*", "&*", "+@all", "--user", "default", "off",
                ])
                .current_dir(&self.dir);
        } else {
            cmd.args(["--port", &port, "--requirepass", &self.password]);
        }
        let child = cmd
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false;
            }
            if self.ping().await {
                // redis-server reuses the address too, so it binds beside the held socket;
                // only now, with the server listening, is the port let go.
                self.held = None;
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn url(&self) -> String {
        match self.ca {
            Some(_) => format!("rediss://localhost:{}/0", self.port),
            None => format!("redis://127.0.0.1:{}/0", self.port),
        }
    }

    async fn connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let info = redis::IntoConnectionInfo::into_connection_info(self.url().as_str()).ok()?;
        let mut settings = info.redis_settings().clone().set_password(&self.password);
        if self.ca.is_some() {
            settings = settings.set_username("toolgate");
        }
        let info = info.set_redis_settings(settings);
        let client = match &self.ca {
            Some(ca) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).ok()?),
                },
            )
            .ok()?,
            None => redis::Client::open(info).ok()?,
        };
        tokio::time::timeout(Duration::from_secs(1), client.get_multiplexed_async_connection())
            .await
            .ok()?
            .ok()
    }

    pub async fn ping(&self) -> bool {
        let Some(mut c) = self.connection().await else {
            return false;
        };
        redis::cmd("PING").query_async::<String>(&mut c).await.is_ok()
    }

    /// Keys matching `pattern`.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.connection().await.expect("redis answers");
        redis::cmd("KEYS").arg(pattern).query_async(&mut c).await.unwrap()
    }

    /// `CLIENT LIST`: one line per connection, with the last command it sent (`cmd=`).
    pub async fn client_list(&self) -> String {
        let mut c = self.connection().await.expect("redis answers");
        redis::cmd("CLIENT").arg("LIST").query_async(&mut c).await.unwrap()
    }

    /// Makes the server require `password` from now on (connections already open stay).
    pub async fn require_password(&mut self, password: &str) {
        let mut c = self.connection().await.expect("redis answers");
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(password)
            .query_async::<()>(&mut c)
            .await
            .unwrap();
        self.password = password.to_owned();
    }

    /// Pauses (`true`, SIGSTOP) or resumes (`false`, SIGCONT) the server: paused, it accepts
    /// connections (the kernel does) and answers nothing.
    pub fn pause(&self, paused: bool) {
        let child = self.child.as_ref().expect("redis-server runs");
        let signal = if paused { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }

    /// Kills the server (SIGKILL: no goodbye to clients) and holds its port.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            // Best effort: should the port be taken in between, restart() says so.
            self.held = hold(self.port).ok();
        }
    }

    /// Starts the server again on the same port (empty: nothing was persisted).
    pub async fn restart(&mut self) {
        self.stop();
        assert!(self.spawn().await, "redis-server restarts on port {}", self.port);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx balancing round-robin over `backends`, each request on its own (so consecutive
/// requests of one client land on different backends) and on a new upstream connection, so a
/// stopped backend refuses the connection before any byte is sent and the request goes to the
/// next one (nginx never resends a POST it has already sent). `X-Upstream` names the backend.
pub struct Balancer {
    pub addr: SocketAddr,
    dir: PathBuf,
    child: Child,
}

impl Balancer {
    pub async fn start(backends: &[SocketAddr]) -> Self {
        let bin = binary("nginx", "apt-get install nginx-light");
        let dir = tempdir("nginx");
        // The port is chosen before nginx binds it, so another test's listener can take it
        // in between; nginx then retries its bind for seconds while a bare connect reaches
        // that other listener. Only nginx answers this path with this token.
        let token = format!("toolgate-balancer-{}-{}", std::process::id(), unique());
        for _ in 0..5 {
            let port = free_port();
            let servers: String = backends
                .iter()
                .map(|b| format!("    server {b} max_fails=1 fail_timeout=60s;\n"))
                .collect();
            let d = dir.display();
            let conf = format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
                 events {{ worker_connections 512; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                 \x20 upstream replicas {{\n{servers}  }}\n\
                 \x20 server {{\n    listen 127.0.0.1:{port};\n    location = /.toolgate-balancer {{\n      return 200 \"{token}\";\n    }}\n    location / {{\n      proxy_pass http://replicas;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_set_header Host 127.0.0.1;\n      proxy_buffering off;\n      proxy_read_timeout 60s;\n      proxy_next_upstream error timeout;\n      add_header X-Upstream $upstream_addr always;\n    }}\n  }}\n}}\n"
            );
            std::fs::write(dir.join("nginx.conf"), conf).unwrap();
            let log = std::fs::File::create(dir.join("stderr.log")).unwrap();
            let mut child = Command::new(&bin)
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(dir.join("nginx.conf"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if answers(addr, &token).await {
                    return Self { addr, dir, child };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nginx did not start; see {}", dir.display());
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// Whether the server on `addr` answers `GET /.toolgate-balancer` with `token`.
async fn answers(addr: SocketAddr, token: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /.toolgate-balancer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await.ok()?;
        Some(answer)
    };
    match tokio::time::timeout(Duration::from_secs(1), exchange).await {
        Ok(Some(answer)) => {
            let text = String::from_utf8_lossy(&answer);
            text.starts_with("HTTP/1.1 200") && text.ends_with(token)
        }
        _ => false,
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
