//! `uraid serve --tls`: qemu-img and libnbd's nbdinfo/nbdcopy (both GnuTLS) connect over TLS
//! with X.509 certificates and with a PSK made here, and read back what was written over
//! TLS; a plaintext client is refused under `--tls require` and served under `--tls on`;
//! `--tls off` refuses STARTTLS; bad TLS options are refused before anything is touched.
// Built with the `tls` feature only (scripts/test.sh turns it on).
#![cfg(feature = "tls")]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Runs `certtool` with a template; certtool comes with gnutls-bin.
fn certtool(dir: &Path, template: &str, args: &[&str]) {
    let t = dir.join("template.info");
    std::fs::write(&t, template).unwrap();
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--template", t.to_str().unwrap()]);
    ok(tool("certtool", &all), "certtool");
}

fn privkey(path: &Path) {
    ok(tool("certtool", &["--generate-privkey", "--outfile", path.to_str().unwrap()]), "certtool privkey");
}

/// A CA, a server certificate for localhost/127.0.0.1 and a client certificate, laid out
/// as nbdkit and qemu expect: `server/` (ca-cert.pem, server-cert.pem, server-key.pem) and
/// `client/` (ca-cert.pem, client-cert.pem, client-key.pem).
fn make_pki(dir: &TempDir) -> (PathBuf, PathBuf) {
    let (server, client) = (dir.path("server"), dir.path("client"));
    std::fs::create_dir_all(&server).unwrap();
    std::fs::create_dir_all(&client).unwrap();
    let s = |n: &str| server.join(n).display().to_string();
    let c = |n: &str| client.join(n).display().to_string();
    privkey(&dir.path("ca-key.pem"));
    let ca_key = dir.path("ca-key.pem").display().to_string();
    certtool(
        &dir.0,
        "cn = uraid test CA\nca\ncert_signing_key\nexpiration_days = 2\n",
        &["--generate-self-signed", "--load-privkey", &ca_key, "--outfile", &s("ca-cert.pem")],
    );
    std::fs::copy(s("ca-cert.pem"), c("ca-cert.pem")).unwrap();
    let signed = |key: &str, out: &str, template: &str| {
        privkey(Path::new(key));
        certtool(
            &dir.0,
            template,
            &[
                "--generate-certificate",
                "--load-ca-certificate",
                &s("ca-cert.pem"),
                "--load-ca-privkey",
                &ca_key,
                "--load-privkey",
                key,
                "--outfile",
                out,
            ],
        );
    };
    // libnbd and qemu check the server's name against the host they dialled.
    signed(
        &s("server-key.pem"),
        &s("server-cert.pem"),
        "cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\n\
         encryption_key\nsigning_key\nexpiration_days = 2\n",
    );
    signed(
        &c("client-key.pem"),
        &c("client-cert.pem"),
        "cn = uraid test client\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n",
    );
    (server, client)
}

/// `psktool -p DIR/keys.psk -u USER`: the file name qemu's tls-creds-psk looks for in `dir`.
fn make_psk(dir: &Path, user: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("keys.psk");
    ok(tool("psktool", &["-p", file.to_str().unwrap(), "-u", user]), "psktool");
    file
}

/// A clean two-way raid1 and a random image of the array's size.
fn array_and_image(dir: &TempDir) -> (Vec<PathBuf>, PathBuf) {
    let members = create_clean(dir, "1", 2, "16M", &[]);
    let s = Served::start(dir, &members, &[]);
    let size: usize = ok(tool("nbdinfo", &["--size", &s.url]), "nbdinfo --size").trim().parse().unwrap();
    s.stop();
    // Never repeating, so a block served from the wrong offset cannot match.
    let image: Vec<u8> =
        (0..size.div_ceil(64)).flat_map(|i| sha256_bytes(&i.to_le_bytes()).into_bytes()).collect();
    let image = &image[..size];
    let path = dir.path("image.raw");
    std::fs::write(&path, image).unwrap();
    (members, path)
}

/// `host=..,port=..` of an nbd:// or nbds:// URL printed by the server.
fn host_port(url: &str) -> (String, String) {
    let rest = url.split("://").nth(1).unwrap();
    let hp = rest.split('/').next().unwrap();
    let (h, p) = hp.rsplit_once(':').unwrap();
    (h.to_string(), p.to_string())
}

fn host_port_addr(url: &str) -> String {
    let (h, p) = host_port(url);
    format!("{h}:{p}")
}

