//! JSON logs on stderr with a filter that can be replaced while the process runs (the admin
//! port's `/loglevel`).
//!
//! The filter is a list of `LEVEL` and `TARGET=LEVEL` directives (`info,toolgate_proxy=debug`),
//! matched by target prefix ([`Targets`]). `EnvFilter`'s span and field directives are not
//! offered: they need the `env-filter` feature, whose regex matching switches on the `regex`
//! crate's full-DFA build for every regex in the process, and a config's 1,000 distinct
//! `pattern`s then cost about 10 KiB and 100 µs each more to compile.

use std::sync::OnceLock;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, Registry};

static HANDLE: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();
static CURRENT: OnceLock<std::sync::Mutex<String>> = OnceLock::new();

/// Installs the global subscriber: JSON lines on stderr, filter from `TOOLGATE_LOG` (else
/// `RUST_LOG`, else `default`).
pub fn init(default: &str) {
    let text = std::env::var("TOOLGATE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .filter(|t| parse(t).is_ok())
        .unwrap_or_else(|| default.to_string());
    let filter = parse(&text).unwrap_or_else(|_| Targets::new().with_default(tracing::Level::INFO));
    let (filter, handle) = reload::Layer::new(filter);
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
    let filter = parse(text).map_err(|e| format!("invalid log filter `{text}`: {e}"))?;
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

/// Parses a filter: comma-separated `LEVEL`, `TARGET=LEVEL` or bare `TARGET` (all levels)
/// directives, where a target is a module path (`toolgate_proxy::mcp`). Anything else is refused
/// with the directive named, rather than read as a target that matches nothing.
fn parse(text: &str) -> Result<Targets, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the filter is empty (say `error` to log errors only)".into());
    }
    for directive in text.split(',') {
        let target = directive.split_once('=').map_or(directive, |(t, _)| t).trim();
        let path = target
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-');
        if target.is_empty() || !path {
            return Err(format!(
                "`{directive}` is not `LEVEL`, `TARGET=LEVEL` or a module path (span and field filters are not supported)"
            ));
        }
        directive
            .trim()
            .parse::<Targets>()
            .map_err(|e| format!("`{directive}`: {e}"))?;
    }
    text.replace(' ', "").parse::<Targets>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse;
    use tracing::Level;
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn levels_and_targets_parse() {
        let f = parse("info,toolgate_proxy=debug, hyper::proto=warn").unwrap();
        assert_eq!(f.default_level(), Some(LevelFilter::INFO));
        assert!(f.would_enable("toolgate_proxy::mcp", &Level::DEBUG));
        assert!(!f.would_enable("hyper::proto::h1", &Level::INFO));
        assert!(!f.would_enable("kube_runtime", &Level::DEBUG));
        assert!(parse("toolgate_operator")
            .unwrap()
            .would_enable("toolgate_operator::render", &Level::TRACE));
    }

    #[test]
    fn bad_filters_are_refused_with_the_directive_named() {
        for (text, says) in [
            ("", "empty"),
            ("  ", "empty"),
            ("info,[[[", "`[[[`"),
            ("info,", "``"),
            ("x[{a}]=debug", "span and field"),
            ("toolgate_proxy=loud", "loud"),
            ("a=b=c", "="),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
