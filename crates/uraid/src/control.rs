//! The control socket of a running `uraid serve`, and the client commands that use it.
//!
//! Protocol: the client sends one line (`detail`, `status`, `progress`, `monitor` (one look
//! for `uraid monitor`, JSON), `fail [--force] MEMBER`, `remove MEMBER`, `add MEMBER`,
//! `grow FIELD<TAB>...`, `stop`, ...), the server answers `OK` or `ERR` on the first
//! line, then text, and closes the connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::bail;

/// Sends one command, returns the reply text (an `ERR` reply becomes an error).
pub fn request(sock: &Path, command: &str) -> anyhow::Result<String> {
    let mut s = UnixStream::connect(sock).map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the control socket {} ({}): is `uraid serve` running with it?",
            sock.display(),
            crate::array::io_words(&e).to_lowercase()
        )
    })?;
    s.write_all(command.as_bytes())?;
    s.write_all(b"\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    let mut text = String::new();
    r.read_to_string(&mut text)?;
    match status.trim_end() {
        "OK" => Ok(text),
        "ERR" => bail!("{}", text.trim_end()),
        other => bail!("unexpected reply from the control socket: {other:?}"),
    }
}

/// How a `uraid serve` ended, for the `stop` command that asked for it: set once the array
/// is closed (or failed to close), after the NBD server stopped.
#[derive(Default)]
pub struct Stopping {
    outcome: std::sync::Mutex<Option<Result<String, String>>>,
    done: std::sync::Condvar,
}

impl Stopping {
    pub fn finished(&self, outcome: Result<String, String>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.done.notify_all();
    }

