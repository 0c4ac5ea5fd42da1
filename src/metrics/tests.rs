use super::*;
use crate::ids::{Epoch, PartitionId};

const ALERTS: &str = include_str!("../../docs/alerts.yml");

fn populated() -> Metrics {
    let m = Metrics::new();
    m.set_lag(&[PartitionLag {
        partition: 3,
        depth: 7,
        oldest_wait_seconds: 1.5,
        keys_affected: 2,
        head_attempts: 1,
        last_error: None,
        next_attempt_at: None,
        next_attempt_in_seconds: None,
    }]);
    let (partition, epoch) = (PartitionId(1), Epoch(1));
    m.observe("w", &WorkerEvent::Acquired { partition, epoch });
    m.observe("w", &WorkerEvent::Released { partition, epoch });
    m.observe("w", &WorkerEvent::Lost { partition, epoch, error: "x".into() });
    m.observe("w", &WorkerEvent::StoreUnavailable { error: "x".into() });
    for outcome in [DeliveryOutcome::Accepted, DeliveryOutcome::DeadLettered] {
        m.delivered("w", outcome, 0.01);
    }
    m
}

#[test]
fn lag_is_exported_per_partition_and_replaced_whole() {
    let m = populated();
    let text = m.encode();
    assert!(text.contains("keyorder_partition_depth{partition=\"3\"} 7"), "{text}");
    assert!(text.contains("keyorder_partition_oldest_wait_seconds{partition=\"3\"} 1.5"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    m.set_lag(&[]);
    assert!(!m.encode().contains("partition=\"3\""), "an emptied partition keeps no series");
}

#[test]
fn worker_events_count_leases() {
    let m = Metrics::new();
    let (partition, epoch) = (PartitionId(1), Epoch(1));
    m.observe("w", &WorkerEvent::Acquired { partition, epoch });
    m.observe("w", &WorkerEvent::Acquired { partition, epoch });
    m.observe("w", &WorkerEvent::Lost { partition, epoch, error: "x".into() });
    let text = m.encode();
    assert!(text.contains("keyorder_worker_leases_acquired_total{worker=\"w\"} 2"), "{text}");
    assert!(text.contains("keyorder_worker_leases_lost_total{worker=\"w\"} 1"), "{text}");
    assert!(text.contains("keyorder_worker_leases_held{worker=\"w\"} 1"), "{text}");
}

#[test]
fn parked_keys_follow_the_worker_and_go_with_the_lease() {
    let m = Metrics::new();
    let (partition, epoch) = (PartitionId(4), Epoch(1));
    let series = "keyorder_partition_parked_keys{partition=\"4\"}";
    m.observe("w", &WorkerEvent::Acquired { partition, epoch });
    m.observe("w", &WorkerEvent::Parked { partition, keys: 2 });
    assert!(m.encode().contains(&format!("{series} 2")), "{}", m.encode());
    m.observe("w", &WorkerEvent::Parked { partition, keys: 1 });
    assert!(m.encode().contains(&format!("{series} 1")), "{}", m.encode());
    m.observe("w", &WorkerEvent::Parked { partition, keys: 0 });
    assert!(!m.encode().contains(series), "none parked: no series");
    m.observe("w", &WorkerEvent::Parked { partition, keys: 3 });
    m.observe("w", &WorkerEvent::Lost { partition, epoch, error: "x".into() });
    assert!(!m.encode().contains(series), "a lost lease's parked keys are another holder's now");
}

/// Identifiers in a PromQL expression that look like keyorder metric names.
fn metric_names_in(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("keyorder_"))
        .map(str::to_owned)
        .collect()
}

/// docs/alerts.yml: its structure (groups, each rule an alert with an expr), and every metric
/// an expression names is one the code exports; promtool checks it too when on PATH.
#[test]
fn alert_rules_name_exported_metrics() {
    let exported = exported_names(&populated().encode());
    assert!(exported.iter().any(|n| n == "keyorder_worker_leases_lost_total"), "{exported:?}");
    assert!(ALERTS.lines().any(|l| l.trim_end() == "groups:"), "no top-level groups:");
    let (mut alerts, mut exprs) = (0, 0);
    for line in ALERTS.lines() {
        let t = line.trim_start();
        assert!(!line.contains('\t'), "YAML forbids tabs: {line:?}");
        if t.starts_with("- alert:") {
            alerts += 1;
        }
        if let Some(expr) = t.strip_prefix("expr:") {
            exprs += 1;
            let names = metric_names_in(expr);
            assert!(!names.is_empty(), "rule uses no keyorder metric: {expr}");
            for n in names {
                assert!(
                    exported.contains(&n),
                    "alerts.yml uses {n}, which /metrics does not export ({exported:?})"
                );
            }
        }
    }
    assert!(alerts >= 3 && alerts == exprs, "{alerts} alerts, {exprs} expressions");
    assert!(ALERTS.contains("keyorder_partition_oldest_wait_seconds"), "the reference's signal");
    if let Ok(out) = std::process::Command::new("promtool")
        .args(["check", "rules", concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.yml")])
        .output()
    {
        assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
    }
}
