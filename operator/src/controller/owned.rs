//! Writing the objects an McpServer owns (ConfigMap, Service, gateway Deployment): skipped
//! when the live object already holds what would be written, over the cached version when
//! there is one, and never over an object someone else owns.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::Value;

use super::{Context, Error, MANAGER};
use crate::crd::McpServer;
use crate::inject::{applied_hash, HASH_ANNOTATION};

/// Whether every field of `doc` holds the same value in `live` (lists item by item, same
/// length). Fields the API server adds (defaults, status) are ignored.
pub(super) fn is_subset(doc: &Value, live: &Value) -> bool {
    match (doc, live) {
        // The API server drops empty lists and maps.
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => is_subset(v, lv),
            None => v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(d), Value::Array(l)) => d.len() == l.len() && d.iter().zip(l).all(|(a, b)| is_subset(a, b)),
        (d, l) => d == l,
    }
}

pub(super) fn is_owned_by(meta: &ObjectMeta, server: &McpServer) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "McpServer" && Some(&o.uid) == server.metadata.uid.as_ref())
}

/// What [`apply_owned`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Applied {
    Unchanged,
    Written,
    /// An object of that name exists and belongs to someone else; left alone.
    Foreign,
}

/// What `live` says about writing `doc`: `None` when it is to be written.
fn verdict<K: Resource + serde::Serialize>(doc: &Value, live: &K, server: &McpServer) -> Option<Applied> {
    if !is_owned_by(live.meta(), server) {
        return Some(Applied::Foreign);
    }
    let same_hash = live
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(HASH_ANNOTATION))
        .map(String::as_str)
        == applied_hash(doc);
    (same_hash && is_subset(doc, &serde_json::to_value(live).unwrap_or_default())).then_some(Applied::Unchanged)
}

/// Applies `doc` over the version of the object the cache shows (`over`): a cache behind
/// the API server makes that a conflict, never a second write. `Ok(false)`: not written,
/// as the object has moved on since that version (or the cache does not hold it).
pub(super) async fn apply_over<K>(ctx: &Context, api: &Api<K>, doc: &Value, over: Option<&str>) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let Some(over) = over else { return Ok(false) };
    let mut guarded = doc.clone();
    guarded["metadata"]["resourceVersion"] = over.into();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    match api
        .patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&guarded))
        .await
    {
        Ok(_) => {
            ctx.metrics.write(super::kind_label::<K>(), "apply");
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Applies `doc` unless `cached` (the watch cache's copy) already holds it; never takes over
/// an object the server does not own. The cache may be behind the API server (an object
/// written a moment ago, or one without the operator's label that it does not list): a
/// cached object is written over the version the cache shows, and otherwise the API's own
/// copy decides. A resync reads nothing, and a stale cache costs a read, never a second
/// write.
pub(super) async fn apply_owned<K>(
    ctx: &Context,
    api: &Api<K>,
    doc: &Value,
    cached: Option<&K>,
    server: &McpServer,
) -> Result<Applied, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    if let Some(v) = cached.and_then(|live| verdict(doc, live, server)) {
        return Ok(v);
    }
    // Cached and this server's (else the verdict said Foreign), only not as it should be.
    if apply_over(ctx, api, doc, cached.and_then(|c| c.meta().resource_version.as_deref())).await? {
        return Ok(Applied::Written);
    }
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    ctx.metrics.read(super::kind_label::<K>());
    if let Some(v) = api.get_opt(name).await?.and_then(|live| verdict(doc, &live, server)) {
        return Ok(v);
    }
    api.patch(name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(doc))
        .await?;
    ctx.metrics.write(super::kind_label::<K>(), "apply");
    Ok(Applied::Written)
}

/// The message for an object of the server's name that it does not own.
pub(super) fn foreign(what: &str, name: &str) -> String {
    format!("{what} {name} exists and is not owned by this McpServer; rename or delete it")
}

/// A delete's result, where the object being gone already is success.
pub(super) fn gone(r: Result<(), kube::Error>) -> Result<(), Error> {
    match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::is_subset;
    use serde_json::json;

    #[test]
    fn subset_ignores_added_fields_but_not_changed_or_missing_ones() {
        let doc = json!({"a": 1, "l": [{"n": "x"}], "m": {"k": "v"}});
        assert!(is_subset(
            &doc,
            &json!({"a": 1, "b": 2, "l": [{"n": "x", "d": 0}], "m": {"k": "v", "z": 1}})
        ));
        assert!(!is_subset(&doc, &json!({"a": 2, "l": [{"n": "x"}], "m": {"k": "v"}})));
        assert!(!is_subset(
            &doc,
            &json!({"a": 1, "l": [{"n": "x"}, {"n": "y"}], "m": {"k": "v"}})
        ));
        assert!(!is_subset(&doc, &json!({"a": 1, "l": [{"n": "x"}]})));
        assert!(
            is_subset(&json!({"env": [], "m": {}}), &json!({})),
            "empty lists and maps are dropped by the API server"
        );
    }
}
