//! Which watch events start a reconcile: a change of the property a reconcile reads, never
//! a write of the status the operator itself reports.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use futures::{future, Stream, StreamExt};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

/// The objects of a reflected watch whose `property` changed since the watch last showed
/// them, and every deleted one. Unlike kube's `predicate_filter`, a deletion always passes
/// (a deleted tool must leave its server's config), and a relist forgets the objects it no
/// longer lists, so one created again under the same name starts a reconcile.
pub(super) fn changes<K, S, P>(stream: S, property: P) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    P: Fn(&K) -> u64,
{
    let mut seen = Seen::default();
    stream.filter_map(move |event| {
        future::ready(match event {
            Ok(event) => seen.pass(event, &property).map(Ok),
            Err(e) => Some(Err(e)),
        })
    })
}

/// What a McpTool reconcile (of its server or of itself) reads from it: its spec (through
/// `generation`), its labels (a server's `toolSelector`) and whether it is being deleted.
pub(super) fn tool_inputs(t: &crate::crd::McpTool) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.metadata.uid.hash(&mut h);
    t.metadata.generation.hash(&mut h);
    t.metadata.labels.hash(&mut h);
    t.metadata.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// The property last seen of each object, by `namespace/name`; a relist is built aside and
/// replaces it when complete.
#[derive(Default)]
struct Seen {
    now: HashMap<String, u64>,
    relist: Option<HashMap<String, u64>>,
}

fn id<K: Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

impl Seen {
    fn pass<K: Resource>(&mut self, event: watcher::Event<K>, property: impl Fn(&K) -> u64) -> Option<K> {
        match event {
            watcher::Event::Apply(o) => {
                let p = property(&o);
                (self.now.insert(id(&o), p) != Some(p)).then_some(o)
            }
            watcher::Event::Delete(o) => {
                self.now.remove(&id(&o));
                Some(o)
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(o) => {
                let (k, p) = (id(&o), property(&o));
                let changed = self.now.get(&k) != Some(&p);
                self.relist.get_or_insert_with(HashMap::new).insert(k, p);
                changed.then_some(o)
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relist.take() {
                    self.now = relisted;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use watcher::Event;

    fn cm(name: &str, v: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.data = Some([("k".to_string(), v.to_string())].into());
        c
    }

    fn value(c: &ConfigMap) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        c.data.hash(&mut h);
        h.finish()
    }

    fn passed(seen: &mut Seen, e: Event<ConfigMap>) -> Option<String> {
        seen.pass(e, value).map(|c| c.name_any())
    }

    #[test]
    fn only_a_changed_property_or_a_deletion_passes() {
        let mut s = Seen::default();
        assert_eq!(passed(&mut s, Event::Init), None);
        assert_eq!(passed(&mut s, Event::InitApply(cm("a", "1"))).as_deref(), Some("a"));
        assert_eq!(passed(&mut s, Event::InitDone), None);
        // The same property again (a status write): nothing to do.
        assert_eq!(passed(&mut s, Event::Apply(cm("a", "1"))), None);
        assert_eq!(passed(&mut s, Event::Apply(cm("a", "2"))).as_deref(), Some("a"));
        assert_eq!(passed(&mut s, Event::Delete(cm("a", "2"))).as_deref(), Some("a"));
        // Created again with what it held before: a new object.
        assert_eq!(passed(&mut s, Event::Apply(cm("a", "2"))).as_deref(), Some("a"));
    }

    #[test]
    fn a_relist_passes_what_changed_and_forgets_what_it_no_longer_lists() {
        let mut s = Seen::default();
        for e in [
            Event::Init,
            Event::InitApply(cm("a", "1")),
            Event::InitApply(cm("b", "1")),
            Event::InitDone,
        ] {
            passed(&mut s, e);
        }
        // The watch lost its place: a relist where b is gone and a is unchanged.
        assert_eq!(passed(&mut s, Event::Init), None);
        assert_eq!(passed(&mut s, Event::InitApply(cm("a", "1"))), None);
        assert_eq!(passed(&mut s, Event::InitDone), None);
        assert_eq!(passed(&mut s, Event::Apply(cm("b", "1"))).as_deref(), Some("b"));
    }
}
