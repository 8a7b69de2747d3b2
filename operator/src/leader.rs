//! Leader election on a `coordination.k8s.io/v1` Lease, so several replicas can run and
//! exactly one reconciles. Expiry is judged the way client-go does it: by how long the
//! record has been seen unchanged on this replica's own clock, never by comparing clocks.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::info;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
}

/// One replica's view of the Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    observed: Option<(String, Instant)>,
}

impl LeaderElector {
    /// An elector for `cfg`.
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    fn now() -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::now())
    }

    /// Tries once to take or renew the lease; `Ok(true)` while this replica holds it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let me = self.cfg.identity.clone();
        let seconds = self.cfg.duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(Self::now()),
                    renew_time: Some(Self::now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = format!("{holder:?}/{:?}", spec.renew_time.as_ref().map(|t| t.0));
        let seen_at = match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                self.observed = Some((record, Instant::now()));
                Instant::now()
            }
        };
        let held_by_me = holder.as_deref() == Some(me.as_str());
        let valid_for = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(seconds).max(1) as u64);
        let expired = holder.is_none() || seen_at.elapsed() > valid_for;
        if !held_by_me && !expired {
            return Ok(false);
        }
        let mut next = spec.clone();
        if !held_by_me {
            next.acquire_time = Some(Self::now());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            info!(previous = ?holder, "taking over the expired lease");
        }
        next.holder_identity = Some(me);
        next.lease_duration_seconds = Some(seconds);
        next.renew_time = Some(Self::now());
        lease.spec = Some(next);
        // The resourceVersion in `lease` makes this a compare-and-swap.
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(Self::now());
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
