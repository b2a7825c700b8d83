//! Figures, the printed table, results.json, the SVG plot and docs/BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Args;

/// One figure measured in several runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
}

impl Figure {
    pub fn new(name: &str, unit: &str) -> Self {
        Self {
            name: name.to_owned(),
            unit: unit.to_owned(),
            values: Vec::new(),
        }
    }

    pub fn push(&mut self, v: f64) {
        self.values.push(v);
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(0.0)
    }

    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(0.0)
    }

    /// `median (min–max)` with `decimals` decimals.
    pub fn cell(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median(),
            self.min(),
            self.max(),
            d = decimals
        )
    }
}

/// All figures of one store × sink pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairResult {
    pub store: String,
    pub sink: String,
    /// Events per drain (and per ceiling run).
    pub events: u64,
    /// Events loaded for the article's algorithm.
    pub article_events: u64,
    pub figures: Vec<Figure>,
}

impl PairResult {
    pub fn new(store: &str, sink: &str) -> Self {
        Self {
            store: store.to_owned(),
            sink: sink.to_owned(),
            events: 0,
            article_events: 0,
            figures: Vec::new(),
        }
    }

    pub fn get(&self, prefix: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.name.starts_with(prefix))
    }

    /// The targets of the benchmark issue, checked on medians: (target, measured, met), each
    /// where its figures were measured.
    pub fn targets(&self) -> Vec<(String, String, bool)> {
        let median = |p: &str| self.get(p).map(Figure::median);
        let m = |p: &str| median(p).unwrap_or(0.0);
        // `value / of` where `of` was measured.
        let share = |value: f64, of: f64| (of > 0.0).then(|| value / of);
        let drain = m("drain, 1 relay");
        type Shown = fn(f64) -> String;
        type Met = fn(f64) -> bool;
        let checks: [(&str, Option<f64>, Shown, Met); 5] = [
            (
                "drain ≥ 60% of min(database ceiling, broker ceiling)",
                share(drain, m("database ceiling").min(m("broker ceiling"))),
                |share| format!("{:.0}%", share * 100.0),
                |share| share >= 0.6,
            ),
            (
                "drain ≥ 10× the article's algorithm",
                share(drain, m("article")),
                |ratio| format!("{ratio:.1}×"),
                |ratio| ratio >= 10.0,
            ),
            (
                "p99 commit→receive ≤ 100 ms at 1,000 events/s",
                median("commit→receive p99 at 1000/s"),
                |p99| format!("{p99:.1} ms"),
                |p99| p99 <= 100.0,
            ),
            (
                "writer throughput with the relay running ≥ 95% of without",
                share(m("writers, relay running"), m("writers, relay stopped")),
                |share| format!("{:.1}%", share * 100.0),
                |share| share >= 0.95,
            ),
            (
                "relay peak RSS ≤ 64 MiB",
                median("relay peak RSS"),
                |rss| format!("{rss:.1} MiB"),
                |rss| rss <= 64.0,
            ),
        ];
        checks
            .into_iter()
            .filter_map(|(target, value, shown, met)| {
                value.map(|v| (target.to_owned(), shown(v), met(v)))
            })
            .collect()
    }
}

/// Machine and run description.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    pub date: String,
    pub command: String,
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    /// (kind, server and version) of every store and broker measured.
    pub servers: Vec<(String, String)>,
    pub runs: usize,
    pub events: u64,
    pub aggregates: u64,
    pub article_events: u64,
    pub article_secs: u64,
    pub latency_secs: u64,
    pub writer_secs: u64,
    pub writer_rounds: u32,
    pub writers: u64,
    /// The outbox table's payload type for the drains (older results: `json`).
    #[serde(default)]
    pub payload_type: outboxkit_core::PayloadType,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub setup: Setup,
    pub pairs: Vec<PairResult>,
}

