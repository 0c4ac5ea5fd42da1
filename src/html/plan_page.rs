//! A repartition plan as one self-contained HTML page: load per partition before and after as
//! bar charts (inline SVG), the moved fraction against the modulo prediction, the whale keys,
//! the heaviest moves, the checklist, and the live verdict when there is one.

use std::fmt::Write as _;

use crate::plan::{KeyLoad, Plan};

use super::escape;

/// The live queue's verdict, when the plan was checked against a database.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveVerdict {
    /// Whether switching now is safe.
    pub safe: bool,
    /// Why not, when it is not.
    pub reasons: Vec<String>,
}

/// The page for `plan`, with `live` when a live queue was read.
pub fn render(plan: &Plan, live: Option<&LiveVerdict>) -> String {
    let mut page = String::new();
    header(&mut page, plan);
    verdict(&mut page, live);
    figures(&mut page, plan);
    charts(&mut page, plan);
    whales(&mut page, plan);
    heaviest(&mut page, plan);
    checklist(&mut page, plan);
    page
}

/// The document's head and the title.
fn header(page: &mut String, plan: &Plan) {
    let title = format!("keyorder plan: {} → {} partitions", plan.from, plan.to);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(&title)
    );
}

/// The live verdict, or that there is none.
fn verdict(page: &mut String, live: Option<&LiveVerdict>) {
    match live {
        Some(v) if v.safe => page.push_str("<p id=\"verdict\" class=\"safe\">SAFE TO SWITCH: the queue is drained and no key is split.</p>\n"),
        Some(v) => {
            page.push_str("<div id=\"verdict\" class=\"unsafe\"><p>NOT SAFE to switch now:</p><ul>");
            for r in &v.reasons {
                let _ = write!(page, "<li>{}</li>", escape(r));
            }
            page.push_str("</ul></div>\n");
        }
        None => page.push_str("<p id=\"verdict\">No live queue was read (give --database for the verdict).</p>\n"),
    }
}

/// The figures table: sample, moved keys and weight against the modulo prediction, skew.
fn figures(page: &mut String, plan: &Plan) {
    let pct = |f: f64| format!("{:.2}%", f * 100.0);
    let _ = writeln!(
        page,
        "<table id=\"figures\"><tr><td>keys in sample</td><td>{}</td></tr><tr><td>total weight</td><td>{:.1}</td></tr>\
         <tr><td>keys that move</td><td id=\"moved\">{} ({})</td></tr><tr><td>modulo predicts</td><td>{}</td></tr>\
         <tr><td>weight that moves</td><td>{}</td></tr><tr><td>skew (max/mean)</td><td>before {:.3}, after {:.3}</td></tr></table>",
        plan.keys,
        plan.weight,
        plan.moved_keys,
        pct(plan.moved_fraction),
        pct(plan.expected_moved_fraction),
        pct(plan.moved_weight_fraction),
        plan.skew_before,
        plan.skew_after
    );
}

/// The load per partition before and after, on one scale.
fn charts(page: &mut String, plan: &Plan) {
    let top = plan
        .partitions_before
        .iter()
        .chain(&plan.partitions_after)
        .copied()
        .fold(0.0_f64, f64::max)
        .max(f64::MIN_POSITIVE);
    bars(
        page,
        "before",
        "load per partition before",
        &plan.partitions_before,
        &plan.keys_before,
        top,
    );
    bars(page, "after", "load per partition after", &plan.partitions_after, &plan.keys_after, top);
}

/// The whale keys, or that there are none.
fn whales(page: &mut String, plan: &Plan) {
    page.push_str("<h2>Whale keys</h2>\n");
    if plan.whales.is_empty() {
        page.push_str("<p id=\"whales\">None heavier than a target partition's mean load.</p>\n");
        return;
    }
    page.push_str(
        "<table id=\"whales\"><tr><th>key</th><th>weight</th><th>before</th><th>after</th></tr>",
    );
    key_rows(page, &plan.whales);
    page.push_str("</table>\n");
}

/// One table row per key: its weight and its partition before and after.
fn key_rows(page: &mut String, keys: &[KeyLoad]) {
    for k in keys {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{:.1}</td><td>p{}</td><td>p{}</td></tr>",
            escape(&k.key),
            k.weight,
            k.before,
            k.after
        );
    }
}

/// The heaviest keys, then the heaviest moves when there are any.
fn heaviest(page: &mut String, plan: &Plan) {
    page.push_str("<h2>Heaviest keys</h2>\n<table><tr><th>key</th><th>weight</th><th>before</th><th>after</th></tr>");
    key_rows(page, &plan.heaviest_keys);
    page.push_str("</table>\n");
    if !plan.top_moves.is_empty() {
        page.push_str("<h2>Heaviest moves</h2>\n<table><tr><th>from</th><th>to</th><th>keys</th><th>weight</th></tr>");
        for m in &plan.top_moves {
            let _ = write!(
                page,
                "<tr><td>p{}</td><td>p{}</td><td>{}</td><td>{:.1}</td></tr>",
                m.from, m.to, m.keys, m.weight
            );
        }
        page.push_str("</table>\n");
    }
}

