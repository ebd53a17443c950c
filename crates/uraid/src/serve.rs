//! `uraid serve`: assemble, then serve the array over NBD with a control socket, until
//! SIGINT/SIGTERM: then stop accepting, finish in-flight requests, flush, mark the
//! superblocks clean (the next start needs no resync) and exit 0.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use uraid_core::Tunables;
use uraid_nbd::{Export, Server, ServerOptions, TlsCredentials, TlsPolicy};

use crate::array::assembly::assemble;
use crate::array::io_words;
use crate::array::report::{human_bytes, level_name};
use crate::array::running::{RunningArray, StartOptions};

#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// TCP address to listen on (default 127.0.0.1:10809, loopback; use 0.0.0.0:10809 to
    /// serve others).
    #[arg(long, conflicts_with = "unix")]
    pub listen: Option<String>,
    /// Listen on a Unix-domain socket instead of TCP.
    #[arg(long)]
    pub unix: Option<PathBuf>,
    /// Export name clients ask for (the empty name works too); default: the array name.
    #[arg(long = "export-name")]
    pub export_name: Option<String>,
    /// Serve read-only; nothing is written to any member.
    #[arg(long = "read-only")]
    pub read_only: bool,
    /// Start even with members missing (degraded).
    #[arg(long, short = 'R')]
    pub run: bool,
    /// mdadm's --force: start a dirty degraded raid4/5/6 (stripes being written when it
    /// stopped may read back wrong) and take back members only a few events behind when
    /// the array cannot start without them.
    #[arg(long, short = 'f')]
    pub force: bool,
    /// md's sync_speed_min: rebuild/resync floor while other I/O runs, KiB/s (or `system`;
    /// default 1000). Not on raid0.
    #[arg(long = "sync-speed-min")]
    pub sync_speed_min: Option<String>,
    /// md's sync_speed_max: rebuild/resync ceiling, KiB/s (or `system`; default 200000).
    /// Not on raid0.
    #[arg(long = "sync-speed-max")]
    pub sync_speed_max: Option<String>,
    /// Rebuild/resync pace under load: adaptive (default: as fast as keeps the clients'
    /// mean latency within --sync-latency-limit-pct of it without the rebuild) or md (the floor,
    /// sync_speed_min). Not on raid0.
    #[arg(long = "sync-policy")]
    pub sync_policy: Option<String>,
    /// The adaptive policy's limit on the clients' mean latency, percent (default 130).
    #[arg(long = "sync-latency-limit-pct")]
    pub sync_latency_limit_pct: Option<String>,
    /// Control socket path (default: .uraid-NAME-UUID8.sock next to the first member, NAME
    /// the array's name, UUID8 the first 8 hex digits of its uuid).
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Mirror read balancing (raid1/raid10): load (default), load-time, round-robin, split,
    /// prefer. Refused on other levels.
    #[arg(long)]
    pub balance: Option<String>,
    /// 0 = reconstruct-write only, 1 = read-modify-write where cheaper (default), 2 = also
    /// where equal (raid4/5/6).
    #[arg(long = "rmw-level")]
    pub rmw_level: Option<String>,
    /// Stripe heads in the stripe cache (raid4/5/6), 17-32768 (default 256).
    #[arg(long = "stripe-cache-size")]
    pub stripe_cache_size: Option<String>,
    /// Requests up to this size (K/M suffixes) run on their connection's thread when the
    /// array thread is idle, with no hand-off between threads; 0 hands every request to
    /// the array thread. Larger requests always go to the array thread, so their engine
    /// work overlaps with reading the next request.
    #[arg(long = "inline-request-max", default_value = "64K", value_parser = crate::size_arg::parse_size_bytes)]
    pub inline_request_max_bytes: u64,
    /// `on`: a connection thread that runs a request itself issues its member I/O on an
    /// io_uring ring of its own and finishes it there, waking no other thread (kernel 6.1+;
    /// elsewhere, and with `off`, that I/O goes to the array thread's ring).
    #[arg(long = "connection-rings", default_value = "on", value_parser = ["on", "off"])]
    pub connection_rings: String,
    /// io_uring registered files (`IORING_REGISTER_FILES`): members' descriptors in each
    /// ring's fixed-file table (a removed member's file then stays open until each ring's
    /// thread next issues I/O). `auto` is off.
    #[arg(long = "registered-files", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub registered_files: String,
    /// io_uring registered buffers (`IORING_REGISTER_BUFFERS`): small O_DIRECT bounce
    /// buffers from one pinned region, read and written with READ_FIXED/WRITE_FIXED.
    /// `auto`: on where a member's I/O goes O_DIRECT to a disk or a file on one.
    #[arg(long = "registered-buffers", default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub registered_buffers: String,
    /// Polled completions (`IORING_SETUP_IOPOLL`) for NVMe members with poll queues: the
    /// array thread issues the members' O_DIRECT reads and writes on a polled ring and
    /// spins on it while they are out (connection threads then leave their requests'
    /// member I/O to it). Refused when a member is not a block device with `queue/io_poll` set.
    #[arg(long = "io-poll")]
    pub io_poll: bool,
    /// A member I/O not completed within this fails the member (its reads are served from
    /// the other copies), as the block layer's command timeout does for md: seconds, or
    /// with an `ms`/`s` suffix. md's failfast members get at most 2 s.
    #[arg(long = "member-timeout", default_value = "30s", value_parser = parse_timeout)]
    pub member_timeout: std::time::Duration,
    /// Runs PATH as `PATH EVENT ARRAY [MEMBER]` on each of mdadm --monitor's events (Fail,
    /// FailSpare, DegradedArray, RebuildStarted, Rebuild20/40/60/80, RebuildFinished,
    /// SpareActive, DeviceDisappeared); events also go to stderr.
    #[arg(long = "monitor-program")]
    pub monitor_program: Option<PathBuf>,
    /// SparesMissing at start when the array has fewer spares than N (mdadm.conf's
    /// `spares=N`, which `--scan` takes from the ARRAY line).
    #[arg(long = "expect-spares", value_name = "N")]
    pub expect_spares: Option<usize>,
    /// Serve Prometheus metrics over HTTP at http://ADDR:PORT/metrics (node_exporter's
    /// node_md_* names and uraid's own; docs/metrics.md). Port 0 picks a free one; the
    /// address is printed at start.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// A TestMessage event once serving (mdadm --monitor --test), to check the program runs.
    #[arg(long = "monitor-test", requires = "monitor_program")]
    pub monitor_test: bool,
    /// NBD over TLS, as nbdkit spells it: off (default), on (a client may start TLS) or
    /// require (a client that does not is refused). Needs --tls-certificates or --tls-psk.
    #[arg(long, default_value = "off", value_parser = ["off", "on", "require"])]
    pub tls: String,
    /// X.509: DIR holds server-cert.pem and server-key.pem (and ca-cert.pem for
    /// --tls-verify-peer), the names nbdkit and qemu use.
    #[arg(long = "tls-certificates", value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,
    /// TLS-PSK: FILE holds username:hexkey lines, as `psktool -p FILE -u NAME` writes them.
    #[arg(long = "tls-psk", value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// With --tls-certificates: a client must show a certificate signed by DIR/ca-cert.pem.
    #[arg(long = "tls-verify-peer", requires = "tls_certificates")]
    pub tls_verify_peer: bool,
    /// Testing only: fail a member's I/O, `member=SLOT,op=read|write|flush|meta[,after=N][,count=N]`
    /// (the first N such I/Os succeed, then COUNT fail, or all). Repeatable.
    #[arg(long = "debug-fault", hide = true)]
    pub debug_faults: Vec<String>,
    /// Serve the array the config file's ARRAY line NAME describes (the only one when NAME
    /// is left out), its members found by its UUID (mdadm --assemble --scan).
    #[arg(long, value_name = "NAME", num_args = 0..=1, conflicts_with = "members")]
    pub scan: Option<Option<String>>,
    /// The config file --scan reads.
    #[arg(long, default_value = crate::config::DEFAULT_PATH)]
    pub config: PathBuf,
    /// Member files or block devices, in any order.
    #[arg(required_unless_present = "scan")]
    pub members: Vec<PathBuf>,
}

