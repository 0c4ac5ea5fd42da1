use super::*;
use crate::ids::{Epoch, PartitionId};
use crate::routing::PartitionCount;

const ALERTS: &str = include_str!("../../docs/alerts.yml");

fn lag_of(partition: i16, depth: i64) -> PartitionLag {
    PartitionLag {
        partition,
        depth,
        oldest_wait_seconds: 1.5,
        keys_affected: 2,
        head_attempts: 1,
        last_error: None,
        next_attempt_at: None,
        next_attempt_in_seconds: None,
    }
}

fn count(n: i64) -> Option<PartitionCount> {
    Some(PartitionCount::new(n).unwrap())
}

fn populated() -> Metrics {
    let m = Metrics::new();
    m.set_lag(count(4), &[lag_of(3, 7)]);
    let (partition, epoch) = (PartitionId(1), Epoch(1));
    m.observe("w", &WorkerEvent::Acquired { partition, epoch });
    m.observe("w", &WorkerEvent::Released { partition, epoch });
    m.observe("w", &WorkerEvent::Lost { partition, epoch, error: "x".into() });
    m.observe("w", &WorkerEvent::StoreUnavailable { error: "x".into() });
    m.observe("w", &WorkerEvent::Acquired { partition: PartitionId(2), epoch });
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
    m.set_lag(None, &[]);
    assert!(!m.encode().contains("partition=\"3\""), "no layout, no rows: no series");
}

/// The series of one family, in the order they are encoded.
fn series(text: &str, family: &str) -> Vec<String> {
    let prefix = format!("{family}{{");
    text.lines().filter(|l| l.starts_with(&prefix)).map(str::to_owned).collect()
}

#[test]
fn every_partition_of_the_layout_exports_its_series_in_order_zero_when_empty() {
    let m = Metrics::new();
    // 16 partitions, partition 5 empty; partition 20 holds stranded rows outside the layout.
    let lag: Vec<PartitionLag> =
        (0..16).filter(|p| *p != 5).map(|p| lag_of(p, 10 + i64::from(p))).rev().collect();
    let lag = [lag, vec![lag_of(20, 3)]].concat();
    m.set_lag(count(16), &lag);
    let text = m.encode();
    for family in [
        "keyorder_partition_depth",
        "keyorder_partition_oldest_wait_seconds",
        "keyorder_partition_keys",
        "keyorder_partition_head_attempts",
    ] {
        let got = series(&text, family);
        let partitions: Vec<String> =
            got.iter().map(|l| l.split('"').nth(1).unwrap_or_default().to_owned()).collect();
        let want: Vec<String> = (0..16).chain([20]).map(|p| p.to_string()).collect();
        assert_eq!(partitions, want, "{family}: every partition, in order\n{text}");
    }
    assert!(text.contains("keyorder_partition_depth{partition=\"5\"} 0\n"), "{text}");
    assert!(text.contains("keyorder_partition_oldest_wait_seconds{partition=\"5\"} 0.0"), "{text}");
    assert!(text.contains("keyorder_partition_depth{partition=\"20\"} 3\n"), "stranded: {text}");
    assert!(text.contains("keyorder_partition_depth{partition=\"15\"} 25\n"), "{text}");
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
    assert!(m.encode().contains(&format!("{series} 0")), "a held partition exports 0");
    m.observe("w", &WorkerEvent::Parked { partition, keys: 2 });
    assert!(m.encode().contains(&format!("{series} 2")), "{}", m.encode());
    m.observe("w", &WorkerEvent::Parked { partition, keys: 1 });
    assert!(m.encode().contains(&format!("{series} 1")), "{}", m.encode());
    m.observe("w", &WorkerEvent::Parked { partition, keys: 0 });
    assert!(m.encode().contains(&format!("{series} 0")), "none parked: 0, not no data");
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

const DASHBOARD: &str = include_str!("../../docs/grafana-dashboard.json");

/// Every query expression of a Grafana dashboard (its panels' targets), with the panel titles.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((title.clone(), target["expr"].as_str().unwrap_or_default().to_owned()));
        }
    }
    out
}

/// docs/grafana-dashboard.json: valid JSON with panels for depth, oldest wait, deliveries by
/// outcome, latency, leases and parked keys, and every metric a query names is one the code
/// exports (a histogram's `_bucket`, `_sum` and `_count` series included).
#[test]
fn the_grafana_dashboard_names_exported_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let exported = exported_names(&populated().encode());
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 6, "{queries:?}");
    for (title, expr) in &queries {
        let names = metric_names_in(expr);
        assert!(!names.is_empty(), "panel {title:?} queries no keyorder metric: {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "the dashboard's panel {title:?} uses {n}, which /metrics does not export \
                 ({exported:?})"
            );
        }
    }
    for needed in [
        "keyorder_partition_depth",
        "keyorder_partition_oldest_wait_seconds",
        "keyorder_worker_deliveries_total",
        "keyorder_worker_delivery_seconds_bucket",
        "keyorder_worker_leases_held",
        "keyorder_partition_parked_keys",
    ] {
        assert!(queries.iter().any(|(_, e)| e.contains(needed)), "no panel shows {needed}");
    }
}
