//! `uraid serve --metrics`: the endpoint fetched with curl, parsed by a Prometheus text
//! parser (prometheus-parse, not ours), node_exporter's names present, and figures that
//! follow I/O, a fail and an add (docs/metrics.md).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use prometheus_parse::{Scrape, Value};

/// The metrics URL `uraid serve` printed at start.
fn metrics_url(s: &Served) -> String {
    let t0 = Instant::now();
    loop {
        let log = s.log_text();
        if let Some(at) = log.find("metrics on http://") {
            let rest = &log[at + "metrics on ".len()..];
            return rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no metrics address printed:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn scrape(url: &str) -> Scrape {
    let o = tool("curl", &["-sS", "--fail", "--max-time", "10", url]);
    assert!(o.status.success(), "curl {url}: {}", text(&o));
    let body = String::from_utf8(o.stdout).unwrap();
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("the exposition parses")
}

fn number(v: &Value) -> f64 {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
        other => panic!("not a number: {other:?}"),
    }
}

/// The value of `metric` whose labels include all of `labels` (exactly one must match).
fn get(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&prometheus_parse::Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{metric} {labels:?}: {} samples", found.len());
    number(&found[0].value)
}

fn sum(s: &Scrape, metric: &str) -> f64 {
    s.samples.iter().filter(|x| x.metric == metric).map(|x| number(&x.value)).sum()
}

/// Polls until `f` holds for a scrape, at most 20 s.
fn wait_for(url: &str, what: &str, f: impl Fn(&Scrape) -> bool) -> Scrape {
    let t0 = Instant::now();
    loop {
        let s = scrape(url);
        if f(&s) {
            return s;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "metrics never showed {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn metrics_follow_io_a_fail_and_an_add() {
    let dir = TempDir::new("metrics");
    let members: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("m{i}"))).collect();
    let mut args = vec!["create", "--level", "5", "--raid-devices", "3", "--size", "16M", "--assume-clean"];
    args.extend(["--name", "metrics"]);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    let served = Served::start(&dir, &members, &["--metrics", "127.0.0.1:0"]);
    let url = metrics_url(&served);
    let dev = served.ctl("detail", None).lines().next().unwrap().trim_end_matches(':').to_string();
    let m = |i: usize| members[i].display().to_string();

    let s = scrape(&url);
    assert_eq!(get(&s, "node_md_disks_required", &[("device", &dev)]), 3.0);
    assert_eq!(get(&s, "node_md_disks", &[("device", &dev), ("state", "active")]), 3.0);
    assert_eq!(get(&s, "node_md_disks", &[("state", "failed")]), 0.0);
    assert_eq!(get(&s, "node_md_disks", &[("state", "spare")]), 0.0);
    assert_eq!(get(&s, "node_md_state", &[("state", "active")]), 1.0);
    assert_eq!(get(&s, "node_md_state", &[("state", "recovering")]), 0.0);
    // node_md_blocks is /proc/mdstat's "N blocks" (KiB), as `uraid status` prints it.
    let status = served.ctl("status", None);
    let blocks: f64 =
        status.split(" blocks").next().unwrap().split_whitespace().last().unwrap().parse().unwrap();
    assert_eq!(get(&s, "node_md_blocks", &[]), blocks);
    assert_eq!(get(&s, "node_md_blocks_synced", &[]), blocks);
    assert_eq!(get(&s, "uraid_stripe_cache_size", &[]), 256.0);
    let reads0 = sum(&s, "uraid_member_reads_total");
    let written0 = sum(&s, "uraid_member_written_bytes_total");

    qemu_io(
        &served.url,
        &[
            "write -P 0x5a 0 1M".into(),
            "read -P 0x5a 0 1M".into(),
            "read -P 0x5a 4k 4k".into(),
            "flush".into(),
        ],
    );
    let s = scrape(&url);
    assert!(sum(&s, "uraid_member_reads_total") > reads0, "member reads did not grow");
    // RAID5 writes its data and parity: at least 1 MiB, more than the data alone.
    assert!(sum(&s, "uraid_member_written_bytes_total") >= written0 + f64::from(1 << 20));
    assert!(get(&s, "uraid_request_duration_seconds_count", &[("op", "read")]) >= 2.0);
    assert!(get(&s, "uraid_request_duration_seconds_count", &[("op", "write")]) >= 1.0);
    assert!(get(&s, "uraid_request_duration_seconds_count", &[("op", "flush")]) >= 1.0);
    for sample in s.samples.iter().filter(|x| x.metric == "uraid_request_duration_seconds") {
        let Value::Histogram(b) = &sample.value else { panic!("not a histogram: {sample:?}") };
        assert!(b.windows(2).all(|w| w[0].count <= w[1].count), "buckets not cumulative: {b:?}");
        let op = sample.labels.get("op").unwrap();
        let count = get(&s, "uraid_request_duration_seconds_count", &[("op", op)]);
        assert_eq!(b.last().map(|x| (x.less_than, x.count)), Some((f64::INFINITY, count)));
    }

    // A scraper that connects and never sends its request holds no one up: I/O goes on.
    let port = url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let mut stuck = std::net::TcpStream::connect(&port).unwrap();
    stuck.write_all(b"GET /metr").unwrap();
    let t0 = Instant::now();
    qemu_io(&served.url, &["write -P 0x33 2M 256k".into(), "read -P 0x33 2M 256k".into()]);
    assert!(t0.elapsed() < Duration::from_secs(4), "I/O waited on a stuck scraper");
    drop(stuck);

    served.ctl("fail", Some(&members[1]));
    let s = wait_for(&url, "the failed member", |s| get(s, "node_md_disks", &[("state", "failed")]) == 1.0);
    assert_eq!(get(&s, "node_md_disks", &[("state", "active")]), 2.0);
    assert_eq!(get(&s, "node_md_degraded", &[]), 1.0);
    assert_eq!(get(&s, "uraid_member_state", &[("member", &m(1)), ("state", "faulty")]), 1.0);
    assert_eq!(get(&s, "uraid_member_state", &[("member", &m(0)), ("state", "active")]), 1.0);
    // Reads of the lost member's chunks are rebuilt from the others.
    let degraded0 = get(&s, "uraid_degraded_reads_total", &[]);
    qemu_io(&served.url, &["read -P 0x5a 0 1M".into()]);
    assert!(get(&scrape(&url), "uraid_degraded_reads_total", &[]) > degraded0);

    // A new device rebuilt into the slot: active again, the failed one still listed until
    // removed, then gone.
    let new = dir.path("m3");
    std::fs::File::create(&new).unwrap().set_len(std::fs::metadata(&members[0]).unwrap().len()).unwrap();
    let control = served.control.display().to_string();
    // Slowed to 1 MB/s, the rebuild is seen under way.
    ok(uraid(&["set", "sync_speed_max", "1000", "--control", &control]), "uraid set");
    served.ctl("add", Some(&new));
    let s =
        wait_for(&url, "the rebuild under way", |s| get(s, "uraid_sync_speed_bytes_per_second", &[]) > 0.0);
    assert_eq!(get(&s, "node_md_state", &[("state", "recovering")]), 1.0);
    assert_eq!(get(&s, "node_md_state", &[("state", "active")]), 0.0);
    assert_eq!(get(&s, "uraid_sync_action", &[("action", "recover")]), 1.0);
    assert!(get(&s, "node_md_blocks_synced", &[]) < blocks);
    let new_name = new.display().to_string();
    assert_eq!(get(&s, "uraid_member_state", &[("member", &new_name), ("state", "rebuilding")]), 1.0);
    ok(uraid(&["set", "sync_speed_max", "200000", "--control", &control]), "uraid set");
    // The slot is in sync (node_md_disks) a moment before the superblock round names the
    // device its member (uraid_member_state): both are waited for.
    let s = wait_for(&url, "the rebuilt member", |s| {
        get(s, "node_md_disks", &[("state", "active")]) == 3.0
            && get(s, "uraid_member_state", &[("member", &new_name), ("state", "active")]) == 1.0
    });
    assert_eq!(get(&s, "node_md_state", &[("state", "active")]), 1.0);
    assert_eq!(get(&s, "node_md_blocks_synced", &[]), blocks);
    assert!(get(&s, "uraid_member_written_bytes_total", &[("member", &new.display().to_string())]) > 0.0);
    served.ctl("remove", Some(&members[1]));
    let s =
        wait_for(&url, "the removed member gone", |s| get(s, "node_md_disks", &[("state", "failed")]) == 0.0);
    assert_eq!(get(&s, "node_md_degraded", &[]), 0.0);
    served.stop();
}
