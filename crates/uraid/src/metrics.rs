//! `uraid serve --metrics ADDR:PORT`: Prometheus' text format over HTTP (`GET /metrics`),
//! with node_exporter's `node_md_*` names and uraid's own `uraid_*` (docs/metrics.md).
//!
//! One thread answers, one connection at a time, each with read and write timeouts: a
//! scrape costs the array thread one short look (`RunningArray::metrics`), and encoding
//! and sending happen here, so a slow or stuck scraper delays only other scrapers.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::array::latency::OPS;
use crate::array::running::metrics::{MemberMetrics, MetricsSnapshot, MEMBER_STATES};
use crate::array::running::RunningArray;

/// A client gets this long to send its request, and to take the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request head read (an HTTP GET with a scraper's headers).
const MAX_HEAD: usize = 16 * 1024;

/// Answers on `listener` until `stop` is set.
pub fn serve(listener: TcpListener, array: Arc<RunningArray>, stop: Arc<AtomicBool>) {
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
                let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
                let _ = stream.set_nodelay(true);
                answer(stream, &array);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Reads the request head; None if the client sent none (in time).
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() > MAX_HEAD {
            return None;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn answer(mut stream: TcpStream, array: &RunningArray) {
    let Some(head) = read_head(&mut stream) else { return };
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = if method != "GET" && method != "HEAD" {
        ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n".to_string())
    } else {
        match path {
            "/metrics" => match array.metrics() {
                Ok(snap) => {
                    ("200 OK", prometheus_client::encoding::prometheus_text::CONTENT_TYPE, encode(snap))
                }
                Err(e) => ("503 Service Unavailable", "text/plain; charset=utf-8", format!("{e:#}\n")),
            },
            "/" => (
                "200 OK",
                "text/plain; charset=utf-8",
                format!("uraid {}: metrics at /metrics\n", array.name),
            ),
            _ => ("404 Not Found", "text/plain; charset=utf-8", "not found: try /metrics\n".to_string()),
        }
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        reply.push_str(&body);
    }
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.flush();
}

/// The snapshot in Prometheus' text format (version 0.0.4).
pub fn encode(snap: MetricsSnapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(snap)));
    let mut out = String::new();
    // Writing to a String fails only if a collector does, and this one does not.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

#[derive(Debug)]
struct Snapshot(MetricsSnapshot);

/// One gauge or counter family: a descriptor, then each label set's value.
fn family<V: Copy>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: &[(Vec<(&str, &str)>, V)],
    put: fn(&mut MetricEncoder, V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        put(&mut m.encode_family(labels)?, *v)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, &str)>, f64)],
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Gauge, rows, |m, v| m.encode_gauge(&v))
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, &str)>, u64)],
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Counter, rows, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(&v, None)
    })
}

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        let dev = || vec![("device", s.name.as_str())];
        let one = |v: f64| vec![(dev(), v)];
        let b = |x: bool| if x { 1.0 } else { 0.0 };

        // node_exporter's mdadm collector, by its names, labels and units.
        let e = &mut enc;
        gauge(e, "node_md_disks_required", "Total number of disks of device.", &one(s.raid_disks as f64))?;
        let disks: Vec<_> =
            [("active", s.disks_active), ("failed", s.disks_failed), ("spare", s.disks_spare)]
                .into_iter()
                .map(|(st, n)| (vec![("device", s.name.as_str()), ("state", st)], n as f64))
                .collect();
        gauge(e, "node_md_disks", "Number of active/failed/spare disks of device.", &disks)?;
        let states: Vec<_> = ["active", "inactive", "recovering", "resync", "check"]
            .into_iter()
            .map(|st| (vec![("device", s.name.as_str()), ("state", st)], b(s.state == Some(st))))
            .collect();
        gauge(e, "node_md_state", "Indicates the state of md-device.", &states)?;
        gauge(e, "node_md_blocks", "Total number of blocks on device.", &one(s.blocks as f64))?;
        gauge(
            e,
            "node_md_blocks_synced",
            "Number of blocks synced on device.",
            &one(s.blocks_synced as f64),
        )?;
        gauge(e, "node_md_raid_disks", "Number of raid disks on device.", &one(s.raid_disks as f64))?;
        gauge(e, "node_md_degraded", "Number of degraded disks on device.", &one(s.degraded as f64))?;

        // uraid's own.
        let info = vec![(vec![("device", s.name.as_str()), ("level", s.level.as_str())], 1.0)];
        gauge(e, "uraid_array_info", "The array served, by name and RAID level.", &info)?;
        gauge(
            e,
            "uraid_array_failed",
            "1 if the array has failed (too few members left).",
            &one(b(s.failed)),
        )?;
        gauge(e, "uraid_array_read_only", "1 if the array is served read-only.", &one(b(s.read_only)))?;
        let action = vec![(vec![("device", s.name.as_str()), ("action", s.sync_action.as_str())], 1.0)];
        gauge(e, "uraid_sync_action", "md's sync_action: the background job running (idle: none).", &action)?;
        gauge(
            e,
            "uraid_sync_speed_bytes_per_second",
            "Speed of the running resync, recovery or check over the last few seconds (md's sync_speed).",
            &one(s.sync_speed_bytes),
        )?;
        gauge(
            e,
            "uraid_mismatch_cnt",
            "md's mismatch_cnt: sectors the last check or repair found inconsistent.",
            &one(s.mismatch_cnt as f64),
        )?;
        if let Some(c) = &s.stripe_cache {
            gauge(
                e,
                "uraid_stripe_cache_size",
                "md's stripe_cache_size: stripe heads the cache may hold.",
                &one(c.size as f64),
            )?;
            gauge(
                e,
                "uraid_stripe_cache_heads",
                "Stripe heads in the cache, busy or idle.",
                &one(c.heads as f64),
            )?;
            gauge(
                e,
                "uraid_stripe_cache_active",
                "md's stripe_cache_active: stripe heads with work on them.",
                &one(c.active as f64),
            )?;
        }
        let arr = &s.array;
        for (name, help, v) in [
            (
                "uraid_degraded_reads",
                "Reads served by reconstructing from the other members.",
                arr.degraded_reads,
            ),
            (
                "uraid_read_errors_corrected",
                "Member read errors repaired by rewriting good data.",
                arr.read_errors_corrected,
            ),
            (
                "uraid_full_stripe_writes",
                "Writes that covered whole stripes (no reads for parity).",
                arr.full_stripe_writes,
            ),
            ("uraid_rmw_writes", "Parity updates by read-modify-write.", arr.rmw_writes),
            ("uraid_rcw_writes", "Parity updates by reconstruct-write.", arr.rcw_writes),
        ] {
            counter(e, name, help, &[(dev(), v)])?;
        }

        fn labels<'a>(s: &'a MetricsSnapshot, m: &'a MemberMetrics) -> Vec<(&'static str, &'a str)> {
            vec![("device", s.name.as_str()), ("member", m.name.as_str())]
        }
        let member = |m| labels(s, m);
        let states: Vec<_> = s
            .members
            .iter()
            .flat_map(|m| {
                MEMBER_STATES.iter().map(move |&st| {
                    let mut l = member(m);
                    l.push(("state", st));
                    (l, b(m.state == st))
                })
            })
            .collect();
        gauge(e, "uraid_member_state", "Each member's role: 1 for the state it is in.", &states)?;
        type Pick = fn(&MemberMetrics) -> u64;
        let per_member: [(&str, &str, Pick); 7] = [
            ("uraid_member_reads", "Read I/Os issued to the member.", |m| m.io.reads),
            ("uraid_member_writes", "Write I/Os issued to the member.", |m| m.io.writes),
            ("uraid_member_flushes", "Flushes issued to the member.", |m| m.io.flushes),
            ("uraid_member_read_bytes", "Bytes read from the member.", |m| m.io.read_bytes),
            ("uraid_member_written_bytes", "Bytes written to the member.", |m| m.io.write_bytes),
            ("uraid_member_errors", "Member I/Os that failed.", |m| m.io.errors),
            ("uraid_member_timeouts", "Member I/Os not answered within --member-timeout.", |m| m.timeouts),
        ];
        for (name, help, pick) in per_member {
            let rows: Vec<_> = s.members.iter().map(|m| (member(m), pick(m))).collect();
            counter(e, name, help, &rows)?;
        }
        let busy: Vec<_> = s.members.iter().map(|m| (member(m), m.io.busy_ns as f64 / 1e9)).collect();
        family(
            e,
            "uraid_member_busy_seconds",
            "Sum of the member I/Os' times, issue to completion.",
            MetricType::Counter,
            &busy,
            |m, v| m.encode_counter::<NoLabelSet, _, f64>(&v, None),
        )?;

        let mut m = e.encode_descriptor(
            "uraid_request_duration_seconds",
            "Time from a request reaching the array to its completion, per operation.",
            None,
            MetricType::Histogram,
        )?;
        for (op, h) in OPS.iter().zip(&s.latency) {
            let labels = vec![("device", s.name.as_str()), ("op", *op)];
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                h.sum_ns as f64 / 1e9,
                h.count(),
                &h.buckets_seconds(),
                None,
            )?;
        }
        Ok(())
    }
}
