//! Operating an array from scripts: `--json` with numbers as numbers (docs/json.md),
//! `uraid monitor`, and the config file (`--scan`).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

fn json(out: String) -> serde_json::Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

/// Every number-like field of `v` is a JSON number: no "2" or "-" where a number belongs.
fn no_numbers_as_strings(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::String(s) => {
            assert!(s.is_empty() || s.parse::<f64>().is_err() && s != "-", "{path} is the string {s:?}")
        }
        serde_json::Value::Array(a) => {
            a.iter().enumerate().for_each(|(i, x)| no_numbers_as_strings(x, &format!("{path}[{i}]")))
        }
        // The metadata version ("1.2") is a name, as mdadm's metadata= takes it.
        serde_json::Value::Object(o) => o
            .iter()
            .filter(|(k, _)| *k != "version")
            .for_each(|(k, x)| no_numbers_as_strings(x, &format!("{path}.{k}"))),
        _ => {}
    }
}

#[test]
fn status_detail_examine_and_list_give_numbers_as_numbers() {
    let dir = TempDir::new("json");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "json"]);

    let ex = json(ok(uraid(&[&["examine", "--json"][..], &paths(&members)].concat()), "examine --json"));
    no_numbers_as_strings(&ex, "examine");
    let ex = ex.as_array().unwrap();
    assert_eq!(ex.len(), 3);
    for (i, m) in ex.iter().enumerate() {
        assert_eq!(m["device"], members[i].display().to_string(), "{m:#}");
        assert_eq!((m["raid_level"].as_str(), m["raid_devices"].as_u64()), (Some("raid5"), Some(3)), "{m:#}");
        assert_eq!((m["device_role"].as_str(), m["raid_device"].as_u64()), (Some("active"), Some(i as u64)));
        assert_eq!(m["array_state"], "AAA");
        assert_eq!(m["version"], "1.2");
        assert!(m["events"].is_u64() && m["data_offset_sectors"].is_u64() && m["chunk_size_bytes"].is_u64());
        assert!(m["bitmap"]["bits"].is_u64(), "{m:#}");
    }
    assert_eq!(ex[0]["array_uuid"], ex[1]["array_uuid"]);
    // A member that cannot be read: an object saying why, and the exit status says so.
    let stray = dir.path("stray");
    std::fs::write(&stray, vec![0u8; 1 << 20]).unwrap();
    let o = uraid(&["examine", "--json", stray.to_str().unwrap()]);
    assert!(!o.status.success());
    let v = json(String::from_utf8_lossy(&o.stdout).to_string());
    assert!(v[0]["error"].is_string() && v[0]["device"] == stray.display().to_string(), "{v:#}");

    let offline = json(ok(uraid(&[&["detail", "--json"][..], &paths(&members)].concat()), "detail --json"));
    no_numbers_as_strings(&offline, "detail");
    assert_eq!(offline["progress"], serde_json::Value::Null);

    let served = Served::start(&dir, &members, &["--sync-speed-max", "1000"]);
    let c = served.control.display().to_string();
    served.ctl("fail", Some(&members[2]));
    served.ctl("remove", Some(&members[2]));
    let new = dir.path("new2");
    std::fs::File::create(&new).unwrap().set_len(std::fs::metadata(&members[2]).unwrap().len()).unwrap();
    served.ctl("add", Some(&new));
    let t0 = Instant::now();
    let st = loop {
        let st = json(ok(uraid(&["status", "--json", "--control", &c]), "status --json"));
        if st["progress"]["speed_kbps"].is_number() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no recovery speed: {st:#}\n{}", served.log_text());
        std::thread::sleep(Duration::from_millis(100));
    };
    no_numbers_as_strings(&st, "status");
    assert!(st["name"].as_str().unwrap().ends_with(":json"), "{st:#}");
    assert_eq!(st["state"], "clean, degraded, recovering", "{st:#}");
    assert_eq!((st["active_devices"].as_u64(), st["raid_devices"].as_u64()), (Some(2), Some(3)), "{st:#}");
    let p = &st["progress"];
    assert_eq!(p["action"], "recovery");
    let (done, total) = (p["done"].as_u64().unwrap(), p["total"].as_u64().unwrap());
    // KiB of each member's data (16 MiB less the superblock's area), as mdstat counts.
    assert!(done < total && (8 * 1024..16 * 1024).contains(&total), "{st:#}");
    assert!(p["eta_s"].as_f64().is_some_and(|x| x > 0.0), "{st:#}");
    let rebuilding =
        st["devices"].as_array().unwrap().iter().find(|d| d["device"] == new.display().to_string());
    let rebuilding = rebuilding.unwrap_or_else(|| panic!("{st:#}"));
    assert_eq!(
        (rebuilding["raid_device"].as_u64(), rebuilding["state"].as_str()),
        (Some(2), Some("spare rebuilding"))
    );
    assert!(rebuilding["number"].is_u64(), "{st:#}");

    let d = json(ok(uraid(&["detail", "--json", "--control", &c]), "detail --json"));
    no_numbers_as_strings(&d, "detail");
    // detail's JSON holds status's fields, and the superblock's and each device's I/O.
    for k in st.as_object().unwrap().keys() {
        assert!(d.get(k).is_some(), "detail --json has no {k}: {d:#}");
    }
    assert!(d["events"].is_u64() && d["chunk_size_bytes"] == 512 * 1024 && d["bitmap"] == true, "{d:#}");

    let l = json(ok(uraid(&["list", "--json"]), "list --json"));
    no_numbers_as_strings(&l, "list");
    let e = l.as_array().unwrap().iter().find(|e| e["control"] == c).unwrap_or_else(|| panic!("{l:#}"));
    assert_eq!((e["raid_level"].as_str(), e["uuid"].as_str()), (Some("raid5"), st["uuid"].as_str()), "{e:#}");
    assert!(e["pid"].is_u64(), "{e:#}");
    served.stop();
}

