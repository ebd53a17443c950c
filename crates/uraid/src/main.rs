//! `uraid`: user-space software RAID, on-disk compatible with Linux md, served over NBD.

mod array;
mod assemble;
mod bench;
mod config;
mod control;
mod create;
mod demo;
mod detail;
mod examine;
mod explain;
mod grow;
mod grow_offline;
mod list;
mod metrics;
mod monitor;
mod notify;
mod reproduce;
mod serve;
mod sim;
mod size_arg;
mod zero;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "uraid", version, about = "User-space software RAID, md-compatible, served over NBD")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create an md array (superblock 1.2, mdadm's defaults) on member files or devices.
    Create(create::CreateArgs),
    /// Print each member's md superblock (mdadm --examine).
    Examine(examine::ExamineArgs),
    /// Check that members form a startable array and print its detail; writes nothing.
    Assemble(assemble::AssembleArgs),
    /// Detail of an array: from its members, or from a running `uraid serve` (--control).
    Detail(detail::DetailArgs),
    /// A RAID6 of six 1 GiB sparse files under ./uraid-demo/, served on 127.0.0.1:10809.
    Demo(demo::DemoArgs),
    /// Assemble and serve the array over NBD, with a control socket, until SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// /proc/mdstat-like status of a running array (through its control socket).
    Status(control::StatusArgs),
    /// Erase the md superblock of members no running array holds (mdadm --zero-superblock).
    ZeroSuperblock(zero::ZeroArgs),
    /// The arrays `uraid serve` runs on this machine: name, uuid, level, state, pid, control
    /// socket and NBD URL.
    List(list::ListArgs),
    /// Watch a running array and run a program on mdadm --monitor's events (Fail,
    /// FailSpare, DegradedArray, Rebuild..., SpareActive, DeviceDisappeared, TestMessage).
    Monitor(monitor::MonitorArgs),
    /// Stop a running array as SIGTERM does: in-flight requests finish, the array is marked
    /// clean; answers once it is closed (mdadm --stop).
    Stop(control::StopArgs),
    /// Scrub a running array: check, repair or idle (md's sync_action, mdadm --action).
    Action(control::ActionArgs),
    /// Mark a member of a running array faulty (mdadm --fail).
    Fail(control::FailArgs),
    /// Remove a failed member or a spare from a running array (mdadm --remove).
    Remove(control::MemberCommandArgs),
    /// Add a member to a running array: rebuilt into a missing slot, or a hot spare.
    Add(control::AddArgs),
    /// Rebuild a new device for an active member, which stays in sync until the new one
    /// takes its slot (mdadm --replace MEMBER --with NEW); the array is never degraded.
    Replace(control::ReplaceArgs),
    /// Change an array's shape (mdadm --grow): on a running one (--control) more or fewer
    /// raid1 mirrors, the component size; a raid4/5/6 grow by members on a stopped one's
    /// members (offline for now), and --continue of a reshape left mid-way.
    Grow(grow::GrowArgs),
    /// Change a tunable of a running array (md's sysfs files), or list them with their values.
    Set(control::SetArgs),
    /// Benchmarks on this machine, each against a peer measured in the same run.
    Bench(bench::BenchArgs),
    /// The member I/Os one request costs on an idle array of a given shape.
    Explain(explain::ExplainArgs),
    /// Random workload with faults on simulated disks, checked against a reference model.
    Sim(sim::SimArgs),
    /// A seed's experiment on simulated disks of its era, with the seed's claims beside ours.
    Reproduce(reproduce::ReproduceArgs),
}

fn main() {
    let cli = Cli::parse();
    // Request-sized buffers (up to 32 MiB) recycle through malloc's heap instead of an
    // mmap/munmap and a round of page faults each.
    uraid_io::real::keep_large_buffers_on_heap();
    if !matches!(cli.command, Command::Serve(_) | Command::Demo(_)) {
        // Report commands end quietly when their reader goes away (`uraid ... | head`);
        // the server keeps Rust's ignored SIGPIPE so a vanished client is only an error.
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Create(args) => create::run(args),
        Command::Examine(args) => examine::run(args),
        Command::Assemble(args) => assemble::run(args),
        Command::Detail(args) => detail::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Status(args) => control::run_status(args),
        Command::Stop(args) => control::run_stop(args),
        Command::List(args) => list::run(args),
        Command::Monitor(args) => monitor::run(args),
        Command::ZeroSuperblock(args) => zero::run(args),
        Command::Fail(args) => control::run_fail(args),
        Command::Remove(args) => control::run_remove(args),
        Command::Add(args) => control::run_add(args),
        Command::Replace(args) => control::run_replace(args),
        Command::Action(args) => control::run_action(args),
        Command::Grow(args) => grow::run(args),
        Command::Set(args) => control::run_set(args),
        Command::Bench(args) => bench::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Reproduce(args) => reproduce::run(args),
    };
    if let Err(e) = result {
        eprintln!("uraid: error: {e:#}");
        std::process::exit(1);
    }
}
