//! The wire format (docs/design.md, "Elastic runtime"): one JSON object per line, at
//! most [`MAX_LINE`] bytes, each with a type `t`.

use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The protocol version agents and coordinators must share (2: mutual MUNGE
/// authentication bound to the run, heartbeats, the coordinator's store).
pub const PROTO: u64 = 2;
pub const MAX_LINE: usize = 1 << 20;
/// The most a peer may send before it has authenticated (the hello).
pub const MAX_HELLO: usize = 16 << 10;

/// Writes `line` and a newline to stderr in one write. The coordinator and the agents
/// share the job's output file, and `eprintln!` writes a formatted line in pieces that
/// interleave with other processes' (a pipe keeps writes up to 4 KiB whole).
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Marks the process's start (called first thing in `main`).
pub fn mark_start() {
    STARTED.get_or_init(std::time::Instant::now);
}

/// Seconds since the process started: an agent states it in its hello, so that the
/// coordinator measures a grow from the newcomer's start on its own clock.
pub fn process_age() -> f64 {
    STARTED
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

pub fn write_err(line: String) {
    use std::io::Write;
    let mut line = line;
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// As [`write_err`], to stdout (workers' output lines).
pub fn write_out(line: String) {
    use std::io::Write;
    let mut line = line;
    line.push('\n');
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `-v`: trace every message and connection problem on stderr.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The payload of an agent's MUNGE credential: binds it to one job, one run of that
/// job, the address the agent dialled (a relay at another address is refused) and
/// the coordinator's nonce of this connection; `anonce` is the agent's own nonce, which
/// the coordinator's answer must carry.
pub fn agent_payload(job: &str, run: &str, to: &str, nonce: &str, anonce: &str) -> String {
    format!("bftrainer-run:v2 agent job={job} run={run} to={to} nonce={nonce} anonce={anonce}")
}

/// The payload of a query's MUNGE credential (`bft-run hosts`): as an agent's, for a
/// party that only asks (it cannot be taken for an agent's, nor an agent's for it).
pub fn query_payload(job: &str, run: &str, to: &str, nonce: &str, anonce: &str) -> String {
    format!("bftrainer-run:v2 query job={job} run={run} to={to} nonce={nonce} anonce={anonce}")
}

/// A node name a peer sent, fit for `host:slots` lines: 1 to 64 letters, digits,
/// dots, dashes and underscores.
pub fn is_node_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
}

/// The payload of the coordinator's MUNGE credential in its welcome: proves that the
/// coordinator runs as the job's owner, for this job and run, on this connection.
pub fn coord_payload(job: &str, run: &str, anonce: &str) -> String {
    format!("bftrainer-run:v2 coord job={job} run={run} anonce={anonce}")
}

/// A fresh random identifier (nonces, run ids): 128 bits in hex.
pub fn fresh_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// An identifier a peer sent: hex, 1 to 64 digits.
pub fn is_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Text from a peer made fit for a log line: printable ASCII only, at most 80
/// characters (a peer's words are never echoed whole into the job's output).
pub fn brief(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(80)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if s.chars().count() > 80 {
        out.push_str("...");
    }
    out
}

/// At most `max` bytes of `s` (cut at a character boundary, "..." added when cut).
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Reads one line (without the newline). `Ok(None)` at end of stream; an error for a
/// line over [`MAX_LINE`], bad UTF-8 or bad JSON, or a JSON value without a string `t`.
pub async fn read_msg<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Value>, String> {
    read_msg_max(r, MAX_LINE).await
}

/// As [`read_msg`], with a smaller limit (an unauthenticated peer's hello).
pub async fn read_msg_max<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Value>, String> {
    let mut buf = Vec::new();
    loop {
        let avail = r
            .fill_buf()
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        if avail.is_empty() {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("the connection closed in the middle of a line".into())
            };
        }
        let (chunk, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], Some(i + 1)),
            None => (avail, None),
        };
        if buf.len() + chunk.len() > max {
            return Err(format!("a line over {max} bytes"));
        }
        buf.extend_from_slice(chunk);
        let used = done.unwrap_or(avail.len());
        r.consume(used);
        if done.is_some() {
            return parse(&buf).map(Some);
        }
    }
}

