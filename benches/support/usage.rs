//! CPU time and peak memory of a process, as the kernel counts them (`/proc/<pid>/stat` and
//! `status`; for the bench's own process, its CPU clock): the figures every bench reports of the
//! process it measures.

use std::process::Command;

/// CPU time and memory of a process, as the kernel counts them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// User and system time of all its threads, in seconds.
    pub cpu: f64,
    /// `VmHWM`: the peak resident set, in MiB.
    pub peak_rss_mib: f64,
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The usage of process `pid` now (`/proc/<pid>/stat` and `status`); zero once it is gone.
pub fn usage(pid: u32) -> Usage {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis, from the state (field 3) on: utime
    // and stime are fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Usage {
        cpu: (tick(11) + tick(12)) / clock_ticks(),
        peak_rss_mib: peak_rss_mib(pid),
    }
}

/// `VmHWM` of process `pid` (`/proc/<pid>/status`), in MiB; zero once it is gone.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0);
    hwm_kb / 1024.0
}

/// [`usage`] of this process, with its CPU time from the process's CPU clock, to the nanosecond:
/// `/proc/<pid>/stat` counts in clock ticks of 10 ms, each about a twentieth of the CPU a
/// 1,000-LoadBalancer convergence takes.
pub fn own() -> Usage {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Usage {
        cpu: now.tv_sec as f64 + now.tv_nsec as f64 / 1e9,
        peak_rss_mib: peak_rss_mib(std::process::id()),
    }
}

/// Marks the start (`true`) or the end (`false`) of the part of a bench worth profiling, for
/// `perf record --delay=-1 --control=fifo:<path>` with `BENCH_PERF_CTL=<path>` set: perf then samples
/// only the timed part, not the set-up before it or the teardown after it. Does nothing without
/// the variable.
pub fn profile_window(open: bool) {
    use std::io::Write;
    let Some(path) = std::env::var_os("BENCH_PERF_CTL") else {
        return;
    };
    let command: &[u8] = if open { b"enable\n" } else { b"disable\n" };
    match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(mut fifo) => {
            if let Err(e) = fifo.write_all(command) {
                eprintln!("BENCH_PERF_CTL {}: {e}", path.to_string_lossy());
            }
        }
        Err(e) => eprintln!("BENCH_PERF_CTL {}: {e}", path.to_string_lossy()),
    }
}