/// qemu-img with a `tls-creds-*` object: writes `image` into the export (`-n`: the target
/// exists), then reads the export back into a file; returns that file's sha256.
fn qemu_img_round_trip(dir: &TempDir, url: &str, creds: &str, image: &Path) -> String {
    let (host, port) = host_port(url);
    let target = format!("driver=nbd,host={host},port={port},export=t,tls-creds=tls0");
    let out = dir.path("qemu-readback.raw");
    let _ = std::fs::remove_file(&out);
    let o = bounded(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "--object",
            creds,
            image.to_str().unwrap(),
            "--target-image-opts",
            &target,
        ],
        LIMIT,
    );
    assert!(o.status.success(), "qemu-img convert into the array over TLS:\n{}", text(&o));
    let o = bounded(
        "qemu-img",
        &["convert", "-O", "raw", "--object", creds, "--image-opts", &target, out.to_str().unwrap()],
        LIMIT,
    );
    assert!(o.status.success(), "qemu-img convert out of the array over TLS:\n{}", text(&o));
    let sha = sha256_file(&out);
    std::fs::remove_file(&out).unwrap();
    sha
}

/// The nbds:// URL with the PSK username (libnbd 1.14 takes it only from the authority).
fn with_user(url: &str, user: &str) -> String {
    let rest = url.split("://").nth(1).unwrap();
    format!("nbds://{user}@{rest}")
}

fn nbdinfo(url: &str) -> std::process::Output {
    bounded("nbdinfo", &[url], LIMIT)
}

#[test]
fn x509_and_psk_clients_read_what_was_written_and_plain_clients_are_refused() {
    let dir = TempDir::new("tls");
    let (members, image) = array_and_image(&dir);
    let want = sha256_file(&image);
    let (server_pki, client_pki) = make_pki(&dir);

    // X.509, required.
    let s = Served::start_tcp(
        &dir,
        &members,
        &["--tls", "require", "--tls-certificates", server_pki.to_str().unwrap()],
    );
    assert!(s.url.starts_with("nbds://127.0.0.1:"), "{}", s.url);
    assert!(s.log_text().contains("TLS required (X.509"), "{}", s.log_text());
    let creds = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", client_pki.display());
    assert_eq!(qemu_img_round_trip(&dir, &s.url, &creds, &image), want, "qemu-img over X.509");
    let tls_url = format!("{}?tls-certificates={}", s.url, client_pki.display());
    let info = ok(nbdinfo(&tls_url), "nbdinfo over X.509");
    assert!(info.contains("with TLS"), "{info}");
    assert_eq!(sha256_bytes(&read_array(&dir, &tls_url)), want, "nbdcopy over X.509");
    // A plaintext client learns nothing and is told why.
    let plain = s.url.replacen("nbds://", "nbd://", 1);
    let o = nbdinfo(&plain);
    assert!(!o.status.success(), "a plaintext nbdinfo was served under --tls require:\n{}", text(&o));
    assert!(!text(&o).contains("export-size"), "{}", text(&o));
    let o = bounded("qemu-img", &["info", &plain], LIMIT);
    assert!(!o.status.success(), "a plaintext qemu-img was served under --tls require:\n{}", text(&o));
    assert!(
        text(&o).contains("this server requires TLS"),
        "qemu-img should relay the server's reason:\n{}",
        text(&o)
    );
    s.stop();

    // TLS-PSK, required: psktool's file, read by uraid, qemu and libnbd alike.
    let psk = make_psk(&dir.path("psk"), "alice");
    let s = Served::start_tcp(&dir, &members, &["--tls", "require", "--tls-psk", psk.to_str().unwrap()]);
    assert!(s.log_text().contains("TLS required (TLS-PSK, 1 user"), "{}", s.log_text());
    let psk_dir = psk.parent().unwrap().display().to_string();
    let creds = format!("tls-creds-psk,id=tls0,dir={psk_dir},username=alice,endpoint=client");
    assert_eq!(qemu_img_round_trip(&dir, &s.url, &creds, &image), want, "qemu-img over PSK");
    let tls_url = format!("{}?tls-psk-file={}", with_user(&s.url, "alice"), psk.display());
    let info = ok(nbdinfo(&tls_url), "nbdinfo over PSK");
    assert!(info.contains("with TLS"), "{info}");
    assert_eq!(sha256_bytes(&read_array(&dir, &tls_url)), want, "nbdcopy over PSK");
    // The right user with the wrong key fails the handshake, and the server says so.
    let wrong = make_psk(&dir.path("wrong"), "alice");
    let o = nbdinfo(&format!("{}?tls-psk-file={}", with_user(&s.url, "alice"), wrong.display()));
    assert!(!o.status.success(), "a wrong PSK was accepted:\n{}", text(&o));
    let o = nbdinfo(&s.url.replacen("nbds://", "nbd://", 1));
    assert!(!o.status.success(), "a plaintext nbdinfo was served under --tls require:\n{}", text(&o));
    let log = s.stop();
    assert!(log.contains("TLS handshake with 127.0.0.1:"), "{log}");
}

