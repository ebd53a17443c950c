//! Fidelity: how closely a reproduced table has the seed's shape.
//!
//! Each table's cells are normalised by the table's reference cell (the baseline the seed
//! compares against: the optimal array's largest block, the first row, or the seed's own
//! relative figures), the seed's cells the same way, and each pair is compared: a cell
//! agrees when ours is within ±25% of the seed's. The fidelity of an experiment is the
//! share of its cells that agree; reference cells themselves (1 by construction) are not
//! counted. The seeds' figures below are copied from the posts in `../shared/seeds/`.

use super::report::{Cell, Report, Table};
pub use super::report::{CellFit, Fidelity, NormCell, NormTable};

/// A normalised cell agrees when `|ours / seed - 1| <= TOLERANCE`.
pub const TOLERANCE: f64 = 0.25;

impl Fidelity {
    fn from_tables(tables: Vec<NormTable>) -> Option<Fidelity> {
        let mut cells = Vec::new();
        for t in &tables {
            for (row, vals) in &t.rows {
                for (col, &(ours, seed)) in t.columns.iter().zip(vals) {
                    let (Some(o), Some(s)) = (ours, seed) else { continue };
                    if !o.is_finite() || s <= 0.0 {
                        continue;
                    }
                    cells.push(CellFit {
                        table: t.title.clone(),
                        row: row.clone(),
                        column: col.clone(),
                        ours: o,
                        seed: s,
                        within: (o / s - 1.0).abs() <= TOLERANCE,
                    });
                }
            }
        }
        if cells.is_empty() {
            return None;
        }
        let within = cells.iter().filter(|c| c.within).count();
        let total = cells.len();
        Some(Fidelity { cells, within, total, share: within as f64 / total as f64, tables })
    }
}

/// The experiment's fidelity, or `None` when the tables lack the cells (a subset run).
pub fn score(r: &Report) -> Option<Fidelity> {
    let tables = match r.experiment.as_str() {
        "stripe-queue" => stripe_queue(r)?,
        "degraded-read" => degraded_read(r)?,
        "nomerges" => nomerges(r)?,
        "mirror-balance" => mirror_balance(r)?,
        "rmw" => rmw(r)?,
        _ => return None,
    };
    Fidelity::from_tables(tables)
}

fn table<'a>(r: &'a Report, title_prefix: &str) -> Option<&'a Table> {
    r.tables.iter().find(|t| t.title.starts_with(title_prefix))
}

fn col(t: &Table, name: &str) -> Option<usize> {
    t.columns.iter().position(|c| c == name)
}

fn num(c: &Cell) -> Option<f64> {
    match c {
        Cell::Num(x) => Some(*x),
        Cell::Int(x) => Some(*x as f64),
        Cell::Text(s) => s.trim_end_matches('%').trim_end_matches('K').parse().ok(),
    }
}

/// The value in `t` at the row whose cells `keys` (column, value) all match, column `name`.
fn at(t: &Table, keys: &[(&str, f64)], name: &str) -> Option<f64> {
    let c = col(t, name)?;
    let key_cols: Vec<(usize, f64)> =
        keys.iter().map(|(k, v)| Some((col(t, k)?, *v))).collect::<Option<_>>()?;
    t.rows
        .iter()
        .find(|row| key_cols.iter().all(|&(i, v)| num(&row[i]) == Some(v)))
        .and_then(|row| num(&row[c]))
}

// ---- 000 -------------------------------------------------------------------------------

/// Seed 000's "Avg Rate" (batching relative to the 1:1 model, %), per table, rows 4096 x
/// 1/2/4/8 threads then 131072 x 1/2/4/8.
const SEED_000: [(&str, [f64; 8]); 4] = [
    ("Sequential Reads", [0.0, -38.0, -35.0, -14.0, 2.0, -11.0, -7.0, -9.0]),
    ("Random Reads", [-9.0, -1.0, -14.0, -21.0, -8.0, -13.0, -15.0, -13.0]),
    ("Sequential Writes", [25.0, 41.0, 40.0, 15.0, 65.0, 46.0, 24.0, 28.0]),
    ("Random Writes", [2.0, -1.0, 2.0, -1.0, 2.0, 3.0, 4.0, 5.0]),
];

