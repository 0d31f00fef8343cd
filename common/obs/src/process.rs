//! Process metrics read from `/proc/self` at scrape time (Linux; elsewhere they are absent):
//! the names Prometheus' client libraries use, so standard dashboards work.

use super::Metrics;
use crate::error::ObsError;

/// Register `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds` and
/// `process_start_time_seconds`, refreshed at each scrape.
pub fn register(metrics: &Metrics) -> Result<(), ObsError> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let cpu = prometheus::Counter::new("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.")?;
    metrics.registry().register(Box::new(cpu.clone()))?;
    let rss = metrics.gauge("process_resident_memory_bytes", "Resident memory size in bytes.")?;
    let virtual_memory = metrics.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")?;
    let open_fds = metrics.gauge("process_open_fds", "Number of open file descriptors.")?;
    let max_fds = metrics.gauge("process_max_fds", "Maximum number of open file descriptors.")?;
    let start = prometheus::Gauge::new("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")?;
    metrics.registry().register(Box::new(start.clone()))?;
    metrics.on_scrape(move || {
        let Some(stat) = read_stat() else { return };
        super::mirror_counter(&cpu, stat.cpu_seconds);
        rss.set(stat.rss_bytes as i64);
        virtual_memory.set(stat.virtual_bytes as i64);
        start.set(stat.start_time_seconds);
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            open_fds.set(entries.count() as i64);
        }
        if let Some(limit) = std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(max_open_files) {
            max_fds.set(limit as i64);
        }
    });
    Ok(())
}

/// CPU seconds (user and system, every thread) this process has used since it started;
/// `None` where the system does not say.
pub fn cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given, or fails.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: it returned 0, so it wrote the struct.
    let usage = unsafe { usage.assume_init() };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// What `/proc/self/stat` says, in base units.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    rss_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: f64,
}

fn read_stat() -> Option<Stat> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf only reads configuration values.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    parse_stat(&stat, &boot, u64::try_from(ticks).ok()?, u64::try_from(page).ok()?)
}

/// Parse `/proc/self/stat` (fields after the command name, which may hold spaces and
/// parentheses) with `/proc/stat`'s boot time.
fn parse_stat(stat: &str, proc_stat: &str, ticks_per_second: u64, page_bytes: u64) -> Option<Stat> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field numbers of proc(5), less the two before this slice (pid, comm).
    let field = |number: usize| -> Option<u64> { fields.get(number - 3)?.parse().ok() };
    let ticks = ticks_per_second.max(1) as f64;
    let boot_time: u64 = proc_stat.lines().find_map(|line| line.strip_prefix("btime ")).and_then(|value| value.trim().parse().ok())?;
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        virtual_bytes: field(23)?,
        rss_bytes: field(24)?.saturating_mul(page_bytes),
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks,
    })
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 8192000 300 18446744073709551615";
        let parsed = parse_stat(stat, "cpu 1 2 3\nbtime 1700000000\n", 100, 4096).expect("parses");
        assert_eq!(parsed, Stat { cpu_seconds: 3.0, rss_bytes: 300 * 4096, virtual_bytes: 8_192_000, start_time_seconds: 1_700_000_010.0 });
        assert_eq!(parse_stat("garbage", "btime 1\n", 100, 4096), None);
    }

    #[test]
    fn the_open_file_limit_is_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(max_open_files("Max open files unlimited unlimited files"), None);
    }
}