impl Report {
    /// Note the server behind a store or sink kind (once).
    pub fn add_server(&mut self, kind: &str, server: &str) {
        if !self.setup.servers.iter().any(|(k, _)| k == kind) {
            self.setup
                .servers
                .push((kind.to_owned(), server.to_owned()));
        }
    }

    pub async fn new(args: &Args, command: String) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_gib = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0 / 1024.0)
            .unwrap_or(0.0);
        Self {
            setup: Setup {
                date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
                command,
                cpu,
                cores: std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(0),
                memory_gib,
                servers: Vec::new(),
                runs: args.runs,
                events: args.events,
                aggregates: args.aggregates,
                article_events: args.article_events,
                article_secs: args.article_secs,
                latency_secs: args.latency_secs,
                writer_secs: args.writer_secs,
                writer_rounds: args.writer_rounds,
                writers: args.writers,
                payload_type: args.payload_type,
            },
            pairs: Vec::new(),
        }
    }

    fn table(&self, pair: &PairResult) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "| figure | median | min | max | unit |");
        let _ = writeln!(t, "|---|---:|---:|---:|---|");
        for f in &pair.figures {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} |",
                f.name,
                fmt(f.median()),
                fmt(f.min()),
                fmt(f.max()),
                f.unit
            );
        }
        t
    }

    fn targets(&self, pair: &PairResult) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "| target | measured (medians) | met |");
        let _ = writeln!(t, "|---|---:|:-:|");
        for (target, measured, met) in pair.targets() {
            let _ = writeln!(
                t,
                "| {target} | {measured} | {} |",
                if met { "yes" } else { "**no**" }
            );
        }
        t
    }

    pub fn print(&self) {
        println!("\nSummary (medians)\n");
        print!("{}", self.summary());
        for pair in &self.pairs {
            println!("\n{} → {}\n", pair.store, pair.sink);
            print!("{}", self.table(pair));
            println!();
            print!("{}", self.targets(pair));
        }
    }

    /// Put another run's pairs beside these (its servers too; its command is kept).
    pub fn merge(&mut self, other: Report) {
        for (kind, server) in &other.setup.servers {
            self.add_server(kind, server);
        }
        self.setup.command = format!("{}` and `{}", self.setup.command, other.setup.command);
        if other.setup.date > self.setup.date {
            self.setup.date = other.setup.date;
        }
        self.pairs.extend(other.pairs);
    }

    /// A report written before (its results.json), to render again with the current
    /// analysis.md.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn write(&self, out: &Path) -> std::io::Result<()> {
        let dir = out.join("bench");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(self).unwrap_or_default(),
        )?;
        for pair in &self.pairs {
            std::fs::write(
                dir.join(format!("{}-{}.svg", pair.store, pair.sink)),
                svg(pair),
            )?;
        }
        std::fs::write(dir.join("summary.svg"), summary_svg(self))?;
        // The sections measured apart (`--pipelines-compare`), then the hand-written analysis.
        let mut analysis = String::new();
        for section in ["pipelines.md", "capture.md"] {
            analysis.push_str(&std::fs::read_to_string(dir.join(section)).unwrap_or_default());
            analysis.push('\n');
        }
        analysis.push_str(&std::fs::read_to_string(dir.join("analysis.md")).unwrap_or_default());
        let setup_notes = std::fs::read_to_string(dir.join("setup-notes.md")).unwrap_or_default();
        std::fs::write(
            out.join("BENCHMARKS.md"),
            self.markdown(&setup_notes, &analysis),
        )?;
        Ok(())
    }

    /// One line per pair: the headline figures and how they compare.
    pub fn summary(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "| pair | drain, 1 relay (events/s) | article (events/s) | drain ÷ article | drain ÷ min(ceilings) | p99 at 1,000/s | writers with ÷ without relay | peak RSS |"
        );
        let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for pair in &self.pairs {
            let m = |p: &str| pair.get(p).map(Figure::median);
            let drain = m("drain, 1 relay").unwrap_or(0.0);
            let ratio = |a: Option<f64>| match a {
                Some(a) if a > 0.0 => format!("{:.1}×", drain / a),
                _ => "–".to_owned(),
            };
            let ceiling = match (m("database ceiling"), m("broker ceiling")) {
                (Some(d), Some(b)) if d.min(b) > 0.0 => {
                    format!("{:.0}%", 100.0 * drain / d.min(b))
                }
                _ => "–".to_owned(),
            };
            let writers = match (m("writers, relay running"), m("writers, relay stopped")) {
                (Some(w), Some(a)) if a > 0.0 => format!("{:.1}%", 100.0 * w / a),
                _ => "–".to_owned(),
            };
            let _ = writeln!(
                t,
                "| {} → {} | {} | {} | {} | {} | {} | {} | {} |",
                pair.store,
                pair.sink,
                fmt(drain),
                m("article").map(fmt).unwrap_or_else(|| "–".into()),
                ratio(m("article")),
                ceiling,
                m("commit→receive p99 at 1000/s")
                    .map(|v| format!("{} ms", fmt(v)))
                    .unwrap_or_else(|| "–".into()),
                writers,
                m("relay peak RSS")
                    .map(|v| format!("{} MiB", fmt(v)))
                    .unwrap_or_else(|| "–".into()),
            );
        }
        t
    }

    /// The page: `setup_notes` (bench/setup-notes.md, measured apart) open the setup section,
    /// `analysis` (bench/pipelines.md, bench/analysis.md) follows the pairs.
    fn markdown(&self, setup_notes: &str, analysis: &str) -> String {
        let s = &self.setup;
        let mut md = String::new();
        let _ = writeln!(md, "# Benchmarks\n");
        let _ = writeln!(
            md,
            "Generated by `outboxkit-bench` on {} — regenerate with:\n\n```sh\nscripts/bench.sh\n```\n\n\
             (which builds in release mode, starts the services and runs `{}`). Raw figures: \
             [`bench/results.json`](bench/results.json).\n",
            s.date, s.command
        );
        let _ = writeln!(md, "## Summary (medians of {} runs)\n", s.runs);
        md.push_str(&self.summary());
        let _ = writeln!(
            md,
            "\n![drain beside the article's algorithm and the ceilings](bench/summary.svg)\n"
        );
        let _ = writeln!(md, "## Setup\n");
        if !setup_notes.trim().is_empty() {
            let _ = writeln!(md, "{}", setup_notes.trim_end());
        }
        let _ = writeln!(
            md,
            "- machine: {} cores of {}, {:.0} GiB; the databases, the brokers, the relays and the benchmark share it",
            s.cores, s.cpu, s.memory_gib
        );
        for (kind, server) in &s.servers {
            let _ = writeln!(md, "- `{kind}`: {server}");
        }
        let _ = writeln!(
            md,
            "- every figure is the median of {} runs, with min and max; all figures of a pair come from the same runs on the same machine",
            s.runs
        );
        let _ = writeln!(
            md,
            "- **drain**: {} pending events (fewer where a pair's section says so) over {} aggregates (a JSON payload ≈ 300 bytes in a `{}` table) loaded with the relay stopped, then N `outbox-relay run` processes (release build, default settings, batch 500) start; timed from their start until no row is pending — a row leaves the pending set only after the broker acknowledged it — then (untimed) the broker is checked to hold every event",
            s.events, s.aggregates, s.payload_type
        );
        let _ = writeln!(
            md,
            "- **article's algorithm**: done faithfully in Rust with the same clients — one transaction selects 100 rows `FOR UPDATE SKIP LOCKED` in `id` order, publishes them one by one awaiting each acknowledgement, sets `published_at`, commits; again until empty ({} events loaded per run; stopped after {} s, its rate being steady)",
            s.article_events, s.article_secs
        );
        let _ = writeln!(md, "- **database ceiling**: the relay's own claim and mark statements (batch 500, delete on mark) in a loop, no broker");
        let _ = writeln!(md, "- **broker ceiling**: the same messages through the same sink and client (batches of 500, every acknowledgement awaited), no database");
        let _ = writeln!(
            md,
            "- **latency**: writers commit business transactions (update the order row + enqueue) at a steady rate for {} s while one relay runs; an independent consumer (Redis `XREAD BLOCK`; a Kafka consumer on every partition; AMQP `basic.consume`; 4 SQS long-polling `ReceiveMessage` loops, on the queue subscribed to the topic for SNS; a JetStream pull consumer of new messages for NATS) notes when each event arrives; commit→receive = arrival − the writer's commit returning",
            s.latency_secs
        );
        let _ = writeln!(
            md,
            "- **cost to writers**: {} writers commit business transactions as fast as they can: {} segments of {} s with no relay, alternating with {} segments of {} s with one relay running (started before the segment, once it has published what the writers left)",
            s.writers, s.writer_rounds, s.writer_secs, s.writer_rounds, s.writer_secs
        );
        let _ = writeln!(
            md,
            "- **memory**: peak RSS (`VmHWM`) of the single relay process during the drain\n"
        );
        for pair in &self.pairs {
            let _ = writeln!(md, "## {} → {}\n", pair.store, pair.sink);
            if pair.events != s.events {
                let _ = writeln!(
                    md,
                    "Drains and ceilings of this pair use **{} events** per run (see the setup).\n",
                    pair.events
                );
            }
            let _ = writeln!(
                md,
                "![throughput]({})\n",
                format_args!("bench/{}-{}.svg", pair.store, pair.sink)
            );
            md.push_str(&self.table(pair));
            md.push('\n');
            md.push_str(&self.targets(pair));
            md.push('\n');
        }
        if !analysis.trim().is_empty() {
            md.push_str(analysis.trim());
            md.push('\n');
        }
        md
    }
}