pub fn parse(line: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| {
        format!(
            "not a JSON line (error at line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    if !v.get("t").is_some_and(Value::is_string) {
        return Err("a message without a string field \"t\"".into());
    }
    Ok(v)
}

pub fn line(v: &Value) -> String {
    let mut s = v.to_string();
    s.push('\n');
    s
}

pub fn error(msg: &str) -> String {
    line(&json!({"t": "error", "msg": msg}))
}

pub fn t(v: &Value) -> &str {
    v.get("t").and_then(Value::as_str).unwrap_or("")
}

pub fn str_field<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    v.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("message {:?} lacks the string field {k:?}", brief(t(v))))
}

/// A string field that must be an identifier ([`is_id`]).
pub fn id_field<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    let s = str_field(v, k)?;
    if !is_id(s) {
        return Err(format!(
            "message {:?}: field {k:?} must be 1 to 64 hex digits",
            brief(t(v))
        ));
    }
    Ok(s)
}

pub fn u64_field(v: &Value, k: &str) -> Result<u64, String> {
    v.get(k).and_then(Value::as_u64).ok_or_else(|| {
        format!(
            "message {:?} lacks the whole-number field {k:?}",
            brief(t(v))
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    fn read_all(input: &[u8]) -> Vec<Result<Option<Value>, String>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut r = BufReader::with_capacity(7, input);
            let mut out = Vec::new();
            loop {
                let m = read_msg(&mut r).await;
                let end = !matches!(m, Ok(Some(_)));
                out.push(m);
                if end {
                    return out;
                }
            }
        })
    }

    #[test]
    fn lines_split_across_reads_and_the_limits() {
        let got = read_all(b"{\"t\":\"ready\",\"worker\":\"1.0\"}\n{\"t\":\"done\"}\n");
        assert_eq!(got.len(), 3);
        assert_eq!(t(got[0].as_ref().unwrap().as_ref().unwrap()), "ready");
        assert_eq!(got[2], Ok(None));
        for (input, want) in [
            (&b"garbage\n"[..], "not a JSON line"),
            (b"{\"x\":1}\n", "without a string field"),
            (b"[1,2]\n", "without a string field"),
            (b"{\"t\":\"ready\"", "closed in the middle"),
        ] {
            let got = read_all(input);
            let e = got.last().unwrap().clone().unwrap_err();
            assert!(e.contains(want), "{input:?}: {e}");
        }
        let mut big = vec![b'a'; MAX_LINE + 10];
        big.push(b'\n');
        let e = read_all(&big).pop().unwrap().unwrap_err();
        assert!(e.contains("over"), "{e}");
    }

    #[test]
    fn fields_say_what_is_missing() {
        let v = parse(br#"{"t":"gen","gen":"x"}"#).unwrap();
        assert!(u64_field(&v, "gen").unwrap_err().contains("\"gen\""));
        assert!(str_field(&v, "store").unwrap_err().contains("\"store\""));
        assert_eq!(
            agent_payload("7", "r1", "h:1", "ab", "cd"),
            "bftrainer-run:v2 agent job=7 run=r1 to=h:1 nonce=ab anonce=cd"
        );
        assert_eq!(
            coord_payload("7", "r1", "cd"),
            "bftrainer-run:v2 coord job=7 run=r1 anonce=cd"
        );
        let v = parse(br#"{"t":"hello","anonce":"xyz","n":"ab01"}"#).unwrap();
        assert!(id_field(&v, "anonce").unwrap_err().contains("hex digits"));
        assert_eq!(id_field(&v, "n"), Ok("ab01"));
        assert!(is_id(&fresh_id()) && fresh_id() != fresh_id());
    }

    #[test]
    fn peer_text_is_cut_and_made_printable() {
        assert_eq!(brief("ok text"), "ok text");
        assert_eq!(brief("a\u{1b}[2Jb\n"), "a?[2Jb?");
        let long = "x".repeat(500);
        assert_eq!(brief(&long).len(), 83);
        assert_eq!(clip("héllo", 2), "h...");
        assert_eq!(clip("abc", 3), "abc");
    }
}
