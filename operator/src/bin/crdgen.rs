//! Prints the CustomResourceDefinitions as YAML documents (`crdgen > crds/toolgate.yaml`).
use kube::CustomResourceExt;
use toolgate_operator::crd::{McpServer, McpTool};

fn main() -> anyhow::Result<()> {
    for crd in [McpServer::crd(), McpTool::crd()] {
        print!("---\n{}", serde_saphyr::to_string(&crd)?);
    }
    Ok(())
}
