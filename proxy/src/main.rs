//! `toolgate-proxy`: serve (`--config FILE`), validate (`check FILE`) or print the config
//! schema (`schema`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use toolgate_proxy::{reload, start, StartOptions};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const EX_USAGE: u8 = 64;

const USAGE: &str = "usage:
  toolgate-proxy --config FILE [--reload-interval-ms N] [--bind-host IP]
                                      serve MCP in front of the configured upstream;
                                      --bind-host overrides the listen hosts (ports kept)
  toolgate-proxy check FILE                               validate a config; list every problem
  toolgate-proxy schema                                   print the JSON Schema of ProxyConfig
  toolgate-proxy import openapi SPEC [--server NAME] [--namespace NS]
      [--include GLOB]... [--exclude GLOB]... [--format mcptool|proxyconfig]
      [--base-url URL] [--no-output-schema] [--output FILE]
                                      one tool per operation of an OpenAPI 3.0/3.1 spec (YAML
                                      or JSON); GLOB matches operationId or tag, `tag:GLOB`,
                                      or a path (`/pets/*`); skipped operations are commented
  toolgate-proxy --version";

fn init_logging() {
    toolgate_telemetry::log::init("info");
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("toolgate-proxy: {msg}\n{USAGE}");
    ExitCode::from(EX_USAGE)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("check") => {
            let Some(path) = args.get(1) else {
                return usage_error("check needs a FILE");
            };
            // Everything `--config` checks: the document, then the files it references
            // (credentials, JWKS, upstream credential, admin token, session keys, the store's
            // password and CA), each problem with its key.
            let compiled = reload::load_file(PathBuf::from(path).as_path()).and_then(|c| {
                let tools = c.tools.len();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the runtime: {e}"))?;
                rt.block_on(async { toolgate_proxy::Runtime::compile(c, 1) })
                    .map(|_| tools)
                    .map_err(|e| e.to_string())
            });
            match compiled {
                Ok(tools) => {
                    println!("{path}: ok ({tools} tools)");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{path}: {e}");
                    ExitCode::from(EX_USAGE)
                }
            }
        }
        Some("import") => match args.get(1).map(String::as_str) {
            Some("openapi") => import_openapi(&args[2..]),
            _ => usage_error("import needs a kind: `import openapi SPEC`"),
        },
        Some("schema") => {
            println!(
                "{}",
                serde_json::to_string_pretty(&toolgate_config::ProxyConfig::json_schema()).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Some("--version" | "-V") => {
            println!("toolgate-proxy {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(_) => serve(&args),
        None => usage_error("missing --config FILE"),
    }
}

fn import_openapi(args: &[String]) -> ExitCode {
    use toolgate_proxy::import::{self, Format, Options};
    let mut opts = Options::default();
    let mut spec = None;
    let mut output = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        let set = match a.as_str() {
            "--server" => value(a).map(|v| opts.server = v),
            "--namespace" => value(a).map(|v| opts.namespace = Some(v)),
            "--include" => value(a).map(|v| opts.filter.include.push(v)),
            "--exclude" => value(a).map(|v| opts.filter.exclude.push(v)),
            "--base-url" => value(a).map(|v| opts.base_url = Some(v)),
            "--output" | "-o" => value(a).map(|v| output = Some(v)),
            "--no-output-schema" => {
                opts.output_schemas = false;
                Ok(())
            }
            "--format" => value(a).and_then(|v| {
                opts.format = match v.as_str() {
                    "mcptool" => Format::McpTool,
                    "proxyconfig" => Format::ProxyConfig,
                    other => return Err(format!("--format is mcptool or proxyconfig, not `{other}`")),
                };
                Ok(())
            }),
            other if other.starts_with('-') => Err(format!("unknown argument `{other}`")),
            path if spec.is_none() => {
                spec = Some(path.to_string());
                Ok(())
            }
            extra => Err(format!("one SPEC only (`{extra}` is a second)")),
        };
        if let Err(e) = set {
            return usage_error(&e);
        }
    }
    let Some(path) = spec else {
        return usage_error("import openapi needs a SPEC file");
    };
    opts.json = output.as_deref().is_some_and(|o| o.ends_with(".json")) && opts.format == Format::ProxyConfig;
    opts.source = std::path::Path::new(&path)
        .file_name()
        .map_or(path.clone(), |n| n.to_string_lossy().into_owned());
    let done = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {path}: {e}"))
        .and_then(|text| import::parse(&text))
        .and_then(|doc| import::import(doc, &opts));
    let result = match done {
        Ok(r) => r,
        Err(e) => {
            eprintln!("toolgate-proxy: {path}: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let written = match &output {
        Some(file) => std::fs::write(file, &result.text).map_err(|e| format!("cannot write {file}: {e}")),
        None => {
            print!("{}", result.text);
            Ok(())
        }
    };
    if let Err(e) = written {
        eprintln!("toolgate-proxy: {e}");
        return ExitCode::FAILURE;
    }
    let tools = result.tools().count();
    if opts.json {
        for (o, reason) in result.skipped() {
            eprintln!("skipped {}: {reason}", o.route);
        }
    }
    if opts.format == Format::McpTool && result.text.len() > 900 * 1024 {
        eprintln!(
            "note: these tools are {} KiB of config and one McpServer's ConfigMap holds at most 1 MiB: import a part for each server (--include tag:NAME)",
            result.text.len() / 1024
        );
    }
    eprintln!(
        "{path}: {tools} tools from {} operations of {}; {} skipped (reasons in the output's comments)",
        result.operations.len(),
        result.title,
        result.operations.len() - tools
    );
    ExitCode::SUCCESS
}

fn serve(args: &[String]) -> ExitCode {
    let mut config = None;
    let mut interval = Duration::from_secs(1);
    let mut bind_host = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => config = it.next().map(PathBuf::from),
            "--reload-interval-ms" => match it.next().and_then(|v| v.parse::<u64>().ok()).filter(|v| *v > 0) {
                Some(ms) => interval = Duration::from_millis(ms),
                None => return usage_error("--reload-interval-ms needs a positive number"),
            },
            "--bind-host" => match it.next().and_then(|v| v.parse::<std::net::IpAddr>().ok()) {
                Some(ip) => bind_host = Some(ip),
                None => return usage_error("--bind-host needs an IP address, for example 127.0.0.1"),
            },
            other => return usage_error(&format!("unknown argument `{other}`")),
        }
    }
    let Some(path) = config else {
        return usage_error("missing --config FILE");
    };
    init_logging();
    let (cfg, config_sha256) = match reload::load_file_with_digest(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("toolgate-proxy: invalid config {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let rt = match toolgate_proxy::server::tokio_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toolgate-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        toolgate_proxy::otel::init_from_env();
        let running = match start(
            cfg,
            StartOptions {
                config_path: Some(path),
                config_sha256: Some(config_sha256),
                reload_interval: interval,
                bind_host,
            },
        )
        .await
        {
            Ok(r) => r,
            Err(e) => {
                eprintln!("toolgate-proxy: {e}");
                return ExitCode::from(EX_USAGE);
            }
        };
        wait_for_signal().await;
        tracing::info!("shutting down: draining in-flight requests");
        running.shutdown().await;
        toolgate_proxy::otel::shutdown(Duration::from_secs(2)).await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
