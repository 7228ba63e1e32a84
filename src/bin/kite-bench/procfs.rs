//! What /proc says about the server: its pid (from the listening socket), its CPU time and
//! its resident memory; and this process's own CPU time.

use std::fs;

/// The pid of the process listening on `port` (TCP, any loopback or wildcard address),
/// found through /proc/net/tcp{,6} and the socket inodes in /proc/*/fd.
pub fn pid_listening_on(port: u16) -> Option<i32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue; // 0A = LISTEN
            }
            let Some((_, p)) = f[1].rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let me = std::process::id() as i32;
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if inodes.iter().any(|i| *i == t) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU seconds of a process (all its threads), from /proc/PID/stat.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields resume after its closing parenthesis.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks())
}

/// Resident set size in bytes, from /proc/PID/status.
pub fn rss_bytes(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds (user + system) this process has used.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    }
}

/// Raises the open-file limit to the hard limit (1000 consumers need 1000 sockets).
pub fn raise_nofile() {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_stat() {
        let me = std::process::id() as i32;
        assert!(cpu_seconds(me).is_some());
        assert!(rss_bytes(me).unwrap() > 0);
    }

    #[test]
    fn finds_own_listener_is_skipped_but_others_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // Our own process is skipped on purpose (the bench is never the server).
        assert_eq!(pid_listening_on(port), None);
    }
}
