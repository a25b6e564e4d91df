//! Binding the TCP endpoints (`[daemon] query_listen`, `[metrics] listen`) without
//! letting a user stop bftrainerd: whoever binds the port first (any user may, the
//! ports are above 1024) would otherwise make the bind fail at start, and systemd would
//! restart the daemon in a loop while it lends nothing. Instead the endpoint waits,
//! retrying with backoff, while the daemon runs; the log and `bftrainer status` say
//! which port is held and, from /proc, by which uid and process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;
use tokio::net::TcpListener;

/// First wait between tries; doubled each time up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between tries: a port freed is taken within this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Endpoints not bound yet, by their config key: the message `bftrainer status` shows.
static PROBLEMS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// The endpoints bftrainerd waits to bind, one message each.
pub fn problems() -> Vec<String> {
    PROBLEMS
        .lock()
        .map(|p| p.values().cloned().collect())
        .unwrap_or_default()
}

fn set_problem(key: &str, msg: Option<String>) {
    if let Ok(mut p) = PROBLEMS.lock() {
        match msg {
            Some(m) => p.insert(key.to_string(), m),
            None => p.remove(key),
        };
    }
}

/// Binds `addr` for the endpoint configured as `key`, waiting as long as it takes: on
/// failure it logs (and shows in status) why and who holds the port, then retries.
pub async fn bind_or_wait(key: &str, addr: SocketAddr) -> TcpListener {
    let mut wait = FIRST_BACKOFF;
    let mut said = String::new();
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                if !said.is_empty() {
                    log::warn!("{key} = \"{addr}\": listening now (the port was freed)");
                }
                set_problem(key, None);
                return l;
            }
            Err(e) => {
                let who = if e.kind() == std::io::ErrorKind::AddrInUse {
                    holder_of(addr.port()).unwrap_or_else(|| {
                        "its holder is not visible in /proc (another network namespace?)".into()
                    })
                } else {
                    String::new()
                };
                let msg = format!(
                    "{key} = \"{addr}\": cannot listen there ({e}){}{}; bftrainerd runs without this endpoint and retries every {} s at most",
                    if who.is_empty() { "" } else { ": the port is held by " },
                    who,
                    MAX_BACKOFF.as_secs()
                );
                // Once per change of cause or holder, not at every try.
                if msg != said {
                    log::error!("{msg}");
                    said = msg.clone();
                }
                set_problem(key, Some(msg));
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_BACKOFF);
    }
}

/// Who listens on TCP `port`, from /proc: "uid U (name), pid P (comm)"; the pid only
/// where this process may read the holder's fds (root may).
pub fn holder_of(port: u16) -> Option<String> {
    let (uid, inode) = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .find_map(|t| listener_in(&t, port))?;
    let name = uid_name(uid).map(|n| format!(" ({n})")).unwrap_or_default();
    let pid = pid_of_socket(inode)
        .map(|(pid, comm)| format!(", pid {pid} ({comm})"))
        .unwrap_or_else(|| ", pid not visible".into());
    Some(format!("uid {uid}{name}{pid}"))
}

/// (uid, inode) of the socket listening on `port` in /proc/net/tcp{,6} text.
fn listener_in(text: &str, port: u16) -> Option<(u32, u64)> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        let local_port = f.get(1)?.rsplit(':').next()?;
        let listening = *f.get(3)? == "0A";
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?)))
            .flatten()
    })
}

fn uid_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.get(2)?.parse::<u32>().ok()? == uid).then(|| f[0].to_string())
    })
}

/// The process holding socket `inode` and its command name.
fn pid_of_socket(inode: u64) -> Option<(u32, String)> {
    let want = format!("socket:[{inode}]");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == want.as_str()) {
                let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                return Some((pid, comm.trim().to_string()));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_of_a_port_is_found_in_proc_net_tcp() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1AA4 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1AA5 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 4343 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(listener_in(t, 0x1AA4), Some((1000, 4242)));
        // An established connection on the port is not its listener.
        assert_eq!(listener_in(t, 0x1AA5), None);
        assert_eq!(listener_in("garbage\n\n  x y", 1), None);
    }

    /// Issue 33, item 14: a port held by someone else does not stop the daemon: the
    /// bind waits, says who holds the port (this process, found through /proc), and
    /// takes the port once it is freed.
    #[tokio::test]
    async fn a_squatted_port_is_waited_for_and_its_holder_named() {
        let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = squatter.local_addr().unwrap();
        let key = format!("test_listen_{}", addr.port());
        let k = key.clone();
        let bound = tokio::spawn(async move { bind_or_wait(&k, addr).await });
        let me = format!("pid {}", std::process::id());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let msg = loop {
            if let Some(m) = problems().into_iter().find(|m| m.starts_with(&key)) {
                break m;
            }
            assert!(std::time::Instant::now() < deadline, "no problem reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            msg.contains("the port is held by uid") && msg.contains(&me),
            "{msg}"
        );
        assert!(!bound.is_finished());
        drop(squatter);
        let l = tokio::time::timeout(Duration::from_secs(30), bound)
            .await
            .expect("bound once the port was freed")
            .unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        assert!(!problems().iter().any(|m| m.starts_with(&key)));
    }
}
