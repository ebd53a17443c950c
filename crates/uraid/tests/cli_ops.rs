//! Operating an array from scripts: `--json` with numbers as numbers (docs/json.md),
//! `uraid monitor`, and the config file (`--scan`).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;

fn create(dir: &TempDir, level: &str, n: usize, extra: &[&str]) -> Vec<PathBuf> {
    let members: Vec<PathBuf> = (0..n).map(|i| dir.path(&format!("m{i}"))).collect();
    let count = n.to_string();
    let mut args =
        vec!["create", "--level", level, "--raid-devices", &count, "--size", "16M", "--assume-clean"];
    args.extend_from_slice(extra);
    args.extend(paths(&members));
    ok(uraid(&args), "uraid create");
    members
}

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
    let members = create(&dir, "5", 3, &["--bitmap", "internal", "--name", "json"]);

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
