//! Helpers for driving the built `uraid` binary and the real tools around it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const URAID: &str = env!("CARGO_BIN_EXE_uraid");

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "uraid-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a tool that the test suite needs; a missing tool fails the test.
pub fn tool(name: &str, args: &[&str]) -> Output {
    Command::new(name).args(args).output().unwrap_or_else(|e| {
        panic!("{name} is required by this test (scripts/install-deps.sh installs it): {e}")
    })
}

pub fn uraid(args: &[&str]) -> Output {
    tool(URAID, args)
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what} failed ({}):\n{}", o.status, text(&o));
    text(&o)
}

pub fn sha256_file(p: &Path) -> String {
    let bytes = std::fs::read(p).unwrap();
    format!("{:x}", Sha256::digest(&bytes))
}

/// `uraid create --assume-clean` of `n` members `m0`.. of `size` each in `dir`.
pub fn create_clean(dir: &TempDir, level: &str, n: usize, size: &str, extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("m{i}"))).collect();
    let count = n.to_string();
    let mut args =
        vec!["create", "--level", level, "--raid-devices", &count, "--size", size, "--assume-clean"];
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    members
}

pub fn paths(v: &[PathBuf]) -> Vec<&str> {
    v.iter().map(|p| p.to_str().unwrap()).collect()
}

