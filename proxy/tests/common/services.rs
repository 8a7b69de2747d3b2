//! Real servers from the distribution, started and stopped by the tests on loopback: Redis
//! (`redis-server`) and an nginx round-robin load balancer. Their absence is a failure, not a
//! skip: `test.sh` installs them.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

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

/// A `redis-server` on a loopback port with a password, no persistence.
pub struct Redis {
    pub port: u16,
    pub password: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    pub async fn start() -> Self {
        let mut r = Self {
            port: 0,
            password: format!("redis-pw-{}", unique()),
            dir: tempdir("redis"),
            child: None,
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
        let child = Command::new(bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--requirepass", &self.password, "--dir"])
            .arg(&self.dir)
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
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let info = redis::IntoConnectionInfo::into_connection_info(self.url().as_str()).ok()?;
        let settings = info.redis_settings().clone().set_password(&self.password);
        let client = redis::Client::open(info.set_redis_settings(settings)).ok()?;
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

    /// Kills the server (SIGKILL: no goodbye to clients).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
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
                 \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://replicas;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_set_header Host 127.0.0.1;\n      proxy_buffering off;\n      proxy_read_timeout 60s;\n      proxy_next_upstream error timeout;\n      add_header X-Upstream $upstream_addr always;\n    }}\n  }}\n}}\n"
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
                if tokio::net::TcpStream::connect(addr).await.is_ok() {
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

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
