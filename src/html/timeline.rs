//! A delivery history drawn as one self-contained HTML page: swim lanes per partition and per
//! worker on a shared time axis, each delivery attempt a bar from send to reply, lease
//! ownership under each partition, lost leases and dead letters marked, and the checker's
//! first counterexample of each kind highlighted and linked from the findings table.
//!
//! Pure string building: no IO, no clock, no network at view time (inline SVG, CSS and a
//! little JavaScript; nothing is fetched). Every piece of text from the history goes through
//! [`super::escape`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::check::{History, LeaseEvent, Outcome, Verdict};
use crate::ids::{PartitionId, Seq, Time};

use super::escape;

/// Height of one lane, in SVG units.
const LANE: f64 = 18.0;
/// Width of the label column.
const LABEL: f64 = 90.0;
/// Width of the time area before zooming.
const WIDTH: f64 = 1400.0;

/// The page for `history` judged by `verdict`, titled `title`. Deliveries named by a
/// counterexample carry `data-cx="KIND"`; the findings table links each kind to them.
pub fn render(title: &str, history: &History, verdict: &Verdict) -> String {
    let lanes = Lanes::of(history);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {height}" width="100%" preserveAspectRatio="xMinYMin meet">"#,
        w = LABEL + WIDTH + 10.0,
        height = lanes.height()
    );
    lane_labels(&mut svg, &lanes);
    time_axis(&mut svg, &lanes);
    lease_bars(&mut svg, &lanes, history);
    delivery_bars(&mut svg, &lanes, history, &counterexample_marks(verdict));
    dead_letter_marks(&mut svg, &lanes, history);
    svg.push_str("</svg>");

    let mut page = String::new();
    header(&mut page, title, verdict);
    findings_table(&mut page, verdict);
    page.push_str(CONTROLS);
    page.push_str(&svg);
    let _ = write!(page, "</div>\n<script>{SCRIPT}</script>\n</body></html>\n");
    page
}

/// Where things go on the time lanes: each partition has a delivery lane and a lease lane under
/// it, then the time axis, then one lane per worker.
struct Lanes<'h> {
    end: Time,
    /// SVG units per millisecond.
    scale: f64,
    partition_row: BTreeMap<PartitionId, usize>,
    worker_index: BTreeMap<&'h str, usize>,
    worker_top: f64,
}

impl<'h> Lanes<'h> {
    fn of(history: &'h History) -> Self {
        let end = history_end(history);
        let partitions: BTreeSet<PartitionId> = history
            .enqueued
            .iter()
            .map(|e| e.partition)
            .chain(history.deliveries.iter().map(|d| d.partition))
            .chain(history.leases.iter().map(|l| l.partition))
            .collect();
        let workers: BTreeSet<&str> = history
            .deliveries
            .iter()
            .map(|d| d.worker.as_str())
            .chain(history.leases.iter().map(|l| l.worker.as_str()))
            .collect();
        Lanes {
            end,
            scale: WIDTH / (end.0.as_secs_f64() * 1000.0).max(1.0),
            worker_top: partitions.len() as f64 * 2.0 * LANE + 2.0 * LANE,
            partition_row: partitions.iter().enumerate().map(|(i, p)| (*p, i)).collect(),
            worker_index: workers.iter().enumerate().map(|(i, w)| (*w, i)).collect(),
        }
    }

    /// The x of time `t`.
    fn x(&self, t: Time) -> f64 {
        LABEL + t.0.as_secs_f64() * 1000.0 * self.scale
    }

    fn height(&self) -> f64 {
        self.worker_top + self.worker_index.len() as f64 * LANE + LANE
    }

    /// The y of the lease lane under `partition`.
    fn lease_y(&self, partition: PartitionId) -> f64 {
        self.partition_row[&partition] as f64 * 2.0 * LANE + LANE + 3.0
    }
}