/// The drain-and-switch checklist, and the end of the page.
fn checklist(page: &mut String, plan: &Plan) {
    page.push_str("<h2>Drain-and-switch checklist</h2>\n<ol>");
    for step in &plan.checklist {
        let _ = write!(page, "<li>{}</li>", escape(step));
    }
    page.push_str("</ol>\n</body></html>\n");
}

/// One bar per partition, heights on a scale shared by both charts (`top`).
fn bars(page: &mut String, id: &str, caption: &str, load: &[f64], keys: &[u64], top: f64) {
    const H: f64 = 160.0;
    let n = load.len().max(1) as f64;
    let w = (900.0 / n).clamp(2.0, 40.0);
    let width = w * n + 60.0;
    let _ = write!(
        page,
        "<h2>{}</h2>\n<svg id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {vh}\" width=\"{width}\" height=\"{vh}\">",
        escape(caption),
        vh = H + 30.0
    );
    let mean = load.iter().sum::<f64>() / n;
    for (i, l) in load.iter().enumerate() {
        let h = l / top * H;
        let _ = write!(
            page,
            "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{h:.1}\"><title>p{i}: load {l:.1}, {} keys</title></rect>",
            keys.get(i).copied().unwrap_or(0),
            x = 40.0 + i as f64 * w,
            y = H - h + 5.0,
            bw = (w - 1.0).max(1.0)
        );
    }
    let my = H - mean / top * H + 5.0;
    let _ = writeln!(
        page,
        "<line class=\"mean\" x1=\"40\" x2=\"{x2}\" y1=\"{my:.1}\" y2=\"{my:.1}\"/><text class=\"axis\" x=\"0\" y=\"{ty:.1}\">mean</text>\
         <text class=\"axis\" x=\"40\" y=\"{by}\">p0</text><text class=\"axis\" x=\"{lx:.1}\" y=\"{by}\">p{last}</text></svg>",
        x2 = 40.0 + w * n,
        ty = my + 3.0,
        by = H + 22.0,
        lx = 40.0 + (n - 1.0) * w,
        last = load.len().saturating_sub(1)
    );
}

const STYLE: &str = "
body{font:13px system-ui,sans-serif;margin:12px;max-width:1100px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.safe{background:#e2f5e2;padding:6px}.unsafe{background:#fde2e2;padding:6px}
.bar{fill:#4e79a7}.bar:hover{fill:#f28e2b}.mean{stroke:#d00;stroke-dasharray:4 3}.axis{font-size:10px;fill:#333}
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Planner;
    use crate::{Overrides, PartitionCount};

    fn plan() -> Plan {
        let count = |n| PartitionCount::new(n).expect("valid");
        let mut planner =
            Planner::new(count(16), count(64), Overrides::new(), Overrides::new()).expect("plan");
        let keys: Vec<String> =
            (0..2000).map(|i| format!("sub_{i}")).chain(["<whale & \"co\">€".to_owned()]).collect();
        let weights: Vec<f64> = (0..2000).map(|_| 1.0).chain([5000.0]).collect();
        planner.add_batch(&keys, &weights).expect("added");
        planner.finish(Some(4), None)
    }

    #[test]
    fn the_page_shows_both_charts_the_moved_fraction_and_the_whale_escaped() {
        let plan = plan();
        let page = render(&plan, None);
        assert_eq!(page.matches("<rect class=\"bar\"").count(), 16 + 64, "one bar per partition");
        assert!(page.contains(&format!("{:.2}%", plan.moved_fraction * 100.0)));
        assert!(!plan.whales.is_empty(), "the heavy key is a whale");
        assert!(page.contains("&lt;whale &amp; &quot;co&quot;&gt;€"));
        assert!(!page.contains("<whale"), "a key reached the page unescaped");
    }

    #[test]
    fn the_verdict_says_safe_only_when_it_is() {
        let plan = plan();
        let safe = render(&plan, Some(&LiveVerdict { safe: true, reasons: vec![] }));
        assert!(safe.contains("<p id=\"verdict\" class=\"safe\">SAFE TO SWITCH"));
        let unsafe_ = render(
            &plan,
            Some(&LiveVerdict { safe: false, reasons: vec!["3 rows <queued>".into()] }),
        );
        assert!(unsafe_.contains("<div id=\"verdict\" class=\"unsafe\"><p>NOT SAFE"));
        assert!(!unsafe_.contains("class=\"safe\""));
        assert!(unsafe_.contains("3 rows &lt;queued&gt;"));
    }
}
