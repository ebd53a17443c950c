//! Member faults injected into real runs, for the tests that fail real member I/O under
//! load (`uraid serve --debug-fault`): a rule fails one member's reads, writes, flushes or
//! metadata writes after a number of them went through, as dm-flakey or the error target
//! would; `when=PATH` arms it only while PATH exists, so a test can fail a member at a
//! moment of its choosing (in the middle of a recovery, say). `from=BYTES` limits a rule to
//! I/O at or past that device offset (the data area, say, not the metadata before it);
//! `hold` keeps the I/O instead of failing it: never performed, never completed, as a
//! device that stops answering, so a test can kill the server while a chosen write is
//! still not on the member (the write hole of `cli_ppl`). See docs/reliability.md.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kind of member I/O a rule fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    /// The array's own metadata I/O: superblock, bitmap and log writes and their flushes.
    Meta,
}

#[derive(Debug)]
pub struct FaultRule {
    pub member: usize,
    pub op: FaultOp,
    /// This many matching I/Os succeed first.
    pub after: u64,
    /// Then this many fail (None: every later one).
    pub count: Option<u64>,
    /// The rule counts and fails I/O only while this file exists.
    pub when: Option<PathBuf>,
    /// The rule counts only I/O at or past this device byte offset.
    pub from_bytes: Option<u64>,
    /// Hold the I/O (never performed nor completed) instead of failing it.
    pub hold: bool,
    seen: AtomicU64,
}

/// What a rule does to one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    Pass,
    Fail,
    Hold,
}

impl FaultRule {
    /// `member=N,op=read|write|flush|meta[,after=N][,count=N][,when=PATH][,from=BYTES][,hold]`.
    pub fn parse(spec: &str) -> Result<FaultRule, String> {
        let mut member = None;
        let mut op = None;
        let mut after = 0;
        let mut count = None;
        let mut when = None;
        let mut from_bytes = None;
        let mut hold = false;
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "hold" {
                hold = true;
                continue;
            }
            let (key, value) =
                part.split_once('=').ok_or_else(|| format!("{part:?}: expected key=value in {spec:?}"))?;
            let number = || value.parse::<u64>().map_err(|_| format!("{key}={value}: not a number"));
            match key {
                "member" => member = Some(number()? as usize),
                "op" => {
                    op = Some(match value {
                        "read" => FaultOp::Read,
                        "write" => FaultOp::Write,
                        "flush" => FaultOp::Flush,
                        "meta" => FaultOp::Meta,
                        other => return Err(format!("op={other}: use read, write, flush or meta")),
                    })
                }
                "after" => after = number()?,
                "count" => count = Some(number()?),
                "when" => when = Some(PathBuf::from(value)),
                "from" => from_bytes = Some(number()?),
                other => {
                    return Err(format!(
                        "{other:?}: a fault rule takes member, op, after, count, when, from and hold"
                    ))
                }
            }
        }
        Ok(FaultRule {
            member: member.ok_or_else(|| format!("{spec:?}: member=N is required"))?,
            op: op.ok_or_else(|| format!("{spec:?}: op=read|write|flush|meta is required"))?,
            after,
            count,
            when,
            from_bytes,
            hold,
            seen: AtomicU64::new(0),
        })
    }
}

/// The rules of one run.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<FaultRule>,
}

impl Faults {
    pub fn new(rules: Vec<FaultRule>) -> Faults {
        Faults { rules }
    }

    /// Counts one I/O of `op` on `member` at device byte `offset_bytes`; what the rules
    /// make of it (a hold wins over a failure).
    pub fn hit(&self, member: usize, op: FaultOp, offset_bytes: u64) -> FaultAction {
        let mut action = FaultAction::Pass;
        let armed = |r: &&FaultRule| {
            r.when.as_ref().is_none_or(|p| p.exists()) && r.from_bytes.is_none_or(|f| offset_bytes >= f)
        };
        for r in self.rules.iter().filter(|r| r.member == member && r.op == op).filter(armed) {
            let n = r.seen.fetch_add(1, Ordering::SeqCst);
            if n >= r.after && r.count.is_none_or(|c| n < r.after + c) {
                action = match (action, r.hold) {
                    (_, true) | (FaultAction::Hold, _) => FaultAction::Hold,
                    _ => FaultAction::Fail,
                };
            }
        }
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_fails_after_its_count_and_for_its_window() {
        let f = Faults::new(vec![FaultRule::parse("member=2,op=write,after=2,count=1").unwrap()]);
        let got: Vec<bool> = (0..5).map(|_| f.hit(2, FaultOp::Write, 0) == FaultAction::Fail).collect();
        assert_eq!(got, [false, false, true, false, false]);
        assert_eq!(f.hit(1, FaultOp::Write, 0), FaultAction::Pass);
        assert_eq!(f.hit(2, FaultOp::Read, 0), FaultAction::Pass);
        assert!(FaultRule::parse("member=1,op=trim").is_err());
        assert!(FaultRule::parse("op=read").is_err());
    }

    #[test]
    fn a_rule_with_when_fails_only_while_its_file_exists() {
        let gate = std::env::temp_dir().join(format!("uraid-fault-gate-{}", std::process::id()));
        let _ = std::fs::remove_file(&gate);
        let f =
            Faults::new(
                vec![FaultRule::parse(&format!("member=0,op=read,when={}", gate.display())).unwrap()],
            );
        assert_eq!(f.hit(0, FaultOp::Read, 0), FaultAction::Pass);
        std::fs::write(&gate, b"").unwrap();
        assert_eq!(f.hit(0, FaultOp::Read, 0), FaultAction::Fail);
        std::fs::remove_file(&gate).unwrap();
        assert_eq!(f.hit(0, FaultOp::Read, 0), FaultAction::Pass);
    }

    #[test]
    fn a_hold_rule_counts_only_past_its_offset_and_holds() {
        let f = Faults::new(vec![FaultRule::parse("member=1,op=write,from=4096,after=1,hold").unwrap()]);
        assert_eq!(f.hit(1, FaultOp::Write, 0), FaultAction::Pass, "before its offset: not counted");
        assert_eq!(f.hit(1, FaultOp::Write, 4096), FaultAction::Pass, "the first counted one passes");
        assert_eq!(f.hit(1, FaultOp::Write, 8192), FaultAction::Hold);
        assert_eq!(f.hit(1, FaultOp::Write, 0), FaultAction::Pass);
        assert!(FaultRule::parse("member=1,op=write,from=x").is_err());
    }
}