/// Lane labels and guides.
fn lane_labels(svg: &mut String, lanes: &Lanes<'_>) {
    for (p, row) in &lanes.partition_row {
        let y = *row as f64 * 2.0 * LANE;
        let _ = write!(
            svg,
            r#"<text class="label" x="2" y="{ty}">p{p}</text><line class="guide" x1="{LABEL}" x2="{x2}" y1="{gy}" y2="{gy}"/>"#,
            ty = y + LANE * 0.75,
            x2 = LABEL + WIDTH,
            gy = y + 2.0 * LANE
        );
    }
    for (w, i) in &lanes.worker_index {
        let y = lanes.worker_top + *i as f64 * LANE;
        let _ = write!(
            svg,
            r#"<text class="label" x="2" y="{}">{}</text>"#,
            y + LANE * 0.75,
            escape(w)
        );
    }
}

/// The time axis: ten ticks.
fn time_axis(svg: &mut String, lanes: &Lanes<'_>) {
    let axis_y = lanes.partition_row.len() as f64 * 2.0 * LANE + LANE;
    for i in 0..=10 {
        let ms = lanes.end.0.as_secs_f64() * 1000.0 * f64::from(i) / 10.0;
        let tx = LABEL + ms * lanes.scale;
        let _ = write!(
            svg,
            r#"<line class="tick" x1="{tx}" x2="{tx}" y1="0" y2="{axis_y}"/><text class="axis" x="{tx}" y="{ty}">{ms:.0} ms</text>"#,
            ty = axis_y + LANE * 0.7
        );
    }
}

/// Lease ownership under each partition: acquired until released or lost.
fn lease_bars(svg: &mut String, lanes: &Lanes<'_>, history: &History) {
    let mut open: BTreeMap<PartitionId, (Time, &str, u64)> = BTreeMap::new();
    for l in &history.leases {
        let y = lanes.lease_y(l.partition);
        match l.change {
            LeaseEvent::Acquired => {
                open.insert(l.partition, (l.at, l.worker.as_str(), l.epoch.0));
            }
            LeaseEvent::Released | LeaseEvent::Lost => {
                if let Some((from, worker, epoch)) = open.remove(&l.partition) {
                    let colour = lanes.worker_index[worker];
                    lease_bar(svg, lanes.x(from), lanes.x(l.at), y, worker, epoch, colour);
                }
                if l.change == LeaseEvent::Lost {
                    let _ = write!(
                        svg,
                        r#"<path class="fault" d="M{mx} {y0} l-4 -7 h8 z"><title>{}</title></path>"#,
                        escape(&format!(
                            "lease of p{} (epoch {}) lost by {} at {} ms",
                            l.partition,
                            l.epoch,
                            l.worker,
                            l.at.0.as_millis()
                        )),
                        mx = lanes.x(l.at),
                        y0 = y + 1.0
                    );
                }
            }
        }
    }
    for (p, (from, worker, epoch)) in &open {
        let (x0, x1) = (lanes.x(*from), lanes.x(lanes.end));
        lease_bar(svg, x0, x1, lanes.lease_y(*p), worker, *epoch, lanes.worker_index[worker]);
    }
}

