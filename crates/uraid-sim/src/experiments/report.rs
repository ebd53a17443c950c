//! What an experiment reports: its tables of cells, the seed's claims beside ours, and how
//! closely the tables have the seed's shape ([`Fidelity`], scored by `fidelity`). A leaf:
//! `tables` fills these in and `fidelity` reads them.

#[derive(Clone, Debug)]
pub enum Cell {
    Num(f64),
    Int(u64),
    Text(String),
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // A cell that was not measured (`uraid bench workload` with a subset selected).
            Cell::Num(x) if x.is_nan() => f.write_str("-"),
            Cell::Num(x) if x.abs() >= 100.0 => write!(f, "{x:.0}"),
            Cell::Num(x) => write!(f, "{x:.1}"),
            Cell::Int(x) => write!(f, "{x}"),
            Cell::Text(s) => f.write_str(s),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

#[derive(Clone, Debug)]
pub struct Claim {
    pub claim: String,
    /// What the seed's own table showed.
    pub seed: String,
    pub holds: bool,
    pub figures: String,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub experiment: String,
    pub setup: String,
    pub tables: Vec<Table>,
    pub claims: Vec<Claim>,
    /// The CPU profile the run was modelled with.
    pub cpu: String,
    /// Each table's cells normalised and compared with the seed's.
    pub fidelity: Option<Fidelity>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CellFit {
    pub table: String,
    pub row: String,
    pub column: String,
    /// Normalised values.
    pub ours: f64,
    pub seed: f64,
    pub within: bool,
}

/// A normalised cell: ours and the seed's (`None` where a side has no figure, or the
/// seed's for a reference cell, which is not scored).
pub type NormCell = (Option<f64>, Option<f64>);

/// One seed table, normalised, ours beside the seed's.
#[derive(Clone, Debug, PartialEq)]
pub struct NormTable {
    pub title: String,
    /// What every cell is divided by.
    pub reference: String,
    pub columns: Vec<String>,
    /// Row label, then a cell per column.
    pub rows: Vec<(String, Vec<NormCell>)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fidelity {
    pub cells: Vec<CellFit>,
    pub within: usize,
    pub total: usize,
    /// `within / total`.
    pub share: f64,
    pub tables: Vec<NormTable>,
}
