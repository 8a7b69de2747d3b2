//! Hot reload: the config file is re-read on an interval (and on SIGHUP). A changed file is
//! parsed, validated and compiled in full, then swapped in atomically; requests already in
//! flight finish on the generation they started with. An invalid file is refused with a log
//! line and the previous config keeps serving.
//!
//! Re-reading through the path (rather than watching inodes) follows the kubelet's atomic
//! `..data` symlink swap of a mounted ConfigMap with no special casing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::mcp::Shared;
use crate::runtime::Runtime;

/// Reads and parses a config file (YAML or JSON). It is validated when it is compiled
/// ([`Runtime::compile`]), which every caller does next.
pub fn load_file(path: &Path) -> Result<toolgate_config::ProxyConfig, String> {
    load_file_with_digest(path).map(|(config, _)| config)
}

/// [`load_file`], and the SHA-256 of the bytes it parsed: given to [`StartOptions`]
/// (`config_sha256`), the watcher's first look at the file does not parse it again when it is
/// unchanged.
///
/// [`StartOptions`]: crate::StartOptions
pub fn load_file_with_digest(path: &Path) -> Result<(toolgate_config::ProxyConfig, [u8; 32]), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
    let config = toolgate_config::parse_text_unvalidated(text).map_err(|e| e.to_string())?;
    Ok((config, Sha256::digest(&bytes).into()))
}

/// Outcome of one reload attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The file is unchanged.
    Unchanged,
    /// A new generation is serving.
    Applied(u64),
    /// The file is invalid; the old config keeps serving.
    Refused(String),
}

/// Applies `text` if it differs from the served config, or if `force` (a file it references,
/// such as the credentials, changed).
pub fn apply(shared: &Shared, text: &str, force: bool) -> Reloaded {
    let old = shared.runtime.load_full();
    // Validated by Runtime::compile below.
    let config = match toolgate_config::parse_text_unvalidated(text) {
        Ok(c) => c,
        Err(e) => return Reloaded::Refused(e.to_string()),
    };
    if crate::runtime::config_digest(&config) == old.config_digest && !force {
        return Reloaded::Unchanged;
    }
    for (key, a, b) in [
        ("server.listen", &old.config.server.listen, &config.server.listen),
        (
            "server.adminListen",
            &old.config.server.admin_listen,
            &config.server.admin_listen,
        ),
    ] {
        if a != b {
            tracing::warn!(key, old = %a, new = %b, "changing a listen address needs a restart; the old address keeps serving");
        }
    }
    if old.config.server.metrics_listen != config.server.metrics_listen {
        tracing::warn!(
            key = "server.metricsListen",
            "changing the metrics listener needs a restart; the old one keeps serving"
        );
    }
    match Runtime::compile(config, old.generation + 1) {
        Ok(mut rt) => {
            rt.auth.keep_keys_of(&old.auth);
            let generation = rt.generation;
            let tools = rt.tools.len();
            shared.adopt(&rt);
            shared.runtime.store(Arc::new(rt));
            shared.subscriptions.reloaded(generation);
            let m = &crate::metrics::METRICS;
            m.config_reloads.with_label_values(&["applied"]).inc();
            m.config_generation.set(i64::try_from(generation).unwrap_or(i64::MAX));
            tracing::info!(generation, tools, "config reloaded");
            Reloaded::Applied(generation)
        }
        Err(e) => Reloaded::Refused(e.to_string()),
    }
}

/// Watches `path` until `stop` fires. `served_sha256` is the SHA-256 of the bytes the served
/// config was parsed from, when known.
pub async fn watch(
    path: PathBuf,
    shared: Arc<Shared>,
    interval: Duration,
    served_sha256: Option<[u8; 32]>,
    mut stop: watch::Receiver<bool>,
) {
    // The file is remembered by its SHA-256, not its bytes (a 1,000-tool config is 600 KB),
    // together with the fingerprint of the files it references. Seeded with what the served
    // generation was compiled from, an unchanged file is not parsed again on the first tick
    // (for 1,000 tools that parse costs 100 ms and raised peak RSS by a third), and a change
    // made before this task first ran still differs from it. Unknown, the first tick parses
    // the file and compares the config with the one being served.
    let mut last: Option<([u8; 32], [u8; 32])> = served_sha256.map(|sha| {
        let served = shared.runtime.load();
        (sha, served.files_fingerprint)
    });
    let mut last_error: Option<String> = None;
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let hangup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hangup = std::future::pending::<()>();
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = hangup => tracing::info!("SIGHUP: checking the config file"),
            _ = stop.changed() => return,
        }
        let bytes = match tokio::fs::read(&path).await {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("cannot read {}: {e}", path.display());
                if last_error.as_deref() != Some(msg.as_str()) {
                    crate::metrics::METRICS
                        .config_reloads
                        .with_label_values(&["unreadable"])
                        .inc();
                    tracing::error!(error = %msg, "config reload failed; the previous config keeps serving");
                    last_error = Some(msg);
                }
                continue;
            }
        };
        // Hashing the file, reading the files it references and compiling a changed config all
        // run off the workers (a large config compiles in tens of milliseconds), so that a proxy
        // with one worker keeps answering calls meanwhile.
        let checking = shared.clone();
        let Ok((attempt, refs_changed, bytes)) = tokio::task::spawn_blocking(move || {
            // Files the served config references (credentials, JWKS, upstream credential),
            // compared with what the served generation was compiled from.
            let served = checking.runtime.load_full();
            let refs = crate::runtime::fingerprint(&served.files);
            let refs_changed = refs != served.files_fingerprint;
            ((<[u8; 32]>::from(Sha256::digest(&bytes)), refs), refs_changed, bytes)
        })
        .await
        else {
            continue;
        };
        // Do not retry a refused attempt until something changes again.
        if last.as_ref() == Some(&attempt) {
            continue;
        }
        last = Some(attempt);
        let applying = shared.clone();
        let applied =
            tokio::task::spawn_blocking(move || apply(&applying, &String::from_utf8_lossy(&bytes), refs_changed))
                .await
                .unwrap_or_else(|e| Reloaded::Refused(format!("the reload stopped: {e}")));
        match applied {
            Reloaded::Refused(e) => {
                crate::metrics::METRICS
                    .config_reloads
                    .with_label_values(&["refused"])
                    .inc();
                tracing::error!(path = %path.display(), problems = %e, "config reload refused; the previous config keeps serving");
                last_error = Some(e);
            }
            Reloaded::Applied(_) | Reloaded::Unchanged => last_error = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:1'}\npolicy: {audit: {enabled: false}}\ntools:\n  - {name: t, inputSchema: {type: object, properties: {a: {type: string}}}, http: {method: GET, path: /}}\n";

    #[test]
    fn the_same_config_is_no_change_and_a_changed_tool_is() {
        let config = toolgate_config::parse_text(TEXT).unwrap();
        let shared = Shared::new(Runtime::compile(config, 1).unwrap());
        // The served runtime keeps its tools compiled, not in `config`: the comparison must
        // still see the same config as the same.
        assert!(matches!(apply(&shared, TEXT, false), Reloaded::Unchanged));
        assert!(matches!(apply(&shared, TEXT, true), Reloaded::Applied(2)), "forced");
        let changed = TEXT.replace("{type: string}", "{type: integer}");
        assert!(matches!(apply(&shared, &changed, false), Reloaded::Applied(3)));
        assert!(matches!(apply(&shared, &changed, false), Reloaded::Unchanged));
        assert!(matches!(apply(&shared, "tools: [", false), Reloaded::Refused(_)));
        assert_eq!(shared.runtime.load().generation, 3);
    }
}