fn stripe_queue(r: &Report) -> Option<Vec<NormTable>> {
    let mut out = Vec::new();
    for (title, seed) in SEED_000 {
        let t = table(r, title)?;
        let mut rows = Vec::new();
        for (i, (bs, thr)) in
            [4096.0, 131072.0].iter().flat_map(|&b| [1.0, 2.0, 4.0, 8.0].map(|n| (b, n))).enumerate()
        {
            let keys = [("Blk Size", bs), ("Num Thr", thr)];
            let ours = at(t, &keys, "MB/s batching")? / at(t, &keys, "MB/s 1:1")?;
            rows.push((format!("{bs:.0} B, {thr:.0} thr"), vec![(Some(ours), Some(1.0 + seed[i] / 100.0))]));
        }
        out.push(NormTable {
            title: format!("{title} (seed 000)"),
            reference: "the 1:1 model in the same row (the seed's Avg Rate + 1)".into(),
            columns: vec!["batching / 1:1".into()],
            rows,
        });
    }
    Some(out)
}

// ---- 001 -------------------------------------------------------------------------------

/// Seed 001: bs (KiB), optimal, degraded, degraded-with-patch.
const SEED_001_SEQ: [(f64, [f64; 3]); 9] = [
    (1024.0, [1608.0, 656.0, 995.0]),
    (512.0, [1624.0, 710.0, 956.0]),
    (256.0, [1635.0, 728.0, 980.0]),
    (128.0, [1636.0, 771.0, 983.0]),
    (64.0, [1612.0, 1119.0, 1000.0]),
    (32.0, [1580.0, 1420.0, 1004.0]),
    (16.0, [1368.0, 688.0, 986.0]),
    (8.0, [768.0, 647.0, 953.0]),
    (4.0, [411.0, 413.0, 850.0]),
];
const SEED_001_RAND: [(f64, [f64; 3]); 9] = [
    (1024.0, [163.0, 160.0, 156.0]),
    (512.0, [274.0, 273.0, 272.0]),
    (256.0, [426.0, 428.0, 424.0]),
    (128.0, [576.0, 592.0, 591.0]),
    (64.0, [726.0, 724.0, 726.0]),
    (32.0, [849.0, 848.0, 837.0]),
    (16.0, [900.0, 970.0, 971.0]),
    (8.0, [927.0, 940.0, 929.0]),
    (4.0, [948.0, 940.0, 955.0]),
];

fn degraded_read(r: &Report) -> Option<Vec<NormTable>> {
    let mut out = Vec::new();
    for (title, unit, seed) in
        [("Sequential Read", "MiB/s", &SEED_001_SEQ), ("Random Read", "IOPS", &SEED_001_RAND)]
    {
        let t = table(r, title)?;
        let cols = ["optimal", "degraded", "degraded-with-patch"].map(|c| format!("{c} ({unit})"));
        let ours_ref = at(t, &[("bs (KiB)", 1024.0)], &cols[0])?;
        let seed_ref = seed[0].1[0];
        let mut rows = Vec::new();
        for &(bs, s) in seed.iter() {
            let mut cells = Vec::new();
            for (i, c) in cols.iter().enumerate() {
                let ours = at(t, &[("bs (KiB)", bs)], c)? / ours_ref;
                // The reference cell is 1 on both sides: shown, not scored.
                let reference = bs == 1024.0 && i == 0;
                cells.push((Some(ours), (!reference).then_some(s[i] / seed_ref)));
            }
            rows.push((format!("{bs:.0} KiB"), cells));
        }
        out.push(NormTable {
            title: format!("{title} (seed 001)"),
            reference: format!("optimal at 1024 KiB ({} = 1)", cols[0]),
            columns: cols.to_vec(),
            rows,
        });
    }
    Some(out)
}

// ---- 002 -------------------------------------------------------------------------------

