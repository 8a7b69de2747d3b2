//! The store the replicas of one server share (`policy.rateLimit.store`): a Redis or Valkey
//! server holding the per-identity and per-tool rate-limit state and the sealed sessions that
//! `DELETE` ended. Nothing else lives there, and nothing a request needs lives only in one
//! replica's memory once it is configured.
//!
//! One `tools/call` costs one round trip: a Lua script (run atomically by the server) checks
//! the session's revocation and both limits with GCRA on the server's clock (so replicas'
//! clocks do not matter) and commits both limits only when both admit the call. Keys carry the
//! subject's digest as a hash tag, so each script touches one slot of a cluster.
//!
//! The store is never waited on for long: each operation has `timeoutMs`, and after a failure
//! it is marked down for a backoff (200 ms doubling to 5 s) during which calls do not ask it
//! and `failurePolicy` decides at once. Across operations that backoff is the only retry (within
//! one, a connection found broken is tried once more): the connection manager makes one
//! connection attempt per reconnect, so a refused connection (Redis restarting, a Service
//! without ready endpoints) fails the operation at once instead of holding it for `timeoutMs`
//! while the manager's own retries run. After a failure the next try is on a new connection,
//! made (and the script loaded) in the background meanwhile: the manager reconnects by itself
//! only after an I/O error, so a password Redis refused (its Secret rotated before Redis), a
//! primary demoted by a failover or a connection that no longer gets answers would otherwise be
//! kept for good. A connection younger than its connect timeout is not given up on a timeout,
//! so a connect slower than `timeoutMs` still completes. The first connection is made the same
//! way as soon as the store is built, not within the first call's `timeoutMs`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use toolgate_config::{FailurePolicy, RedisConfig};

use crate::metrics::METRICS;
use crate::policy::ratelimit::Rate;

const MIN_BACKOFF_MS: u64 = 200;
const MAX_BACKOFF_MS: u64 = 5_000;

/// GCRA over up to two limits, plus a revocation check, in one atomic step.
/// KEYS[1]: the session's revocation key (ARGV[1] = "1" to check it); KEYS[2..]: limit keys;
/// ARGV[2k], ARGV[2k+1]: interval and tolerance of KEYS[k+1] in microseconds.
/// Returns {0, 0} admitted, {-1, 0} revoked, {k, retry_us} refused by the k-th limit.
const ADMIT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  return {-1, 0}
end
local next_tat = {}
for i = 2, #KEYS do
  local interval = tonumber(ARGV[2 * i - 2])
  local tolerance = tonumber(ARGV[2 * i - 1])
  local tat = tonumber(redis.call('GET', KEYS[i]))
  if tat == nil or tat < now then tat = now end
  if tat - now > tolerance then
    return {i - 1, math.floor(tat - now - tolerance)}
  end
  next_tat[i] = tat + interval
end
for i = 2, #KEYS do
  local ttl_ms = math.ceil((next_tat[i] - now) / 1000) + 1
  redis.call('SET', KEYS[i], string.format('%.0f', next_tat[i]), 'PX', ttl_ms)
end
return {0, 0}
";

/// What the store is configured with, files read.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The config section.
    pub config: RedisConfig,
    /// From `passwordFile`.
    pub password: Option<String>,
    /// From `caFile`.
    pub ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("config", &self.config)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Why the store did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Marked down after a recent failure: not asked.
    Down,
    /// No answer within `timeoutMs`.
    Timeout,
    /// The server or the connection failed.
    Failed(String),
}

/// The store's verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Counted.
    Admitted,
    /// Over the limit of this scope (`identity` or `tool`); retry after.
    Limited(&'static str, Duration),
    /// The session was ended by `DELETE` on some replica.
    Revoked,
}

/// A connection to the shared store.
pub struct Store {
    /// What it was built from (a reload with equal settings keeps the connection).
    pub settings: StoreSettings,
    conn: arc_swap::ArcSwap<Managed>,
    /// What a new connection manager is made from, after a failure.
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    timeout: Duration,
    /// The longest a connection may take to be made.
    connect_timeout: Duration,
    admit: redis::Script,
    epoch: Instant,
    down_until_ms: AtomicU64,
    backoff_ms: AtomicU64,
    /// Set and cleared only with `last_error` locked, so the two always agree.
    down: AtomicBool,
    /// Why the last operation failed, while none has succeeded since (`/readyz` reports it).
    last_error: std::sync::Mutex<Option<StoreError>>,
}

/// Makes `conn`'s connection and loads `script` on it, in the background. Its outcome shows in
/// the next operation; a failure here is not one.
fn warm(conn: &ConnectionManager, script: &redis::Script) {
    let (mut conn, script) = (conn.clone(), script.clone());
    tokio::spawn(async move {
        let _ = script.load_async(&mut conn).await;
    });
}