/// The counterexample marks of each kind: its partitions and event ids.
type Marks<'v> = BTreeMap<&'static str, (Vec<PartitionId>, BTreeSet<&'v str>)>;

/// Deliveries, on their partition's lane and their worker's.
fn delivery_bars(svg: &mut String, lanes: &Lanes<'_>, history: &History, cx: &Marks<'_>) {
    for (i, d) in history.deliveries.iter().enumerate() {
        let (x0, x1) = (lanes.x(d.sent_at), lanes.x(d.end()).max(lanes.x(d.sent_at) + 1.0));
        let class = match d.outcome {
            Outcome::Accepted => "ok",
            Outcome::Rejected(_) => "failed",
        };
        let marks: Vec<&str> = cx
            .iter()
            .filter(|(_, (p, ids))| p.contains(&d.partition) && ids.contains(d.event_id.as_str()))
            .map(|(kind, _)| *kind)
            .collect();
        let outcome = match &d.outcome {
            Outcome::Accepted => "accepted".to_owned(),
            Outcome::Rejected(why) => format!("rejected: {why}"),
        };
        let tip = escape(&format!(
            "{} key={} seq={} attempt={} p{} by {} sent {} ms, arrived {} ms, ended {} ms: {}",
            d.event_id,
            d.key,
            d.seq,
            d.attempt,
            d.partition,
            d.worker,
            d.sent_at.0.as_millis(),
            d.arrived_at.0.as_millis(),
            d.end().0.as_millis(),
            outcome
        ));
        let data = format!(
            r#"data-i="{i}" data-event="{}" data-key="{}" data-t0="{x0:.2}" data-t1="{x1:.2}"{}"#,
            escape(&d.event_id),
            escape(&d.key),
            if marks.is_empty() {
                String::new()
            } else {
                format!(r#" data-cx="{}""#, marks.join(" "))
            }
        );
        let cx_class = if marks.is_empty() { "" } else { " cx" };
        let py = lanes.partition_row[&d.partition] as f64 * 2.0 * LANE + 2.0;
        let wy = lanes.worker_top + lanes.worker_index[d.worker.as_str()] as f64 * LANE + 2.0;
        for y in [py, wy] {
            let _ = write!(
                svg,
                r#"<rect class="d {class}{cx_class}" x="{x0:.2}" y="{y}" width="{w:.2}" height="{h}" {data}><title>{tip}</title></rect>"#,
                w = x1 - x0,
                h = LANE - 4.0
            );
        }
    }
}

/// Dead letters: a mark at the move, on the row's partition.
fn dead_letter_marks(svg: &mut String, lanes: &Lanes<'_>, history: &History) {
    let partition_of: BTreeMap<Seq, PartitionId> =
        history.enqueued.iter().map(|e| (e.seq, e.partition)).collect();
    for dl in &history.dead_letters {
        if let Some(row) = partition_of.get(&dl.seq).and_then(|p| lanes.partition_row.get(p)) {
            let y = *row as f64 * 2.0 * LANE + LANE / 2.0;
            let _ = write!(
                svg,
                r#"<text class="dlq" x="{}" y="{}">✕<title>{}</title></text>"#,
                lanes.x(dl.at),
                y + 4.0,
                escape(&format!(
                    "seq {} dead-lettered at {} ms: {}",
                    dl.seq,
                    dl.at.0.as_millis(),
                    dl.reason
                ))
            );
        }
    }
}

/// The document's head, the title and the summary line.
fn header(page: &mut String, title: &str, verdict: &Verdict) {
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n",
        t = escape(title)
    );
    let _ = writeln!(
        page,
        "<p id=\"summary\">{} events, {} delivery attempts, {} dead-lettered, {} violation(s)</p>",
        verdict.events,
        verdict.deliveries,
        verdict.dead_lettered,
        verdict.violations()
    );
}

/// The findings table: each kind's count and its first counterexample, linked to its bars.
fn findings_table(page: &mut String, verdict: &Verdict) {
    page.push_str("<table id=\"findings\"><tr><th>finding</th><th>count</th><th>first counterexample</th></tr>\n");
    for f in &verdict.findings {
        let class = if f.kind.is_violation() && f.count > 0 { "violation" } else { "" };
        let first = match &f.first {
            Some(c) => format!(
                "<a href=\"#timeline\" class=\"show\" data-kind=\"{k}\">show</a> <span class=\"events\" data-kind=\"{k}\">{}</span>: {}",
                c.event_ids.iter().map(|e| escape(e)).collect::<Vec<_>>().join(", "),
                escape(&c.note),
                k = f.kind.name()
            ),
            None => String::new(),
        };
        let _ = writeln!(
            page,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td>{first}</td></tr>",
            f.kind.name(),
            f.count
        );
    }
    page.push_str("</table>\n");
}

/// The controls and the legend, then the opening of the view the lanes are drawn in.
const CONTROLS: &str = "<div id=\"controls\">key <input id=\"key\" placeholder=\"filter one key\"> <button id=\"zin\">zoom in</button> <button id=\"zout\">zoom out</button> <button id=\"reset\">reset</button> <span class=\"hint\">drag to pan, wheel to zoom, hover a bar for its event</span><br><span class=\"legend\"><b class=\"ok\">&#9632;</b> accepted <b class=\"failed\">&#9632;</b> failed attempt <b class=\"cx\">&#9632;</b> counterexample; the thin bar under a partition is its lease holder (colour per worker), <b class=\"fault\">&#9660;</b> a lost lease, &#10005; a dead letter</span></div>\n<div id=\"view\">";

/// For each kind with a counterexample: its partitions and event ids.
fn counterexample_marks(
    verdict: &Verdict,
) -> BTreeMap<&'static str, (Vec<PartitionId>, BTreeSet<&str>)> {
    verdict
        .findings
        .iter()
        .filter_map(|f| {
            let c = f.first.as_ref()?;
            let ids = c.event_ids.iter().map(String::as_str).collect();
            Some((f.kind.name(), (c.partitions.clone(), ids)))
        })
        .collect()
}