/// A program that appends its arguments, one call a line, to `heard`.
fn event_program(dir: &TempDir, name: &str) -> (PathBuf, PathBuf) {
    let heard = dir.path(&format!("{name}.heard"));
    let program = dir.path(name);
    std::fs::write(&program, format!("#!/bin/sh\necho \"$@\" >> {}\n", heard.display())).unwrap();
    std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (program, heard)
}

fn heard(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// `uraid monitor` runs the program with mdadm's arguments from outside the server: Fail
/// then DegradedArray on a fail, FailSpare for a device that fails during its rebuild,
/// the rebuild's events after an add, DeviceDisappeared for a member file deleted and for
/// the array once its server stops; `--oneshot` reports an array already degraded.
#[test]
fn uraid_monitor_runs_the_program_on_the_arrays_events() {
    let dir = TempDir::new("monitor-verb");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "watched"]);
    let served = Served::start(&dir, &members, &["--sync-speed-max", "1000"]);
    let c = served.control.display().to_string();
    let (program, heard_path) = event_program(&dir, "on-event");
    let log = std::fs::File::create(dir.path("monitor.log")).unwrap();
    let mut monitor = std::process::Command::new(URAID)
        .args([
            "monitor",
            "--control",
            &c,
            "--program",
            program.to_str().unwrap(),
            "--test",
            "--delay",
            "0.1",
        ])
        .stderr(log)
        .spawn()
        .unwrap();
    let wait_for = |what: &str| {
        let t0 = Instant::now();
        while !heard(&heard_path).iter().any(|l| l.starts_with(what)) {
            let mlog = std::fs::read_to_string(dir.path("monitor.log")).unwrap_or_default();
            assert!(t0.elapsed() < Duration::from_secs(30), "no {what}: {:?}\n{mlog}", heard(&heard_path));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Each verb bounded: a hang shows as a failure with the server's log.
    let ctl = |verb: &str, member: &Path| {
        let o = bounded(URAID, &[verb, member.to_str().unwrap(), "--control", &c], Duration::from_secs(30));
        assert!(o.status.success(), "uraid {verb}: {}\n{}", text(&o), served.log_text());
    };
    wait_for("TestMessage ");
    let array = heard(&heard_path)[0].split(' ').nth(1).unwrap().to_string();
    assert!(array.ends_with(":watched"), "{:?}", heard(&heard_path));

    ctl("fail", &members[1]);
    wait_for("DegradedArray");
    // --oneshot: one look, an array already degraded reported, then exit.
    let (once, once_heard) = event_program(&dir, "once");
    let once_args = ["monitor", "--oneshot", "--control", &c, "--program", once.to_str().unwrap()];
    ok(bounded(URAID, &once_args, Duration::from_secs(30)), "monitor --oneshot");
    assert_eq!(heard(&once_heard), vec![format!("DegradedArray {array}")]);

    ctl("remove", &members[1]);
    let size = std::fs::metadata(&members[1]).unwrap().len();
    let new = |name: &str| {
        let p = dir.path(name);
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        p
    };
    let doomed = new("doomed");
    ctl("add", &doomed);
    wait_for("RebuildStarted");
    ctl("fail", &doomed);
    wait_for("FailSpare");
    ctl("remove", &doomed);
    let new1 = new("new1");
    ctl("add", &new1);
    ok(bounded(URAID, &["set", "sync_speed_max", "200000", "--control", &c], Duration::from_secs(30)), "set");
    wait_for("SpareActive");

    std::fs::remove_file(&members[0]).unwrap();
    wait_for("DeviceDisappeared");
    let (out, st, slog) = served.stop_verb();
    assert!(out.status.success() && st.success(), "{}\n{slog}", text(&out));
    let t0 = Instant::now();
    while !heard(&heard_path).contains(&format!("DeviceDisappeared {array}")) {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", heard(&heard_path));
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = monitor.kill();
    let _ = monitor.wait();

    let got = heard(&heard_path);
    let pos = |l: String| got.iter().position(|g| *g == l).unwrap_or_else(|| panic!("no {l:?} in {got:?}"));
    let last = |l: String| got.iter().rposition(|g| *g == l).unwrap_or_else(|| panic!("no {l:?} in {got:?}"));
    let order = [
        pos(format!("TestMessage {array}")),
        pos(format!("Fail {array} {}", members[1].display())),
        pos(format!("DegradedArray {array}")),
        pos(format!("RebuildStarted {array}")),
        pos(format!("FailSpare {array} {}", doomed.display())),
        // new1's rebuild: a fast one may start and end between two looks, reported as
        // RebuildStarted and RebuildFinished all the same (its Rebuild20..80 may be missed).
        last(format!("RebuildStarted {array}")),
        last(format!("RebuildFinished {array}")),
        pos(format!("SpareActive {array} {}", new1.display())),
        pos(format!("DeviceDisappeared {array} {}", members[0].display())),
        pos(format!("DeviceDisappeared {array}")),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    assert_eq!(got.iter().filter(|l| l.starts_with("Fail ")).count(), 1, "{got:?}");
    assert_eq!(got.iter().filter(|l| l.starts_with("DegradedArray")).count(), 1, "{got:?}");
}

/// `uraid serve ARGS` with its stderr in `log`, once its control socket answers.
fn serve_until_ready(args: &[&str], control: &std::path::Path, log: &std::path::Path) -> std::process::Child {
    let mut child = std::process::Command::new(URAID)
        .arg("serve")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(control).is_err() {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        assert!(child.try_wait().unwrap().is_none(), "uraid serve {args:?} exited:\n{said}");
        assert!(t0.elapsed() < Duration::from_secs(20), "uraid serve {args:?} did not start:\n{said}");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `detail --scan`'s lines, written to a config file, start the same array with
/// `serve --scan NAME` on the same sockets; members are found by UUID through a DEVICE
/// glob too, and a file there with another array's UUID, or none, is left byte-identical.
/// `assemble --scan` checks the arrays the file lists; bad lines are refused by number.
/// A line's `spares=N` above the spares there is mdadm's SparesMissing event.
#[test]
fn detail_scan_written_to_a_config_file_serves_the_same_array_again() {
    let dir = TempDir::new("scan");
    let members = create_clean(&dir, "5", 3, "16M", &["--bitmap", "internal", "--name", "scanme"]);
    let others: Vec<PathBuf> = (0..2).map(|i| dir.path(&format!("other{i}"))).collect();
    let mut args =
        vec!["create", "--level", "1", "--raid-devices", "2", "--size", "16M", "--name", "scanme2"];
    args.extend(paths(&others));
    ok(uraid(&args), "create the other array");
    let junk = dir.path("junk");
    std::fs::write(&junk, vec![7u8; 1 << 20]).unwrap();
    let untouched: Vec<String> = others.iter().chain([&junk]).map(|p| sha256_file(p)).collect();

    let served = Served::start(&dir, &members, &[]);
    let c = served.control.display().to_string();
    // The control socket accepts once bound; an answer comes once the array is listed.
    let before = json(ok(uraid(&["detail", "--json", "--control", &c]), "detail --json"));
    let scan = ok(uraid(&["detail", "--scan"]), "detail --scan");
    let line =
        scan.lines().find(|l| l.ends_with(&format!(" control={c}"))).unwrap_or_else(|| panic!("{scan}"));
    let (out, st, log) = served.stop_verb();
    assert!(out.status.success() && st.success(), "{log}");
    let name = line.split_whitespace().nth(1).unwrap().to_string();
    assert!(name.ends_with(":scanme"), "{line}");

    // Read back as written: the same members, the same sockets.
    let conf = dir.path("uraid.conf");
    std::fs::write(&conf, format!("# uraid detail --scan\n{line}\n")).unwrap();
    let cf = conf.to_str().unwrap();
    let log = dir.path("scan.log");
    let mut child = serve_until_ready(&["--scan", "scanme", "--config", cf], Path::new(&c), &log);
    let again = json(ok(uraid(&["detail", "--json", "--control", &c]), "detail --json"));
    assert_eq!((&again["uuid"], &again["devices"]), (&before["uuid"], &before["devices"]), "{again:#}");
    let url = format!("nbd+unix:///t?socket={}", dir.path("nbd.sock").display());
    assert_eq!(tool("nbdinfo", &["--size", &url]).status.code(), Some(0), "not served at {url}");
    ok(uraid(&["stop", "--control", &c]), "stop");
    assert!(child.wait().unwrap().success());

    // Found by UUID among a DEVICE glob's files, with no devices= at all; the other
    // array's members and the junk file are read, never written.
    let uuid = before["uuid"].as_str().unwrap();
    let control = dir.path("ctl2.sock");
    std::fs::write(
        &conf,
        format!(
            "DEVICE {}/*\nMAILADDR root\nARRAY {name} UUID={uuid} spares=1\n  unix={} control={}\n",
            dir.0.display(),
            dir.path("nbd2.sock").display(),
            control.display()
        ),
    )
    .unwrap();
    let mut child = serve_until_ready(&["--scan", "--config", cf], &control, &log);
    let cc = control.display().to_string();
    let st = json(ok(uraid(&["status", "--json", "--control", &cc]), "status --json"));
    let mut devices: Vec<&str> =
        st["devices"].as_array().unwrap().iter().map(|d| d["device"].as_str().unwrap()).collect();
    devices.sort();
    let want: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    assert_eq!(devices, want, "{st:#}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("line 2: MAILADDR is mdadm's and ignored"), "{said}");
    // spares=1 and none there: mdadm's SparesMissing at the first look.
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log).unwrap().contains(&format!("{name}: event SparesMissing")) {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(uraid(&["stop", "--control", &cc]), "stop");
    assert!(child.wait().unwrap().success());
    let after: Vec<String> = others.iter().chain([&junk]).map(|p| sha256_file(p)).collect();
    assert_eq!(untouched, after, "a device without the array's UUID was written");

    // assemble --scan checks every array listed; writes nothing either.
    let other_uuid = json(ok(uraid(&["examine", "--json", others[0].to_str().unwrap()]), "examine"))[0]
        ["array_uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let devices_other: Vec<&str> = paths(&others);
    std::fs::write(
        &conf,
        format!("{line}\nARRAY other UUID={other_uuid} devices={}\n", devices_other.join(",")),
    )
    .unwrap();
    let out = ok(uraid(&["assemble", "--scan", "--config", cf]), "assemble --scan");
    assert!(out.contains("serve --scan other") && out.contains(&format!("serve --scan {name}")), "{out}");
    assert_eq!(untouched[..2].to_vec(), others.iter().map(|p| sha256_file(p)).collect::<Vec<_>>());

    // Refusals: the line, what is wrong, what to do.
    std::fs::write(&conf, format!("{line}\nARRAY broken devices={}\n", devices_other.join(","))).unwrap();
    let o = uraid(&["serve", "--scan", "--config", cf]);
    let e = text(&o);
    assert!(
        !o.status.success()
            && e.contains("uraid.conf line 2: ARRAY broken has no UUID=")
            && e.contains("uraid examine"),
        "{e}"
    );
    std::fs::write(&conf, "ARRAY lost UUID=00000000:00000000:00000000:00000001 devices=/nonexistent/*\n")
        .unwrap();
    let o = uraid(&["assemble", "--scan", "lost", "--config", cf]);
    let e = text(&o);
    assert!(!o.status.success() && e.contains("no device with the UUID") && e.contains("line 1"), "{e}");
    let o = uraid(&["serve", "--scan", "--config", dir.path("absent.conf").to_str().unwrap()]);
    assert!(text(&o).contains("uraid detail --scan >"), "{}", text(&o));
}
