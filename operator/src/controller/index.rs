//! Indexes kept beside the watch caches, so a reconcile looks up its own tools instead of
//! scanning every McpTool in scope (1,000 servers × 10 tools made that 10,000 checks per
//! reconcile).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use kube::runtime::watcher;
use kube::ResourceExt;

use crate::crd::McpTool;

/// Tool names by the `namespace/server` their `serverRef` names.
#[derive(Default)]
struct Names {
    by_server: HashMap<String, BTreeSet<String>>,
    server_of: HashMap<String, String>,
}

impl Names {
    fn insert(&mut self, t: &McpTool) {
        self.remove(t);
        let ns = t.namespace().unwrap_or_default();
        let server = format!("{ns}/{}", t.spec.server_ref.name);
        self.by_server.entry(server.clone()).or_default().insert(t.name_any());
        self.server_of.insert(format!("{ns}/{}", t.name_any()), server);
    }

    fn remove(&mut self, t: &McpTool) {
        let ns = t.namespace().unwrap_or_default();
        let Some(server) = self.server_of.remove(&format!("{ns}/{}", t.name_any())) else {
            return;
        };
        if let Some(names) = self.by_server.get_mut(&server) {
            names.remove(&t.name_any());
            if names.is_empty() {
                self.by_server.remove(&server);
            }
        }
    }
}

/// Which tools name which server, kept from the McpTool watch after the cache has applied
/// each event; a relist is built aside and replaces the index when complete.
#[derive(Default)]
pub struct ToolIndex {
    now: Mutex<Names>,
    relist: Mutex<Option<Names>>,
}

impl ToolIndex {
    /// Applies one event of the McpTool watch.
    pub fn observe(&self, event: &watcher::Event<McpTool>) {
        match event {
            watcher::Event::Apply(t) => self.now.lock().expect("lock").insert(t),
            watcher::Event::Delete(t) => self.now.lock().expect("lock").remove(t),
            watcher::Event::Init => *self.relist.lock().expect("lock") = Some(Names::default()),
            watcher::Event::InitApply(t) => self
                .relist
                .lock()
                .expect("lock")
                .get_or_insert_with(Names::default)
                .insert(t),
            watcher::Event::InitDone => {
                if let Some(names) = self.relist.lock().expect("lock").take() {
                    *self.now.lock().expect("lock") = names;
                }
            }
        }
    }

    /// Names of the tools whose `serverRef` names `server` in `ns`, in order.
    pub fn tools_of(&self, ns: &str, server: &str) -> Vec<String> {
        let now = self.now.lock().expect("lock");
        now.by_server
            .get(&format!("{ns}/{server}"))
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Which tools each server last rendered into its config, both ways: a tool moving to
/// another server also reconciles the one it left.
#[derive(Default)]
pub struct Served(Mutex<Rendered>);

#[derive(Default)]
struct Rendered {
    tools_of: HashMap<String, Vec<String>>,
    server_of: HashMap<String, String>,
}

impl Served {
    /// Server `server` in `ns` now serves `tools` (and no other).
    pub fn record(&self, ns: &str, server: &str, tools: Vec<String>) {
        let mut r = self.0.lock().expect("lock");
        let key = format!("{ns}/{server}");
        for t in r.tools_of.remove(&key).unwrap_or_default() {
            let tool = format!("{ns}/{t}");
            if r.server_of.get(&tool).is_some_and(|s| s == server) {
                r.server_of.remove(&tool);
            }
        }
        for t in &tools {
            r.server_of.insert(format!("{ns}/{t}"), server.to_string());
        }
        if !tools.is_empty() {
            r.tools_of.insert(key, tools);
        }
    }

    /// The server that last rendered tool `tool` in `ns`.
    pub fn server_of(&self, ns: &str, tool: &str) -> Option<String> {
        self.0
            .lock()
            .expect("lock")
            .server_of
            .get(&format!("{ns}/{tool}"))
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, server: &str) -> McpTool {
        McpTool::test(name).with(json!({"serverRef": {"name": server}}))
    }

    #[test]
    fn the_index_follows_a_tool_moving_and_a_relist() {
        let i = ToolIndex::default();
        i.observe(&watcher::Event::Apply(tool("t1", "a")));
        i.observe(&watcher::Event::Apply(tool("t2", "a")));
        assert_eq!(i.tools_of("demo", "a"), ["t1", "t2"]);
        i.observe(&watcher::Event::Apply(tool("t1", "b")));
        assert_eq!(i.tools_of("demo", "a"), ["t2"]);
        assert_eq!(i.tools_of("demo", "b"), ["t1"]);
        i.observe(&watcher::Event::Delete(tool("t2", "a")));
        assert!(i.tools_of("demo", "a").is_empty());
        // A relist without t1: it is gone once the relist completes, not before.
        i.observe(&watcher::Event::Init);
        i.observe(&watcher::Event::InitApply(tool("t3", "a")));
        assert_eq!(i.tools_of("demo", "b"), ["t1"]);
        i.observe(&watcher::Event::InitDone);
        assert!(i.tools_of("demo", "b").is_empty());
        assert_eq!(i.tools_of("demo", "a"), ["t3"]);
    }

    #[test]
    fn served_remembers_the_last_server_of_each_tool() {
        let s = Served::default();
        s.record("ns", "a", vec!["t1".into(), "t2".into()]);
        s.record("ns", "b", vec!["t1".into()]);
        assert_eq!(s.server_of("ns", "t1").as_deref(), Some("b"));
        // a renders again without t1: t1 stays b's.
        s.record("ns", "a", vec!["t2".into()]);
        assert_eq!(s.server_of("ns", "t1").as_deref(), Some("b"));
        s.record("ns", "b", vec![]);
        assert_eq!(s.server_of("ns", "t1"), None);
        assert_eq!(s.server_of("ns", "t2").as_deref(), Some("a"));
    }
}
