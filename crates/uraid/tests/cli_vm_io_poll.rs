//! `serve --io-poll` on devices that have poll queues, which this host's kernel cannot give:
//! uraid runs inside the md VM (`../shared/tools/mdvm`, built `--with-clients` by
//! scripts/install-deps.sh) on four null_blk devices loaded with poll queues
//! (`queue_mode=2 poll_queues=2 memory_backed=1`), the kernel's NBD client in front. A
//! member without poll queues is refused naming it; a RAID5 of the null_blk devices served
//! with `--io-poll` recovers, takes a pattern written through NBD and reads it back, its
//! member I/O polled (the server counts it at stop), and Linux md then assembles it, reads
//! the same bytes and its `check` finds mismatch_cnt 0. The script is tests/vm/io_poll.sh.

mod common;

use std::path::{Path, PathBuf};

use common::*;

#[test]
fn a_raid5_of_null_blk_devices_with_poll_queues_is_served_polled_and_md_agrees() {
    let dir = TempDir::new("vmiopoll");
    let binary = uraid_for_vm(&dir);
    // Two small disks for the member that cannot poll (virtio); the array is null_blk's.
    let images: Vec<PathBuf> = (0..2)
        .map(|i| {
            let p = dir.path(&format!("vd{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(16 << 20).unwrap();
            p
        })
        .collect();
    let mut files = vec![binary.clone()];
    // A build with TLS links OpenSSL, which the VM's root lacks.
    files.extend(libraries_the_vm_lacks(&binary));
    files.extend(vm_kernel_modules(&["fs/configfs/configfs.ko", "drivers/block/null_blk/null_blk.ko"]));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm/io_poll.sh");
    let o = md_vm_with(&script, &images, false, &files);
    let out = text(&o);
    for step in [
        "queue/io_poll 1",
        "refused without poll queues",
        "member I/Os were polled",
        "mismatch_cnt 0",
        "IO-POLL OK",
    ] {
        assert!(out.contains(step), "the VM script did not get to {step:?}:\n{out}");
    }
    assert!(o.status.success(), "{out}");
}

/// The VM kernel's modules at `rel` (under its `kernel/` folder), from the md VM's build
/// folder (`$MDVM_BUILD`, by default `~/.cache/mdvm`, where build-vm unpacked the kernel).
fn vm_kernel_modules(rel: &[&str]) -> Vec<PathBuf> {
    let build = std::env::var_os("MDVM_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/mdvm"));
    let version = std::fs::read_to_string(build.join("kernel-version")).unwrap_or_else(|e| {
        panic!("{}: {e}: the md VM is not built (scripts/install-deps.sh)", build.display())
    });
    let kernel = build.join("kernel-deb/x/lib/modules").join(version.trim()).join("kernel");
    rel.iter()
        .map(|r| {
            let p = kernel.join(r);
            assert!(p.exists(), "{} is missing: the VM's kernel has no such module", p.display());
            p
        })
        .collect()
}
