//! JSON logs on stderr with a filter that can be replaced while the process runs (the admin
//! port's `/loglevel`).

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

static HANDLE: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static CURRENT: OnceLock<std::sync::Mutex<String>> = OnceLock::new();

/// Installs the global subscriber: JSON lines on stderr, filter from `TOOLGATE_LOG` (else
/// `RUST_LOG`, else `default`).
pub fn init(default: &str) {
    let text = std::env::var("TOOLGATE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .filter(|t| EnvFilter::try_new(t).is_ok())
        .unwrap_or_else(|| default.to_string());
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&text));
    let fmt = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(std::io::stderr);
    if tracing_subscriber::registry().with(filter).with(fmt).try_init().is_ok() {
        let _ = HANDLE.set(handle);
        let _ = CURRENT.set(std::sync::Mutex::new(text));
    }
}

/// The filter in force, for example `info` or `info,toolgate_proxy=debug`.
pub fn current() -> String {
    CURRENT
        .get()
        .map(|c| c.lock().map(|s| s.clone()).unwrap_or_default())
        .unwrap_or_default()
}

/// Replaces the filter (same syntax as `TOOLGATE_LOG`); an invalid one is refused and the old
/// one stays.
pub fn set(text: &str) -> Result<(), String> {
    let text = text.trim();
    let filter = EnvFilter::try_new(text).map_err(|e| format!("invalid log filter `{text}`: {e}"))?;
    let handle = HANDLE.get().ok_or("logging is not initialized")?;
    handle.reload(filter).map_err(|e| e.to_string())?;
    if let Some(c) = CURRENT.get() {
        if let Ok(mut c) = c.lock() {
            *c = text.to_string();
        }
    }
    tracing::info!(filter = text, "log level changed");
    Ok(())
}