/// `mdadm --examine` fields of one member.
pub fn mdadm_field(examine: &str, key: &str) -> Option<String> {
    examine.lines().find_map(|l| {
        let (k, v) = l.split_once(" : ")?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// A running `uraid serve`; SIGTERM and wait on `stop`, SIGKILL on drop.
pub struct Served {
    pub child: Option<Child>,
    pub control: PathBuf,
    pub url: String,
    pub log: PathBuf,
}

impl Served {
    /// Serves on a Unix socket in `dir`; waits until the control socket answers.
    pub fn start(dir: &TempDir, members: &[PathBuf], extra: &[&str]) -> Served {
        Served::spawn(dir, members, false, extra)
    }

    /// Serves on TCP on a free loopback port; `url` is the one the server printed (nbds://
    /// under `--tls require`).
    pub fn start_tcp(dir: &TempDir, members: &[PathBuf], extra: &[&str]) -> Served {
        Served::spawn(dir, members, true, extra)
    }

    fn spawn(dir: &TempDir, members: &[PathBuf], tcp: bool, extra: &[&str]) -> Served {
        let sock = dir.path("nbd.sock");
        let control = dir.path("control.sock");
        let log = dir.path(&format!("serve-{}.log", std::process::id()));
        let logf = std::fs::File::create(&log).unwrap();
        let listen = if tcp { ["--listen", "127.0.0.1:0"] } else { ["--unix", sock.to_str().unwrap()] };
        let mut args: Vec<String> = vec![
            "serve".into(),
            listen[0].into(),
            listen[1].into(),
            "--control".into(),
            control.display().to_string(),
            "--export-name".into(),
            "t".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(members.iter().map(|p| p.display().to_string()));
        let child = Command::new(URAID)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("spawn uraid serve");
        let mut s = Served {
            child: Some(child),
            control: control.clone(),
            url: format!("nbd+unix:///t?socket={}", sock.display()),
            log,
        };
        let t0 = Instant::now();
        loop {
            // The control socket accepts connections from its bind on; the stop hint is
            // printed once the array is listed, just before the control socket is served.
            if std::os::unix::net::UnixStream::connect(&control).is_ok()
                && (tcp || sock.exists())
                && s.log_text().contains("uraid stop --control")
            {
                break;
            }
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("uraid serve exited ({st}):\n{}", s.log_text());
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "uraid serve did not start:\n{}", s.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        if tcp {
            // "... on nbd://127.0.0.1:PORT/t, pid N"
            let log = s.log_text();
            let url = log.split_whitespace().find(|w| w.starts_with("nbd://") || w.starts_with("nbds://"));
            s.url = url
                .unwrap_or_else(|| panic!("no URL in the server's log:\n{log}"))
                .trim_end_matches(',')
                .into();
        }
        s
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn ctl(&self, verb: &str, member: Option<&Path>) -> String {
        let c = self.control.display().to_string();
        let mut args = vec![verb.to_string()];
        if let Some(m) = member {
            args.push(m.display().to_string());
        }
        args.push("--control".into());
        args.push(c);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(uraid(&a), &format!("uraid {verb}"))
    }

    /// SIGTERM, then the exit status must be success.
    pub fn stop(self) -> String {
        let (st, log) = self.terminate();
        assert!(st.success(), "uraid serve exited with {st} after SIGTERM:\n{log}");
        log
    }

    /// SIGTERM and wait (at most 30 s): the exit status and the server's log.
    pub fn terminate(self) -> (std::process::ExitStatus, String) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.wait_exit()
    }

    /// `uraid stop --control` (its output), then the server's exit status and log.
    pub fn stop_verb(self) -> (std::process::Output, std::process::ExitStatus, String) {
        let c = self.control.display().to_string();
        let out = uraid(&["stop", "--control", &c]);
        let (st, log) = self.wait_exit();
        (out, st, log)
    }

    /// Waits (at most 30 s) for the server to exit: its status and log.
    fn wait_exit(mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, self.log_text());
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "uraid serve did not stop:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Served {
    /// SIGKILL, as a crash: nothing of the server's own shutdown runs.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn qemu_io(url: &str, cmds: &[String]) -> String {
    let mut args: Vec<String> = vec!["-f".into(), "raw".into()];
    for c in cmds {
        args.push("-c".into());
        args.push(c.clone());
    }
    args.push(url.into());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = tool("qemu-io", &a);
    let t = text(&o);
    assert!(
        o.status.success() && !t.contains("Pattern verification failed") && !t.contains("failed:"),
        "qemu-io: {t}"
    );
    t
}

fn mdvm_tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/mdvm")
}

/// Runs `script` as root in the md VM with `images` as /dev/vda, /dev/vdb, ... (`read_only`:
/// a qemu snapshot, the images stay as they are). One vCPU: qemu's multi-threaded TCG has
/// aborted mid-boot on an assertion in its own memory map (CI, qemu 10.0). A VM that died
/// without reporting the script's exit status is booted again, at most twice; a script
/// that ran and failed, or a VM that hit its time limit, is returned as it is.
pub fn md_vm(script: &Path, images: &[PathBuf], read_only: bool) -> Output {
    md_vm_with(script, images, read_only, &[])
}

/// [`md_vm`] with `files` copied into the VM as /mdvm/files/NAME (a uraid binary, say).
pub fn md_vm_with(script: &Path, images: &[PathBuf], read_only: bool, files: &[PathBuf]) -> Output {
    let run = mdvm_tools().join("run-in-md-vm");
    let mut args: Vec<String> = vec!["-c".into(), "1".into()];
    if read_only {
        args.push("--ro".into());
    }
    for f in files {
        args.push("-f".into());
        args.push(f.display().to_string());
    }
    args.push(script.display().to_string());
    args.extend(images.iter().map(|p| p.display().to_string()));
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut attempt = 1;
    loop {
        let o = tool(run.to_str().unwrap(), &a);
        let t = text(&o);
        let vm_crashed = o.status.code() == Some(125)
            && t.contains("no exit status from VM")
            && !t.contains("qemu_rc=124");
        if !vm_crashed || attempt == 3 {
            return o;
        }
        eprintln!("md VM died without an exit status (attempt {attempt} of 3), booting again:\n{t}");
        attempt += 1;
    }
}

/// What real Linux md makes of member images (read-only: a qemu snapshot), through
/// `../shared/tools/mdvm`: the sha256 of the assembled array and `mismatch_cnt` after
/// md's own `check`. The VM is built by scripts/install-deps.sh; a missing VM fails.
pub struct MdView {
    pub sha256: String,
    pub mismatch_cnt: u64,
}

pub fn md_check(images: &[PathBuf]) -> MdView {
    let (sha256, mismatch_cnt) = md_verify(images, true);
    MdView { sha256: sha256.expect("sha256"), mismatch_cnt }
}

/// md's `check` alone: `mismatch_cnt`, without hashing the array (under the VM's TCG the
/// hash of a large array costs several times md's own check of it; see docs/reliability.md).
pub fn md_mismatch_cnt(images: &[PathBuf]) -> u64 {
    md_verify(images, false).1
}

fn md_verify(images: &[PathBuf], hash: bool) -> (Option<String>, u64) {
    let shared = mdvm_tools().join("examples/verify-assemble.sh");
    let script = if hash {
        shared
    } else {
        let body = std::fs::read_to_string(&shared).expect("mdvm's verify-assemble.sh");
        let check_only: String =
            body.lines().filter(|l| !l.contains("sha256")).map(|l| format!("{l}\n")).collect();
        let p = std::env::temp_dir().join(format!("uraid-md-check-only-{}.sh", std::process::id()));
        std::fs::write(&p, check_only).unwrap();
        p
    };
    let o = md_vm(&script, images, true);
    let out = text(&o);
    let after = |marker: &str| -> Option<String> {
        let mut lines = out.lines().skip_while(|l| l.trim() != marker);
        lines.next()?;
        lines.next().map(|l| l.trim().to_string())
    };
    if !out.contains("=== mdstat") {
        panic!("md did not assemble the array:\n{out}");
    }
    let sha256 = hash.then(|| after("=== sha256").unwrap_or_else(|| panic!("md gave no sha256:\n{out}")));
    let mismatch_cnt = after("=== mismatch_cnt")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("md's check gave no mismatch_cnt:\n{out}"));
    (sha256, mismatch_cnt)
}

/// The whole array through NBD, bounded so a hang fails the test.
pub fn read_array(dir: &TempDir, url: &str) -> Vec<u8> {
    let out = dir.path("readback");
    let _ = std::fs::remove_file(&out);
    let o = bounded("nbdcopy", &[url, out.to_str().unwrap()], Duration::from_secs(60));
    assert!(o.status.success(), "nbdcopy out: {}", text(&o));
    let data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    data
}

pub fn sha256_bytes(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Runs a command, failing the test if it takes longer than `limit` (a hang, or a server
/// that started where it should have refused).
pub fn bounded(cmd: &str, args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{cmd} {args:?} still ran after {limit:?}:\n{}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A child process killed and reaped on drop, so a failing test leaves nothing running.
pub struct Reaped(pub Option<Child>);

impl Reaped {
    pub fn try_done(&mut self) -> bool {
        self.0.as_mut().is_some_and(|c| c.try_wait().unwrap().is_some())
    }
    pub fn wait(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }
    /// SIGKILL and reap it now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fio job on fio's nbd engine: random 8 KiB writes over the first `size` with crc32c in
/// every block and a fixed seed, so a later `--verify_only` run regenerates the same
/// offsets and contents.
pub fn fio_verify_job(name: &str, url: &str, size: &str, seed: u64, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=8k",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        // No verify state file left in the working directory.
        "--verify_state_save=0",
        "--output-format=normal",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend([format!("--name={name}"), format!("--size={size}"), format!("--randseed={seed}")]);
    a.push(format!("--uri={url}"));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub fn spawn_fio(args: &[String]) -> Reaped {
    let child = Command::new("fio")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("fio is required by this test (scripts/install-deps.sh installs it): {e}")
        });
    Reaped(Some(child))
}

/// fio must exit 0 with `err= 0`, no verification complaint, and every one of its
/// `blocks` issued (and so read back and checked).
pub fn check_fio_run(o: &Output, what: &str, blocks: u64, server_log: &str) {
    let t = text(o);
    assert!(
        o.status.success()
            && t.contains("err= 0")
            && !t.contains("verify:")
            && !t.contains("bad magic")
            && t.contains(&format!("issued rwts: total={blocks},")),
        "fio {what} failed ({}):\n{t}\nserver log:\n{server_log}",
        o.status,
    );
}

/// Waits until a two-member mirror is whole and no resync or recovery runs (`status`), up
/// to 90 s; returns that status.
pub fn wait_in_sync(s: &Served) -> String {
    wait_whole(s, 2)
}

/// Waits until all `n` slots are in sync and no resync or recovery runs (`status`), up to
/// 90 s; returns that status.
pub fn wait_whole(s: &Served, n: usize) -> String {
    let t0 = Instant::now();
    let whole = format!("[{n}/{n}]");
    loop {
        let st = s.ctl("status", None);
        if st.contains(&whole) && !st.contains("recovery") && !st.contains("resync") {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "the resync did not finish:\n{st}\n{}", s.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most 180 s) until `status` shows no reshape; returns that status.
pub fn wait_reshaped(s: &Served) -> String {
    let t0 = Instant::now();
    loop {
        let st = s.ctl("status", None);
        if !st.contains("reshape") {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the reshape did not finish:\n{st}\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The shared libraries `binary` links that the VM's root does not hold (it has mdadm's,
/// the C library among them): OpenSSL's, as `ldd` resolves them on the host.
pub fn libraries_the_vm_lacks(binary: &Path) -> Vec<PathBuf> {
    let o = Command::new("ldd").arg(binary).output().expect("ldd");
    assert!(o.status.success(), "ldd {}: {}", binary.display(), String::from_utf8_lossy(&o.stderr));
    let libs: Vec<PathBuf> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("libssl") || l.contains("libcrypto"))
        .filter_map(|l| l.split("=>").nth(1)?.split_whitespace().next().map(PathBuf::from))
        .collect();
    assert!(libs.iter().all(|p| p.exists()), "ldd named libraries that are not there: {libs:?}");
    libs
}

/// A copy of the uraid binary without debug info, for the md VM (which holds it in RAM).
pub fn uraid_for_vm(dir: &TempDir) -> PathBuf {
    let binary = dir.path("uraid-vm");
    let st = Command::new("strip").arg("-o").arg(&binary).arg(URAID).status().expect("strip (binutils)");
    assert!(st.success(), "strip {URAID}");
    binary
}
