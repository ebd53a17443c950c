//! `uraid reproduce EXPERIMENT`: a seed's experiment on simulated disks of its era, printed
//! like the seed's table, with the seed's claims beside ours.

use clap::Args;
use uraid_sim::experiments::tables::{self, Cell, Report, EXPERIMENTS};

#[derive(Args)]
pub struct ReproduceArgs {
    /// stripe-queue, degraded-read, nomerges, mirror-balance, rmw, or all.
    experiment: String,
    /// Shorter runs (fraction of the full virtual durations).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// CPU model: the seed's era by default; an era profile (iop348-2007, opteron-2008,
    /// core2-2009, xeon-2010, xeon-2015), `host` (this machine's figures) or `none`.
    #[arg(long)]
    cpu: Option<String>,
    /// Also print each table normalised by its reference cell, ours beside the seed's.
    #[arg(long)]
    normalised: bool,
    #[arg(long)]
    json: bool,
}

fn cell_json(c: &Cell) -> serde_json::Value {
    match c {
        Cell::Num(x) => serde_json::json!((x * 10.0).round() / 10.0),
        Cell::Int(x) => serde_json::json!(x),
        Cell::Text(s) => serde_json::json!(s),
    }
}

pub fn report_json(r: &Report) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = r
        .tables
        .iter()
        .flat_map(|t| {
            t.rows.iter().map(move |row| {
                let mut m = serde_json::Map::new();
                m.insert("table".into(), serde_json::json!(t.title));
                for (c, v) in t.columns.iter().zip(row) {
                    m.insert(c.clone(), cell_json(v));
                }
                serde_json::Value::Object(m)
            })
        })
        .collect();
    let claims: Vec<serde_json::Value> = r
        .claims
        .iter()
        .map(
            |c| serde_json::json!({"claim": c.claim, "holds": c.holds, "figures": c.figures, "seed": c.seed}),
        )
        .collect();
    let fidelity = r.fidelity.as_ref().map(|f| {
        let tables: Vec<serde_json::Value> = f
            .tables
            .iter()
            .map(|t| {
                let rows: Vec<serde_json::Value> = t
                    .rows
                    .iter()
                    .map(|(label, cells)| {
                        let mut m = serde_json::Map::new();
                        m.insert("row".into(), serde_json::json!(label));
                        for (c, (ours, seed)) in t.columns.iter().zip(cells) {
                            let r3 = |x: &Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
                            m.insert(c.clone(), serde_json::json!({"ours": r3(ours), "seed": r3(seed)}));
                        }
                        serde_json::Value::Object(m)
                    })
                    .collect();
                serde_json::json!({"table": t.title, "reference": t.reference, "rows": rows})
            })
            .collect();
        serde_json::json!({"share": (f.share * 1000.0).round() / 1000.0, "within": f.within, "total": f.total,
            "tolerance": uraid_sim::experiments::fidelity::TOLERANCE, "normalised": tables})
    });
    serde_json::json!({"experiment": r.experiment, "setup": r.setup, "cpu": r.cpu, "rows": rows,
        "claims": claims, "fidelity": fidelity})
}

fn fmt_norm(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}"))
}

/// Each table normalised by its reference cell: ours, then the seed's, per column.
pub fn print_normalised(r: &Report) {
    let Some(f) = &r.fidelity else { return };
    for t in &f.tables {
        println!("{} normalised by {}: ours / seed", t.title, t.reference);
        let mut header = vec!["".to_string()];
        for c in &t.columns {
            header.push(format!("{c} ours"));
            header.push("seed".into());
        }
        let cells: Vec<Vec<String>> = t
            .rows
            .iter()
            .map(|(label, v)| {
                std::iter::once(label.clone())
                    .chain(v.iter().flat_map(|(o, s)| [fmt_norm(*o), fmt_norm(*s)]))
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|i| cells.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0))
            .collect();
        let line = |v: &[String]| {
            v.iter().zip(&widths).map(|(s, w)| format!("{s:>w$}")).collect::<Vec<_>>().join("  ")
        };
        println!("{}", line(&header));
        for row in &cells {
            println!("{}", line(row));
        }
        println!();
    }
}

pub fn print_report(r: &Report) {
    println!("== {} ==", r.experiment);
    println!("{}\n", r.setup);
    for t in &r.tables {
        println!("{}", t.title);
        let cells: Vec<Vec<String>> =
            t.rows.iter().map(|row| row.iter().map(|c| c.to_string()).collect()).collect();
        let widths: Vec<usize> = (0..t.columns.len())
            .map(|i| cells.iter().map(|r| r[i].len()).chain([t.columns[i].len()]).max().unwrap_or(0))
            .collect();
        let line = |v: &[String]| {
            v.iter().zip(&widths).map(|(s, w)| format!("{s:>w$}")).collect::<Vec<_>>().join("  ")
        };
        println!("{}", line(&t.columns));
        for row in &cells {
            println!("{}", line(row));
        }
        println!();
    }
    for c in &r.claims {
        if c.holds {
            println!("claim holds: {}\n  ours: {}\n  seed: {}", c.claim, c.figures, c.seed);
        } else {
            println!(
                "FINDING: the seed's claim does NOT hold here: {}\n  ours: {}\n  seed: {}",
                c.claim, c.figures, c.seed
            );
        }
    }
    if let Some(f) = &r.fidelity {
        println!(
            "fidelity: {:.2} ({} of {} cells within ±{:.0}% of the seed's, each table normalised by its \
             reference cell; CPU model {})",
            f.share,
            f.within,
            f.total,
            uraid_sim::experiments::fidelity::TOLERANCE * 100.0,
            r.cpu
        );
    }
    println!();
}

pub fn run(args: ReproduceArgs) -> anyhow::Result<()> {
    let names: Vec<&str> =
        if args.experiment == "all" { EXPERIMENTS.to_vec() } else { vec![args.experiment.as_str()] };
    if !(args.scale > 0.0 && args.scale <= 10.0) {
        anyhow::bail!("--scale must be in (0, 10]");
    }
    if let Some(cpu) = &args.cpu {
        uraid_sim::cpu::CpuCosts::named(cpu).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    }
    let mut out = Vec::new();
    for name in names {
        let opts = tables::Options { scale: args.scale, cpu: args.cpu.clone() };
        let r = tables::run_with(name, &opts, &mut uraid_sim::experiments::sim_job::SimRunner)
            .map_err(anyhow::Error::msg)?;
        if args.json {
            out.push(report_json(&r));
        } else {
            print_report(&r);
            if args.normalised {
                print_normalised(&r);
            }
        }
    }
    if args.json {
        let v = if out.len() == 1 { out.remove(0) } else { serde_json::Value::Array(out) };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
