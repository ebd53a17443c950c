//! Simulator speed: simulated member I/Os per second of real time, one core.
//! `cargo bench -p uraid-sim --bench sim_speed`

use uraid_sim::bench::sim_speed;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // The size `uraid bench sim` uses: within the simulated members' page pool (1 GiB).
    let n = if quick { 200_000 } else { 400_000 };
    uraid_sim::bench::warm_up_sim(n);
    for (profile, members, qd) in
        [("nvme", 8, 32), ("ssd-sata", 8, 32), ("hdd-7200-2009", 8, 32), ("hdd-7200-2009", 8, 1)]
    {
        let s = sim_speed(profile, members, qd, n);
        println!(
            "sim {profile:>14} members={members} qd={qd:>2}: {:>10.0} member I/Os per real second ({} I/Os, {:.2} s real, {:.1} s virtual){}",
            s.ios_per_real_second(),
            s.member_ios,
            s.real_seconds,
            s.virtual_seconds,
            if s.ios_per_real_second() >= 1e6 { "" } else { "  [below 1,000,000 target]" }
        );
    }
}
