//! The `process_*` metrics Prometheus client libraries export by default (and vLLM with them):
//! CPU seconds, resident and virtual memory, open and maximum file descriptors, start time —
//! read from Linux's `/proc` at each scrape. Elsewhere they are simply absent.

use metrics::{counter, gauge};

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// Reads `/proc` and sets the process metrics; what cannot be read is left out.
pub fn refresh() {
    let Some(p) = read() else { return };
    counter!("process_cpu_seconds_total").absolute(p.cpu_seconds as u64);
    gauge!("process_resident_memory_bytes").set(p.resident_bytes);
    gauge!("process_virtual_memory_bytes").set(p.virtual_bytes);
    gauge!("process_start_time_seconds").set(p.start_time);
    gauge!("process_open_fds").set(p.open_fds);
    if let Some(m) = p.max_fds {
        gauge!("process_max_fds").set(m);
    }
}

/// Hands the allocator's free memory back to the operating system (glibc keeps freed heap
/// pages mapped; a model's unload frees hundreds of megabytes at once). Elsewhere a no-op.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only releases memory glibc's allocator holds free; it takes no
        // pointers and is safe to call from any thread.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// One reading of this process's figures.
#[derive(Debug, Clone, PartialEq)]
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time: f64,
    open_fds: f64,
    max_fds: Option<f64>,
}

fn read() -> Option<ProcessFigures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    parse(&stat, &status, &boot, &limits, open_fds)
}

/// The figures from the texts of `/proc/self/stat`, `/proc/self/status`, `/proc/stat` and
/// `/proc/self/limits`.
fn parse(
    stat: &str,
    status: &str,
    boot: &str,
    limits: &str,
    open_fds: f64,
) -> Option<ProcessFigures> {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15, starttime 22.
    let field = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    let kib = |key: &str| {
        let line = status.lines().find(|l| l.starts_with(key))?;
        Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? * 1024.0)
    };
    let btime = boot.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse::<f64>().ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok());
    Some(ProcessFigures {
        cpu_seconds: (field(14)? + field(15)?) / USER_HZ,
        resident_bytes: kib("VmRSS:")?,
        virtual_bytes: kib("VmSize:")?,
        start_time: btime + field(22)? / USER_HZ,
        open_fds,
        max_fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_texts() {
        let stat = "4242 (tandem (decode) w) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 50 0 0 20 0 \
                    9 0 12345 999 123 18446744073709551615";
        let status = "Name:\ttandem\nVmSize:\t  2048 kB\nVmRSS:\t   512 kB\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 4096                 files\n";
        let p = parse(stat, status, boot, limits, 7.0).unwrap();
        assert_eq!(p.cpu_seconds, 3.0);
        assert_eq!((p.resident_bytes, p.virtual_bytes), (512.0 * 1024.0, 2048.0 * 1024.0));
        assert_eq!(p.start_time, 1_700_000_000.0 + 123.45);
        assert_eq!((p.open_fds, p.max_fds), (7.0, Some(1024.0)));
        assert!(parse("garbage", status, boot, limits, 0.0).is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let p = read().expect("/proc is readable");
        assert!(p.resident_bytes > 0.0 && p.virtual_bytes >= p.resident_bytes);
        assert!(p.open_fds >= 3.0 && p.start_time > 1.6e9);
    }
}
