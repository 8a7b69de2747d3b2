//! Which watch events start a reconcile: a change of the property a reconcile reads, never
//! a write of the status the operator itself reports.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use futures::{stream, Stream, StreamExt};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

/// The objects of a reflected watch whose `property` changed since the watch last showed
/// them, and every deleted one. Unlike kube's `predicate_filter`, a deletion always passes
/// (a deleted tool must leave its server's config). A list (the first, or a relist after
/// the watch lost its place) passes every object it holds once it is complete, when the
/// cache holds it too: what changed while the watch was away is not known, so everything is
/// looked at again. Objects deleted meanwhile are not listed, as with kube's own streams.
pub(super) fn changes<K, S, P>(stream: S, property: P) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    P: Fn(&K) -> u64,
{
    let mut seen = Seen::default();
    stream.flat_map(move |event| {
        stream::iter(match event {
            Ok(event) => seen.pass(event, &property).into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e)],
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

/// The property last seen of each object, by `namespace/name`; a list is built aside, with
/// the objects it held, and replaces it when complete.
struct Seen<K> {
    now: HashMap<String, u64>,
    list: Option<(HashMap<String, u64>, Vec<K>)>,
}

impl<K> Default for Seen<K> {
    fn default() -> Self {
        Self {
            now: HashMap::new(),
            list: None,
        }
    }
}

fn id<K: Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

impl<K: Resource> Seen<K> {
    fn pass(&mut self, event: watcher::Event<K>, property: impl Fn(&K) -> u64) -> Vec<K> {
        match event {
            watcher::Event::Apply(o) => {
                let p = property(&o);
                if self.now.insert(id(&o), p) == Some(p) {
                    vec![]
                } else {
                    vec![o]
                }
            }
            watcher::Event::Delete(o) => {
                self.now.remove(&id(&o));
                vec![o]
            }
            watcher::Event::Init => {
                self.list = Some((HashMap::new(), Vec::new()));
                vec![]
            }
            watcher::Event::InitApply(o) => {
                let (seen, objects) = self.list.get_or_insert_with(Default::default);
                seen.insert(id(&o), property(&o));
                objects.push(o);
                vec![]
            }
            watcher::Event::InitDone => match self.list.take() {
                Some((seen, objects)) => {
                    self.now = seen;
                    objects
                }
                None => vec![],
            },
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

    fn passed(seen: &mut Seen<ConfigMap>, e: Event<ConfigMap>) -> Vec<String> {
        seen.pass(e, value).iter().map(ResourceExt::name_any).collect()
    }

    #[test]
    fn only_a_changed_property_or_a_deletion_passes() {
        let mut s = Seen::default();
        assert!(passed(&mut s, Event::Init).is_empty());
        assert!(passed(&mut s, Event::InitApply(cm("a", "1"))).is_empty());
        // The list passes once complete (the cache holds it by then).
        assert_eq!(passed(&mut s, Event::InitDone), ["a"]);
        // The same property again (a status write): nothing to do.
        assert!(passed(&mut s, Event::Apply(cm("a", "1"))).is_empty());
        assert_eq!(passed(&mut s, Event::Apply(cm("a", "2"))), ["a"]);
        assert_eq!(passed(&mut s, Event::Delete(cm("a", "2"))), ["a"]);
        // Created again with what it held before: a new object.
        assert_eq!(passed(&mut s, Event::Apply(cm("a", "2"))), ["a"]);
    }

    #[test]
    fn a_relist_passes_everything_it_lists_and_forgets_what_it_does_not() {
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
        assert!(passed(&mut s, Event::Init).is_empty());
        assert!(passed(&mut s, Event::InitApply(cm("a", "1"))).is_empty());
        assert_eq!(passed(&mut s, Event::InitDone), ["a"]);
        assert!(passed(&mut s, Event::Apply(cm("a", "1"))).is_empty());
        assert_eq!(passed(&mut s, Event::Apply(cm("b", "1"))), ["b"]);
    }
}
