//! `uraid demo`: a RAID6 of six 1 GiB sparse files under ./uraid-demo/, served on
//! 127.0.0.1:10809 with a control socket, and how to use it.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::create::{create, CreateArgs};
use crate::serve::{serve, ServeArgs};

const MEMBERS: usize = 6;

#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Where the member files live (created on first run, reopened later).
    #[arg(long, default_value = "uraid-demo")]
    pub dir: PathBuf,
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let members: Vec<PathBuf> = (0..MEMBERS).map(|i| args.dir.join(format!("member{i}.img"))).collect();
    let existing = members.iter().filter(|m| m.exists()).count();
    if existing == 0 {
        std::fs::create_dir_all(&args.dir)?;
        // Zeroed members are already consistent for raid6 (P = Q = 0), so no initial
        // resync is needed and the files stay sparse.
        let summary = create(&CreateArgs {
            level: "6".into(),
            raid_devices: MEMBERS as u32,
            chunk: None,
            layout: None,
            bitmap: "internal".into(),
            bitmap_chunk: None,
            consistency_policy: None,
            name: Some("demo".into()),
            size: Some("1G".into()),
            assume_clean: true,
            force: false,
            write_mostly: Vec::new(),
            write_behind: None,
            failfast: Vec::new(),
            members: members.clone(),
        })?;
        eprintln!("{summary}");
    } else {
        eprintln!("uraid: reusing the demo array in {}", args.dir.display());
    }
    let control = args.dir.join(".uraid-demo.sock");
    let dir = args.dir.clone();
    let banner = move |url: &str, control: &Path| usage(url, control, &dir);
    serve(
        ServeArgs {
            listen: Some(args.listen.clone()),
            unix: None,
            export_name: None,
            read_only: false,
            // A member lost between runs should not stop the demo: it runs degraded.
            run: true,
            force: false,
            sync_speed_min: None,
            sync_speed_max: None,
            sync_policy: None,
            sync_latency_limit_pct: None,
            control: Some(control),
            balance: None,
            rmw_level: None,
            stripe_cache_size: None,
            inline_request_max_bytes: uraid_io::runtime::DEFAULT_RUN_ON_SUBMITTER_MAX_BYTES,
            connection_rings: "on".into(),
            registered_files: "auto".into(),
            registered_buffers: "auto".into(),
            io_poll: false,
            member_timeout: uraid_io::real::DEFAULT_MEMBER_TIMEOUT,
            monitor_program: None,
            expect_spares: None,
            monitor_test: false,
            scan: None,
            config: crate::config::DEFAULT_PATH.into(),
            metrics: None,
            tls: "off".into(),
            tls_certificates: None,
            tls_psk: None,
            tls_verify_peer: false,
            debug_faults: Vec::new(),
            members: members.iter().filter(|m| m.exists()).cloned().collect(),
        },
        Some(&banner),
    )
}

fn usage(url: &str, control: &Path, dir: &Path) -> String {
    let c = control.display();
    let m2 = dir.join("member2.img");
    let m2 = m2.display();
    let addr = url.trim_start_matches("nbd://").split('/').next().unwrap_or("127.0.0.1:10809");
    let (host, port) = addr.rsplit_once(':').unwrap_or(("127.0.0.1", "10809"));
    format!(
        "
uraid demo: a RAID6 of 6 x 1 GiB sparse files in {dir} is served at {url}

  qemu-img info {url}
  nbdinfo {url}
  mkdir -p /tmp/uraid-mnt && nbdfuse /tmp/uraid-mnt/disk {url} &   # then use /tmp/uraid-mnt/disk as a file
  fio --name=demo --ioengine=nbd --uri={url} --rw=randrw --bs=4k --iodepth=32 --size=256M --runtime=20 --time_based --verify=crc32c
  sudo nbd-client {host} {port} /dev/nbd0 -N demo               # a kernel block device

  uraid status --control {c}
  uraid detail --control {c}
  uraid fail {m2} --control {c}; uraid remove {m2} --control {c}; uraid add {m2} --control {c}

Ctrl-C stops it cleanly (the next start needs no resync). Run `uraid demo` again to reopen it.",
        dir = dir.display()
    )
}
