//! Where a config's memory goes: the bytes jemalloc counts as allocated after each step of
//! loading a config and serving every tool once (parse, compile, each tool's validator, each
//! tool's metric series), so a change shows which part it moved. RSS adds the binary's code,
//! stacks and the allocator's own pages to this; `bench/rss-load.py` measures that.
//!
//!     cargo run --release -p toolgate-proxy --features heap-stats --example heap -- CONFIG
//!
//! For example the benchmark's 1,000 tools with distinct schemas:
//!
//!     BENCH_TOOLS=1000 BENCH_DISTINCT=1 bench/config.py /tmp/p.yaml 8080 8931 9464
//!     cargo run --release -p toolgate-proxy --features heap-stats --example heap -- /tmp/p.yaml
use std::path::PathBuf;
use std::time::Duration;

use tikv_jemalloc_ctl::{epoch, stats};
use toolgate_proxy::{config::ToolConfig, metrics::METRICS, runtime::CompiledTool, Runtime};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn allocated() -> usize {
    epoch::advance().expect("jemalloc epoch");
    stats::allocated::read().expect("jemalloc stats")
}

/// Prints what was allocated since `before` and moves `before` on.
fn step(what: &str, before: &mut usize) {
    let now = allocated();
    let delta = (now as f64 - *before as f64) / 1024.0;
    println!(
        "{what:<46} {delta:>9.1} KiB   (allocated {:>5.1} MiB)",
        now as f64 / 1048576.0
    );
    *before = now;
}

fn main() {
    let Some(path) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: heap CONFIG");
        std::process::exit(2);
    };
    println!(
        "inline sizes: CompiledTool {} B (of which ToolConfig {} B)",
        std::mem::size_of::<CompiledTool>(),
        std::mem::size_of::<ToolConfig>()
    );
    let mut at = allocated();
    std::sync::LazyLock::force(&METRICS);
    step("metrics registry", &mut at);
    let config = toolgate_proxy::reload::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    step("config parsed", &mut at);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let runtime = rt
        .block_on(async { Runtime::compile(config, 1) })
        .expect("the config compiles");
    step(
        &format!("compiled ({} tools; parsed config dropped)", runtime.tools.len()),
        &mut at,
    );
    for t in &runtime.tools {
        t.input.get().expect("a loaded schema compiles");
    }
    step("every input validator compiled", &mut at);
    for t in &runtime.tools {
        METRICS.tool_call(&t.config.name, "success", "read", Duration::from_millis(1));
        METRICS
            .upstream_duration
            .with_label_values(&[&t.config.name, "200"])
            .observe(0.001);
        METRICS
            .mcp_operation_duration
            .with_label_values(&["tools/call", &t.config.name, "execute_tool", "", "", "2025-06-18"])
            .observe(0.001);
    }
    step("every tool's metric series (one call each)", &mut at);
    let text = METRICS.render();
    let size = text.len();
    drop(text);
    println!("a /metrics scrape renders {} KiB of text", size / 1024);
    drop(runtime);
    step("runtime dropped", &mut at);
}