/// Seed 002, the 25-run averages: nomerges, I/Os per second, CPU in the block I/O code (%).
const SEED_002: [(f64, f64, f64); 2] = [(0.0, 483_880.96, 7.199), (1.0, 483_921.92, 5.771)];

fn nomerges(r: &Report) -> Option<Vec<NormTable>> {
    let t = table(r, "random 4k")?;
    let iops0 = at(t, &[("nomerges", 0.0)], "IOPS")?;
    let cpu0 = at(t, &[("nomerges", 0.0)], "queue CPU ns/IO")?;
    let mut rows = Vec::new();
    for (nm, iops, cpu) in SEED_002 {
        let reference = nm == 0.0;
        let ours_iops = at(t, &[("nomerges", nm)], "IOPS")? / iops0;
        let ours_cpu = at(t, &[("nomerges", nm)], "queue CPU ns/IO")? / cpu0;
        rows.push((
            format!("nomerges {nm:.0}"),
            vec![
                (Some(ours_iops), (!reference).then_some(iops / SEED_002[0].1)),
                (Some(ours_cpu), (!reference).then_some(cpu / SEED_002[0].2)),
            ],
        ));
    }
    Some(vec![NormTable {
        title: "random 4k asynchronous direct I/O (seed 002)".into(),
        reference: "nomerges 0".into(),
        columns: vec!["IOPS".into(), "CPU in the I/O code".into()],
        rows,
    }])
}

// ---- 003 -------------------------------------------------------------------------------

/// Seed 003: algorithm, processes, linear 1 MB MBps, random tps.
const SEED_003: [(&str, f64, f64, f64); 20] = [
    ("load-time", 1.0, 101.0, 161.0),
    ("load-time", 2.0, 78.0, 265.0),
    ("load-time", 4.0, 90.0, 325.0),
    ("load-time", 8.0, 101.0, 384.0),
    ("load-time", 16.0, 118.0, 426.0),
    ("load-time", 32.0, 142.0, 457.0),
    ("round-robin", 1.0, 64.0, 158.0),
    ("round-robin", 2.0, 131.0, 260.0),
    ("round-robin", 4.0, 235.0, 342.0),
    ("round-robin", 5.0, 240.0, 362.0),
    ("round-robin", 8.0, 239.0, 397.0),
    ("round-robin", 16.0, 246.0, 432.0),
    ("round-robin", 32.0, 258.0, 452.0),
    ("load", 1.0, 104.0, 159.0),
    ("load", 2.0, 214.0, 256.0),
    ("load", 4.0, 425.0, 332.0),
    ("load", 5.0, 300.0, 352.0),
    ("load", 8.0, 245.0, 391.0),
    ("load", 16.0, 255.0, 436.0),
    ("load", 32.0, 263.0, 457.0),
];

fn mirror_balance(r: &Report) -> Option<Vec<NormTable>> {
    let t = table(r, "gmirror")?;
    let bal = col(t, "balance")?;
    let value = |name: &str, procs: f64, column: &str| -> Option<f64> {
        let p = col(t, "processes")?;
        let c = col(t, column)?;
        t.rows
            .iter()
            .find(|row| matches!(&row[bal], Cell::Text(s) if s == name) && num(&row[p]) == Some(procs))
            .and_then(|row| num(&row[c]))
    };
    let (lin, rnd) = ("linear 1MB MBps", "random tps");
    // The seed table's first row (gmirror's original load, one process).
    let (ref_l, ref_r) = (value("load-time", 1.0, lin)?, value("load-time", 1.0, rnd)?);
    let (seed_l, seed_r) = (SEED_003[0].2, SEED_003[0].3);
    let mut rows = Vec::new();
    for &(name, p, l, rr) in SEED_003.iter() {
        let reference = name == "load-time" && p == 1.0;
        rows.push((
            format!("{name}, {p:.0} proc"),
            vec![
                (Some(value(name, p, lin)? / ref_l), (!reference).then_some(l / seed_l)),
                (Some(value(name, p, rnd)? / ref_r), (!reference).then_some(rr / seed_r)),
            ],
        ));
    }
    Some(vec![NormTable {
        title: "gmirror of 4 drives (seed 003)".into(),
        reference: "the first row: gmirror's original load (load-time here), 1 process".into(),
        columns: vec![lin.into(), rnd.into()],
        rows,
    }])
}

