//! Real member faults below uraid, which this host's kernel cannot give: uraid runs inside
//! the md VM (`../shared/tools/mdvm`, built `--with-clients` by scripts/install-deps.sh) on
//! device-mapper members, with the kernel's NBD client in front. A member turned to dm's
//! error target during a write pass, or while idle, is failed before the pass completes,
//! with no client error and the data read back; a suspended member (its I/O never
//! answers) is failed after `--member-timeout`, the writes go on degraded, and `status`
//! answers throughout. The script is tests/vm/block_faults.sh; docs/reliability.md.

mod common;

use std::path::{Path, PathBuf};

use common::*;

#[test]
fn dm_members_that_fail_or_hang_are_failed_and_the_client_sees_no_error() {
    let dir = TempDir::new("vmblock");
    let binary = uraid_for_vm(&dir);
    let images: Vec<PathBuf> = (0..8)
        .map(|i| {
            let p = dir.path(&format!("vd{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(48 << 20).unwrap();
            p
        })
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/block_faults.sh");
    let mut files = vec![binary.clone()];
    files.extend(libraries_the_vm_lacks(&binary));
    let o = md_vm_with(&script, &images, false, &files);
    let out = text(&o);
    for phase in ["1 ok", "2 ok", "3 ok", "BLOCK-FAULTS OK"] {
        assert!(out.contains(phase), "the VM script did not get to {phase:?}:\n{out}");
    }
    assert!(o.status.success(), "{out}");
}