#[test]
fn tls_on_serves_both_kinds_of_client_and_tls_off_refuses_starttls() {
    let dir = TempDir::new("tls-on");
    let members = create_clean(&dir, "1", 2, "16M", &[]);
    let psk = make_psk(&dir.path("psk"), "bob");
    let s = Served::start_tcp(&dir, &members, &["--tls", "on", "--tls-psk", psk.to_str().unwrap()]);
    assert!(s.url.starts_with("nbd://"), "TLS is optional, so the URL is plain: {}", s.url);
    assert!(s.log_text().contains("TLS offered, plaintext allowed"), "{}", s.log_text());
    let info = ok(nbdinfo(&s.url), "plaintext nbdinfo under --tls on");
    assert!(info.contains("without TLS"), "{info}");
    let tls_url = format!("{}?tls-psk-file={}", with_user(&s.url, "bob"), psk.display());
    let info = ok(nbdinfo(&tls_url), "nbdinfo over TLS under --tls on");
    assert!(info.contains("with TLS"), "{info}");
    // The same data both ways.
    qemu_io(&s.url, &["write -P 0x5a 4096 65536".into()]);
    let plain = read_array(&dir, &s.url);
    assert_eq!(&plain[4096..4096 + 65536], &[0x5a; 65536][..]);
    assert_eq!(sha256_bytes(&read_array(&dir, &tls_url)), sha256_bytes(&plain));

    // A client that starts TLS and then sends no TLS is dropped; the server goes on serving.
    {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(host_port_addr(&s.url)).unwrap();
        c.set_read_timeout(Some(LIMIT)).unwrap();
        let mut greeting = [0u8; 18];
        c.read_exact(&mut greeting).unwrap();
        let mut starttls = 1u32.to_be_bytes().to_vec(); // NBD_FLAG_C_FIXED_NEWSTYLE
        starttls.extend_from_slice(b"IHAVEOPT");
        starttls.extend_from_slice(&5u32.to_be_bytes()); // NBD_OPT_STARTTLS
        starttls.extend_from_slice(&0u32.to_be_bytes());
        c.write_all(&starttls).unwrap();
        let mut reply = [0u8; 20];
        c.read_exact(&mut reply).unwrap();
        assert_eq!(
            &reply[12..16],
            &1u32.to_be_bytes(),
            "STARTTLS not acknowledged under --tls on: {reply:?}"
        );
        c.write_all(b"this is not a ClientHello\r\n").unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        ok(nbdinfo(&tls_url), "nbdinfo over TLS after a bad handshake");
    }
    // An idle TLS client does not hold up a stop: the relay ends with the connection.
    let mut idle = std::process::Command::new("qemu-io")
        .args([
            "--object",
            &format!(
                "tls-creds-psk,id=tls0,dir={},username=bob,endpoint=client",
                psk.parent().unwrap().display()
            ),
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={},export=t,tls-creds=tls0", host_port(&s.url).1),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("qemu-io is required by this test (scripts/install-deps.sh installs it)");
    // It has connected once it answers a read.
    {
        use std::io::{BufRead, Write};
        let mut stdin = idle.stdin.take().unwrap();
        writeln!(stdin, "read 0 512").unwrap();
        idle.stdin = Some(stdin);
        let stdout = idle.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let t0 = std::time::Instant::now();
        loop {
            let left = LIMIT.checked_sub(t0.elapsed()).expect("qemu-io did not read over TLS");
            if rx.recv_timeout(left).expect("qemu-io ended").contains("read 512/512 bytes") {
                break;
            }
        }
    }
    let t0 = std::time::Instant::now();
    let log = s.stop();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the stop took {:?} with a TLS client:\n{log}",
        t0.elapsed()
    );
    assert!(log.contains("TLS handshake with 127.0.0.1:"), "the bad handshake should be reported:\n{log}");
    drop(idle.stdin.take());
    let _ = idle.wait();

    // --tls off (the default): STARTTLS is refused, and a client that insists gives up.
    let s = Served::start_tcp(&dir, &members, &[]);
    let tls_url = format!("{}?tls-psk-file={}", with_user(&s.url, "bob"), psk.display());
    let o = nbdinfo(&tls_url);
    assert!(!o.status.success(), "TLS was started under --tls off:\n{}", text(&o));
    ok(nbdinfo(&s.url), "plaintext nbdinfo under --tls off");
    s.stop();
}

#[test]
fn verify_peer_wants_a_client_certificate_signed_by_the_ca() {
    let dir = TempDir::new("tls-peer");
    let members = create_clean(&dir, "1", 2, "16M", &[]);
    let (server_pki, client_pki) = make_pki(&dir);
    let s = Served::start_tcp(
        &dir,
        &members,
        &["--tls", "require", "--tls-certificates", server_pki.to_str().unwrap(), "--tls-verify-peer"],
    );
    let info = ok(
        nbdinfo(&format!("{}?tls-certificates={}", s.url, client_pki.display())),
        "nbdinfo with a client cert",
    );
    assert!(info.contains("with TLS"), "{info}");
    // The server directory has the CA but no client certificate.
    let o = nbdinfo(&format!("{}?tls-certificates={}", s.url, server_pki.display()));
    assert!(
        !o.status.success(),
        "a client without a certificate was served under --tls-verify-peer:\n{}",
        text(&o)
    );
    s.stop();
}

#[test]
fn bad_tls_options_are_refused_before_anything_is_touched() {
    let dir = TempDir::new("tls-bad");
    let members = create_clean(&dir, "1", 2, "16M", &[]);
    let before: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
    let (server_pki, _) = make_pki(&dir);
    let no_key = dir.path("no-key");
    std::fs::create_dir_all(&no_key).unwrap();
    std::fs::copy(server_pki.join("server-cert.pem"), no_key.join("server-cert.pem")).unwrap();
    let bad_psk = dir.path("bad.psk");
    std::fs::write(&bad_psk, "alice:00ff\nbob-without-a-key\n").unwrap();
    let swapped = dir.path("swapped");
    std::fs::create_dir_all(&swapped).unwrap();
    std::fs::copy(server_pki.join("server-cert.pem"), swapped.join("server-cert.pem")).unwrap();
    std::fs::copy(dir.path("ca-key.pem"), swapped.join("server-key.pem")).unwrap();
    let p = |p: &Path| p.display().to_string();
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec!["--tls".into(), "require".into()],
            vec!["--tls require needs credentials".into(), "--tls-psk FILE".into()],
        ),
        (
            vec!["--tls".into(), "on".into(), "--tls-certificates".into(), p(&dir.path("nowhere"))],
            vec![format!("{} is not a directory", p(&dir.path("nowhere")))],
        ),
        (
            vec!["--tls".into(), "require".into(), "--tls-certificates".into(), p(&no_key)],
            vec![
                format!("cannot read {}: no such file", p(&no_key.join("server-key.pem"))),
                "certtool".into(),
            ],
        ),
        (
            vec!["--tls".into(), "require".into(), "--tls-certificates".into(), p(&swapped)],
            vec!["server-key.pem is not the key of".into()],
        ),
        (
            vec!["--tls".into(), "require".into(), "--tls-psk".into(), p(&bad_psk)],
            vec![format!("--tls-psk: {}: line 2 is not username:hexkey", p(&bad_psk)), "psktool".into()],
        ),
        (vec!["--tls-certificates".into(), p(&server_pki)], vec!["--tls is off: add --tls on".into()]),
    ];
    for (args, words) in cases {
        let mut all: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--control".into(),
            p(&dir.path("c.sock")),
        ];
        all.extend(args.iter().cloned());
        all.extend(members.iter().map(|m| p(m)));
        let a: Vec<&str> = all.iter().map(String::as_str).collect();
        let o = bounded(URAID, &a, LIMIT);
        assert!(!o.status.success(), "uraid serve {args:?} started:\n{}", text(&o));
        let t = text(&o);
        for w in words {
            assert!(t.contains(&w), "uraid serve {args:?} should say {w:?}:\n{t}");
        }
        assert!(t.contains("nothing was started"), "{t}");
        let after: Vec<String> = members.iter().map(|m| sha256_file(m)).collect();
        assert_eq!(before, after, "uraid serve {args:?} wrote to a member");
    }
}
