//! `uraid reproduce EXPERIMENT`: a seed's experiment on simulated disks of its era, printed
//! like the seed's table, with the seed's claims beside ours.

use clap::Args;
use uraid_io::experiments::tables::{self, Cell, Report, EXPERIMENTS};

#[derive(Args)]
pub struct ReproduceArgs {
    /// stripe-queue, degraded-read, nomerges, mirror-balance, rmw, or all.
    experiment: String,
    /// Shorter runs (fraction of the full virtual durations).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
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
    serde_json::json!({"experiment": r.experiment, "setup": r.setup, "rows": rows, "claims": claims})
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
    println!();
}

pub fn run(args: ReproduceArgs) -> anyhow::Result<()> {
    let names: Vec<&str> =
        if args.experiment == "all" { EXPERIMENTS.to_vec() } else { vec![args.experiment.as_str()] };
    if !(args.scale > 0.0 && args.scale <= 10.0) {
        anyhow::bail!("--scale must be in (0, 10]");
    }
    let mut out = Vec::new();
    for name in names {
        let r = tables::run(name, args.scale).map_err(anyhow::Error::msg)?;
        if args.json {
            out.push(report_json(&r));
        } else {
            print_report(&r);
        }
    }
    if args.json {
        let v = if out.len() == 1 { out.remove(0) } else { serde_json::Value::Array(out) };
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}
