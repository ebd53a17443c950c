//! Serves a RAM disk or a file over NBD, for manual tests and benchmarks.
//!
//! cargo run --release -p uraid-nbd --example serve -- [--listen 127.0.0.1:10809]
//!     [--unix PATH] [--size-mib 1024 | --file PATH] [--read-only] [--name NAME]

use std::sync::Arc;
use uraid_nbd::{BlockDevice, Export, FileDevice, MemDevice, Server, ServerOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Loopback only unless told otherwise: NBD has no authentication.
    let mut listen = "127.0.0.1:10809".to_string();
    let mut unix = None;
    let mut size_mib = 1024usize;
    let mut file = None;
    let mut read_only = false;
    let mut name = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs ADDR")?,
            "--unix" => unix = Some(args.next().ok_or("--unix needs PATH")?),
            "--size-mib" => size_mib = args.next().ok_or("--size-mib needs N")?.parse()?,
            "--file" => file = Some(args.next().ok_or("--file needs PATH")?),
            "--read-only" => read_only = true,
            "--name" => name = args.next().ok_or("--name needs NAME")?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let device: Arc<dyn BlockDevice> = match file {
        Some(path) => Arc::new(FileDevice::open(path.as_ref(), read_only, 8)?),
        None => Arc::new(MemDevice::new(size_mib << 20).read_only(read_only)),
    };
    let mut export = Export::new(name, device);
    export.read_only = read_only;
    let server = Server::new(vec![export], ServerOptions::default())?;
    match unix {
        Some(path) => {
            let _ = std::fs::remove_file(&path);
            eprintln!("serving on nbd+unix:///?socket={path}");
            server.serve_unix(std::os::unix::net::UnixListener::bind(&path)?)?;
        }
        None => {
            let listener = std::net::TcpListener::bind(&listen)?;
            eprintln!("serving on nbd://{}/", listener.local_addr()?);
            server.serve_tcp(listener)?;
        }
    }
    Ok(())
}