/// A connection manager and when it was made.
struct Managed {
    conn: ConnectionManager,
    made: Instant,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// GCRA parameters of `rate` in microseconds: (emission interval, burst tolerance).
fn gcra(rate: Rate) -> (u64, u64) {
    let window = micros(rate.window).max(1);
    let interval = (window / rate.requests.max(1)).max(1);
    (interval, window.saturating_sub(interval))
}

impl Store {
    /// A store for `settings`; connects in the background (call inside a Tokio runtime).
    pub fn connect(settings: StoreSettings) -> Result<Self, String> {
        let c = &settings.config;
        let mut info = redis::IntoConnectionInfo::into_connection_info(c.url.as_str())
            .map_err(|e| format!("policy.rateLimit.store.redis.url: {e}"))?;
        let mut redis_info = info.redis_settings().clone();
        if let Some(u) = &c.username {
            redis_info = redis_info.set_username(u);
        }
        if let Some(p) = &settings.password {
            redis_info = redis_info.set_password(p);
        }
        info = info.set_redis_settings(redis_info);
        let client = match &settings.ca {
            Some(ca) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            None => redis::Client::open(info),
        }
        .map_err(|e| format!("policy.rateLimit.store.redis: {e}"))?;
        let timeout = Duration::from_millis(c.timeout_ms.max(1));
        let connect_timeout = timeout.max(Duration::from_secs(1));
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout))
            // One attempt per reconnect: `run`'s backoff decides when to try again.
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| format!("policy.rateLimit.store.redis: {e}"))?;
        let admit = redis::Script::new(ADMIT);
        // Connected and the script loaded before the first call, rather than within its
        // `timeoutMs` (a TLS handshake alone can take longer than the 50 ms default).
        warm(&conn, &admit);
        METRICS.store_up.set(1);
        Ok(Self {
            settings,
            conn: arc_swap::ArcSwap::from_pointee(Managed {
                conn,
                made: Instant::now(),
            }),
            client,
            manager_config: config,
            timeout,
            connect_timeout,
            admit,
            epoch: Instant::now(),
            down_until_ms: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(MIN_BACKOFF_MS),
            down: AtomicBool::new(false),
            last_error: std::sync::Mutex::new(None),
        })
    }

    /// What to do while the store cannot answer.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.settings.config.failure_policy
    }

    fn key(&self, subject: &str, rest: &str) -> String {
        format!("{}{{{subject}}}:{rest}", self.settings.config.key_prefix)
    }

    /// Replaces `used` (the manager an operation failed on) with a new one, unless another
    /// failure did already, and makes its connection and loads the script in the background:
    /// the next try, after the backoff, then finds them ready.
    fn renew(&self, used: &Arc<Managed>) {
        if !Arc::ptr_eq(&self.conn.load(), used) {
            return;
        }
        let conn = match ConnectionManager::new_lazy_with_config(self.client.clone(), self.manager_config.clone()) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "the shared store's connection could not be renewed");
                return;
            }
        };
        let fresh = Arc::new(Managed {
            conn,
            made: Instant::now(),
        });
        let prev = self.conn.compare_and_swap(used, Arc::clone(&fresh));
        if Arc::ptr_eq(&prev, used) {
            warm(&fresh.conn, &self.admit);
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the store is marked down now (calls do not ask it).
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed) && self.now_ms() < self.down_until_ms.load(Ordering::Relaxed)
    }

    /// Whether the last operation failed (and none has succeeded since).
    pub fn failing(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Why the last operation failed, while none has succeeded since.
    pub fn last_error(&self) -> Option<StoreError> {
        self.last_error_slot().clone()
    }

    fn last_error_slot(&self) -> std::sync::MutexGuard<'_, Option<StoreError>> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store's state for `/readyz`: reported, never failed on (failing readiness while
    /// Redis is away would take every replica out at once, and `failurePolicy` already says
    /// what calls get meanwhile).
    pub fn status(&self) -> serde_json::Value {
        let last = self.last_error();
        serde_json::json!({
            "up": last.is_none(),
            "lastError": last.map(|e| match e {
                StoreError::Down => "marked down".to_owned(),
                StoreError::Timeout => format!("no answer within {} ms", self.timeout.as_millis()),
                StoreError::Failed(m) => m,
            }),
        })
    }

    /// Runs one operation (`attempt` makes a fresh try of it) within `timeoutMs`. A connection
    /// that broke since the last use (Redis restarted, a failover) fails the first try; the
    /// manager reconnects at once and one more try fits in the same deadline.
    async fn run<T, F, Fut>(&self, op: &'static str, attempt: F) -> Result<T, StoreError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        if self.is_down() {
            METRICS.store_operations.with_label_values(&[op, "skipped"]).inc();
            return Err(StoreError::Down);
        }
        let started = Instant::now();
        let used = self.conn.load_full();
        let tries = async {
            match attempt(used.conn.clone()).await {
                Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() => {
                    attempt(used.conn.clone()).await
                }
                other => other,
            }
        };
        let outcome = match tokio::time::timeout(self.timeout, tries).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout),
            Ok(Err(e)) => Err(StoreError::Failed(e.to_string())),
            Err(_) => Err(StoreError::Timeout),
        };
        METRICS
            .store_duration
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        match &outcome {
            Ok(_) => {
                METRICS.store_operations.with_label_values(&[op, "ok"]).inc();
                self.backoff_ms.store(MIN_BACKOFF_MS, Ordering::Relaxed);
                // The lock only on the way back up, never on the path of every call.
                if self.down.load(Ordering::Relaxed) {
                    let mut last = self.last_error_slot();
                    if self.down.swap(false, Ordering::Relaxed) {
                        *last = None;
                        METRICS.store_up.set(1);
                        tracing::info!(op, "the shared store answers again");
                    }
                }
            }
            Err(e) => {
                let result = if *e == StoreError::Timeout { "timeout" } else { "error" };
                // A timeout on a connection still being made is no reason to start over.
                if *e != StoreError::Timeout || used.made.elapsed() >= self.connect_timeout {
                    self.renew(&used);
                }
                METRICS.store_operations.with_label_values(&[op, result]).inc();
                let backoff = self.backoff_ms.load(Ordering::Relaxed);
                self.backoff_ms
                    .store((backoff * 2).min(MAX_BACKOFF_MS), Ordering::Relaxed);
                self.down_until_ms
                    .store(self.now_ms().saturating_add(backoff), Ordering::Relaxed);
                let was_down = {
                    let mut last = self.last_error_slot();
                    *last = Some(e.clone());
                    self.down.swap(true, Ordering::Relaxed)
                };
                if !was_down {
                    METRICS.store_up.set(0);
                    let policy = match self.failure_policy() {
                        FailurePolicy::FailOpen => "failOpen: limits are counted on each replica",
                        FailurePolicy::FailClosed => "failClosed: write-tier calls are refused",
                    };
                    tracing::warn!(op, error = ?e, backoff_ms = backoff, policy, "the shared store does not answer");
                }
            }
        }
        outcome
    }

    /// Checks `session` (a sealed session's handle) and counts one call of `subject` (a digest)
    /// against `identity` and, when set, the tool's own limit.
    pub async fn admit(
        &self,
        subject: &str,
        identity: Rate,
        tool: Option<(&str, Rate)>,
        session: Option<&str>,
    ) -> Result<Admission, StoreError> {
        let mut inv = self.admit.prepare_invoke();
        match session {
            Some(h) => inv.key(self.key(subject, &format!("rev:{h}"))).arg("1"),
            None => inv.key(self.key(subject, "rev:-")).arg("0"),
        };
        let (i, t) = gcra(identity);
        inv.key(self.key(subject, "id")).arg(i).arg(t);
        if let Some((name, rate)) = tool {
            let (i, t) = gcra(rate);
            inv.key(self.key(subject, &format!("tool:{name}"))).arg(i).arg(t);
        }
        let inv = &inv;
        let (code, retry_us): (i64, u64) = self
            .run("admit", |mut conn| async move { inv.invoke_async(&mut conn).await })
            .await?;
        Ok(match code {
            0 => Admission::Admitted,
            -1 => Admission::Revoked,
            1 => Admission::Limited("identity", Duration::from_micros(retry_us)),
            _ => Admission::Limited("tool", Duration::from_micros(retry_us)),
        })
    }

    /// Records that the session `handle` of `subject` ended, for as long as its id could open.
    pub async fn revoke(&self, subject: &str, handle: &str, remaining: Duration) -> Result<(), StoreError> {
        let ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.key(subject, &format!("rev:{handle}")))
            .arg("1")
            .arg("PX")
            .arg(ms);
        let cmd = &cmd;
        self.run(
            "revoke",
            |mut conn| async move { cmd.query_async::<()>(&mut conn).await },
        )
        .await
    }

    /// Whether the session `handle` of `subject` was ended on some replica.
    pub async fn is_revoked(&self, subject: &str, handle: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.key(subject, &format!("rev:{handle}")));
        let cmd = &cmd;
        self.run("check_session", |mut conn| async move {
            cmd.query_async::<bool>(&mut conn).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcra_parameters_spread_the_window_over_the_requests() {
        let r = Rate {
            requests: 10,
            window: Duration::from_secs(60),
        };
        assert_eq!(gcra(r), (6_000_000, 54_000_000));
        let one = Rate {
            requests: 1,
            window: Duration::from_secs(1),
        };
        assert_eq!(gcra(one), (1_000_000, 0), "one per window: no burst");
    }

    #[test]
    fn settings_never_print_the_password() {
        let s = StoreSettings {
            config: toolgate_config::RedisConfig {
                url: "redis://127.0.0.1:6379".into(),
                username: None,
                password_file: Some("/x".into()),
                ca_file: None,
                key_prefix: "toolgate:".into(),
                timeout_ms: 50,
                failure_policy: FailurePolicy::FailOpen,
            },
            password: Some("hunter2-secret".into()),
            ca: None,
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