/// An SVG chart 900 wide and `height` high on white, titled `title` (baseline at `title_y`),
/// left open for its content and `</svg>`.
fn svg_start(height: f64, title_y: u32, title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"20\" y=\"{title_y}\" font-size=\"16\" font-weight=\"bold\">{title}</text>\n"
    )
}

/// Drain (1 relay) beside the article's algorithm and the lower ceiling, for every pair; log
/// scale, since the article's rate is an order of magnitude below.
fn summary_svg(report: &Report) -> String {
    let rows: Vec<(String, f64, f64, f64)> = report
        .pairs
        .iter()
        .map(|p| {
            let m = |n: &str| p.get(n).map(Figure::median).unwrap_or(0.0);
            let ceiling = match (m("database ceiling"), m("broker ceiling")) {
                (d, b) if d > 0.0 && b > 0.0 => d.min(b),
                (d, b) => d.max(b),
            };
            (
                format!("{} → {}", p.store, p.sink),
                m("drain, 1 relay"),
                m("article"),
                ceiling,
            )
        })
        .collect();
    let top = rows
        .iter()
        .map(|r| r.1.max(r.2).max(r.3))
        .fold(10.0, f64::max)
        .log10()
        .ceil();
    let bottom = 2.0; // 100 events/s
    let (left, width, row) = (230.0, 600.0, 46.0);
    let x = |v: f64| left + width * ((v.max(1.0).log10() - bottom).max(0.0) / (top - bottom));
    let height = 90.0 + row * rows.len() as f64 + 20.0;
    let title = "Events/s (log scale, medians): relay drain, article's algorithm, lower ceiling";
    let mut s = svg_start(height, 26, title);
    let _ = writeln!(
        s,
        r##"<rect x="20" y="38" width="12" height="12" fill="#2b7bb9"/><text x="38" y="49">outbox relay, 1 process</text><rect x="220" y="38" width="12" height="12" fill="#c0392b"/><text x="238" y="49">article's algorithm</text><line x1="400" x2="400" y1="36" y2="52" stroke="black" stroke-width="3"/><text x="408" y="49">min(database ceiling, broker ceiling)</text>"##
    );
    let mut decade = bottom;
    while decade <= top {
        let gx = x(10f64.powf(decade));
        let _ = writeln!(
            s,
            r##"<line x1="{gx:.1}" x2="{gx:.1}" y1="62" y2="{}" stroke="#ddd"/><text x="{gx:.1}" y="{}" text-anchor="middle" fill="#666">{}</text>"##,
            height - 24.0,
            height - 8.0,
            fmt(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for (i, (name, drain, article, ceiling)) in rows.iter().enumerate() {
        let y = 70.0 + row * i as f64;
        let _ = writeln!(s, r#"<text x="20" y="{}">{name}</text>"#, y + 20.0);
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{}" width="{:.1}" height="16" fill="#2b7bb9"/><text x="{:.1}" y="{}">{}</text>"##,
            y + 2.0,
            x(*drain) - left,
            x(*drain) + 6.0,
            y + 15.0,
            fmt(*drain)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{}" width="{:.1}" height="16" fill="#c0392b"/><text x="{:.1}" y="{}">{}</text>"##,
            y + 20.0,
            x(*article) - left,
            x(*article) + 6.0,
            y + 33.0,
            fmt(*article)
        );
        if *ceiling > 0.0 {
            let cx = x(*ceiling);
            let _ = writeln!(
                s,
                r#"<line x1="{cx:.1}" x2="{cx:.1}" y1="{}" y2="{}" stroke="black" stroke-width="3"/>"#,
                y,
                y + 38.0
            );
        }
    }
    let _ = writeln!(s, "</svg>");
    s
}

fn fmt(v: f64) -> String {
    if v >= 1000.0 {
        let s = format!("{v:.0}");
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Horizontal bars of the throughput figures (median, min–max whisker).
fn svg(pair: &PairResult) -> String {
    let bars: Vec<&Figure> = pair
        .figures
        .iter()
        .filter(|f| f.unit == "events/s" || f.unit == "rows/s")
        .collect();
    let top = bars.iter().map(|f| f.max()).fold(1.0, f64::max);
    let (left, width, row) = (330.0, 520.0, 34.0);
    let height = 60.0 + row * bars.len() as f64 + 30.0;
    let title = format!(
        "{} → {}: throughput (events/s, median of runs, whiskers min–max)",
        pair.store, pair.sink
    );
    let mut s = svg_start(height, 28, &title);
    for (i, f) in bars.iter().enumerate() {
        let y = 50.0 + row * i as f64;
        let w = width * f.median() / top;
        let color = if f.name.starts_with("drain") {
            "#2b7bb9"
        } else if f.name.starts_with("article") {
            "#c0392b"
        } else {
            "#95a5a6"
        };
        let _ = writeln!(s, r#"<text x="20" y="{}">{}</text>"#, y + 18.0, f.name);
        let _ = writeln!(
            s,
            r#"<rect x="{left}" y="{}" width="{w:.1}" height="22" fill="{color}"/>"#,
            y + 4.0
        );
        let (x0, x1) = (left + width * f.min() / top, left + width * f.max() / top);
        let _ = writeln!(
            s,
            r#"<line x1="{x0:.1}" x2="{x1:.1}" y1="{cy}" y2="{cy}" stroke="black"/><line x1="{x0:.1}" x2="{x0:.1}" y1="{a}" y2="{b}" stroke="black"/><line x1="{x1:.1}" x2="{x1:.1}" y1="{a}" y2="{b}" stroke="black"/>"#,
            cy = y + 15.0,
            a = y + 10.0,
            b = y + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}">{}</text>"#,
            left + w.max(x1 - left) + 8.0,
            y + 19.0,
            fmt(f.median())
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}