    fn wait(&self) -> Result<String, String> {
        let mut g = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = g.as_ref() {
                return o.clone();
            }
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What the control thread needs to stop the server it belongs to.
pub struct StopHandle {
    pub shutdown: uraid_nbd::ShutdownHandle,
    pub stopping: std::sync::Arc<Stopping>,
}

/// Serves the control socket until `stop` is set. One thread; each command is short
/// (an add returns once the recovery started) but `stop`, which answers once the array is
/// closed.
pub fn serve(
    listener: std::os::unix::net::UnixListener,
    array: std::sync::Arc<crate::array::running::RunningArray>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop_handle: StopHandle,
) {
    use std::sync::atomic::Ordering;
    let _ = listener.set_nonblocking(true);
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                handle_client(stream, &array, &stop_handle);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

fn handle_client(stream: UnixStream, array: &crate::array::running::RunningArray, stop: &StopHandle) {
    let mut line = String::new();
    let mut r = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    // A line of at most 4 KiB: a path and a verb.
    if (&mut r).take(4096).read_line(&mut line).is_err() {
        return;
    }
    let line = line.trim();
    let (verb, arg) = line.split_once(' ').map(|(v, a)| (v, a.trim())).unwrap_or((line, ""));
    let need_arg = |what: &str| -> anyhow::Result<()> {
        if arg.is_empty() {
            bail!("`{what}` needs a member path");
        }
        Ok(())
    };
    let reply: anyhow::Result<String> = match verb {
        "detail" => array.detail(),
        "detail-json" => array.detail_json(),
        "status" => array.status(),
        "status-json" => array.status_json(),
        "monitor" => array.monitor_look(),
        "progress" => array.progress(),
        "action" => array.action(arg),
        "fail" => need_arg("fail").and_then(|_| match arg.strip_prefix("--force ") {
            Some(path) => array.fail(path.trim(), true),
            None => array.fail(arg, false),
        }),
        "remove" => need_arg("remove").and_then(|_| array.remove(arg)),
        "add" => need_arg("add").and_then(|_| match arg.strip_prefix("--force ") {
            Some(path) => array.add(path.trim(), true),
            None => array.add(arg, false),
        }),
        // `replace [--force ]MEMBER<TAB>NEW`: a tab, as paths may hold spaces.
        "replace" => {
            let (force, rest) = match arg.strip_prefix("--force ") {
                Some(rest) => (true, rest.trim()),
                None => (false, arg),
            };
            match rest.split_once('\t') {
                Some((member, new)) => array.replace(member.trim(), new.trim(), force),
                None => Err(anyhow::anyhow!("`replace` needs the member and the new device")),
            }
        }
        // `grow KEY=VALUE<TAB>...`: a tab between fields, as paths may hold spaces.
        "grow" => crate::array::running::grow::parse_grow_request(arg)
            .and_then(|(req, adds)| array.grow(req, &adds)),
        "set" => match arg.split_once(' ') {
            Some((name, value)) => array.set_tunable(name, value),
            None if arg.is_empty() => array.set_tunable("", ""),
            None => Err(anyhow::anyhow!("`set` needs a tunable and a value, e.g. `set rmw_level 0`")),
        },
        "stop" => {
            eprintln!(
                "uraid: stop asked on the control socket: stopping (finishing in-flight requests, then \
                 marking the array clean)"
            );
            stop.shutdown.shutdown();
            stop.stopping.wait().map_err(anyhow::Error::msg)
        }
        other => Err(anyhow::anyhow!(
            "unknown control command {other:?}: use detail, detail-json, status, status-json, progress, \
             monitor, action, fail, remove, add, replace, grow, set or stop"
        )),
    };
    let mut w = stream;
    let _ = match reply {
        Ok(text) => write!(w, "OK\n{text}"),
        Err(e) => write!(w, "ERR\n{e:#}\n"),
    };
}

/// Where `uraid serve` puts its control socket unless told: next to the first member,
/// named after the array and the start of its uuid, so two arrays in one folder (both
/// named after it by default) get two sockets.
pub fn default_socket_path(
    first_member: &Path,
    array_name: &str,
    array_uuid: &[u8; 16],
) -> std::path::PathBuf {
    // Next to a member file; in the current directory for a member on an NBD server.
    let dir = Some(crate::array::member::absolute_member(first_member))
        .filter(|p| p.is_absolute())
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| std::path::PathBuf::from("."));
    let short = array_name.rsplit(':').next().unwrap_or(array_name);
    let clean: String = short
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    let uuid: String = array_uuid[..4].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!(".uraid-{}-{uuid}.sock", if clean.is_empty() { "array" } else { &clean }))
}

#[derive(clap::Args, Clone, Debug)]
pub struct MemberCommandArgs {
    /// Control socket of the running `uraid serve` (printed when it starts).
    #[arg(long)]
    pub control: std::path::PathBuf,
    /// The member file or device.
    pub member: std::path::PathBuf,
}

#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: std::path::PathBuf,
    /// JSON: the array's state, counts, sync progress and devices (docs/json.md).
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Clone, Debug)]
pub struct StopArgs {
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: std::path::PathBuf,
}

#[derive(clap::Args, Clone, Debug)]
pub struct SetArgs {
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: std::path::PathBuf,
    /// stripe_cache_size, rmw_level, preread_bypass_threshold (raid4/5/6), balance
    /// (raid1/10), sync_speed_min, sync_speed_max. Without it (and VALUE): the values now.
    #[arg(requires = "value")]
    pub tunable: Option<String>,
    /// The new value (as md's sysfs file takes it).
    pub value: Option<String>,
}

#[derive(clap::Args, Clone, Debug)]
pub struct ActionArgs {
    /// check (count inconsistent sectors in mismatch_cnt, change nothing), repair (rewrite
    /// parity or the other copies; on raid6 a single bad data block is located and
    /// rewritten), idle (stop a check or repair).
    pub action: String,
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: std::path::PathBuf,
}

/// md's `echo check > /sys/block/mdX/md/sync_action` (mdadm --action).
pub fn run_action(args: ActionArgs) -> anyhow::Result<()> {
    print!("{}", request(&args.control, &format!("action {}", args.action))?);
    Ok(())
}