// ---- 004 -------------------------------------------------------------------------------

/// Seed 004, skip_copy=0 (md copies, as the model charges): bsize KiB, rmw_level 1, 0 (KB/s).
const SEED_004: [(f64, f64, f64); 8] = [
    (4.0, 165.0, 140.0),
    (8.0, 324.0, 274.0),
    (16.0, 640.0, 534.0),
    (32.0, 1234.0, 1045.0),
    (64.0, 2282.0, 1962.0),
    (128.0, 4113.0, 3898.0),
    (256.0, 7557.0, 7638.0),
    (512.0, 19652.0, 19688.0),
];

fn rmw(r: &Report) -> Option<Vec<NormTable>> {
    let t = table(r, "300 seconds")?;
    let ours_ref = at(t, &[("bsize", 4.0)], "rmw_level=1")?;
    let mut rows = Vec::new();
    for (kib, one, zero) in SEED_004 {
        let reference = kib == 4.0;
        rows.push((
            format!("{kib:.0}K"),
            vec![
                (
                    Some(at(t, &[("bsize", kib)], "rmw_level=1")? / ours_ref),
                    (!reference).then_some(one / 165.0),
                ),
                (Some(at(t, &[("bsize", kib)], "rmw_level=0")? / ours_ref), Some(zero / 165.0)),
            ],
        ));
    }
    Some(vec![NormTable {
        title: "random write, 8 threads, RAID6 64K chunk (seed 004, skip_copy=0)".into(),
        reference: "rmw_level=1 at 4K".into(),
        columns: vec!["rmw_level=1".into(), "rmw_level=0".into()],
        rows,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(tables: Vec<NormTable>) -> Fidelity {
        Fidelity::from_tables(tables).unwrap()
    }

    /// ±25% either way, reference and missing cells not counted.
    #[test]
    fn cells_within_a_quarter_agree() {
        let t = NormTable {
            title: "t".into(),
            reference: "r".into(),
            columns: vec!["a".into(), "b".into()],
            rows: vec![
                ("1".into(), vec![(Some(1.0), None), (Some(1.24), Some(1.0))]),
                ("2".into(), vec![(Some(0.7), Some(1.0)), (None, Some(2.0))]),
                ("3".into(), vec![(Some(2.6), Some(2.0)), (Some(1.5), Some(2.0))]),
            ],
        };
        let f = fit(vec![t]);
        assert_eq!((f.within, f.total), (2, 4), "{f:?}");
        assert_eq!(f.share, 0.5);
        assert!(f.cells.iter().any(|c| c.row == "3" && c.column == "b" && c.within));
    }

    /// A reproduction equal to the seed scores 1; one with another shape does not.
    #[test]
    fn seed_004_against_itself() {
        let rows = SEED_004
            .iter()
            .map(|&(k, one, zero)| {
                vec![Cell::Text(format!("{k:.0}K")), Cell::Num(one), Cell::Text("-".into()), Cell::Num(zero)]
            })
            .collect();
        let table = Table {
            title: "300 seconds random write".into(),
            columns: vec!["bsize".into(), "rmw_level=1".into(), "x".into(), "rmw_level=0".into()],
            rows,
        };
        let mut r = Report {
            experiment: "rmw".into(),
            setup: String::new(),
            tables: vec![table],
            claims: Vec::new(),
            cpu: "none".into(),
            fidelity: None,
        };
        assert_eq!(score(&r).unwrap().share, 1.0);
        // Flat throughput whatever the block size: a different shape.
        for row in &mut r.tables[0].rows {
            row[1] = Cell::Num(165.0);
            row[3] = Cell::Num(140.0);
        }
        assert!(score(&r).unwrap().share < 0.3);
    }
}
