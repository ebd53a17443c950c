//! SVG plots of `uraid bench workload`: throughput against block size or thread count,
//! one chart per table (or per measure), one line per configuration. plotters' SVG backend
//! with its built-in text measure: no font or system library is needed.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;
use uraid_sim::experiments::tables::{Cell, Report, Table};

use crate::size_arg::parse_size_bytes;

/// One chart: `y` columns of `table` against its `x` column, a line per (series value, y).
struct Chart<'a> {
    table: &'a Table,
    title: String,
    x: usize,
    /// Plot x on a log2 axis (block sizes, process counts).
    log2_x: bool,
    x_desc: &'static str,
    series: Option<usize>,
    y: Vec<usize>,
    y_desc: String,
}

fn col(t: &Table, name: &str) -> Option<usize> {
    t.columns.iter().position(|c| c.starts_with(name))
}

/// x values: numbers, or sizes such as "4K" (in KiB).
fn x_value(c: &Cell) -> f64 {
    match c {
        Cell::Num(x) => *x,
        Cell::Int(x) => *x as f64,
        Cell::Text(s) => parse_size_bytes(s).map(|b| b as f64 / 1024.0).unwrap_or(f64::NAN),
    }
}

fn y_value(c: &Cell) -> f64 {
    match c {
        Cell::Num(x) => *x,
        Cell::Int(x) => *x as f64,
        Cell::Text(_) => f64::NAN,
    }
}

fn charts<'a>(experiment: &str, r: &'a Report) -> Vec<Chart<'a>> {
    let mut out = Vec::new();
    for t in &r.tables {
        let mk =
            |x: &str, log2_x, x_desc, series: Option<&str>, y: &[&str], y_desc: &str| -> Option<Chart<'a>> {
                Some(Chart {
                    table: t,
                    title: t.title.clone(),
                    x: col(t, x)?,
                    log2_x,
                    x_desc,
                    series: match series {
                        Some(s) => Some(col(t, s)?),
                        None => None,
                    },
                    y: y.iter().map(|c| col(t, c)).collect::<Option<Vec<_>>>()?,
                    y_desc: y_desc.to_string(),
                })
            };
        let all_y: Vec<&str> = t.columns.iter().skip(1).map(|s| s.as_str()).collect();
        let charts = match experiment {
            "stripe-queue" => {
                vec![mk("Num Thr", true, "threads", Some("Blk Size"), &["MB/s batching", "MB/s 1:1"], "MB/s")]
            }
            "degraded-read" => {
                let unit = if t.title.starts_with("Sequential") { "MiB/s" } else { "IOPS" };
                vec![mk("bs (KiB)", true, "block size (KiB)", None, &all_y, unit)]
            }
            "rmw" => {
                vec![mk("bsize", true, "block size (KiB)", None, &["rmw_level=1", "rmw_level=0"], "KB/s")]
            }
            "mirror-balance" => vec![
                mk(
                    "processes",
                    true,
                    "processes",
                    Some("balance"),
                    &["linear 1MB MBps"],
                    "linear 1 MiB reads, MB/s",
                ),
                mk(
                    "processes",
                    true,
                    "processes",
                    Some("balance"),
                    &["random tps"],
                    "random reads, I/Os per s",
                ),
            ],
            "nomerges" => vec![mk("nomerges", false, "nomerges", None, &["IOPS"], "IOPS")],
            _ => vec![],
        };
        out.extend(charts.into_iter().flatten());
    }
    out
}

type Line = (String, Vec<(f64, f64)>);

fn lines(c: &Chart) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for row in &c.table.rows {
        let x = x_value(&row[c.x]);
        let x = if c.log2_x { x.log2() } else { x };
        for &y in &c.y {
            let name = match c.series {
                Some(s) if c.y.len() > 1 => format!("{} {}", row[s], c.table.columns[y]),
                Some(s) => row[s].to_string(),
                None => c.table.columns[y].clone(),
            };
            let v = y_value(&row[y]);
            let i = match out.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    out.push((name, Vec::new()));
                    out.len() - 1
                }
            };
            if x.is_finite() && v.is_finite() {
                out[i].1.push((x, v));
            }
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Write the experiment's charts, stacked, into one SVG file.
pub fn write_svg(path: &Path, experiment: &str, r: &Report) -> anyhow::Result<()> {
    let charts = charts(experiment, r);
    anyhow::ensure!(!charts.is_empty(), "nothing to plot for {experiment}");
    let err = |e: &dyn std::fmt::Display| anyhow!("{e}");
    let root = SVGBackend::new(path, (900, 380 * charts.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let areas = root.split_evenly((charts.len(), 1));
    for (area, c) in areas.iter().zip(&charts) {
        let lines = lines(c);
        let pts = || lines.iter().flat_map(|l| l.1.iter());
        let (mut x0, mut x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let y1 = pts().fold(0.0f64, |m, p| m.max(p.1));
        if x0 > x1 {
            (x0, x1) = (0.0, 1.0);
        }
        if c.log2_x {
            (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
        } else if x1 - x0 < 1e-9 {
            (x0, x1) = (x0 - 0.5, x1 + 0.5);
        }
        let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
        let mut cc = ChartBuilder::on(area)
            .caption(format!("{experiment}: {}", c.title), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(|e| err(&e))?;
        let log2 = c.log2_x;
        let x_fmt = move |v: &f64| {
            if !log2 {
                format!("{v}")
            } else if (v - v.round()).abs() < 1e-6 {
                format!("{}", 2f64.powf(v.round()))
            } else {
                String::new()
            }
        };
        let steps = if c.log2_x { (x1 - x0) as usize + 1 } else { 10 };
        cc.configure_mesh()
            .x_desc(c.x_desc)
            .y_desc(c.y_desc.as_str())
            .x_labels(steps)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|v: &f64| {
                if v.abs() >= 100.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.1}")
                }
            })
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, pts)) in lines.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            cc.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        cc.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