/// Like writing /sys/block/mdX/md/TUNABLE: takes effect at once; prints every tunable.
pub fn run_set(args: SetArgs) -> anyhow::Result<()> {
    let line = match (&args.tunable, &args.value) {
        (Some(t), Some(v)) => format!("set {t} {v}"),
        _ => "set".to_string(),
    };
    print!("{}", request(&args.control, &line)?);
    Ok(())
}

pub fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    print!("{}", request(&args.control, if args.json { "status-json" } else { "status" })?);
    Ok(())
}

/// `uraid stop`: the server stops as on SIGTERM, and the answer comes once the array is
/// closed, saying whether it was closed cleanly.
pub fn run_stop(args: StopArgs) -> anyhow::Result<()> {
    print!("{}", request(&args.control, "stop")?);
    Ok(())
}

#[derive(clap::Args, Clone, Debug)]
pub struct FailArgs {
    #[command(flatten)]
    pub member: MemberCommandArgs,
    /// Fail the member even when the array would fail without it (mdadm refuses that).
    #[arg(long)]
    pub force: bool,
}

pub fn run_fail(fail: FailArgs) -> anyhow::Result<()> {
    let force = if fail.force { "--force " } else { "" };
    print!("{}", request(&fail.member.control, &format!("fail {force}{}", abs(&fail.member.member)))?);
    Ok(())
}

pub fn run_remove(args: MemberCommandArgs) -> anyhow::Result<()> {
    print!("{}", request(&args.control, &format!("remove {}", abs(&args.member)))?);
    Ok(())
}

#[derive(clap::Args, Clone, Debug)]
pub struct AddArgs {
    #[command(flatten)]
    pub member: MemberCommandArgs,
    /// Overwrite the superblock of a member that belongs to another array.
    #[arg(long)]
    pub force: bool,
}

/// Adds, then shows the rebuild's progress while attached to a terminal.
pub fn run_add(add: AddArgs) -> anyhow::Result<()> {
    let args = add.member;
    let force = if add.force { "--force " } else { "" };
    print!("{}", request(&args.control, &format!("add {force}{}", abs(&args.member)))?);
    show_progress(&args.control)
}

/// While attached to a terminal: the running sync's progress bar until it is done.
pub fn show_progress(control: &Path) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Ok(());
    }
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let p = request(control, "progress")?;
        let mut it = p.split_whitespace();
        let (Some(kind), Some(done), Some(total)) = (it.next(), it.next(), it.next()) else {
            println!("\r{:60}\rdone", "");
            return Ok(());
        };
        let (done, total): (f64, f64) = (done.parse().unwrap_or(0.0), total.parse().unwrap_or(1.0));
        let frac = if total > 0.0 { (done / total).min(1.0) } else { 1.0 };
        let filled = (frac * 40.0) as usize;
        print!("\r{kind} [{}{}] {:5.1}%", "#".repeat(filled), "-".repeat(40 - filled), frac * 100.0);
        let _ = std::io::stdout().flush();
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct ReplaceArgs {
    /// Control socket of the running `uraid serve`.
    #[arg(long)]
    pub control: std::path::PathBuf,
    /// The active member to replace.
    pub member: std::path::PathBuf,
    /// The new file or device, rebuilt while the member stays active.
    #[arg(long = "with")]
    pub with: std::path::PathBuf,
    /// Overwrite the superblock of a device that belongs to another array.
    #[arg(long)]
    pub force: bool,
}

/// mdadm --replace MEMBER --with NEW: prints what started (`uraid status` shows the copy).
pub fn run_replace(args: ReplaceArgs) -> anyhow::Result<()> {
    let force = if args.force { "--force " } else { "" };
    let line = format!("replace {force}{}\t{}", abs(&args.member), abs(&args.with));
    print!("{}", request(&args.control, &line)?);
    Ok(())
}

/// Members are named to the server by absolute path: it runs in another directory.
pub(crate) fn abs(p: &Path) -> String {
    crate::array::member::absolute_member(p).display().to_string()
}