fn lease_bar(svg: &mut String, x0: f64, x1: f64, y: f64, worker: &str, epoch: u64, index: usize) {
    let _ = write!(
        svg,
        r#"<rect class="lease w{}" x="{x0:.2}" y="{y}" width="{w:.2}" height="5"><title>{}</title></rect>"#,
        index % 8,
        escape(&format!("held by {worker}, epoch {epoch}")),
        w = (x1 - x0).max(1.0)
    );
}

fn history_end(history: &History) -> Time {
    let last_delivery = history.deliveries.iter().map(|d| d.end()).max().unwrap_or_default();
    let last_lease = history.leases.iter().map(|l| l.at).max().unwrap_or_default();
    history.end.max(last_delivery).max(last_lease)
}

const STYLE: &str = "
body{font:13px system-ui,sans-serif;margin:12px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
tr.violation td{background:#fde2e2}
#view{border:1px solid #ccc;overflow:hidden;cursor:grab}
.label,.axis{font-size:10px;fill:#333}.axis{text-anchor:middle}
.guide{stroke:#eee}.tick{stroke:#f3f3f3}
.d.ok{fill:#5aa469}.d.failed{fill:#e39b3b}.d.cx{stroke:#d00;stroke-width:2.5;fill:#ff3b3b}
.d.dim{opacity:.08}.d.flash{stroke:#000;stroke-width:4}
.lease{opacity:.7}.w0{fill:#4e79a7}.w1{fill:#f28e2b}.w2{fill:#76b7b2}.w3{fill:#b07aa1}
.w4{fill:#edc948}.w5{fill:#9c755f}.w6{fill:#bab0ac}.w7{fill:#59a14f}
.fault{fill:#d00}.dlq{fill:#000;font-size:12px;text-anchor:middle}
.hint{color:#777}.legend b.ok{color:#5aa469}.legend b.failed{color:#e39b3b}.legend b.cx{color:#ff3b3b}.legend b.fault{color:#d00}
";

const SCRIPT: &str = r#"
(function(){
  var svg=document.getElementById('timeline');
  var vb=svg.viewBox.baseVal, full={x:vb.x,y:vb.y,w:vb.width,h:vb.height};
  // What is highlighted, per finding, as the browser sees it (read by the browser test).
  var marked={};
  svg.querySelectorAll('rect.cx').forEach(function(b){b.dataset.cx.split(' ').forEach(function(k){
    (marked[k]=marked[k]||{})[b.dataset.event]=1})});
  var shown={}; Object.keys(marked).sort().forEach(function(k){shown[k]=Object.keys(marked[k]).sort()});
  document.body.dataset.highlighted=JSON.stringify(shown);
  function zoom(f,cx){var nw=Math.max(20,Math.min(full.w,vb.width*f));
    if(cx===undefined)cx=vb.x+vb.width/2; vb.x=Math.max(0,cx-(cx-vb.x)*nw/vb.width); vb.width=nw;}
  document.getElementById('zin').onclick=function(){zoom(0.5)};
  document.getElementById('zout').onclick=function(){zoom(2)};
  document.getElementById('reset').onclick=function(){vb.x=full.x;vb.width=full.w};
  svg.addEventListener('wheel',function(e){e.preventDefault();
    var r=svg.getBoundingClientRect(), cx=vb.x+(e.clientX-r.left)/r.width*vb.width;
    zoom(e.deltaY<0?0.8:1.25,cx)},{passive:false});
  var drag=null;
  svg.addEventListener('mousedown',function(e){drag={x:e.clientX,vx:vb.x}});
  window.addEventListener('mouseup',function(){drag=null});
  window.addEventListener('mousemove',function(e){if(!drag)return;
    var r=svg.getBoundingClientRect(); vb.x=Math.max(0,drag.vx-(e.clientX-drag.x)/r.width*vb.width)});
  document.getElementById('key').addEventListener('input',function(e){var k=e.target.value;
    svg.querySelectorAll('rect.d').forEach(function(b){b.classList.toggle('dim',k!==''&&b.dataset.key!==k)})});
  document.querySelectorAll('a.show').forEach(function(a){a.addEventListener('click',function(){
    var kind=a.dataset.kind, bars=[].filter.call(svg.querySelectorAll('rect.cx'),function(b){
      return (' '+b.dataset.cx+' ').indexOf(' '+kind+' ')>=0});
    if(!bars.length)return;
    var x0=Math.min.apply(null,bars.map(function(b){return +b.dataset.t0})),
        x1=Math.max.apply(null,bars.map(function(b){return +b.dataset.t1}));
    var pad=Math.max(20,(x1-x0)*0.5); vb.x=Math.max(0,x0-pad); vb.width=Math.min(full.w,x1-x0+2*pad);
    bars.forEach(function(b){b.classList.add('flash');setTimeout(function(){b.classList.remove('flash')},1500)})})});
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, Delivery, Enqueued};
    use std::time::Duration;

    fn at(ms: u64) -> Time {
        Time(Duration::from_millis(ms))
    }

    fn reordered() -> History {
        let key = "<sub&\"1'>€";
        let ev = |i: i64, ms| Enqueued {
            event_id: format!("evt<{i}>&"),
            key: key.to_owned(),
            seq: Seq(i),
            partition: PartitionId(2),
            layout: 0,
            at: at(ms),
        };
        let dl = |i: i64, ms| Delivery {
            event_id: format!("evt<{i}>&"),
            key: key.to_owned(),
            seq: Seq(i),
            partition: PartitionId(2),
            attempt: 1,
            worker: "w<0>".into(),
            sent_at: at(ms),
            arrived_at: at(ms + 1),
            finished_at: Some(at(ms + 2)),
            outcome: Outcome::Accepted,
        };
        History {
            enqueued: vec![ev(1, 0), ev(2, 1)],
            // Seq 2 first: a reorder.
            deliveries: vec![dl(2, 10), dl(1, 20)],
            end: at(100),
            ..History::default()
        }
    }

    #[test]
    fn history_text_never_reaches_the_page_unescaped() {
        let h = reordered();
        let page = render("run <1> & \"two\"", &h, &check(&h));
        for raw in ["evt<1>&", "<sub&", "w<0>", "run <1>"] {
            assert!(!page.contains(raw), "{raw:?} appears unescaped");
        }
        assert!(page.contains("evt&lt;1&gt;&amp;"));
        assert!(page.contains("€"), "non-ASCII text is kept as is (the page is UTF-8)");
        assert!(page.contains("<meta charset=\"utf-8\">"));
    }

    #[test]
    fn the_counterexample_is_marked_on_exactly_its_deliveries() {
        let h = reordered();
        let verdict = check(&h);
        let reorder = verdict.finding(crate::check::Kind::Reorder).and_then(|f| f.first.clone());
        let reorder = reorder.expect("the history reorders");
        let page = render("t", &h, &verdict);
        // Both bars (partition lane and worker lane) of each event the checker names.
        for id in &reorder.event_ids {
            let marked = format!(r#"data-event="{}" data-key"#, escape(id));
            let n = page.matches(&marked).count();
            assert_eq!(n, 2, "{id} drawn twice");
            assert!(page.contains(&format!(
                r#"data-event="{}" data-key="{}" "#,
                escape(id),
                escape(&h.deliveries[0].key)
            )));
        }
        // Seq 2 went out while seq 1 was queued: the same two deliveries are the skip's
        // counterexample too, so each bar carries both kinds.
        assert_eq!(
            page.matches(r#"data-cx="reorder skip""#).count(),
            2 * reorder.event_ids.len().min(2)
        );
    }

    #[test]
    fn the_page_fetches_nothing() {
        let h = reordered();
        let page = render("t", &h, &check(&h));
        for remote in ["src=\"http", "href=\"http", "@import", "url(", "<link", "src=\"//"] {
            assert!(!page.contains(remote), "the page loads {remote}");
        }
    }
}