const DEFAULT_LISTEN: &str = "127.0.0.1:10809";

/// `serve --scan`: the members the config file's ARRAY line finds, and its listen, unix,
/// export-name and control options and the file's PROGRAM where the command line gives none.
fn from_config(mut args: ServeArgs) -> anyhow::Result<ServeArgs> {
    let Some(name) = args.scan.clone() else { return Ok(args) };
    let config = crate::config::Config::load(&args.config)?;
    let a = config.array(name.as_deref())?;
    args.members = config.find_members(a)?;
    eprintln!(
        "uraid: {} (line {} of {}): members {}",
        a.name,
        a.line,
        config.path.display(),
        args.members.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(" ")
    );
    if args.listen.is_none() && args.unix.is_none() {
        args.listen = a.listen.clone();
        args.unix = a.unix.clone();
    }
    args.export_name = args.export_name.or_else(|| a.export_name.clone());
    args.control = args.control.or_else(|| a.control.clone());
    args.monitor_program = args.monitor_program.or_else(|| config.program.clone());
    args.expect_spares = args.expect_spares.or(a.spares);
    Ok(args)
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Binds a Unix socket. Only a stale socket nobody listens on is replaced: any other file
/// at `path` (a member, a document) is refused, never deleted.
fn bind_unix(path: &Path, what: &str) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!(
                "{} exists and is not a socket: choose another path for the {what} (nothing was changed)",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("{what} {} is in use: is this array already served?", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale {what} {}", path.display()))?;
    }
    UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on the {what} {}: {}", path.display(), io_words(&e)))
}

fn debug_faults(specs: &[String]) -> anyhow::Result<Option<Arc<uraid_io::real::fault::Faults>>> {
    if specs.is_empty() {
        return Ok(None);
    }
    let rules = specs
        .iter()
        .map(|s| uraid_io::real::fault::FaultRule::parse(s).map_err(|e| anyhow::anyhow!("--debug-fault {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    eprintln!("uraid: injecting member faults: {}", specs.join("; "));
    Ok(Some(Arc::new(uraid_io::real::fault::Faults::new(rules))))
}

/// `--member-timeout`: `30`, `30s` or `500ms`; from 100 ms to a day.
fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{s:?}: give seconds (30, 30s) or milliseconds (500ms)");
    let ms = match s.strip_suffix("ms") {
        Some(n) => n.trim().parse::<u64>().map_err(|_| bad())?,
        None => {
            s.strip_suffix('s').unwrap_or(s).trim().parse::<u64>().map_err(|_| bad())?.saturating_mul(1000)
        }
    };
    if !(100..=86_400_000).contains(&ms) {
        return Err(format!("{s:?}: the member timeout must be between 100ms and 86400s"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// `--tls`, `--tls-certificates`, `--tls-psk`: the policy and the credentials, loaded and
/// checked before anything is assembled so a bad file changes nothing.
fn tls_options(args: &ServeArgs) -> anyhow::Result<(TlsPolicy, Option<Arc<TlsCredentials>>)> {
    let policy = match args.tls.as_str() {
        "on" => TlsPolicy::On,
        "require" => TlsPolicy::Require,
        _ => TlsPolicy::Off,
    };
    let credentials = match (&args.tls_certificates, &args.tls_psk) {
        (Some(dir), _) => TlsCredentials::x509(dir, args.tls_verify_peer).map_err(|e| {
            anyhow::anyhow!(
                "--tls-certificates: {e} (the directory must hold server-cert.pem and server-key.pem, \
                 as for nbdkit; `certtool` or `openssl req` makes them); nothing was started"
            )
        })?,
        (None, Some(file)) => TlsCredentials::psk(file).map_err(|e| {
            anyhow::anyhow!(
                "--tls-psk: {e} (each line is username:hexkey; `psktool -p FILE -u NAME` writes one); \
                 nothing was started"
            )
        })?,
        (None, None) if policy == TlsPolicy::Off => return Ok((policy, None)),
        (None, None) => bail!(
            "--tls {} needs credentials: --tls-certificates DIR (server-cert.pem, server-key.pem) or \
                 --tls-psk FILE (psktool's username:hexkey lines); nothing was started",
            args.tls
        ),
    };
    if policy == TlsPolicy::Off {
        bail!(
            "TLS credentials were given but --tls is off: add --tls on (TLS optional) or --tls require; \
                 nothing was started"
        );
    }
    Ok((policy, Some(Arc::new(credentials))))
}

/// `on`/`off`/`auto` (`None`) as parsed by clap.
fn on_off_auto(v: &str) -> Option<bool> {
    match v {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    serve(from_config(args)?, None)
}

/// Text printed once serving: given the NBD URL and the control socket path.
pub type Banner = dyn Fn(&str, &Path) -> String;

/// Serves until a signal; `banner` is printed after the listeners are up (the demo's).
pub fn serve(args: ServeArgs, banner: Option<&Banner>) -> anyhow::Result<()> {
    // Before anything can be reached (the control socket, the NBD socket): a SIGTERM that
    // arrives as soon as a client sees the sockets must stop the array cleanly, not kill it.
    let mut signals =
        signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
            .context("installing the SIGINT/SIGTERM handlers")?;
    let (tls, tls_credentials) = tls_options(&args)?;
    let mut assembled = assemble(&args.members, args.run, args.force, !args.read_only)?;
    // Through the tunables' table: one range and one message per tunable. A flag given for
    // a tunable the level does not have (a stripe cache on a mirror) is refused, as
    // `uraid set` refuses it, rather than accepted and ignored.
    let level = assembled.geometry.level;
    let flags = [
        ("balance", args.balance.as_ref()),
        ("rmw_level", args.rmw_level.as_ref()),
        ("stripe_cache_size", args.stripe_cache_size.as_ref()),
        ("sync_speed_min", args.sync_speed_min.as_ref()),
        ("sync_speed_max", args.sync_speed_max.as_ref()),
        ("sync_policy", args.sync_policy.as_ref()),
        ("sync_latency_limit_pct", args.sync_latency_limit_pct.as_ref()),
    ];
    let mut tunables = Tunables::default();
    for (name, value) in flags {
        let Some(value) = value else { continue };
        let flag = format!("--{}", name.replace('_', "-"));
        let spec = uraid_core::tunables::find(name).map_err(anyhow::Error::msg)?;
        if !(spec.applies_to)(level) {
            bail!(
                "{flag} does not apply to a {} array (md has no {name} there); nothing was started",
                level_name(level.md_level())
            );
        }
        (spec.set)(&mut tunables, value).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
    }
    // Checked together, so --sync-speed-min and --sync-speed-max may both be raised at once.
    tunables.check().map_err(|e| anyhow::anyhow!("{e}; nothing was started"))?;
    for w in &assembled.plan.warnings {
        eprintln!("uraid: {w}");
    }
    let uuid = assembled.plan.uuid;
    let control_path = args.control.clone().unwrap_or_else(|| {
        crate::control::default_socket_path(&args.members[0], &assembled.plan.name, &assembled.plan.uuid)
    });
    // Bind everything before starting the array, so a busy port writes nothing.
    let listener = match &args.unix {
        Some(p) => Listener::Unix(bind_unix(p, "NBD socket")?, p.clone()),
        None => {
            let listen = args.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
            Listener::Tcp(
                TcpListener::bind(listen)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {}", io_words(&e)))?,
            )
        }
    };
    let control_listener = bind_unix(&control_path, "control socket")?;
    let metrics_listener = match &args.metrics {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for --metrics: {}", io_words(&e)))?,
        ),
        None => None,
    };

    // A stale member (older events) is never used for its data; like `mdadm --re-add`, it is
    // brought back by rebuilding it from the others once the array runs, if the array still
    // lists it in its slot. One the array let go (replaced, removed) is never written.
    let stale: Vec<PathBuf> = assembled
        .plan
        .stale
        .iter()
        .filter(|s| s.re_addable)
        .map(|s| assembled.members[s.member].path.clone())
        .collect();
    let faults = debug_faults(&args.debug_faults)?;
    let opts = StartOptions {
        read_only: args.read_only,
        inline_request_max_bytes: args.inline_request_max_bytes,
        connection_rings: args.connection_rings == "on",
        registered: uraid_io::real::RegisteredChoice {
            files: on_off_auto(&args.registered_files),
            buffers: on_off_auto(&args.registered_buffers),
        },
        io_poll: args.io_poll,
        faults,
        tunables,
        member_timeout: args.member_timeout,
        monitor_program: args.monitor_program.clone(),
        expect_spares: args.expect_spares,
    };
    // md's ppl_recover, once nothing can refuse the start any more.
    if !args.read_only {
        if let Some(msg) = assembled.replay_ppl()? {
            eprintln!("uraid: {msg}");
        }
    } else if assembled.ppl_replay_due() {
        eprintln!(
            "uraid: read-only: the partial parity log is not replayed, so stripes being written when \
             the array stopped may read back wrong where a member is missing"
        );
    }
    let array = RunningArray::start(assembled, opts)?;
    if !args.read_only {
        for path in stale {
            match array.add(&path.display().to_string(), false) {
                Ok(msg) => eprintln!("{}", msg.trim_end()),
                Err(e) => eprintln!("uraid: the stale member {} was not re-added: {e:#}", path.display()),
            }
        }
    }
    let export_name = args.export_name.clone().unwrap_or_else(|| {
        let n = &array.name;
        n.rsplit(':').next().unwrap_or(n).to_string()
    });
    let mut export = Export::new(export_name.clone(), array.device.clone());
    export.description = format!("uraid {} {}", level_name(array.geometry.level.md_level()), array.name);
    export.read_only = args.read_only;
    let tls_line = match &tls_credentials {
        Some(c) if tls == TlsPolicy::Require => format!("\nuraid: TLS required ({})", c.description()),
        Some(c) => format!("\nuraid: TLS offered, plaintext allowed ({})", c.description()),
        None => String::new(),
    };
    let opts = ServerOptions { tls, tls_credentials, ..ServerOptions::default() };
    let server = Server::new(vec![export], opts).context("NBD server")?;

    // nbds: a client must start TLS (libnbd's and nbdkit's URI scheme).
    let s = if tls == TlsPolicy::Require { "s" } else { "" };
    let url = match &listener {
        Listener::Tcp(l) => {
            let a = l.local_addr()?;
            format!("nbd{s}://{a}/{export_name}")
        }
        Listener::Unix(_, p) => format!("nbd{s}+unix:///{export_name}?socket={}", p.display()),
    };
    // Listed before the control socket answers: whoever reaches the array finds it listed.
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let _listed = crate::list::register(&crate::list::Entry {
        name: array.name.clone(),
        uuid: uraid_core::meta::superblock::format_uuid(&uuid),
        level: level_name(array.geometry.level.md_level()),
        pid: std::process::id(),
        control: absolute(&control_path),
        url: url.clone(),
        members: args.members.iter().map(|m| crate::array::member::absolute_member(m)).collect(),
    });
    let metrics_line = match &metrics_listener {
        Some(l) => format!("\nuraid: metrics on http://{}/metrics", l.local_addr()?),
        None => String::new(),
    };
    // Said before the control socket answers: whoever reaches it (a test, a script reading
    // the log) finds the pid and the stop hint printed.
    eprintln!(
        "uraid: serving {} ({}, {} devices, {}) on {url}, pid {}\nuraid: control socket {}\n\
         uraid: `uraid stop --control {}` stops it (as SIGTERM does){tls_line}{metrics_line}",
        array.name,
        level_name(array.geometry.level.md_level()),
        array.geometry.raid_disks,
        human_bytes(uraid_nbd::BlockDevice::size_bytes(&*array.device)),
        std::process::id(),
        control_path.display(),
        control_path.display()
    );
    let stop_control = Arc::new(AtomicBool::new(false));
    let stopping = Arc::new(crate::control::Stopping::default());
    let control_thread = {
        let array = array.clone();
        let stop = stop_control.clone();
        let handle =
            crate::control::StopHandle { shutdown: server.shutdown_handle(), stopping: stopping.clone() };
        std::thread::Builder::new()
            .name("uraid-control".into())
            .spawn(move || crate::control::serve(control_listener, array, stop, handle))?
    };
    let stop_metrics = Arc::new(AtomicBool::new(false));
    let metrics_thread = match metrics_listener {
        Some(l) => {
            let (array, stop) = (array.clone(), stop_metrics.clone());
            Some(
                std::thread::Builder::new()
                    .name("uraid-metrics".into())
                    .spawn(move || crate::metrics::serve(l, array, stop))?,
            )
        }
        None => None,
    };
    let shutdown = server.shutdown_handle();
    let signal_handle = signals.handle();
    let signal_thread = std::thread::Builder::new().name("uraid-signals".into()).spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!(
                "uraid: signal {sig}: stopping (finishing in-flight requests, then marking the array clean)"
            );
            shutdown.shutdown();
        }
    })?;

    if let Some(b) = banner {
        println!("{}", b(&url, &control_path));
    }
    if args.monitor_test {
        array.test_event();
    }
    crate::notify::notify(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving {} on {url}",
        std::process::id(),
        array.name
    ));
    let served = match &listener {
        Listener::Tcp(l) => server.serve_tcp(l.try_clone()?),
        Listener::Unix(l, _) => server.serve_unix(l.try_clone()?),
    };
    crate::notify::notify(&format!("STOPPING=1\nSTATUS=stopping {}", array.name));
    signal_handle.close();
    let _ = signal_thread.join();
    let stopped = array.stop();
    // A `uraid stop` waiting on the control thread hears how it ended; only then does that
    // thread stop taking commands (those arriving meanwhile find the array stopped).
    stopping.finished(match (&served, &stopped) {
        (_, Err(e)) => Err(format!("{e:#}")),
        (Err(e), Ok(())) => Err(format!("the NBD server failed: {e}")),
        (Ok(()), Ok(())) => Ok(format!("{} stopped cleanly\n", array.name)),
    });
    stop_control.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = control_thread.join();
    stop_metrics.store(true, std::sync::atomic::Ordering::SeqCst);
    if let Some(t) = metrics_thread {
        let _ = t.join();
    }
    let _ = std::fs::remove_file(&control_path);
    if let Listener::Unix(_, p) = &listener {
        let _ = std::fs::remove_file(p);
    }
    served.context("NBD server")?;
    stopped?;
    eprintln!("uraid: {} stopped cleanly", array.name);
    Ok(())
}
