//! Operator metrics: one registry per process, served on the admin port at `/metrics`.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    /// `toolgate_operator_reconciles_total{controller,result}`.
    pub reconciles: IntCounterVec,
    /// `toolgate_operator_reconcile_duration_seconds{controller}`.
    pub reconcile_duration: HistogramVec,
    /// `toolgate_operator_reconcile_errors_total{controller,reason}`.
    pub reconcile_errors: IntCounterVec,
    /// `toolgate_operator_api_writes_total{kind,verb}`: every write the operator sends.
    pub api_writes: IntCounterVec,
    /// `toolgate_operator_api_reads_total{kind}`: every single-object read the operator sends
    /// (reconciles read from the watch caches; the initial lists and watches are not counted).
    pub api_reads: IntCounterVec,
    /// `toolgate_operator_managed_objects{kind}`: McpServers and McpTools seen.
    pub managed: IntGaugeVec,
    /// `toolgate_operator_tools{accepted}`: tools by their Accepted condition, as last rendered.
    pub tools: IntGaugeVec,
    /// `toolgate_operator_leader`: 1 while this replica holds the lease.
    pub leader: IntGauge,
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "toolgate_operator_reconciles_total",
                "Reconciles run, by controller and result (ok, error).",
            ),
            &["controller", "result"],
        )
        .expect("metric");
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "toolgate_operator_reconcile_duration_seconds",
                "Time spent in one reconcile.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["controller"],
        )
        .expect("metric");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "toolgate_operator_reconcile_errors_total",
                "Failed reconciles, by controller and reason.",
            ),
            &["controller", "reason"],
        )
        .expect("metric");
        let api_writes = IntCounterVec::new(
            Opts::new(
                "toolgate_operator_api_writes_total",
                "Write requests sent to the API server, by kind and verb.",
            ),
            &["kind", "verb"],
        )
        .expect("metric");
        let api_reads = IntCounterVec::new(
            Opts::new(
                "toolgate_operator_api_reads_total",
                "Single-object reads sent to the API server, by kind (reconciles read the watch caches).",
            ),
            &["kind"],
        )
        .expect("metric");
        let managed = IntGaugeVec::new(
            Opts::new(
                "toolgate_operator_managed_objects",
                "Custom resources the operator watches, by kind.",
            ),
            &["kind"],
        )
        .expect("metric");
        let tools = IntGaugeVec::new(
            Opts::new(
                "toolgate_operator_tools",
                "McpTools by their Accepted condition (true, false).",
            ),
            &["accepted"],
        )
        .expect("metric");
        let leader = IntGauge::new(
            "toolgate_operator_leader",
            "1 while this replica holds the leader lease.",
        )
        .expect("metric");
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_duration.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(api_writes.clone()),
            Box::new(api_reads.clone()),
            Box::new(managed.clone()),
            Box::new(tools.clone()),
            Box::new(leader.clone()),
            Box::new(toolgate_telemetry::process::ProcessCollector::new()),
        ] {
            registry.register(c).expect("unique metric");
        }
        Self {
            registry,
            reconciles,
            reconcile_duration,
            reconcile_errors,
            api_writes,
            api_reads,
            managed,
            tools,
            leader,
        }
    }

    /// Counts one write of `kind` with `verb` (apply, patch, delete, create, update).
    pub fn write(&self, kind: &'static str, verb: &'static str) {
        self.api_writes.with_label_values(&[kind, verb]).inc();
    }

    /// Counts one read of `kind`.
    pub fn read(&self, kind: &'static str) {
        self.api_reads.with_label_values(&[kind]).inc();
    }

    /// The name of every metric family this registry can export (also those with no sample
    /// yet); dashboards and alerts are checked against it.
    pub fn names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 8] = [
            &self.reconciles,
            &self.reconcile_duration,
            &self.reconcile_errors,
            &self.api_writes,
            &self.api_reads,
            &self.managed,
            &self.tools,
            &self.leader,
        ];
        toolgate_telemetry::names(&collectors)
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        toolgate_telemetry::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
