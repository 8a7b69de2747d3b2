//! `example-service [--listen 127.0.0.1:8080]`: the REST service of the Toolgate quickstart.

use std::net::SocketAddr;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen: SocketAddr = "127.0.0.1:8080".parse()?;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                listen = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--listen needs an address"))?
                    .parse()?
            }
            "-h" | "--help" => {
                println!("usage: example-service [--listen ADDR]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument `{other}` (try --help)"),
        }
    }
    toolgate_example_service::run(listen).await
}
