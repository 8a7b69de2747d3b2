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
/// length). Fields the API server adds (defaults, status) are ignored, and so is the API
/// server's rewriting of a quantity in `requests`, `limits` or `sizeLimit` into its canonical
/// form (`cpu: "0.5"` comes back as `500m`): else a server whose resources were not written in
/// that form would have its workload written again on every resync.
pub(super) fn is_subset(doc: &Value, live: &Value) -> bool {
    subset(doc, live, false)
}

/// Keys whose values the API server stores as canonical quantities.
const QUANTITY_KEYS: [&str; 3] = ["requests", "limits", "sizeLimit"];

fn subset(doc: &Value, live: &Value, quantities: bool) -> bool {
    match (doc, live) {
        // The API server drops empty lists and maps.
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, v)| match l.get(k) {
            Some(lv) => subset(v, lv, quantities || QUANTITY_KEYS.contains(&k.as_str())),
            None => v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(|o| o.is_empty()),
        }),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(a, b)| subset(a, b, quantities))
        }
        (Value::String(d), Value::String(l)) if quantities && d != l => {
            quantity_nanos(d).is_some_and(|a| quantity_nanos(l) == Some(a))
        }
        (d, l) => d == l,
    }
}

/// A Kubernetes quantity (`500m`, `0.5`, `128Mi`, `1e3`, `1.5Gi`) in billionths of its unit,
/// rounded up as the API server rounds it; `None` when it is not one or does not fit.
fn quantity_nanos(text: &str) -> Option<i128> {
    let (negative, rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let number_end = rest
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.len() + fraction.len() == 0 || whole.len() + fraction.len() > 30 || fraction.contains('.') {
        return None;
    }
    let mut mantissa: i128 = 0;
    for d in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa * 10 + i128::from(d - b'0');
    }
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) && s.len() > 1 => (s[1..].parse::<i32>().ok().filter(|e| e.abs() <= 40)?, 0),
        _ => return None,
    };
    let scaled = mantissa.checked_mul(2i128.checked_pow(exp2)?)?;
    // In nano units: 10^9 more, less one per fraction digit.
    let exp = exp10 + 9 - i32::try_from(fraction.len()).ok()?;
    let nanos = if exp >= 0 {
        scaled.checked_mul(10i128.checked_pow(exp.unsigned_abs())?)?
    } else {
        let divisor = 10i128.checked_pow(exp.unsigned_abs())?;
        scaled.checked_add(divisor - 1)? / divisor
    };
    Some(if negative { -nanos } else { nanos })
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

    #[test]
    fn subset_takes_a_quantity_in_its_canonical_form() {
        let doc = json!({"resources": {"requests": {"cpu": "0.5", "memory": "0.125Gi"}, "limits": {"memory": "134217728"}},
                         "volumes": [{"emptyDir": {"sizeLimit": "1024Ki"}}], "env": [{"name": "N", "value": "0.5"}]});
        let live = json!({"resources": {"requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}},
                          "volumes": [{"emptyDir": {"sizeLimit": "1Mi"}}], "env": [{"name": "N", "value": "0.5"}]});
        assert!(is_subset(&doc, &live));
        let mut more = live.clone();
        more["resources"]["requests"]["cpu"] = json!("501m");
        assert!(!is_subset(&doc, &more), "a different quantity is a change");
        let mut env = live.clone();
        env["env"][0]["value"] = json!("500m");
        assert!(!is_subset(&doc, &env), "only quantities are compared as quantities");
    }

    #[test]
    fn quantities_parse_as_the_api_server_reads_them() {
        use super::quantity_nanos as q;
        assert_eq!(q("500m"), Some(500_000_000));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("1"), Some(1_000_000_000));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("+2Ki"), q("2048"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("-1"), Some(-1_000_000_000));
        assert_eq!(q("0.0000000001"), q("1n"), "below a nano rounds up");
        for bad in ["", "m", "1x", "1.2.3", "1 m", "Ki", "1e", "1e99", "1Ei0", "--1"] {
            assert_eq!(q(bad), None, "{bad:?}");
        }
        assert_eq!(q("8Ei"), Some(8 * (1i128 << 60) * 1_000_000_000));
        assert_eq!(
            q(".158456325028528675187087900671Gi"),
            None,
            "too large to round: not a panic"
        );
    }
}
