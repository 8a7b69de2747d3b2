//! The standard `process_*` metrics, read from `/proc/self` at scrape time (Linux; elsewhere
//! the collector reports nothing).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge, Opts};

/// `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
/// `process_start_time_seconds`, `process_threads`.
pub struct ProcessCollector {
    cpu: Counter,
    rss: Gauge,
    vsize: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge,
    threads: Gauge,
    descs: Vec<Desc>,
    refreshing: std::sync::Mutex<()>,
}

impl ProcessCollector {
    /// A collector for this process.
    pub fn new() -> Self {
        let cpu = Counter::with_opts(Opts::new(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
        ))
        .expect("metric");
        let gauge = |name: &str, help: &str| Gauge::with_opts(Opts::new(name, help)).expect("metric");
        let rss = gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
        let vsize = gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.");
        let open_fds = gauge("process_open_fds", "Number of open file descriptors.");
        let max_fds = gauge("process_max_fds", "Maximum number of open file descriptors.");
        let start_time = gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
        );
        let threads = gauge("process_threads", "Number of OS threads in the process.");
        let mut descs = Vec::new();
        for c in [&rss, &vsize, &open_fds, &max_fds, &start_time, &threads] {
            descs.extend(c.desc().into_iter().cloned());
        }
        descs.extend(cpu.desc().into_iter().cloned());
        let s = Self {
            cpu,
            rss,
            vsize,
            open_fds,
            max_fds,
            start_time,
            threads,
            descs,
            refreshing: std::sync::Mutex::new(()),
        };
        if let Some(start) = start_time_seconds() {
            s.start_time.set(start);
        }
        s
    }

    fn refresh(&self) {
        // Concurrent scrapes would both add the same CPU delta.
        let _one_at_a_time = self.refreshing.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return;
        };
        // Fields after the command name (which may contain spaces) in parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // rest[0] is field 3 (state): utime=14, stime=15, threads=20, vsize=23, rss=24.
        let ticks = CLOCK_TICKS;
        let cpu = (num(11) + num(12)) / ticks;
        let seen = self.cpu.get();
        if cpu > seen {
            self.cpu.inc_by(cpu - seen);
        }
        self.threads.set(num(17));
        self.vsize.set(num(20));
        self.rss.set(num(21) * PAGE_SIZE);
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as f64);
        }
        if let Ok(limits) = std::fs::read_to_string("/proc/self/limits") {
            if let Some(line) = limits.lines().find(|l| l.starts_with("Max open files")) {
                if let Some(soft) = line.split_whitespace().nth(3).and_then(|v| v.parse::<f64>().ok()) {
                    self.max_fds.set(soft);
                }
            }
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

/// The metric names this collector exports.
pub const NAMES: [&str; 7] = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "process_threads",
];

/// USER_HZ: 100 on every Linux architecture the binaries are built for.
const CLOCK_TICKS: f64 = 100.0;
/// Page size of x86_64 and aarch64 Linux as built (4 KiB pages).
const PAGE_SIZE: f64 = 4096.0;

fn start_time_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let start_ticks: f64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find(|l| l.starts_with("btime"))?
        .split_whitespace()
        .nth(1)?
        .parse::<f64>()
        .ok()?;
    Some(boot + start_ticks / CLOCK_TICKS)
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.refresh();
        let mut out = Vec::new();
        out.extend(self.cpu.collect());
        for g in [
            &self.rss,
            &self.vsize,
            &self.open_fds,
            &self.max_fds,
            &self.start_time,
            &self.threads,
        ] {
            out.extend(g.collect());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_this_process() {
        let registry = prometheus::Registry::new();
        registry.register(Box::new(ProcessCollector::new())).unwrap();
        let text = crate::render(&registry);
        let value = |name: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        };
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_start_time_seconds") > 1.6e9);
        assert!(value("process_threads") >= 1.0);
        assert!(text.contains("# TYPE process_cpu_seconds_total counter"));
    }
}
