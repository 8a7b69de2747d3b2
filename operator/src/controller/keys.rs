//! The session-key Secret of an McpServer (`<server>-session-keys`): created with a random key,
//! moved through a rotation step when its time has come (see [`crate::sessionkeys`]), and never
//! touched when someone else made a Secret of that name.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tracing::info;

use super::owned::{foreign, is_owned_by};
use super::server::publish;
use super::{Context, Error};
use crate::crd::{McpServer, ServerSessions};
use crate::objects;
use crate::render;
use crate::sessionkeys::Keys;
use crate::status::reason;

/// The Secret `doc` of `keys`, owned by `server`.
fn session_secret(server: &McpServer, keys: &Keys, resource_version: Option<String>) -> Secret {
    let mut meta: ObjectMeta = serde_json::from_value(objects::owned_meta(
        server,
        &render::session_secret_name(server),
        "session-keys",
    ))
    .unwrap_or_default();
    meta.labels.get_or_insert_with(Default::default).insert(
        crate::guard::SECRET_USAGE_LABEL.into(),
        crate::guard::SECRET_USAGE_PROXY.into(),
    );
    meta.annotations = Some(keys.annotations());
    meta.resource_version = resource_version;
    Secret {
        metadata: meta,
        type_: Some("Opaque".into()),
        data: Some(std::collections::BTreeMap::from([(
            render::SESSION_KEYS_KEY.to_string(),
            k8s_openapi::ByteString(keys.text().into_bytes()),
        )])),
        ..Secret::default()
    }
}

/// What [`ensure`] did: when to look again, and whether the Secret is known to exist now.
pub(super) struct Ensured {
    pub again: Option<std::time::Duration>,
    pub present: bool,
}

/// Creates the server's session-key Secret, or moves its key rotation on. `Ok(Err(_))`: a
/// Secret of that name that is not the operator's (reported, never touched).
pub(super) async fn ensure(
    server: &McpServer,
    ctx: &Context,
    api: &Api<Secret>,
) -> Result<Result<Ensured, String>, Error> {
    let name = render::session_secret_name(server);
    let sessions = server.spec.sessions.as_ref();
    let want = ServerSessions::key_generation(sessions);
    let ttl = std::time::Duration::from_secs(ServerSessions::ttl_seconds(sessions));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let ns = server.namespace().unwrap_or_default();
    // A miss in the cache of the operator's labelled Secrets: absent, just made, or someone
    // else's. Absent from the metadata cache of every Secret too, it is created without a
    // read first (a 409 says it exists after all); listed there, the API's copy decides.
    let live = match super::cached(&ctx.session_keys, &ns, &name) {
        Some(live) => live,
        None => {
            if super::cached(&ctx.secrets, &ns, &name).is_none() {
                let doc = session_secret(server, &Keys::fresh(want, now), None);
                match api.create(&kube::api::PostParams::default(), &doc).await {
                    Ok(_) => {
                        ctx.metrics.write("Secret", "create");
                        info!(secret = %name, "session key created");
                        return Ok(Ok(Ensured {
                            again: None,
                            present: true,
                        }));
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            ctx.metrics.read("Secret");
            match api.get_opt(&name).await? {
                Some(live) => std::sync::Arc::new(live),
                // Deleted again meanwhile: look again shortly.
                None => {
                    return Ok(Ok(Ensured {
                        again: Some(std::time::Duration::from_secs(1)),
                        present: false,
                    }))
                }
            }
        }
    };
    // Owned, and labelled as the operator's: with the chart, only the operator may write that
    // label on a Secret, so an owner reference someone else copied is not enough.
    let labelled = live
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(objects::MANAGED_BY.0))
        .is_some_and(|v| v == objects::MANAGED_BY.1);
    if !is_owned_by(&live.metadata, server) || !labelled {
        return Ok(Err(format!(
            "{}; the operator keeps this server's session keys in it",
            foreign("Secret", &name)
        )));
    }
    let text = live
        .data
        .as_ref()
        .and_then(|d| d.get(render::SESSION_KEYS_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default();
    let Some(keys) = Keys::read(&text, live.metadata.annotations.as_ref()) else {
        return Ok(Err(format!(
            "Secret {name} does not hold session keys as the operator writes them; delete it and a new key is made (open 2025-era sessions then start over)"
        )));
    };
    let (next, again) = keys.step(want, now, ctx.defaults.session_key_propagation, ttl);
    if let Some(next) = next {
        let doc = session_secret(server, &next, live.metadata.resource_version.clone());
        match api.replace(&name, &kube::api::PostParams::default(), &doc).await {
            Ok(_) => {}
            // The cache was behind the Secret (the precondition on its resourceVersion held):
            // look again once the watch has caught up.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return Ok(Ok(Ensured {
                    again: Some(std::time::Duration::from_secs(1)),
                    present: true,
                }))
            }
            Err(e) => return Err(e.into()),
        }
        ctx.metrics.write("Secret", "update");
        let note = format!(
            "Session key generation {}: {:?} (Secret {name})",
            next.generation, next.phase
        );
        info!(secret = %name, generation = next.generation, phase = ?next.phase, "session key rotation");
        publish(ctx, server, EventType::Normal, reason::SESSION_KEY_ROTATED, note).await;
    }
    Ok(Ok(Ensured { again, present: true }))
}
